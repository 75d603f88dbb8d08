"""Fleets of simulated nodes (:class:`scheduler.ops.simnode.SimNode`, the one
simulated node) and a fast way to deliver many heartbeats.

Heartbeats go through the library's own operations
(:class:`scheduler.store.calls.Ops`), only pipelined, so a 10,000-node fleet is set
up in seconds.  A node's heartbeat may report a past :class:`Observed` state:
that is how the scenarios make heartbeats lag behind reality.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

from scheduler import Heartbeat, Scheduler
from scheduler.domain.records import MIB
from scheduler.ops.simnode import SimNode
from scheduler.store.calls import Call

GIB = 1024 * MIB

#: Node shapes (CPU, memory GiB) of a mixed fleet.
SHAPES: tuple[tuple[int, int], ...] = ((16, 64), (32, 128), (64, 256), (96, 384))
#: Sandbox sizes (CPU, memory MiB) of a realistic stream.
SIZES: tuple[tuple[int, int], ...] = ((1, 2048), (2, 4096), (2, 4096), (4, 8192))


def run_pipelined(
    s: Scheduler, calls: Sequence[Call[Any]], batch: int = 500, errors: bool = False
) -> list[Any]:
    """Run library operations in pipelines of ``batch`` (one round trip each).

    Each call is exactly the FCALL (or EVALSHA) the library would send on its
    own; the pipeline only saves round trips.  With ``errors`` an error reply
    (a refusal, a RESYNC) is returned in its place instead of raised.
    """
    out: list[Any] = []
    for i in range(0, len(calls), batch):
        chunk = calls[i : i + batch]
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


def send_heartbeats(
    s: Scheduler,
    heartbeats: Iterable[Heartbeat],
    batch: int = 500,
    memo: dict[str, Any] | None = None,
) -> int:
    """Full heartbeats, pipelined; with ``memo`` (``Scheduler.beats``) the
    client remembers them, so its later heartbeats go as deltas."""
    calls = [s.ops.heartbeat(hb, memo) for hb in heartbeats]
    run_pipelined(s, calls, batch)
    return len(calls)


def mixed_fleet(
    n: int, rng: random.Random, load: tuple[float, float] = (0.3, 0.7), prefix: str = "node"
) -> list[SimNode]:
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
