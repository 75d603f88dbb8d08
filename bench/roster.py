"""Scenario ``roster``: what one heartbeat with a long roster costs Redis.

A cell whose policy allows rosters of ``max_roster_ids`` (100,000 here) and
one node: its heartbeat lists N new sandboxes (every one a new binding),
then one that replaces half of them, then one that lists none (every
binding goes).  Each is one script call, so Redis runs nothing else
meanwhile: ``redis_ms`` is that call's time inside Redis (``INFO
commandstats``), ``max_ping_wait_ms`` the longest a ``PING`` sent in a loop
from another connection waited during the call, ``keys_after`` the cell's
key count after it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import redis

from bench.runner import Result, Target, machine
from scheduler import Heartbeat, NodeSnapshot, Policy, Scheduler

COLUMNS = ["roster_ids", "heartbeat", "redis_ms", "wall_ms", "max_ping_wait_ms", "keys_after"]


@dataclass(frozen=True)
class Params:
    sizes: tuple[int, ...] = (4096, 100_000)
    max_roster_ids: int = 100_000

    @classmethod
    def quick(cls) -> Params:
        return cls(sizes=(50, 500), max_roster_ids=1000)


class Pinger:
    """PINGs in a loop on its own connection; the longest wait while running."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.stop = threading.Event()
        self.longest = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            t = time.perf_counter()
            self.client.ping()
            self.longest = max(self.longest, time.perf_counter() - t)

    def __enter__(self) -> Pinger:
        self.client.ping()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.client.close()


def _heartbeat(ids: list[str]) -> Heartbeat:
    return Heartbeat(
        node_id="n1",
        service_instance_id="boot-1",
        endpoint="n1.bench:8000",
        snapshot=NodeSnapshot(cpu_count=64, memory_total_bytes=256 << 30, sandbox_count=len(ids)),
        sandbox_ids=ids,
    )


def run(target: Target, p: Params) -> Result:
    rows = []
    for n in p.sizes:
        cell = target.new_cell("roster")
        s = Scheduler.connect(target.url, cell=cell, policy=Policy(max_roster_ids=p.max_roster_ids))
        try:
            ids = [f"sandbox-{i:08d}-0123456789abcdef" for i in range(n)]
            half = ids[n // 2 :] + [f"sandbox-{i:08d}-fedcba9876543210" for i in range(n // 2)]
            for label, roster in (("all new", ids), ("half replaced", half), ("all dropped", [])):
                call = s.ops.heartbeat(_heartbeat(roster))  # built before the clock starts
                before = target.script_stats()
                with Pinger(target.url) as pinger:
                    t = time.perf_counter()
                    s.run(call)
                    wall = time.perf_counter() - t
                _, usec = target.script_stats_since(before)
                keys = sum(
                    1 for _ in target.client.scan_iter(match=f"{s.keys.base}*", count=10_000)
                )
                rows.append(
                    {
                        "roster_ids": n,
                        "heartbeat": label,
                        "redis_ms": round(usec / 1000, 1),
                        "wall_ms": round(wall * 1000, 1),
                        "max_ping_wait_ms": round(pinger.longest * 1000, 1),
                        "keys_after": keys,
                    }
                )
        finally:
            s.close()
            target.drop_cell(cell)
    return Result(
        "roster",
        COLUMNS,
        rows,
        params={"sizes": list(p.sizes), "max_roster_ids": p.max_roster_ids},
        machine=machine(target),
    )
