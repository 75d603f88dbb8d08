"""Scenario ``latency``: what one Schedule costs as the fleet grows.

For each fleet size: a mixed fleet (16 to 96 CPU nodes) already running
sandboxes that fill 30-70 % of each node's CPU, set up with pipelined
heartbeats (each with its node's full roster), and pending reservations
(one per 50 nodes, at least 8), about as many all along.  Then a
steady stream, in blocks:

1. **schedule** (measured): ``block`` creations of mixed sizes, each timed
   client-side through the library (``Scheduler.schedule``), each followed by
   a timed Redis ``PING`` on the same connection, for a same-run baseline;
2. **gateway** (not measured): each placement is assigned, and one random
   running sandbox per placement is deleted, so the load stays put;
3. **heartbeat** (measured): the nodes that changed and are due report
   their full roster, releasing the reservations of the sandboxes listed,
   so that about the same number stay pending.

Redis CPU per call comes from ``INFO commandstats`` (``cmdstat_fcall``
usec / calls), read before and after every block and summed per kind of
block, so each figure is per call of that one script.  Statistics are reset
(``CONFIG RESETSTAT``) before each fleet size when the server is ours.

Re-run one size to compare before / after a change to the Lua selection:
``python -m bench latency --nodes 10000 --json before.json``.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from bench.fleet import SIZES, SimNode, mixed_fleet, send_heartbeats
from bench.runner import Result, Target, machine, percentile
from scheduler import NoNodesAvailable, Policy, Request, Scheduler
from scheduler.records import MIB

#: Nodes registered before the pending reservations are made (see run_size).
SEED_NODES = 200

COLUMNS = ["nodes", "ping_p50_us", "schedule_p50_us", "schedule_p99_us", "redis_us_per_schedule",
           "redis_us_per_heartbeat"]


@dataclass(frozen=True)
class Params:
    nodes: tuple[int, ...] = (100, 1000, 10000)
    seconds: float = 10.0
    min_schedules: int = 60
    max_schedules: int = 5000
    block: int = 10
    seed: int = 1

    @classmethod
    def quick(cls) -> Params:
        return cls(nodes=(20, 60), seconds=0.2, min_schedules=40, block=10)


class _Stream:
    """The fleet's truth and the bookkeeping that keeps its load steady."""

    def __init__(self, s: Scheduler, nodes: list[SimNode], rng: random.Random) -> None:
        self.s = s
        self.rng = rng
        self.by_id = {n.node_id: n for n in nodes}
        # sandboxes some roster has listed: candidates for deletion (O(1) random pick)
        self.listed: list[tuple[str, str]] = [(n.node_id, sb) for n in nodes for sb in n.sandboxes]
        self.unlisted: dict[str, list[str]] = {}  # node -> created, not yet in a roster
        self.fifo: deque[str] = deque()  # nodes of unlisted sandboxes, oldest first
        self.dirty: set[str] = set()
        self.seq = 0
        self.refused = 0

    def created(self, node_id: str, cpu: int, memory_mb: int, sandbox_id: str) -> None:
        self.by_id[node_id].create(sandbox_id, cpu, memory_mb * MIB)
        self.unlisted.setdefault(node_id, []).append(sandbox_id)
        self.fifo.append(node_id)

    def place(self, count: int) -> None:
        """Schedule and assign ``count`` creations (not measured)."""
        for _ in range(count):
            cpu, mem = self.rng.choice(SIZES)
            try:
                p = self.s.schedule(Request.cold(cpu, mem))
            except NoNodesAvailable:
                self.refused += 1
                continue
            self.seq += 1
            sb = f"new{self.seq}"
            self.s.assign(sb, p.node_id, p.endpoint, p.reservation_id)
            self.created(p.node_id, cpu, mem, sb)

    def delete_random(self, count: int) -> None:
        for _ in range(min(count, len(self.listed))):
            i = self.rng.randrange(len(self.listed))
            self.listed[i], self.listed[-1] = self.listed[-1], self.listed[i]
            node_id, sb = self.listed.pop()
            self.by_id[node_id].delete(sb)
            self.dirty.add(node_id)

    def due_heartbeats(self, keep_pending: int) -> list[SimNode]:
        """Nodes that report now: changed ones, and enough of those with the
        oldest unlisted sandboxes that about ``keep_pending`` stay unlisted."""
        pending = sum(len(v) for k, v in self.unlisted.items() if k not in self.dirty)
        while pending > keep_pending and self.fifo:
            node_id = self.fifo.popleft()
            if node_id in self.unlisted and node_id not in self.dirty:
                pending -= len(self.unlisted[node_id])
                self.dirty.add(node_id)
        due = [self.by_id[n] for n in sorted(self.dirty)]
        for n in due:
            for sb in self.unlisted.pop(n.node_id, []):
                if sb in n.sandboxes:
                    self.listed.append((n.node_id, sb))
        self.dirty.clear()
        return due


