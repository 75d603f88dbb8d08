"""Scenario ``scale``: what one cell of 1,000, 10,000 and 100,000 nodes costs
its Redis core, and the longest call it makes Redis serve (issue #31).

Per fleet size, on a fresh cell: a mixed fleet (``bench.fleet.mixed_fleet``,
16-96 CPU nodes already running sandboxes that fill 30-70 % of their CPU,
rosters of about 5-45 ids) registered with pipelined full heartbeats, and
pending reservations (one per 50 nodes).  Then ``rounds`` rounds, each:

1. **placements**: ``burst`` coalesced Schedules (batch calls of 16, what a
   replica sends), cancelled after (not measured);
2. **changed heartbeats**: the nodes those placements went to, once
   assigned, each listing its new sandbox and dropping one, in heartbeat
   batches of 16 (coalesced, as a replica sends them);
3. **steady heartbeats**: ``burst`` unchanged nodes, the same way;
4. **floor**: ``burst`` calls of the bare reservation writes
   (``bench.latency.FLOOR_LIBRARY``, the floor the other benches use);
5. **periodic work** of ``replicas`` replicas over 5 s of their monitor
   loops, driven by the bench (the calls a replica's monitor makes: each
   1 s tick a probe, a replica-roster refresh, a census step and a step of
   an index rebuild (none under way: two fields read); each 5 s
   the sweeps, the policy, the counters and a census step), not replica
   processes: their Redis cost is what is measured here.

All are sent through the library's own calls (``Scheduler.ops``), only
pipelined.  One 2-core machine cannot send a 100,000-node fleet's 20,000
heartbeats a second through replicas, so the cell's Redis core share at the
5 s cadence is computed from the per-call costs measured here:
``placements_per_s * placement + changed * heartbeat + (nodes / 5 - changed)
* steady + periodic``, where ``changed`` are the heartbeats a steady cell
changes, one per placement and one per sandbox that ends (twice the
placement rate); and, as an upper bound, with every heartbeat a changed
one.  Redis time per call is ``INFO commandstats`` usec of FCALL
(the script's own time), and ``*_cpu_us`` the redis-server process's CPU
over the same pipelined burst (``INFO cpu``: parsing and replies included),
the figure the core share uses.

Then the bounded calls that are not periodic: a census step, a ListNodes and
a ListObservedNodes page, ``sync_nodes []`` (start-up in
heartbeat-registration mode), a policy change (which takes the first step of
the index rebuild it starts), a batch of 16 placements while the index is
stale, and the rebuild's steps, taken until the index
is whole as a replica's monitor takes them (the longest step, and how many);
and, apart, one that still reads the fleet: the unpaged list the monitor
used to make every 5 s.  Last, the sync of a static list and a discovery's
of the fleet (its first MAX_STATIC_NODES nodes; the others leave), each a
pass of bounded steps (lua/sync_begin-5.lua): the longest step, how many,
all of them together.  The
longest single call comes from ``SLOWLOG`` (every call over 1 ms logged,
reset before the measured rounds): the longest of the periodic and hot-path
calls, and of the start-up and one-off ones, reported apart.

Last, CPU-config clusters of ``cpucfg_members`` (100 and 10,000) members,
10 % of them without a config: the Redis time of one heartbeat with its CPU
config step (heartbeat batches of 16 carrying both, each ingest right
after its heartbeat as a replica sends a Heartbeat RPC), every answer
checked OK; the clusters measured in turn, round after
round, and their ratio taken per round (the median of CPUCFG_ROUNDS).

The replica tier: per size, a replica as shipped (``schedctl serve``, uvloop,
coalescing on) and the bare grpc.aio server answering a constant, loaded in
turn by ``bench throughput``'s ``cpu`` path (REPLICA_IN_FLIGHT calls in flight
over 8 connections; steady Heartbeats of the fleet's nodes, each node in
turn, then Schedules) on a fleet of the size, at most REPLICA_FLEET_MAX nodes
(each round a fresh cell, every node's heartbeat sent before the load: the
figures of the largest fleet stand for larger ones).  The replica's CPU per
RPC, its ratio to the bare server's, and the replica process-cores the
fleet needs at 5 s: nodes / 5 Heartbeats and ``placements_per_s`` Schedules
a second at those costs.  Where gRPC or the CPU figures are not available,
the columns are empty and a note says why.
"""

from __future__ import annotations

import functools
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import msgspec

from bench import grpc_path, throughput
from bench.fleet import SIZES, mixed_fleet, run_pipelined, send_heartbeats
from bench.latency import FLOOR_LIBRARY, floor_burst
from bench.runner import Result, Target, machine
from bench.versus import _Run
from scheduler import Heartbeat, NodeSnapshot, Policy, Request, Scheduler
from scheduler.domain.catalog import FULL_SCAN_MAX
from scheduler.domain.errors import IndexBehind, NoNodesAvailable
from scheduler.domain.limits import MAX_STATIC_NODES
from scheduler.domain.records import MachineInfo
from scheduler.store.calls import (
    CENSUS_STEP,
    LIST_PAGE,
    OBSERVED_PAGE,
    REBUILD_STEP,
    Call,
    Followed,
    Plan,
    ReplicaEntry,
)
from scheduler.store.cpuconfig import CpuConfigOps
from scheduler.store.scripts import FUNCTION, library

