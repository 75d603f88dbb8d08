"""Every cell on a target: one Redis, or every primary of a Redis Cluster.

A cell is found by its policy hash (``<prefix>:{<cell>}:policy``, the key a
replica writes first); its numbers come from its own scripts, so they read
exactly as ``schedctl nodes`` and ``schedctl reservations`` would.
"""

from __future__ import annotations

from typing import Any

import msgspec
from redis.crc import key_slot

from scheduler.client import Scheduler
from scheduler.keys import DEFAULT_PREFIX, CellKeys
from scheduler.translate import translated


class CellSummary(msgspec.Struct, kw_only=True):
    cell: str
    #: the hash slot all of the cell's keys live in (its hash tag's)
    slot: int
    #: host:port of the primary that serves it
    primary: str
    nodes: int
    ready: int
    pending_reservations: int
    #: placements made since the cell was created (its reserved_total counter)
    placed_total: int
    strategy: str


def cell_names(client: Any, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Cells with a policy on ``client``'s target (every primary of a cluster)."""
    head = f"{prefix}:{{"
    names = set()
    for key in client.scan_iter(match=f"{prefix}:{{*}}:policy", count=1000):
        text = key.decode() if isinstance(key, bytes) else str(key)
        if text.startswith(head) and text.endswith("}:policy"):
            names.add(text[len(head) : -len("}:policy")])
    return sorted(names)


def primary_of(client: Any, key: str) -> str:
    get_node = getattr(client, "get_node_from_key", None)
    if get_node is not None:  # a cluster client
        node = get_node(key)
        return f"{node.host}:{node.port}"
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix:{kw['path']}"
    return f"{kw.get('host', '?')}:{kw.get('port', '?')}"


def summarize(sched: Scheduler, prefix: str = DEFAULT_PREFIX) -> list[CellSummary]:
    out = []
    with translated(sched.target):  # (an ACL without SCAN: one line, not a traceback)
        names = cell_names(sched.client, prefix)
    for name in names:
        cell = Scheduler(sched.client, cell=name, prefix=prefix, url=sched.url)
        keys = CellKeys(name, prefix)
        views = cell.nodes()
        stats = cell.stats()
        policy = cell.policy()
        out.append(
            CellSummary(
                cell=name,
                slot=key_slot(keys.policy.encode()),
                primary=primary_of(sched.client, keys.policy),
                nodes=len(views),
                ready=sum(1 for v in views if v.status == "READY"),
                pending_reservations=stats.pending,
                placed_total=stats.reserved_total,
                strategy=policy.strategy if policy else "",
            )
        )
    return out
