"""Simulated runtime nodes: what each really runs, what it reports, and a
fast way to deliver many heartbeats.

A :class:`SimNode` is the truth about one node (its sandboxes).  Its
heartbeat is built from an :class:`Observed` state, which may be a past one:
that is how the scenarios make heartbeats lag behind reality.  Heartbeats go
through the library's own operations (:class:`scheduler.client.Ops`), only
pipelined, so a 10,000-node fleet is set up in seconds.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler import Heartbeat, NodeSnapshot, Scheduler
from scheduler.client import Call
from scheduler.records import MIB

GIB = 1024 * MIB

#: Node shapes (CPU, memory GiB) of a mixed fleet.
SHAPES: tuple[tuple[int, int], ...] = ((16, 64), (32, 128), (64, 256), (96, 384))
#: Sandbox sizes (CPU, memory MiB) of a realistic stream.
SIZES: tuple[tuple[int, int], ...] = ((1, 2048), (2, 4096), (2, 4096), (4, 8192))


@dataclass(frozen=True)
class Observed:
    """A node's numbers at one moment: what a heartbeat sent then would say."""

    sandboxes: tuple[str, ...]
    allocated_cpu: int
    allocated_memory_bytes: int
    create_successes: int


@dataclass
class SimNode:
    node_id: str
    cpu: int
    memory_bytes: int
    endpoint: str = ""
    instance: str = "boot-1"
    #: sandbox id -> (cpu, memory bytes), in creation order
    sandboxes: dict[str, tuple[int, int]] = field(default_factory=dict)
    create_successes: int = 0

    def __post_init__(self) -> None:
        if not self.endpoint:
            self.endpoint = f"http://{self.node_id}.bench:8000"

    @property
    def allocated_cpu(self) -> int:
        return sum(c for c, _ in self.sandboxes.values())

    @property
    def allocated_memory_bytes(self) -> int:
        return sum(m for _, m in self.sandboxes.values())

    def create(self, sandbox_id: str, cpu: int, memory_bytes: int) -> None:
        self.sandboxes[sandbox_id] = (cpu, memory_bytes)
        self.create_successes += 1

    def delete(self, sandbox_id: str) -> None:
        del self.sandboxes[sandbox_id]

    def observe(self) -> Observed:
        return Observed(tuple(self.sandboxes), self.allocated_cpu, self.allocated_memory_bytes,
                        self.create_successes)

    def heartbeat(self, seen: Observed | None = None, roster: bool = True) -> Heartbeat:
        """The heartbeat this node sends, reporting ``seen`` (default: now)."""
        o = seen or self.observe()
        return Heartbeat(
            node_id=self.node_id, service_instance_id=self.instance, endpoint=self.endpoint,
            snapshot=NodeSnapshot(
                status="READY", cpu_count=self.cpu, memory_total_bytes=self.memory_bytes,
                allocated_cpu=o.allocated_cpu, allocated_memory_bytes=o.allocated_memory_bytes,
                sandbox_count=len(o.sandboxes), create_successes=o.create_successes,
                memory_used_bytes=o.allocated_memory_bytes // 2,
                cpu_percent=min(100, o.allocated_cpu * 50 // max(1, self.cpu))),
            sandbox_ids=list(o.sandboxes) if roster else [])


def run_pipelined(s: Scheduler, calls: Sequence[Call[Any]], batch: int = 500,
                  errors: bool = False) -> list[Any]:
    """Run library operations in pipelines of ``batch`` (one round trip each).

    Each call is exactly the FCALL (or EVALSHA) the library would send on its
    own; the pipeline only saves round trips.  With ``errors`` an error reply
    (a refusal, a RESYNC) is returned in its place instead of raised.
    """
    out: list[Any] = []
    for i in range(0, len(calls), batch):
        chunk = calls[i:i + batch]
        pipe = s.client.pipeline(transaction=False)
        for c in chunk:
            s.scripts[c.script](keys=c.keys, args=c.args, client=pipe)
        for c, r in zip(chunk, pipe.execute(raise_on_error=not errors), strict=True):
            if isinstance(r, Exception):
                out.append(r)
                continue
            try:
                out.append(c.parse(r))
            except Exception as e:
                if not errors:
                    raise
                out.append(e)
    return out


def send_heartbeats(s: Scheduler, heartbeats: Iterable[Heartbeat], batch: int = 500,
                    memo: dict[str, Any] | None = None) -> int:
    """Full heartbeats, pipelined; with ``memo`` (``Scheduler.beats``) the
    client remembers them, so its later heartbeats go as deltas."""
    calls = [s.ops.heartbeat(hb, memo) for hb in heartbeats]
    run_pipelined(s, calls, batch)
    return len(calls)


def mixed_fleet(n: int, rng: random.Random, load: tuple[float, float] = (0.3, 0.7),
                prefix: str = "node") -> list[SimNode]:
    """``n`` nodes of mixed shapes, each already running sandboxes that fill a
    uniformly drawn share (``load``) of its CPU."""
    width = len(str(max(0, n - 1)))
    nodes = []
    for i in range(n):
        cpu, gib = SHAPES[i % len(SHAPES)]
        node = SimNode(f"{prefix}-{i:0{width}d}", cpu, gib * GIB)
        target = rng.uniform(*load) * cpu
        k = 0
        while True:
            c, mib = rng.choice(SIZES)
            if node.allocated_cpu + c > target:
                break
            node.create(f"{node.node_id}-sb{k}", c, mib * MIB)
            k += 1
        nodes.append(node)
    return nodes
