"""Scenario ``durability``: what ``min_replicas_acked`` costs a Schedule.

A primary with one replica (real ``redis-server`` processes started here), a
fleet heartbeated in, then Schedules through the asyncio client, one at a
time and ``concurrency`` at once, with ``min_replicas_acked`` 0 (answered
once the primary has the reservation) and 1 (answered once a replica has it
too: ``WAIT 1`` on the connection that wrote).  Rows alternate the two
settings round by round so both see the same machine; ``PING`` of the
primary in the same run is the floor.
"""

from __future__ import annotations

import asyncio
import os
import platform
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.runner import Result, cpu_model, percentile
from scheduler import Heartbeat, NodeSnapshot, Policy, Request
from scheduler.client.aio import AsyncScheduler
from scheduler.store.connection import Durability
from scheduler.testing.redis_server import SentinelTopology

GIB = 1 << 30


@dataclass(frozen=True)
class Params:
    nodes: int = 100
    #: Schedules per setting and concurrency, over all rounds
    calls: int = 3000
    rounds: int = 6
    concurrency: tuple[int, ...] = (1, 16)
    ack_timeout_ms: int = 1000

    @classmethod
    def quick(cls) -> Params:
        return cls(nodes=10, calls=120, rounds=2)


async def _fleet(s: AsyncScheduler, n: int) -> None:
    for k in range(n):
        await s.heartbeat(
            Heartbeat(
                node_id=f"n{k:04d}",
                service_instance_id="b1",
                endpoint=f"n{k}.bench:5000",
                snapshot=NodeSnapshot(
                    status="READY", cpu_count=1_000_000, memory_total_bytes=1_000_000 * GIB
                ),
            )
        )


async def _burst(s: AsyncScheduler, calls: int, concurrency: int) -> list[float]:
    latencies: list[float] = []
    req = Request.cold(1, 1)
    left = [calls]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            start = time.perf_counter()
            await s.schedule(req)
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def _ping(s: AsyncScheduler, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        await s.client.ping()
        out.append(time.perf_counter() - start)
    return out


async def _measure(url: str, p: Params) -> list[dict[str, Any]]:
    clients = {
        acked: await AsyncScheduler.connect(
            url,
            cell="durability",
            policy=Policy(),
            overwrite_policy=True,
            durability=Durability(replicas=acked, timeout_ms=p.ack_timeout_ms),
        )
        for acked in (0, 1)
    }
    try:
        await _fleet(clients[0], p.nodes)
        samples: dict[tuple[int, int], list[float]] = {
            (a, c): [] for a in clients for c in p.concurrency
        }
        pings: list[float] = []
        per_round = max(1, p.calls // p.rounds)
        for r in range(p.rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for c in p.concurrency:
                for acked in order:
                    samples[(acked, c)] += await _burst(clients[acked], per_round, c)
            pings += await _ping(clients[0], 50)
        ping_p50 = percentile(pings, 50) * 1000
        rows = []
        for (acked, c), lat in sorted(samples.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            rows.append(
                {
                    "min_replicas_acked": acked,
                    "concurrency": c,
                    "calls": len(lat),
                    "p50_ms": round(percentile(lat, 50) * 1000, 3),
                    "p99_ms": round(percentile(lat, 99) * 1000, 3),
                    "ping_p50_ms": round(ping_p50, 3),
                    "per_s": round(len(lat) / sum(lat) * c) if lat else None,
                }
            )
        return rows
    finally:
        for s in clients.values():
            await s.close()


def run(p: Params) -> Result:
    with SentinelTopology(replicas=1, sentinels=0) as topo:
        rows = asyncio.run(_measure(topo.primary.url, p))
        version = str(topo.primary.client().info("server").get("redis_version", "?"))
    by = {(r["min_replicas_acked"], r["concurrency"]): r for r in rows}
    notes = [
        f"{p.nodes} nodes; a primary and one replica on this machine (loopback); "
        f"{p.rounds} alternating rounds; WAIT timeout {p.ack_timeout_ms} ms."
    ]
    for c in p.concurrency:
        zero, one = by.get((0, c)), by.get((1, c))
        if zero and one and zero["p50_ms"]:
            notes.append(
                f"concurrency {c}: p50 x{one['p50_ms'] / zero['p50_ms']:.2f}, "
                f"p99 x{one['p99_ms'] / zero['p99_ms']:.2f} with min_replicas_acked 1"
            )
    return Result(
        scenario="durability",
        columns=[
            "min_replicas_acked",
            "concurrency",
            "calls",
            "p50_ms",
            "p99_ms",
            "ping_p50_ms",
            "per_s",
        ],
        rows=rows,
        params=asdict(p),
        notes=notes,
        machine={
            "nproc": os.cpu_count(),
            "cpu_model": cpu_model(),
            "redis_version": version,
            "python": platform.python_version(),
            "redis": "started by the benchmark",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        },
    )
