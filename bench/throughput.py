"""Scenario ``throughput``: schedules per second as replica processes are added.

A 1,000-node mixed fleet (30-60 % allocated, set up with pipelined
heartbeats, fresh for every row), then every replica process schedules
1 CPU / 1 GiB creations back to back for a fixed time, all starting
together.  Each Schedule reserves; nothing is released during a row (the
fleet has room for far more than a row places).

- **library**: each replica process calls ``Scheduler.schedule`` itself.
- **grpc**: each replica is a ``schedctl serve`` process; one load process
  per replica calls its ``Schedule`` RPC (``new_cold_sandbox`` hint).

``redis_cpu_share`` is the CPU time redis-server used during the row divided
by the row's wall time (1.0 = one core busy all along).  Redis runs commands
on one thread, so a share near 1.0 means Redis is the bottleneck; on a
machine with few cores, the replica processes also compete with it.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from bench import grpc_path
from bench.fleet import mixed_fleet, send_heartbeats
from bench.runner import Result, Target, machine
from scheduler import Policy, Scheduler
from scheduler.testing.replicas import LibraryReplicas, Stream, StreamResult

COLUMNS = ["path", "replicas", "schedules_per_s", "redis_cpu_share", "redis_us_per_schedule",
           "note"]
PATHS = ("library", "grpc")


@dataclass(frozen=True)
class Params:
    replicas: tuple[int, ...] = (1, 2, 4, 8)
    nodes: int = 1000
    seconds: float = 4.0
    cpu: int = 1
    memory_mb: int = 1024
    paths: tuple[str, ...] = PATHS
    seed: int = 1

    @classmethod
    def quick(cls) -> Params:
        return cls(replicas=(1, 2), nodes=40, seconds=0.3)


POLICY = Policy(strategy="least_loaded", report_ttl_ms=3_600_000)


def _fleet(target: Target, p: Params, seed: int) -> tuple[str, Scheduler]:
    cell = target.new_cell("throughput")
    s = Scheduler.connect(target.url, cell=cell, policy=POLICY)
    nodes = mixed_fleet(p.nodes, random.Random(seed), load=(0.3, 0.6))
    send_heartbeats(s, [n.heartbeat() for n in nodes])
    return cell, s


def _row(path: str, replicas: int, schedules: int, wall: float, cpu: float,
         stats: tuple[int, int], note: str = "") -> dict[str, Any]:
    calls, usec = stats
    return {"path": path, "replicas": replicas,
            "schedules_per_s": round(schedules / wall, 1) if wall > 0 else 0.0,
            "redis_cpu_share": round(cpu / wall, 3) if wall > 0 else 0.0,
            "redis_us_per_schedule": round(usec / calls, 1) if calls else None, "note": note}



def run_library(target: Target, p: Params, pool: LibraryReplicas, replicas: int) -> dict[str, Any]:
    cell, s = _fleet(target, p, p.seed + replicas)
    try:
        cpu0, stats0 = target.cpu_seconds(), target.script_stats()
        results, wall = pool.run([Stream(cell, p.seconds, p.cpu, p.memory_mb)] * replicas)
        cpu, stats = target.cpu_seconds() - cpu0, target.script_stats_since(stats0)
    finally:
        s.close()
        target.drop_cell(cell)
    done = [r for r in results if isinstance(r, StreamResult)]
    refused = sum(r.refused for r in done)
    note = f"{refused} refused" if refused else ""
    return _row("library", replicas, sum(r.schedules for r in done), wall, cpu, stats, note)


def run_grpc(target: Target, p: Params, replicas: int) -> dict[str, Any]:
    cell, s = _fleet(target, p, p.seed + replicas)
    try:
        with grpc_path.Replicas(target.url, cell, POLICY, replicas) as servers:
            stats0 = target.script_stats()
            schedules, refused, wall, cpu = servers.load(p.seconds, p.cpu, p.memory_mb,
                                                         target.cpu_seconds)
            stats = target.script_stats_since(stats0)
    finally:
        s.close()
        target.drop_cell(cell)
    return _row("grpc", replicas, schedules, wall, cpu, stats,
                f"{refused} refused" if refused else "")


def run(target: Target, p: Params | None = None) -> Result:
    p = p or Params()
    facts = machine(target)  # before the run: its load average is the one that matters
    rows: list[dict[str, Any]] = []
    notes = [f"{p.nodes}-node mixed fleet, 30-60 % allocated; {p.cpu} CPU / {p.memory_mb} MB "
             f"creations back to back for {p.seconds} s per row; redis_cpu_share: redis-server "
             "CPU seconds per wall second; redis_us_per_schedule: INFO commandstats usec per "
             "script call during the row (only Schedule runs then)"]
    if "library" in p.paths:
        with LibraryReplicas(target.url, max(p.replicas)) as pool:
            for replicas in p.replicas:
                rows.append(run_library(target, p, pool, replicas))
    if "grpc" in p.paths:
        missing = grpc_path.unavailable()
        for replicas in p.replicas:
            if missing:
                rows.append({"path": "grpc", "replicas": replicas, "schedules_per_s": None,
                             "redis_cpu_share": None, "redis_us_per_schedule": None,
                             "note": "not available"})
            else:
                rows.append(run_grpc(target, p, replicas))
        if missing:
            notes.append(f"grpc rows not measured: {missing}")
    per_core = [f"{r['path']} {r['replicas']}: {r['schedules_per_s'] / r['redis_cpu_share']:,.1f}"
                for r in rows if r["schedules_per_s"] and r["redis_cpu_share"]]
    if per_core:
        # less sensitive to other work on the machine than the rate itself
        notes.append("schedules per Redis CPU-second (schedules_per_s / redis_cpu_share): "
                     + ", ".join(per_core))
    return Result("throughput", COLUMNS, rows, params=asdict(p), machine=facts,
                  notes=notes)