def run_size(target: Target, n: int, p: Params) -> tuple[dict[str, Any], dict[str, Any]]:
    rng = random.Random(p.seed * 1_000_003 + n)
    cell = target.new_cell("latency")
    policy = Policy(strategy="least_loaded", report_ttl_ms=3_600_000)
    s = Scheduler.connect(target.url, cell=cell, policy=policy)
    try:
        nodes = mixed_fleet(n, rng)
        stream = _Stream(s, nodes, rng)
        keep_pending = max(8, n // 50)
        t0 = time.perf_counter()
        # The pending reservations are made while only the first nodes are
        # registered, where a Schedule is cheap; then the rest of the fleet joins.
        send_heartbeats(s, [node.heartbeat() for node in nodes[:SEED_NODES]])
        stream.place(keep_pending)
        send_heartbeats(s, [node.heartbeat() for node in nodes[SEED_NODES:]])
        setup_s = time.perf_counter() - t0

        target.reset_stats()
        sched_ns: list[int] = []
        ping_ns: list[int] = []
        sched_calls = sched_usec = hb_calls = hb_usec = 0
        start = time.perf_counter()
        while len(sched_ns) < p.max_schedules and (
                len(sched_ns) < p.min_schedules or time.perf_counter() - start < p.seconds):
            # 1. schedule block
            placed: list[tuple[Any, int, int]] = []
            c0, u0 = target.script_stats()
            for _ in range(p.block):
                cpu, mem = rng.choice(SIZES)
                req = Request.cold(cpu, mem)
                t = time.perf_counter_ns()
                try:
                    placement = s.schedule(req)
                except NoNodesAvailable:
                    placement = None
                    stream.refused += 1
                sched_ns.append(time.perf_counter_ns() - t)
                t = time.perf_counter_ns()
                s.client.ping()
                ping_ns.append(time.perf_counter_ns() - t)
                if placement is not None:
                    placed.append((placement, cpu, mem))
            c1, u1 = target.script_stats()
            sched_calls += c1 - c0
            sched_usec += u1 - u0
            # 2. gateway: assignments and deletions
            for placement, cpu, mem in placed:
                stream.seq += 1
                sb = f"new{stream.seq}"
                s.assign(sb, placement.node_id, placement.endpoint, placement.reservation_id)
                stream.created(placement.node_id, cpu, mem, sb)
            stream.delete_random(len(placed))
            # 3. heartbeat block
            due = stream.due_heartbeats(keep_pending)
            c0, u0 = target.script_stats()
            hb_calls += send_heartbeats(s, [node.heartbeat() for node in due])
            c1, u1 = target.script_stats()
            hb_usec += u1 - u0
        elapsed = time.perf_counter() - start
        pending = s.stats().pending
    finally:
        s.close()
        target.drop_cell(cell)
    row = {
        "nodes": n,
        "ping_p50_us": round(percentile(ping_ns, 50) / 1000, 1),
        "schedule_p50_us": round(percentile(sched_ns, 50) / 1000, 1),
        "schedule_p99_us": round(percentile(sched_ns, 99) / 1000, 1),
        "redis_us_per_schedule": round(sched_usec / max(1, sched_calls), 1),
        "redis_us_per_heartbeat": round(hb_usec / max(1, hb_calls), 1),
    }
    detail = {"nodes": n, "schedules": len(sched_ns), "heartbeats": hb_calls,
              "refused": stream.refused, "pending_at_end": pending,
              "sandboxes": sum(len(x.sandboxes) for x in nodes),
              "setup_seconds": round(setup_s, 2), "measured_seconds": round(elapsed, 2)}
    return row, detail


def run(target: Target, p: Params | None = None) -> Result:
    p = p or Params()
    facts = machine(target)  # before the run: its load average is the one that matters
    rows, details = [], []
    for n in p.nodes:
        row, detail = run_size(target, n, p)
        rows.append(row)
        details.append(detail)
    params: dict[str, Any] = asdict(p)
    params["detail"] = details
    notes = [
        "mixed fleet (16/32/64/96 CPU, 4 GiB per CPU) 30-70 % allocated, full rosters; "
        "steady stream of 1-4 CPU creations with as many deletions; ~1 pending "
        "reservation per 50 nodes",
        "schedule_*: client-side, one Scheduler.schedule through the library; ping_p50_us: "
        "Redis PING on the same connection, same run; redis_us_*: INFO commandstats "
        "fcall usec per call (evalsha on a server without functions)",
    ]
    for row, d in zip(rows, details, strict=True):
        ratio = row["schedule_p50_us"] / row["ping_p50_us"] if row["ping_p50_us"] else 0.0
        hb_share = row["redis_us_per_heartbeat"] / max(1e-9, row["redis_us_per_schedule"])
        notes.append(f"{d['nodes']} nodes: schedule p50 = {ratio:,.1f} x PING p50; Redis CPU "
                     f"per heartbeat = {hb_share:.3f} x per schedule")
    for d in details:
        notes.append(f"{d['nodes']} nodes: {d['sandboxes']} sandboxes, setup "
                     f"{d['setup_seconds']} s, {d['schedules']} schedules and "
                     f"{d['heartbeats']} heartbeats in {d['measured_seconds']} s, "
                     f"{d['pending_at_end']} reservations pending at the end, "
                     f"{d['refused']} refused")
    return Result("latency", COLUMNS, rows, params=params, machine=facts, notes=notes)
