"""Scenario ``latency``: what one Schedule and one Heartbeat cost as the fleet grows.

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
3. **heartbeat** (measured): the nodes that changed and are due report,
   one RPC at a time as a replica sends them (``Scheduler.heartbeat``: a
   delta against the replica's previous write, with the roster when it
   changed), releasing the reservations of the sandboxes listed, so that
   about the same number stay pending;
4. **steady heartbeat** (measured): a few nodes that did not change report
   again (the common heartbeat of a healthy fleet: only the clock moves).

Then, on the same fleet, **busy** figures: bursts of creations (and of
steady heartbeats) sent pipelined, so Redis runs them back to back as it
does when many replicas share it; each burst's reservations are cancelled
afterwards.  A single client that waits for every answer leaves Redis idle
between calls and its caches cold, which on a small shared machine costs a
large share of every call; the busy figure is the cost per decision when
Redis is the bottleneck.  ``redis_us_floor_busy`` is a reference, not our
code: a function that makes only the writes every reservation must make
(reservation hash, expiry and per-node zsets, the node's pending load,
counters; no decision, no index), measured the same way in the same run.

Redis CPU per call comes from ``INFO commandstats`` (``cmdstat_fcall``
usec / calls; ``cmdstat_evalsha`` on a server without functions), read
before and after every block and summed per kind of block, so each figure is
per call of that one script.  Statistics are reset (``CONFIG RESETSTAT``)
before each fleet size when the server is ours.

Re-run one size to compare before / after a change to the Lua selection:
``python -m bench latency --nodes 10000 --json before.json``.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from bench.fleet import SIZES, mixed_fleet, run_pipelined, send_heartbeats
from bench.runner import Result, Target, machine, percentile
from scheduler import NoNodesAvailable, Policy, Request, Scheduler
from scheduler.domain.records import MIB
from scheduler.ops.simnode import SimNode
from scheduler.store.scripts import FUNCTION

#: Nodes registered before the pending reservations are made (see run_size).
SEED_NODES = 200

COLUMNS = [
    "nodes",
    "ping_p50_us",
    "schedule_p50_us",
    "schedule_p99_us",
    "redis_us_per_schedule",
    "redis_us_per_heartbeat",
    "redis_us_per_steady_heartbeat",
    "redis_us_per_schedule_busy",
    "redis_us_per_schedule_coalesced",
    "redis_us_per_heartbeat_busy",
    "redis_us_per_steady_heartbeat_busy",
    "redis_us_per_heartbeat_coalesced",
    "redis_us_per_steady_heartbeat_coalesced",
    "redis_us_floor_busy",
]

#: The writes every reservation must make, and nothing else (no decision, no
#: index): a reference for the busy figures, loaded as its own small library.
FLOOR_LIBRARY = """#!lua name=sched_bench_floor
redis.register_function('sched_bench_floor', function(keys, args)
  local base, rid = keys[1], args[1]
  local packed = redis.call('HGET', keys[2], 'packed')
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZRANGEBYSCORE', keys[5], '-inf', now, 'LIMIT', 0, 64)
  local rr = redis.call('INCR', base .. 'floor-rr')
  local node = args[2]
  local v = redis.call('HMGET', base .. 'node:' .. node, 'endpoint', 'pending_count')
  local expires = string.format('%d', now + 600000)
  redis.call('HSET', base .. 'floor-res:' .. rid, 'reservation_id', rid, 'node_id', node,
    'cpu', '2', 'memory_bytes', '4294967296', 'state', 'pending', 'seq', rr,
    'created_ms', string.format('%d', now), 'expires_ms', expires, 'pressure', '0.5')
  redis.call('ZADD', base .. 'floor-node-res:' .. node, rr, rid)
  redis.call('ZADD', base .. 'floor-expiry', expires, rid)
  redis.call('HSET', base .. 'floor-node:' .. node, 'pending_count', '1', 'pending_cpu', '2',
    'pending_memory_bytes', '4294967296')
  redis.call('HINCRBY', keys[4], 'floor_total', 1)
  return { node, v[1] or '', rid, '0.5', 2, 4294967296, 'READY', now }
end)
"""


def floor_burst(
    target: Target, s: Scheduler, count: int, tag: str, node_ids: list[str], rng: random.Random
) -> tuple[int, int]:
    """(calls, usec) of ``count`` pipelined FLOOR_LIBRARY calls (loaded by the
    caller), each on a random node of ``node_ids``; ``tag`` keeps their
    reservation ids apart from other bursts'."""
    keys = s.ops.schedule(Request.cold(1, 1)).keys
    pipe = s.client.pipeline(transaction=False)
    for i in range(count):
        pipe.execute_command(
            "FCALL", "sched_bench_floor", len(keys), *keys, f"{tag}-{i}", rng.choice(node_ids)
        )
    w = target.script_stats()
    pipe.execute()
    return target.script_stats_since(w)