COLUMNS = [
    "nodes",
    "placement_us",
    "placement_per_floor",
    "heartbeat_us",
    "heartbeat_per_floor",
    "steady_us",
    "floor_us",
    "placement_cpu_us",
    "heartbeat_cpu_us",
    "steady_cpu_us",
    "placement_commands",
    "heartbeat_commands",
    "steady_commands",
    "periodic_us_per_s",
    "core_share_at_5s",
    "core_share_idle_host",
    "core_share_all_changed",
    "longest_hot_ms",
    "longest_hot_call",
    "longest_oneoff_ms",
    "longest_oneoff_call",
    "replica_heartbeat_cpu_us",
    "replica_heartbeat_per_bare",
    "replica_schedule_cpu_us",
    "replica_schedule_per_bare",
    "replica_cores_at_5s",
]
#: Schedules (and heartbeats) per batch call, as a replica's coalescer sends them.
COALESCED = 16
#: The floor (bench.latency's bare reservation writes) on this machine when
#: idle (docs/performance.md, latency: 16.5-24.3 us): core_share_idle_host
#: projects the core share measured on a busy host onto it.
IDLE_FLOOR_US = 20.0
#: Redis time a call must pass to be logged (SLOWLOG), microseconds.
SLOW_US = 1000
#: Placements measured while nodes are stale, at most (_dark): enough for
#: the monitors' steps to take 99 % of 100,000 nodes out (1,547 steps).
DARK_CALLS = 4096
#: The largest fleet the replica tier is measured on (run_replica): every
#: round registers it anew and sends each node's heartbeat through the
#: replica before the load.
REPLICA_FLEET_MAX = 10_000
#: Calls in flight on the replica tier's load (bench throughput's cpu path).
REPLICA_IN_FLIGHT = 32


@dataclass(frozen=True)
class Params:
    nodes: tuple[int, ...] = (1_000, 10_000, 100_000)
    rounds: int = 3
    burst: int = 256
    replicas: int = 3
    placements_per_s: float = 200.0
    cpucfg_members: tuple[int, ...] = (100, 10_000)
    seed: int = 1
    #: the replica tier (run_replica): rounds per RPC, seconds of load each
    replica_rounds: int = 3
    replica_seconds: float = 4.0

    @classmethod
    def quick(cls) -> Params:
        return cls(
            nodes=(1_000, 10_000), rounds=2, burst=128, replica_rounds=1, replica_seconds=1.0
        )


def _cpu_burst(target: Target, send: Any) -> tuple[int, int, float, int]:
    """(calls, commandstats usec, redis-server CPU seconds, Redis commands the
    scripts ran) of one burst."""
    cpu, commands = target.cpu_seconds(), _commands(target)
    n, usec = send()
    return n, usec, target.cpu_seconds() - cpu, _commands(target) - commands


class _Measured(_Run):
    """versus' bursts, with the redis-server CPU and the commands of the
    measured pipeline alone (not of the placements and assignments that set a
    heartbeat burst up, nor of the cancels after a placement burst)."""

    last: tuple[float, int] = (0.0, 0)

    def _send(self, lib: Any, calls: Any) -> tuple[int, int, list[Any]]:
        cpu, commands = self.target.cpu_seconds(), _commands(self.target)
        out = super()._send(lib, calls)
        self.last = (self.target.cpu_seconds() - cpu, _commands(self.target) - commands)
        return out


def _measured(r: _Measured, burst: Any) -> tuple[int, int, float, int]:
    n, usec = burst(r.ours)
    return n, usec, r.last[0], r.last[1]


def _slowest(target: Target) -> tuple[float, str]:
    """The longest call SLOWLOG kept since its last reset: (ms, what)."""
    entries = target.client.slowlog_get(1024)
    if not entries:
        return 0.0, f"none over {SLOW_US / 1000:g} ms"
    worst = max(entries, key=lambda e: e["duration"])
    cmd = worst["command"]
    words = (cmd.decode() if isinstance(cmd, bytes) else str(cmd)).split()
    return worst["duration"] / 1000, " ".join(words[:2])


def _periodic(s: Scheduler, replicas: int) -> list[Call[Any]]:
    """The calls ``replicas`` monitors make in 5 s (5 ticks, one stats refresh)."""
    calls: list[Call[Any]] = []
    for r in range(replicas):
        entry = ReplicaEntry(
            replica_id=f"bench-{r}",
            version="bench",
            commit="-",
            host="bench",
            pid=r,
            grpc="-",
            started_ms=0,
        )
        for _ in range(5):
            calls += [
                s.ops.probe(write=False),
                s.ops.replica_seen(entry, 1.0),
                s.ops.census(CENSUS_STEP),
                # (a step of an index rebuild: none under way, two fields read)
                s.ops.index_rebuild("step", REBUILD_STEP),
            ]
        calls += [s.ops.sweep(), s.ops.policy(), s.ops.stats()]
    return calls


