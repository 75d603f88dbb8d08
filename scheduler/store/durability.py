"""What keeps an acknowledged write: ``min_replicas_acked`` (:class:`Durability`,
and how many replicas a WAIT can reach), and a Redis that would drop keys
(``maxmemory-policy``, evictions seen in ``INFO stats``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from scheduler.domain.errors import FailedPrecondition
from scheduler.store.cluster import is_cluster_client

log = logging.getLogger("scheduler.store.durability")


@dataclass(frozen=True)
class Durability:
    """When is a write acknowledged?  ``replicas`` > 0: only once that many
    Redis replicas have it (``WAIT replicas timeout_ms`` on the connection that
    wrote), so a failover cannot lose it."""

    replicas: int = 0
    timeout_ms: int = 200


#: The only eviction policy under which Redis never drops a key to make room
#: (it refuses writes at maxmemory instead, which the replica reports).
SAFE_EVICTION_POLICY = "noeviction"


class EvictionRisk(FailedPrecondition):
    """Redis may drop keys to make room (``maxmemory-policy`` other than
    ``noeviction``): reservations, bindings and node records could vanish
    while health says SERVING.  ``allow_eviction`` in the config accepts it."""


@dataclass
class EvictionWatch:
    """What a replica checks at start and in every health probe: the server's
    ``maxmemory-policy`` (INFO memory) and its ``evicted_keys`` (INFO stats),
    read once per primary (every primary of a cluster).  ``allowed``: a policy
    that evicts is logged, not refused."""

    allowed: bool = False
    #: evicted_keys per server at the last check (None: not read yet)
    evicted: dict[str, int] = field(default_factory=dict)

    async def check(self, client: Any, target: str) -> int:
        """Raise :class:`EvictionRisk` for a policy that evicts (unless allowed);
        return how many keys were evicted since the last check (logged)."""
        rose = 0
        for where, memory, stats in await _infos(client):
            policy = str(memory.get("maxmemory_policy", SAFE_EVICTION_POLICY))
            if policy != SAFE_EVICTION_POLICY and not self.allowed:
                raise EvictionRisk(
                    f"Redis at {target} has maxmemory-policy {policy}: at maxmemory it "
                    f"drops keys (reservations, bindings, node records) and the cell's "
                    f"ceilings no longer hold; set it to {SAFE_EVICTION_POLICY} "
                    "(CONFIG SET maxmemory-policy noeviction), or set scheduler.allow_eviction "
                    "to accept it"
                )
            evicted = _int_field(stats, "evicted_keys")
            before = self.evicted.get(where)
            self.evicted[where] = evicted
            if before is not None and evicted > before:
                rose += evicted - before
                log.error(
                    "Redis at %s evicted %d keys since the last check (maxmemory-policy %s): "
                    "the cell may have lost reservations or bindings",
                    target,
                    evicted - before,
                    policy,
                )
        return rose

    def total(self) -> int:
        return sum(self.evicted.values())


def _int_field(info: dict[str, Any], name: str) -> int:
    try:
        return int(info.get(name, 0))
    except (TypeError, ValueError):
        return 0


async def _infos(client: Any) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(server, INFO memory, INFO stats) of each primary ``client`` writes to."""
    if is_cluster_client(client):
        await client.initialize()
        out = []
        for node in client.get_primaries():
            memory = await client.info("memory", target_nodes=node)
            stats = await client.info("stats", target_nodes=node)
            out.append((str(node.name), _one_node(memory), _one_node(stats)))
        return out
    memory = await client.info("memory")
    stats = await client.info("stats")
    return [("", memory, stats)]


def _one_node(reply: Any) -> dict[str, Any]:
    """A cluster client's reply for one node: the INFO dict itself, or
    {node: INFO dict}."""
    if isinstance(reply, dict) and len(reply) == 1:
        (value,) = reply.values()
        if isinstance(value, dict):
            return value
    return dict(reply)


async def connected_replicas(client: Any) -> int:
    """How many Redis replicas are connected to the primary (INFO replication
    ``connected_slaves``): what a write with ``min_replicas_acked`` waits for,
    so that whichever one Sentinel promotes has every acknowledged write."""
    info = await client.info("replication")
    return _int_field(info, "connected_slaves")