#: Creations per pipelined burst, and bursts per fleet size, for the busy figures.
BURST = 200
BURSTS = 5
#: Schedules per batch call in the coalesced figure (what a replica sends when
#: that many queued while its previous call was in flight).
COALESCED = 16


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


def _busy(
    target: Target,
    s: Scheduler,
    stream: _Stream,
    rng: random.Random,
) -> dict[str, float | None]:
    """Redis CPU per call with Redis busy, in rounds so that every kind meets the
    same machine: each round sends a pipelined burst of creations (then
    cancelled), the same number coalesced into batch calls of COALESCED (per
    placement), of the reference writes, of steady heartbeats, and of changed
    heartbeats (nodes whose roster moved by 1 to 4 sandboxes, as deltas)."""
    sums: dict[str, list[int]] = {
        k: [0, 0]
        for k in (
            "schedule",
            "coalesced",
            "floor",
            "steady",
            "changed",
            "steady_coalesced",
            "changed_coalesced",
        )
    }

    def add(kind: str, calls: int, usec: int) -> None:
        sums[kind][0] += calls
        sums[kind][1] += usec

    floor_ok = s.scripts.mode == FUNCTION
    if floor_ok:
        s.client.execute_command("FUNCTION", "LOAD", "REPLACE", FLOOR_LIBRARY)
    ids = list(stream.by_id)
    clean = [
        n
        for n in stream.by_id.values()
        if n.node_id not in stream.dirty
        and n.node_id not in stream.unlisted
        and n.node_id in s.beats
    ]
    changing = list(clean)
    rng.shuffle(changing)
    for b in range(BURSTS):
        # creations, one call each
        calls = [
            s.ops.schedule(Request.cold(*rng.choice(SIZES)), reservation_id=f"busy{b}-{i}")
            for i in range(BURST)
        ]
        w = target.script_stats()
        replies = run_pipelined(s, calls, errors=True)
        add("schedule", *target.script_stats_since(w))
        run_pipelined(
            s,
            [
                s.ops.cancel(f"busy{b}-{i}")
                for i, r in enumerate(replies)
                if not isinstance(r, Exception)
            ],
            errors=True,
        )
        # the same, coalesced
        batches = [
            s.ops.schedule_batch(
                [
                    s.ops.schedule(
                        Request.cold(*rng.choice(SIZES)), reservation_id=f"co{b}-{j}-{i}"
                    )
                    for i in range(COALESCED)
                ]
            )
            for j in range(BURST // COALESCED)
        ]
        w = target.script_stats()
        replies = run_pipelined(s, batches, errors=True)
        _, usec = target.script_stats_since(w)
        done = [
            p
            for r in replies
            if not isinstance(r, Exception)
            for p in r
            if not isinstance(p, Exception)
        ]
        add("coalesced", len(done), usec)
        run_pipelined(s, [s.ops.cancel(p.reservation_id or "") for p in done], errors=True)
        # the reference writes
        if floor_ok:
            add("floor", *floor_burst(target, s, BURST, f"floor{b}", ids, rng))
        # steady heartbeats
        sample = rng.sample(clean, min(BURST, len(clean)))
        w = target.script_stats()
        run_pipelined(s, [s.ops.heartbeat(n.heartbeat(), s.beats) for n in sample], errors=True)
        add("steady", *target.script_stats_since(w))
        # the same, coalesced
        sample = rng.sample(clean, min(BURST, len(clean)))
        add("steady_coalesced", *_coalesced_beats(target, s, sample))
        # changed heartbeats, one call each, then the same nodes changed again, coalesced
        part = changing[b * len(changing) // BURSTS : (b + 1) * len(changing) // BURSTS][:BURST]
        for kind in ("changed", "changed_coalesced"):
            for k, node in enumerate(part):
                for j in range(rng.randint(1, 4)):
                    if j % 2 == 0 or not node.sandboxes:
                        node.create(f"chg{b}-{kind}-{k}-{j}", 1, 1024 * MIB)
                    else:
                        node.delete(next(iter(node.sandboxes)))
            if kind == "changed":
                w = target.script_stats()
                run_pipelined(
                    s, [s.ops.heartbeat(n.heartbeat(), s.beats) for n in part], errors=True
                )
                add(kind, *target.script_stats_since(w))
            else:
                add(kind, *_coalesced_beats(target, s, part))
    if floor_ok:
        s.client.execute_command("FUNCTION", "DELETE", "sched_bench_floor")
    return {k: (u / n if n else None) for k, (n, u) in sums.items()}


def _coalesced_beats(target: Target, s: Scheduler, nodes: list[SimNode]) -> tuple[int, int]:
    """(heartbeats, usec) of the nodes' heartbeats sent as batch calls of
    COALESCED (what a replica sends when that many queued)."""
    calls = [s.ops.heartbeat(n.heartbeat(), s.beats) for n in nodes]
    batches = [
        s.ops.heartbeat_batch(calls[i : i + COALESCED]) for i in range(0, len(calls), COALESCED)
    ]
    w = target.script_stats()
    replies = run_pipelined(s, batches, errors=True)
    _, usec = target.script_stats_since(w)
    results: list[Any] = []
    for i, r in zip(range(0, len(calls), COALESCED), replies, strict=True):
        results += [r] * len(calls[i : i + COALESCED]) if isinstance(r, Exception) else r
    for n, r in zip(nodes, results, strict=True):
        if isinstance(r, Exception):  # (a RESYNC: sent again in full, not measured)
            s.heartbeat(n.heartbeat())
    return len(calls), usec


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


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
        # The client remembers what it sent, so later heartbeats go as deltas.
        send_heartbeats(s, [node.heartbeat() for node in nodes[:SEED_NODES]], memo=s.beats)
        stream.place(keep_pending)
        send_heartbeats(s, [node.heartbeat() for node in nodes[SEED_NODES:]], memo=s.beats)
        setup_s = time.perf_counter() - t0

        target.reset_stats()
        sched_ns: list[int] = []
        ping_ns: list[int] = []
        sched_calls = sched_usec = hb_calls = hb_usec = steady_calls = steady_usec = 0
        start = time.perf_counter()
        while len(sched_ns) < p.max_schedules and (
            len(sched_ns) < p.min_schedules or time.perf_counter() - start < p.seconds
        ):
            # 1. schedule block
            placed: list[tuple[Any, int, int]] = []
            w = target.script_stats()
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
            k, u = target.script_stats_since(w)
            sched_calls, sched_usec = sched_calls + k, sched_usec + u
            # 2. gateway: assignments and deletions
            for placement, cpu, mem in placed:
                stream.seq += 1
                sb = f"new{stream.seq}"
                s.assign(sb, placement.node_id, placement.endpoint, placement.reservation_id)
                stream.created(placement.node_id, cpu, mem, sb)
            stream.delete_random(len(placed))
            # 3. heartbeat block: one RPC at a time, as a replica sends them
            due = stream.due_heartbeats(keep_pending)
            w = target.script_stats()
            for node in due:
                s.heartbeat(node.heartbeat())
            k, u = target.script_stats_since(w)
            hb_calls, hb_usec = hb_calls + k, hb_usec + u
            # 4. steady heartbeats: nodes that did not change report again
            clean = [stream.by_id[x] for x in rng.sample(list(stream.by_id), min(p.block, n))]
            clean = [x for x in clean if x.node_id not in stream.unlisted]
            w = target.script_stats()
            for node in clean:
                s.heartbeat(node.heartbeat())
            k, u = target.script_stats_since(w)
            steady_calls, steady_usec = steady_calls + k, steady_usec + u
        elapsed = time.perf_counter() - start
        busy = _busy(target, s, stream, rng)
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
        "redis_us_per_steady_heartbeat": round(steady_usec / max(1, steady_calls), 1),
        "redis_us_per_schedule_busy": _round(busy["schedule"]),
        "redis_us_per_schedule_coalesced": _round(busy["coalesced"]),
        "redis_us_per_heartbeat_busy": _round(busy["changed"]),
        "redis_us_per_steady_heartbeat_busy": _round(busy["steady"]),
        "redis_us_per_heartbeat_coalesced": _round(busy["changed_coalesced"]),
        "redis_us_per_steady_heartbeat_coalesced": _round(busy["steady_coalesced"]),
        "redis_us_floor_busy": _round(busy["floor"]),
    }
    detail = {
        "nodes": n,
        "schedules": len(sched_ns),
        "heartbeats": hb_calls,
        "steady_heartbeats": steady_calls,
        "refused": stream.refused,
        "pending_at_end": pending,
        "sandboxes": sum(len(x.sandboxes) for x in nodes),
        "setup_seconds": round(setup_s, 2),
        "measured_seconds": round(elapsed, 2),
    }
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
        "redis_us_per_heartbeat: nodes that changed, one Scheduler.heartbeat at a time (a "
        "delta with the roster); *_steady_heartbeat: nodes that did not change",
        f"*_busy: pipelined bursts of {BURST} (Redis busy, as under many replicas); "
        f"*_coalesced: the same bursts as batch calls of {COALESCED} Schedules (per "
        "placement); *_heartbeat_busy: nodes whose roster moved by 1 to 4, as deltas; "
        f"*_heartbeat_coalesced: the same heartbeats as batch calls of {COALESCED} "
        "(per heartbeat); "
        "redis_us_floor_busy: only the writes every reservation must make, same bursts "
        "(a reference, not our code)",
    ]
    for row, d in zip(rows, details, strict=True):
        ratio = row["schedule_p50_us"] / row["ping_p50_us"] if row["ping_p50_us"] else 0.0
        hb_share = row["redis_us_per_heartbeat"] / max(1e-9, row["redis_us_per_schedule"])
        line = (
            f"{d['nodes']} nodes: schedule p50 = {ratio:,.1f} x PING p50; Redis CPU "
            f"per heartbeat = {hb_share:.3f} x per schedule"
        )
        busy, floor = row["redis_us_per_schedule_busy"], row["redis_us_floor_busy"]
        if busy and floor:
            line += f"; busy schedule = {busy / floor:.2f} x the floor"
            for name, label in (
                ("redis_us_per_schedule_coalesced", "coalesced placement"),
                ("redis_us_per_heartbeat_busy", "busy changed heartbeat"),
                ("redis_us_per_heartbeat_coalesced", "coalesced changed heartbeat"),
            ):
                if row[name]:
                    line += f", {label} = {row[name] / floor:.2f} x"
        notes.append(line)
    for d in details:
        notes.append(
            f"{d['nodes']} nodes: {d['sandboxes']} sandboxes, setup "
            f"{d['setup_seconds']} s, {d['schedules']} schedules, "
            f"{d['heartbeats']} heartbeats and {d['steady_heartbeats']} steady ones "
            f"in {d['measured_seconds']} s, "
            f"{d['pending_at_end']} reservations pending at the end, "
            f"{d['refused']} refused"
        )
    return Result("latency", COLUMNS, rows, params=params, machine=facts, notes=notes)