def _commands(target: Target) -> int:
    """Commands Redis has run (INFO commandstats), script calls themselves not
    counted: the calls the scripts made, and ours."""
    stats = target.client.info("commandstats")
    return sum(
        int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_fcall", "cmdstat_info")
    )


T = TypeVar("T")


def _timed(target: Target, run: Callable[[], T]) -> tuple[T, dict[str, float]]:
    """``run()``'s answer and what it cost Redis, in ms: its FCALL time
    (``ms``, wall clock as Redis counts it), the redis-server process's CPU
    (``cpu_ms``, its background threads' frees included, which a busy host
    does not inflate as much) and its main thread's (``main_ms``, the one
    every other call waits on)."""
    (cpu, main), before = target.cpu_times(), target.script_stats()
    answer = run()
    ms = target.script_stats_since(before)[1] / 1000
    cpu_after, main_after = target.cpu_times()
    return answer, {
        "ms": ms,
        "cpu_ms": (cpu_after - cpu) * 1000,
        "main_ms": (main_after - main) * 1000,
    }


def _rounded(cost: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in cost.items()}


def _one(target: Target, s: Scheduler, call: Call[Any], refused: bool = False) -> dict[str, float]:
    """One call's cost (:func:`_timed`).  ``refused``: the call is a
    Schedule no node can take, or one the index cannot decide on a fleet
    too large to scan (its refusal is what is measured)."""

    def run() -> None:
        try:
            s.run(call)
        except (NoNodesAvailable, IndexBehind):
            if not refused:
                raise
        else:
            if refused:
                raise RuntimeError("a Schedule meant to be refused was placed")

    return _rounded(_timed(target, run)[1])


