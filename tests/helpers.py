"""Small builders shared by the tests."""

from __future__ import annotations

from typing import Any

from scheduler import Heartbeat, NodeSnapshot, Scheduler
from scheduler.testing.model import NodeState

GIB = 1024**3


def hb(node_id: str, *, cpu: int = 16, mem_gib: int = 64, sid: str = "boot-1",
       roster: list[str] | None = None, endpoint: str | None = None, **snap: Any) -> Heartbeat:
    return Heartbeat(
        node_id=node_id, service_instance_id=sid,
        endpoint=endpoint if endpoint is not None else f"{node_id}.local:5000",
        snapshot=NodeSnapshot(cpu_count=cpu, memory_total_bytes=mem_gib * GIB, **snap),
        sandbox_ids=roster or [])


def fleet(s: Scheduler, n: int, **kw: Any) -> list[str]:
    ids = [f"n{i}" for i in range(n)]
    for node_id in ids:
        s.heartbeat(hb(node_id, **kw))
    return ids


def node_states(s: Scheduler) -> list[NodeState]:
    """Every node record as the model reads it, straight from Redis."""
    ids = [x.decode() for x in s.client.zrange(s.keys.nodes, 0, -1)]
    out = []
    for node_id in ids:
        raw = s.client.hgetall(s.keys.node(node_id))
        out.append(NodeState.from_record({k.decode(): v.decode() for k, v in raw.items()}))
    return out


def rr_value(s: Scheduler) -> int:
    return int(s.client.get(s.keys.rr) or 0)
