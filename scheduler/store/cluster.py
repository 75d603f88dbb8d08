"""Redis Cluster: every call goes to the primary that serves its cell's hash
slot (a cell's keys share one hash tag), found from the call's keys without
asking a node."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from scheduler.store.address import RedisAddress


def _fcall_slot(client: Any, args: tuple[Any, ...]) -> int | None:
    """The slot of ``FCALL fn numkeys key...`` from its keys, as redis-py does
    for EVALSHA: without this it asks a node (COMMAND GETKEYS) on every call."""
    keys = args[2 : 2 + int(args[1])] if len(args) > 1 else ()
    if not keys:
        return None
    slots = {client.keyslot(k) for k in keys}
    if len(slots) != 1:
        raise redis.exceptions.RedisClusterException(
            "FCALL - all keys must map to the same key slot"
        )
    return int(slots.pop())


class _SyncCluster(redis.cluster.RedisCluster):
    def determine_slot(self, *args: Any) -> int | None:
        if str(args[0]).upper() in ("FCALL", "FCALL_RO"):
            slot = _fcall_slot(self, args[1:])
            if slot is not None:
                return slot
        result: int | None = super().determine_slot(*args)
        return result


class _AsyncCluster(redis.asyncio.cluster.RedisCluster):
    async def _determine_slot(self, command: str, *args: Any) -> int:
        if command.upper() in ("FCALL", "FCALL_RO"):
            slot = _fcall_slot(self, args)
            if slot is not None:
                return slot
        result: int = await super()._determine_slot(command, *args)
        return result


def _cluster_options(addr: RedisAddress) -> dict[str, Any]:
    # a slot move or a failover inside the cluster is followed by redis-py
    # (MOVED / ASK, TRYAGAIN retried); the whole cluster being down is not hidden
    return {**addr.options, "require_full_coverage": False}


def is_cluster_client(client: Any) -> bool:
    return isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))