def _dark(target: Target, nodes: int, seed: int) -> dict[str, dict[str, Any]]:
    """Nodes stop heartbeating at once, on a cell of their own (report TTL
    30 s, the clock frozen and moved): first 10 % of the fleet, then, once
    the index is clean again, all but 1 % of it.  After each, placements one
    by one, each followed by one index step as a replica's monitor takes
    them (back to back while one is under way: the stale nodes, 64 a step),
    until the index lists no stale node (at most DARK_CALLS): the longest
    placement's Redis time and CPU (ms), how many, their Redis time in all,
    how many were refused (nothing eligible, or BEHIND: the index catching
    up on a fleet too large to scan), the stale index entries at the start
    and left; and the longest index step and the steps' time in all."""
    rng = random.Random(seed * 7_919 + nodes)
    ttl = 30_000
    cell = target.new_cell("scale-dark")
    s = Scheduler.connect(target.url, cell=cell, policy=Policy(report_ttl_ms=ttl), timeout_s=120)
    out: dict[str, dict[str, Any]] = {}

    def measured(call: Callable[[], Any]) -> dict[str, float]:
        return _rounded(_timed(target, call)[1])

    try:
        s.advance_clock(0, "freeze")
        lit = mixed_fleet(nodes, rng)
        send_heartbeats(s, [n.heartbeat() for n in lit], batch=100)
        seen = s.keys.base + "idx-seen"
        for share in (0.1, 0.99):
            s.advance_clock(ttl * 2 // 3)
            keep = max(1, round(nodes * (1 - share)))
            lit = rng.sample(lit, keep)
            send_heartbeats(s, [n.heartbeat() for n in lit], batch=100)
            now = s.advance_clock(ttl // 2)

            def stale(now: int = now) -> int:
                return int(target.client.zcount(seen, "-inf", f"({now - ttl}"))

            rows: list[dict[str, float]] = []
            steps: list[dict[str, float]] = []
            refused = {"no nodes": 0, "behind": 0}

            def place(refused: dict[str, int] = refused) -> None:
                try:
                    s.schedule(Request.cold(*rng.choice(SIZES)))
                except NoNodesAvailable:
                    refused["no nodes"] += 1
                except IndexBehind:
                    refused["behind"] += 1

            listed = stale()
            while stale() and len(rows) < DARK_CALLS:
                rows.append(measured(place))
                steps.append(measured(lambda: s.index_rebuild("step", REBUILD_STEP)))
            none = {"ms": 0.0, "cpu_ms": 0.0, "main_ms": 0.0}
            longest = max(rows, key=lambda x: x["ms"], default=none)
            out[f"placements while {share:.0%} went dark (the longest)"] = longest | {
                "most_main_ms": max((x["main_ms"] for x in rows), default=0.0),
                "calls": len(rows),
                "all_ms": round(sum(x["ms"] for x in rows), 2),
                "refused": refused["no nodes"],
                "behind": refused["behind"],
                "stale_listed": listed,
                "stale_left": stale(),
            }
            step = max(steps, key=lambda x: x["ms"], default=none)
            out[f"index steps while {share:.0%} went dark (the longest)"] = step | {
                "most_main_ms": max((x["main_ms"] for x in steps), default=0.0),
                "calls": len(steps),
                "all_ms": round(sum(x["ms"] for x in steps), 2),
            }
        # round_robin and random with 1 % of the fleet lit, the index caught
        # up: their walk of 64 or 32 draws mostly miss, and least_loaded's
        # pick through the index decides (until then the full scan: the fleet)
        for _ in range(nodes):
            if not stale():
                break
            s.index_rebuild("step", REBUILD_STEP)
        for strategy in ("round_robin", "random"):
            out[f"{strategy} routing, 1 % lit (the longest of 8)"] = max(
                (_one(target, s, s.ops.schedule(Request.route(), strategy)) for _ in range(8)),
                key=lambda x: x["ms"],
            )
    finally:
        s.close()
        target.drop_cell(cell)
    return out


def _rebuild(s: Scheduler) -> Plan[None]:
    """The steps of the index rebuild under way, until it ends (a plan, for
    :func:`_plan_steps`)."""
    while True:
        step = yield s.ops.index_rebuild("step", REBUILD_STEP)
        if step.done:
            return None


def _plan_steps(target: Target, s: Scheduler, plan: Plan[Any]) -> dict[str, Any]:
    """A plan's calls (a node-list sync: its begin, chunks and walk steps)
    run one by one: the longest one's Redis time and CPU (ms; main_ms: the
    most main-thread CPU of one, the thread every other call waits on), how
    many calls, all of them together, and the plan's answer."""
    longest: dict[str, float] = {"ms": 0.0, "cpu_ms": 0.0, "main_ms": 0.0}
    steps, total_ms, total_cpu = 0, 0.0, 0.0
    answer: Any = None
    slowest = ""
    try:
        call = next(plan)
        while True:
            reply, cost = _timed(target, functools.partial(s.run, call))
            steps = steps + 1
            total_ms, total_cpu = total_ms + cost["ms"], total_cpu + cost["cpu_ms"]
            if cost["cpu_ms"] > longest["cpu_ms"]:
                slowest = f"{call.script} (call {steps})"
            longest = {k: max(v, cost[k]) for k, v in longest.items()}
            call = plan.send(reply)
    except StopIteration as done:
        answer = done.value
    return {
        "ms": round(longest["ms"], 2),
        "cpu_ms": round(longest["cpu_ms"], 2),
        "main_ms": round(longest["main_ms"], 2),
        "steps": steps,
        "all_steps_ms": round(total_ms, 1),
        "all_steps_cpu_ms": round(total_cpu, 1),
        "answer": list(answer) if isinstance(answer, tuple) else answer,
        "longest_cpu": slowest,
    }


def run_size(target: Target, nodes: int, p: Params) -> dict[str, Any]:
    rng = random.Random(p.seed * 1_000_003 + nodes)
    cell = target.new_cell("scale")
    policy = Policy(strategy="least_loaded", report_ttl_ms=3_600_000)
    # (a long timeout: a pipeline of full heartbeats, or the unpaged list at
    # 100,000 nodes, takes seconds on a busy host)
    s = Scheduler.connect(target.url, cell=cell, policy=policy, timeout_s=120)
    try:
        s.stats()  # (loads the library)
        if s.scripts.mode != FUNCTION:
            raise SystemExit("bench scale needs a Redis with functions (FUNCTION / FCALL)")
        s.client.execute_command("FUNCTION", "LOAD", "REPLACE", FLOOR_LIBRARY)
        s.sync_nodes([])  # (what a replica's first start does to the empty cell)
        fleet = mixed_fleet(nodes, rng)
        started = time.perf_counter()
        send_heartbeats(s, [n.heartbeat() for n in fleet], batch=100, memo=s.beats)
        setup_s = time.perf_counter() - started
        for _ in range(max(8, nodes // 50)):
            s.schedule(Request.cold(*rng.choice(SIZES)))
        r = _Measured(target, s, fleet, library(), p)  # type: ignore[arg-type]  # (.burst, .seed)
        ids = [n.node_id for n in fleet]
        target.client.config_set("slowlog-log-slower-than", SLOW_US)
        target.client.config_set("slowlog-max-len", 1024)
        target.client.slowlog_reset()
        got: dict[str, list[tuple[int, int, float, int]]] = {
            k: [] for k in ("placement", "heartbeat", "steady", "floor", "periodic")
        }
        for i in range(p.rounds):
            got["placement"].append(_measured(r, r.coalesced))
            got["heartbeat"].append(_measured(r, r.coalesced_heartbeat))
            got["steady"].append(_measured(r, r.coalesced_steady))
            got["floor"].append(
                _cpu_burst(target, lambda i=i: floor_burst(target, s, p.burst, f"f{i}", ids, rng))
            )

            def periodic() -> tuple[int, int]:
                before = target.script_stats()
                run_pipelined(s, _periodic(s, p.replicas))
                return target.script_stats_since(before)

            got["periodic"].append(_cpu_burst(target, periodic))
        hot_ms, hot_call = _slowest(target)
        target.client.slowlog_reset()
        oneoff = {
            "census step": _one(target, s, s.ops.census(CENSUS_STEP)),
            "ListNodes page": _one(target, s, s.ops.listed("", LIST_PAGE)),
            "ListObservedNodes page": _one(target, s, s.ops.observed("", "", "", OBSERVED_PAGE)),
            "sync_nodes [] (start-up)": _plan_steps(target, s, s._sync_nodes([])),
        }
        # a changed policy: the change takes the index rebuild's first step,
        # then steps of REBUILD_STEP nodes, as a replica's monitor takes them,
        # until the index is whole (lua/index_rebuild-5.lua)
        changed = Policy(strategy="least_loaded", report_ttl_ms=3_600_001)
        oneoff["policy change (its first rebuild step)"] = _one(
            target, s, s.ops.sync_policy(changed, overwrite=True)
        )
        # placements while the index is stale: a batch of 16 takes one step of
        # 32 nodes and checks what it picks among (lua/includes/schedule.lua)
        oneoff["coalesced placements (16) while stale"] = _one(
            target,
            s,
            s.ops.schedule_batch(
                [s.ops.schedule(Request.cold(*rng.choice(SIZES))) for _ in range(COALESCED)]
            ),
        )
        oneoff["index rebuild step (the longest)"] = _plan_steps(target, s, _rebuild(s))
        # round_robin and random: a bounded walk or sample of the node list
        # (SPREAD, lua/includes/schedule.lua), not the full scan they made
        for strategy in ("round_robin", "random"):
            oneoff[f"{strategy} placement (the longest of 8)"] = max(
                (
                    _one(target, s, s.ops.schedule(Request.cold(*rng.choice(SIZES)), strategy))
                    for _ in range(8)
                ),
                key=lambda x: x["ms"],
            )
        # least_loaded's refusal: the index finds nothing, the reasons of the
        # first REFUSAL_COUNTED nodes are counted (it was the full scan)
        oneoff["least_loaded refusal (no node fits)"] = _one(
            target, s, s.ops.schedule(Request.cold(1 << 20, 0)), refused=True
        )
        off_ms, off_call = _slowest(target)
        # (not a call of ours on a hot path: what round_robin and random made
        # every decision before, the dry run's full scan)
        oneoff["explain (the full scan round_robin made)"] = _one(
            target, s, s.ops.explain(Request.cold(1, 0), "round_robin")
        )
        # a cluster's P2P peer list: what a replica reads once a second for
        # every node of the cluster that asks (scheduler/server/peers.py; it
        # was each node's request, every 5 s), its member ids and then pages
        # of PEER_PAGE rows: the fleet's first REPLICA_FLEET_MAX nodes
        # advertise an endpoint, in one cluster
        send_heartbeats(
            s,
            [
                msgspec.structs.replace(
                    n.heartbeat(),
                    cluster_id="p2p",
                    p2p_backend="iroh",
                    p2p_address=f"{n.node_id}:4433",
                )
                for n in fleet[:REPLICA_FLEET_MAX]
            ],
            batch=100,
            memo=s.beats,
        )
        peer_read = _plan_steps(target, s, s._peers("p2p", "iroh", ""))
        peer_read["answer"] = len(peer_read["answer"])  # (the peers listed)
        oneoff["ListP2pPeers of a cluster (a replica's one read a second)"] = peer_read
        # an index of another layout, as a version that changes index_format
        # finds it: sync_policy starts its drop, and steps of REBUILD_STEP
        # nodes drop it and then build it anew (lua/includes/index_moves.lua
        # UPGRADE; it was one call of the fleet)
        s.client.hset(s.keys.policy, "index_format", "0")
        oneoff["sync_policy on another index layout (its first step)"] = _one(
            target, s, s.ops.sync_policy(changed, overwrite=True)
        )
        # a placement while the old index is dropped: the full scan on a fleet
        # of at most FULL_SCAN_MAX nodes, refused BEHIND on a larger one
        oneoff["placement while the old index is dropped"] = _one(
            target, s, s.ops.schedule(Request.cold(1, 0)), refused=nodes > FULL_SCAN_MAX
        )
        oneoff["index upgrade step (the longest)"] = _plan_steps(target, s, _rebuild(s))
        # many nodes stale at once (a rack gone dark; all but 1 % of the fleet,
        # as right after a settle): placements pick around what the sweeps
        # have not taken out yet, and read the fleet at most once for the lot
        # (lua/includes/schedule.lua index_chosen; it was every call's full scan)
        oneoff |= _dark(target, nodes, p.seed)
        # (not a call of ours any more: what the monitor made every 5 s before)
        oneoff["unpaged list (the old monitor's)"] = _one(
            target, s, Call("observed", s.keys.fixed(), ["", "", "1", "brief"], len)
        )
        # a static list's and a discovery's sync of the whole fleet (both at
        # most MAX_STATIC_NODES nodes; a bigger fleet: its first
        # MAX_STATIC_NODES, the others leave), in bounded steps (a pass:
        # lua/sync_begin-5.lua), each step measured; last, since a bigger
        # fleet leaves it smaller
        listed = [(n.node_id, n.endpoint) for n in fleet[:MAX_STATIC_NODES]]  # (as registered)
        oneoff["sync_nodes of the whole list"] = _plan_steps(target, s, s._sync_nodes(listed))
        oneoff["sync_discovered of the whole list"] = _plan_steps(
            target, s, s._sync_discovered([1, 1, 1], [(i, e, False) for i, e in listed])
        )
    finally:
        target.client.config_set("slowlog-log-slower-than", 10000)
        s.close()
        target.drop_cell(cell)

    def per(kind: str) -> float:
        return statistics.median(usec / max(1, n) for n, usec, _, _ in got[kind])

    def cpu_per(kind: str) -> float:
        return statistics.median(cpu * 1e6 / max(1, n) for n, _, cpu, _ in got[kind])

    def commands_per(kind: str) -> float:
        return statistics.median(c / max(1, n) for n, _, _, c in got[kind])

    def per_floor(kind: str) -> float:
        """The median of the rounds' ratios (a round's calls met the same host)."""
        return statistics.median(
            (usec / max(1, n)) / (f_usec / max(1, f_n))
            for (n, usec, _, _), (f_n, f_usec, _, _) in zip(got[kind], got["floor"], strict=True)
        )

    floor = per("floor")
    # periodic: one burst is 5 s of every replica's monitor
    periodic_us_per_s = statistics.median(usec for _, usec, _, _ in got["periodic"]) / 5
    periodic_cpu_per_s = statistics.median(cpu for _, _, cpu, _ in got["periodic"]) * 1e6 / 5
    # a steady cell: each placement changes its node's next heartbeat, and each
    # sandbox that ends another one; the other heartbeats are steady
    beats = nodes / 5
    changed = min(beats, 2 * p.placements_per_s)
    rest = p.placements_per_s * cpu_per("placement") + periodic_cpu_per_s
    share = (changed * cpu_per("heartbeat") + (beats - changed) * cpu_per("steady") + rest) / 1e6
    upper = (beats * cpu_per("heartbeat") + rest) / 1e6
    # the same on an idle host: scaled by the floor such a host measured
    idle = share * IDLE_FLOOR_US / floor
    idle_upper = upper * IDLE_FLOOR_US / floor
    return {
        "nodes": nodes,
        "placement_us": round(per("placement"), 1),
        "placement_per_floor": round(per_floor("placement"), 2),
        "heartbeat_us": round(per("heartbeat"), 1),
        "heartbeat_per_floor": round(per_floor("heartbeat"), 2),
        "steady_us": round(per("steady"), 1),
        "floor_us": round(floor, 1),
        "placement_cpu_us": round(cpu_per("placement"), 1),
        "heartbeat_cpu_us": round(cpu_per("heartbeat"), 1),
        "steady_cpu_us": round(cpu_per("steady"), 1),
        "placement_commands": round(commands_per("placement"), 1),
        "heartbeat_commands": round(commands_per("heartbeat"), 1),
        "steady_commands": round(commands_per("steady"), 1),
        # (one periodic burst is 5 s of every replica's monitor)
        "periodic_commands_per_s": round(statistics.median(c for *_, c in got["periodic"]) / 5),
        "periodic_us_per_s": round(periodic_us_per_s),
        "core_share_at_5s": round(share, 3),
        "core_share_idle_host": round(idle, 3),
        "core_share_all_changed": round(upper, 3),
        "core_share_all_changed_idle_host": round(idle_upper, 3),
        "longest_hot_ms": round(hot_ms, 2),
        "longest_hot_call": hot_call,
        "longest_oneoff_ms": round(off_ms, 2),
        "longest_oneoff_call": off_call,
        "oneoff": oneoff,
        "setup_s": round(setup_s, 1),
    }


# ---------------------------------------------------------------------------
# The replica tier
# ---------------------------------------------------------------------------
def run_replica(
    target: Target, nodes: int, p: Params, unavailable: str | None
) -> dict[str, float | None]:
    """A replica's CPU per steady Heartbeat and per Schedule RPC on a fleet of
    ``nodes`` (us), and its ratio to the bare server's in the same rounds;
    None where it cannot be measured here (``unavailable`` says why)."""
    out: dict[str, float | None] = {}
    for rpc in ("heartbeat", "schedule"):
        got: dict[str, Any] = {}
        if not unavailable:
            tp = throughput.Params(
                nodes=nodes,
                seconds=p.replica_seconds,
                rounds=p.replica_rounds,
                concurrency=REPLICA_IN_FLIGHT,
                channels=8,
                rpc=rpc,
                shipped=True,
                seed=p.seed,
            )
            bare, replica = throughput.run_cpu(target, tp, (throughput.BARE, throughput.SHIPPED))
            got = replica if bare["cpu_us_per_call"] else {}
        out[f"replica_{rpc}_cpu_us"] = got.get("cpu_us_per_call")
        out[f"replica_{rpc}_per_bare"] = got.get("ratio_to_bare")
    return out


def replica_cores(nodes: int, m: dict[str, float | None], p: Params) -> dict[str, Any]:
    """The replica tier's columns of a row: the measured costs, and the
    process-cores a fleet of ``nodes`` needs at 5 s heartbeats and
    ``placements_per_s`` placements at those costs."""
    beat, place = m["replica_heartbeat_cpu_us"], m["replica_schedule_cpu_us"]
    cores = None
    if beat is not None and place is not None:
        cores = round((nodes / 5 * beat + p.placements_per_s * place) / 1e6, 2)
    return dict(m) | {"replica_cores_at_5s": cores}


# ---------------------------------------------------------------------------
# A CPU-config cluster
# ---------------------------------------------------------------------------
CONFIG = '{"kvm_capabilities": ["a", "b"], "cpuid_modifiers": [], "msr_modifiers": []}'


def _member(cluster: str, i: int, config: str) -> Heartbeat:
    return Heartbeat(
        node_id=f"{cluster}-{i:05d}",
        service_instance_id="boot-1",
        cluster_id=cluster,
        endpoint=f"{cluster}-{i}.local:5000",
        machine_info=MachineInfo(cpu_config_json=config),
        snapshot=NodeSnapshot(status="READY", cpu_count=16, memory_total_bytes=64 << 30),
    )


#: Rounds of the CPU-config clusters' paired measurement (run_cpucfg): each
#: round measures every cluster once, in turn, so the host's load moves
#: both sides of a round's ratio alike.
CPUCFG_ROUNDS = 9


def run_cpucfg(target: Target, p: Params) -> list[dict[str, Any]]:
    """Redis time per heartbeat of a cluster of each of ``cpucfg_members``
    members (10 % without a config) with its CPU config step, as a replica
    sends both, coalesced; every cluster on a cell of its own in the same
    server, measured in turn, round after round: the per-round ratio of
    each to the first (the smallest) is the figure, its median over the
    rounds, as the host's load moves both alike."""
    rng = random.Random(p.seed)
    clusters: list[tuple[Scheduler, CpuConfigOps, int, int]] = []
    cells: list[str] = []
    for members in p.cpucfg_members:
        cells.append(target.new_cell(f"scale-cpucfg-{members}"))
        s = Scheduler.connect(
            target.url, cell=cells[-1], policy=Policy(report_ttl_ms=3_600_000), timeout_s=120
        )
        clusters.append((s, CpuConfigOps(s.keys), members, max(1, members // 10)))
    cluster = "c"

    def batch(
        s: Scheduler, cpu: CpuConfigOps, ids: Sequence[int], config_of: Any
    ) -> list[Call[Any]]:
        """Heartbeat batches of COALESCED members, each heartbeat with its
        CPU config ingest in the same trip, as a replica sends a Heartbeat RPC
        (the memo makes a member's later ones steady, as in the field)."""
        calls: list[Call[Any]] = []
        for i in ids:
            cfg = config_of(i)
            ingest = cpu.ingest(f"{cluster}-{i:05d}", cluster, cfg, False)
            calls.append(s.ops.heartbeat(_member(cluster, i, cfg), s.beats).then(ingest))
        return [
            s.ops.heartbeat_batch(calls[j : j + COALESCED]) for j in range(0, len(calls), COALESCED)
        ]

    def measure(s: Scheduler, cpu: CpuConfigOps, members: int, missing: int) -> dict[str, Any]:
        picked = sorted(rng.sample(range(missing, members), min(p.burst, members - missing)))
        batches = batch(s, cpu, picked, lambda i: "")
        before, commands = target.script_stats(), _commands(target)
        out = run_pipelined(s, batches, 64, errors=True)
        _, usec = target.script_stats_since(before)
        # (an ingest that failed leaves its heartbeat's answer without one)
        errors = sum(
            isinstance(one, Exception) or (isinstance(one, Followed) and one.then is None)
            for reply in out
            for one in (reply if isinstance(reply, list) else [reply])
        )
        return {
            "us": usec / len(picked),
            "commands": (_commands(target) - commands) / len(picked),
            "beats": len(picked),
            "errors": errors,
        }

    seen: list[list[dict[str, Any]]] = [[] for _ in clusters]
    try:
        for s, cpu, members, missing in clusters:
            s.stats()
            # the members without a config join first: the round waits from the start
            run_pipelined(
                s, batch(s, cpu, range(members), lambda i, m=missing: "" if i < m else CONFIG), 64
            )
            # then every member once without its config, as a runtime sends after
            # its first success: the measured ones are steady heartbeats on both
            # sides (a first one without the config changes the record: in
            # full, where the smaller cluster's later rounds were steady, so a
            # cluster of 10,000 read 1.4-1.8 times one of 100 for that alone)
            run_pipelined(s, batch(s, cpu, range(members), lambda i: ""), 64)
        for _ in range(CPUCFG_ROUNDS):
            for k, (s, cpu, members, missing) in enumerate(clusters):
                seen[k].append(measure(s, cpu, members, missing))
    finally:
        for (s, _, _, _), cell in zip(clusters, cells, strict=True):
            s.close()
            target.drop_cell(cell)
    out = []
    for k, (_, _, members, missing) in enumerate(clusters):
        rows = seen[k]
        # each round's ratio to the first cluster's, measured just before it
        ratios = [r["us"] / b["us"] for r, b in zip(rows, seen[0], strict=True)]
        commands = [r["commands"] / b["commands"] for r, b in zip(rows, seen[0], strict=True)]
        out.append(
            {
                "members": members,
                "without_config": missing,
                "us_per_heartbeat": round(statistics.median(r["us"] for r in rows), 1),
                "commands_per_heartbeat": round(statistics.median(r["commands"] for r in rows), 1),
                "ratio_to_smallest": round(statistics.median(ratios), 2),
                "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
                "commands_ratio": round(statistics.median(commands), 2),
                "heartbeats": sum(r["beats"] for r in rows),
                "errors": sum(r["errors"] for r in rows),
            }
        )
    return out


def run(target: Target, p: Params | None = None) -> Result:
    p = p or Params()
    facts = machine(target)
    rows = [run_size(target, n, p) for n in p.nodes]
    replica_note = grpc_path.unavailable() or grpc_path.cpu_unmeasurable()
    measured: dict[int, dict[str, float | None]] = {}
    for row in rows:
        fleet = min(row["nodes"], REPLICA_FLEET_MAX)
        if fleet not in measured:
            measured[fleet] = run_replica(target, fleet, p, replica_note)
        row |= replica_cores(row["nodes"], measured[fleet], p)
    cfg = run_cpucfg(target, p)
    params: dict[str, Any] = asdict(p)
    params["cpucfg"] = cfg
    notes = [
        f"one redis-server, {p.rounds} rounds per size of {p.burst}-call pipelined bursts "
        f"(medians); batch calls of {COALESCED} (coalesced placements and heartbeats)",
        "*_commands: Redis commands the scripts ran per call (INFO commandstats calls, a "
        "batch's shared ones spread over its calls), a measure no other load moves; "
        "*_us: INFO commandstats FCALL usec per call (the script's own time); *_cpu_us: "
        "redis-server CPU (INFO cpu) over the same burst, per call; *_per_floor: the median of "
        "the rounds' ratios to the bare reservation writes (floor_us) of the same round",
        f"core_share_at_5s = {p.placements_per_s:g} placements/s x placement_cpu_us + "
        f"min(nodes/5, {2 * p.placements_per_s:g})/s changed heartbeats (each placement "
        "changes its node's next one, each sandbox that ends another) x heartbeat_cpu_us + "
        "the other nodes/5 a second x steady_cpu_us + the periodic work of "
        f"{p.replicas} replicas' monitors (driven by the bench, not replica processes), in "
        "Redis cores; core_share_all_changed: every heartbeat a changed one (an upper "
        "bound); core_share_idle_host: the first scaled by "
        f"{IDLE_FLOOR_US:g} us / floor_us (the floor this machine measured idle), a "
        "projection",
        f"longest_*: SLOWLOG (calls over {SLOW_US / 1000:g} ms): hot = the rounds above "
        "(placements, heartbeats, periodic work), oneoff = "
        + ", ".join(k for k in rows[0]["oneoff"] if "old" not in k)
        + " (each row's oneoff gives each one's FCALL time and redis-server CPU, those of "
        "the unpaged list, the old monitor's call, and the step counts and totals of the "
        "rebuild and of the node-list syncs, whose figures are their longest step's; "
        "the dark rows: a share of the fleet stops heartbeating, then placements one by "
        "one, each followed by a monitor's index step, until the index lists no stale "
        f"node, at most {DARK_CALLS}: the longest placement and step, how many calls, "
        "their time in all, refusals (nothing eligible; behind: the index catching up "
        "on a fleet larger than the full scan reads), stale index entries at the start "
        "and left); "
        "SLOWLOG durations are wall-clock, so a busy host inflates them",
        "cpucfg (params): a cluster's heartbeats with their CPU config step, 10 % of the "
        "members without a config: "
        + "; ".join(
            f"{c['members']} members {c['us_per_heartbeat']} us a heartbeat "
            f"(x{c['ratio_to_smallest']}, rounds {c['ratio_range'][0]}-{c['ratio_range'][1]}), "
            f"{c['commands_per_heartbeat']} Redis commands "
            f"(x{c['commands_ratio']}), {c['errors']} errors in {c['heartbeats']}"
            for c in cfg
        ),
        f"replica_*: a replica as shipped (uvloop, coalescing on) against the bare grpc.aio "
        f"server answering a constant, {REPLICA_IN_FLIGHT} calls in flight over 8 connections "
        f"(bench throughput's cpu path), steady Heartbeats then Schedules, {p.replica_rounds} "
        f"round(s) of {p.replica_seconds:g} s each, medians; on a fleet of the row's size, at "
        f"most {REPLICA_FLEET_MAX:,} nodes (a larger row takes those figures); "
        "replica_cores_at_5s = (nodes/5 Heartbeats + "
        f"{p.placements_per_s:g} Schedules a second) x their CPU per RPC, in process-cores"
        + (f"; not measured: {replica_note}" if replica_note else ""),
    ]
    return Result("scale", COLUMNS, rows, params, facts, notes)
