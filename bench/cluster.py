"""Scenario ``cluster``: N cells on a 3-primary Redis Cluster against the same
N cells on one Redis, in one run.

Each cell is one hash slot, so one cell is served by one Redis core however
big the cluster is; a cluster adds cores for *more cells*.  Per row: N cells
(names picked so the cluster spreads them evenly over its primaries), each
with a mixed fleet heartbeated in, then one replica process per cell
scheduling creations back to back (0 CPU / 1 MiB: no row fills its fleet, so
no refusal's full scan skews it), all starting together.
Reported: aggregate placements per second and each Redis process's CPU share
(CPU seconds per wall second) during the row; the note gives the ratio
cluster / single for the same N.  Every server and replica process runs on
this machine, so the ratio is bounded by its cores: read it with the
``nproc`` of the machine line.
"""

from __future__ import annotations

import os
import platform
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.fleet import mixed_fleet, send_heartbeats
from bench.runner import Result, cpu_model
from scheduler import Policy, Scheduler
from scheduler.testing.redis_server import ClusterTopology, RedisServer
from scheduler.testing.replicas import LibraryReplicas, Stream, StreamResult

COLUMNS = ["redis", "cells", "schedules_per_s", "redis_cpu_shares", "per_cell_per_s", "refused"]
POLICY = Policy(strategy="least_loaded", report_ttl_ms=3_600_000)


@dataclass(frozen=True)
class Params:
    cells: tuple[int, ...] = (3, 6)
    nodes: int = 200
    seconds: float = 4.0
    seed: int = 1

    @classmethod
    def quick(cls) -> Params:
        return cls(cells=(3,), nodes=20, seconds=0.5)


def _cpu(servers: list[RedisServer]) -> list[float]:
    out = []
    for s in servers:
        info = s.client().info("cpu")
        out.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
    return out


def _cell_names(n: int, owner: Any) -> list[str]:
    """``n`` fresh cell names (a row of its own), round-robin over the
    primaries ``owner(name)`` names."""
    by_owner: dict[int, list[str]] = {}
    i = 0
    while sum(len(v) for v in by_owner.values()) < 3 * n and i < 100_000:
        name = f"bench{n}-{i}"
        by_owner.setdefault(owner(name), []).append(name)
        i += 1
    groups = list(by_owner.values())
    out: list[str] = []
    k = 0
    while len(out) < n:
        group = groups[k % len(groups)]
        if group:
            out.append(group.pop(0))
        k += 1
    return out


def _row(
    label: str, url: str, servers: list[RedisServer], cells: list[str], p: Params
) -> dict[str, Any]:
    rng = random.Random(p.seed)
    opened = []
    try:
        for cell in cells:
            s = Scheduler.connect(url, cell=cell, policy=POLICY, overwrite_policy=True)
            opened.append(s)
            send_heartbeats(s, [n.heartbeat() for n in mixed_fleet(p.nodes, rng, (0.3, 0.6))])
        with LibraryReplicas(url, len(cells)) as pool:
            cpu0 = _cpu(servers)
            # (0 CPU / 1 MiB: the fleet never fills up, so no refusal's full scan
            # skews a row; the decision path is the same)
            results, wall = pool.run([Stream(cell, p.seconds, 0, 1) for cell in cells])
            cpu = [b - a for a, b in zip(cpu0, _cpu(servers), strict=True)]
    finally:
        for s in opened:
            s.close()
    done = [r for r in results if isinstance(r, StreamResult)]
    total = sum(r.schedules for r in done)
    return {
        "redis": label,
        "cells": len(cells),
        "schedules_per_s": round(total / wall, 1) if wall else 0.0,
        "redis_cpu_shares": " / ".join(f"{c / wall:.2f}" for c in cpu) if wall else "",
        "per_cell_per_s": round(total / wall / len(cells), 1) if wall else 0.0,
        "refused": sum(r.refused for r in done),
    }


def run(p: Params) -> Result:
    rows: list[dict[str, Any]] = []
    notes = [
        f"{p.nodes}-node mixed fleet per cell; one replica process per cell scheduling "
        f"0 CPU / 1 MiB back to back for {p.seconds} s; redis_cpu_shares: CPU seconds "
        "per wall second of each redis-server (the cluster's three primaries in order)."
    ]
    with ClusterTopology(primaries=3, replicas=0) as topo, RedisServer() as single:
        version = str(single.client().info("server").get("redis_version", "?"))
        primaries = topo.primaries()

        def owner(name: str) -> int:
            return topo.slot_owner(topo.keyslot(f"sched:{{{name}}}:policy")).port

        for n in p.cells:
            names = _cell_names(n, owner)
            # alternate which goes first, so neither always meets a warmer machine
            pair = [("cluster", topo.url, primaries), ("single", single.url, [single])]
            if n % 2:
                pair.reverse()
            got = {label: _row(label, url, servers, names, p) for label, url, servers in pair}
            rows += [got["single"], got["cluster"]]
            one, many = got["single"]["schedules_per_s"], got["cluster"]["schedules_per_s"]
            if one:
                notes.append(f"{n} cells: cluster / single = {many / one:.2f}")
    return Result(
        scenario="cluster",
        columns=COLUMNS,
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
