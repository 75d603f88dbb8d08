"""Scenario ``heartbeats``: what a Heartbeat RPC costs the replica and Redis,
with heartbeat coalescing off and on.

A replica's client (``AsyncScheduler``) takes heartbeats as its servicer
hands them over: the heartbeat, then the step of the cluster's CPU config
exchange (``cpu_config=True``), with ``concurrency`` in flight.  Each pass
sends one heartbeat from every node of the fleet: ``steady`` nodes report
the same numbers again, ``changed`` ones list a new sandbox and, past three,
drop their oldest (a delta of one or two roster changes).  Coalescing on,
what queues while a call is in flight goes as one ``heartbeat_batch`` call
(the heartbeats and the exchange steps alike); off, every step is a call of
its own.  ``client_us``: this process's CPU time (user + system) per
heartbeat, the replica's share without gRPC; ``redis_us``: ``INFO
commandstats`` usec of script calls per heartbeat; ``calls``: script calls
per heartbeat.  Each round measures off and on in turn (alternating which
goes first) on fleets of their own; medians over rounds.
"""

from __future__ import annotations

import asyncio
import resource
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any

from bench.runner import Result, Target, machine
from scheduler import MachineInfo, Policy
from scheduler.client.aio import AsyncScheduler
from scheduler.domain.records import Heartbeat
from scheduler.ops.simnode import SimNode

COLUMNS = [
    "heartbeats",
    "coalescing",
    "client_us",
    "redis_us",
    "calls",
    "batch_mean",
    "client_ratio",
    "redis_ratio",
    "rounds",
]
KINDS = ("steady", "changed")
#: what every node carries until its first heartbeat (the exchange needs one)
CPU_CONFIG = '{"kvm_capabilities": ["171", "56"]}'


@dataclass(frozen=True)
class Params:
    nodes: int = 300
    rounds: int = 3
    passes: int = 5
    concurrency: int = 32

    @classmethod
    def quick(cls) -> Params:
        return cls(nodes=20, rounds=1, passes=1, concurrency=8)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _measure(target: Target, kind: str, coalesce: bool, p: Params) -> dict[str, float]:
    cell = target.new_cell("heartbeats")
    a = await AsyncScheduler.connect(target.url, cell=cell, policy=Policy(report_ttl_ms=3_600_000))
    a.beat_coalescer.enabled = coalesce
    try:
        fleet = [SimNode(f"n{i}", 32, 128 << 30, cluster_id="c1") for i in range(p.nodes)]

        def beat(node: SimNode, first: bool = False) -> Heartbeat:
            b = node.heartbeat()
            if first:
                b.machine_info = MachineInfo(cpu_config_json=CPU_CONFIG)
            return b

        for node in fleet:  # (every node in, and the cluster's config delivered)
            await a.heartbeat(beat(node, first=True), cpu_config=True)
        for node in fleet:
            await a.heartbeat(beat(node), cpu_config=True)
        gate = asyncio.Semaphore(p.concurrency)
        made = 0

        async def one(node: SimNode) -> None:
            nonlocal made
            async with gate:
                if kind == "changed":
                    made += 1
                    node.create(f"hb-{made}", 1, 1 << 30)
                    if len(node.sandboxes) > 3:
                        node.delete(next(iter(node.sandboxes)))
                await a.heartbeat(beat(node), cpu_config=True)

        batches, batched = a.beat_coalescer.batches, a.beat_coalescer.batched
        before, cpu = target.script_stats(), _cpu_s()
        for _ in range(p.passes):
            await asyncio.gather(*(one(node) for node in fleet))
        cpu = _cpu_s() - cpu
        calls, usec = target.script_stats_since(before)
        batches, batched = a.beat_coalescer.batches - batches, a.beat_coalescer.batched - batched
    finally:
        await a.close()
        target.drop_cell(cell)
    n = p.passes * p.nodes
    return {
        "client_us": 1e6 * cpu / n,
        "redis_us": usec / n,
        "calls": calls / n,
        "batch_mean": batched / batches if batches else 1.0,
    }


def run(target: Target, p: Params | None = None) -> Result:
    p = p or Params()
    facts = machine(target)
    got: dict[tuple[str, bool], list[dict[str, float]]] = {
        (k, c): [] for k in KINDS for c in (False, True)
    }
    # (a first pass in this process pays for code paths run once: not measured)
    asyncio.run(_measure(target, "changed", True, replace(p, nodes=min(p.nodes, 20), passes=1)))
    for i in range(p.rounds):
        for kind in KINDS:
            order = [False, True] if i % 2 == 0 else [True, False]
            for coalesce in order:
                got[(kind, coalesce)].append(asyncio.run(_measure(target, kind, coalesce, p)))
    rows: list[dict[str, Any]] = []
    for kind in KINDS:
        for coalesce in (False, True):
            runs = got[(kind, coalesce)]
            off = got[(kind, False)]
            row: dict[str, Any] = {"heartbeats": kind, "coalescing": "on" if coalesce else "off"}
            for key in ("client_us", "redis_us", "calls", "batch_mean"):
                row[key] = round(
                    statistics.median(r[key] for r in runs),
                    2 if key in ("calls", "batch_mean") else 1,
                )
            # (each round's on against the same round's off)
            for key, name in (("client_us", "client_ratio"), ("redis_us", "redis_ratio")):
                row[name] = round(
                    statistics.median(
                        r[key] / o[key] for r, o in zip(runs, off, strict=True) if o[key]
                    ),
                    3,
                )
            row["rounds"] = len(runs)
            rows.append(row)
    notes = [
        f"{p.nodes} nodes of one cluster, {p.passes} passes a round, {p.concurrency} heartbeat "
        f"RPCs in flight through AsyncScheduler.heartbeat(cpu_config=True), as the servicer "
        f"calls it; medians over {p.rounds} rounds; *_ratio: on against off in the same round",
        "client_us: this process's CPU per heartbeat (the replica's part, gRPC aside); "
        "redis_us: INFO commandstats usec of FCALL/EVALSHA per heartbeat",
    ]
    return Result("heartbeats", COLUMNS, rows, params=asdict(p), machine=facts, notes=notes)
