"""Many nodes gone stale at once (a rack gone dark; a settle, after which
every node must heartbeat again): the placement index still lists them
until a sweep takes them out, 32 a placement call and 64 a monitor's step.
A least_loaded decision used to hand every call of that window to the full
scan, which reads the fleet (about 167 ms of Redis CPU a placement at
10,000 nodes, while 1,000 went dark).  Now it picks from the index around
them: a node it picks is checked against its record, a stale one leaves
the index with its bucket's stale members, and the pick runs again, a
bounded number of times a call; when every pick meets a stale node, the
full scan decides on a fleet of at most FULL_SCAN_MAX nodes (it takes
every stale node it reads out, so the fleet is read once for the lot), and
on a larger one the decision is refused BEHIND while the monitors' steps
catch up.  Here, against a real Redis (commands counted by Redis itself):
every placement of that window reads a bounded number of records, none
goes to a dark node, each has the least pressure of the fleet, and once
the sweeps are done the decisions are the model's again; the replicas'
periodic sweep takes stale nodes out too, with no placement at all; and
with locality on, a warm node gone dark but still listed never wins.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from scheduler import IndexBehind, Limits, Policy, Request, Scheduler
from scheduler.domain.catalog import FULL_SCAN_MAX
from scheduler.domain.errors import NoNodesAvailable
from scheduler.domain.policy import Locality
from scheduler.domain.records import LocalityRequirement as LR
from tests.helpers import GIB, hb
from tests.test_index import index_is_consistent
from tests.test_index_rebuild import _hmgets
from tests.test_locality import beat
from tests.test_model_equivalence import check_stream

pytestmark = pytest.mark.real_only

FLEET = 600
#: Nodes that stop heartbeating: more than five sweeps take (STALE_BATCH 64).
DARK = frozenset(i for i in range(FLEET) if i % 5 < 3)
STALE_BATCH = 64
#: Stale nodes a placement call's sweep takes (PLACEMENT_STALE_BATCH).
PLACEMENT_BATCH = 32
#: Picks a decision makes around stale entries (UNSWEPT_PICK_TRIES).
TRIES = 8
#: ...and the decisions of one call together (UNSWEPT_CALL_TRIES).
CALL_TRIES = 16
#: Records a call reads of the buckets its picks met stale nodes in (STALE_BUCKET_READS).
STALE_BUCKET_READS = 32
REPORT_TTL_MS = 30_000
POLICY = Policy(report_ttl_ms=REPORT_TTL_MS, limits=Limits(max_sandbox_count=6))


def test_the_bounds_are_the_scripts_own() -> None:
    """The bounds these tests count with are the ones the scripts hold."""
    lua = Path(__file__).parent.parent / "lua" / "includes"
    moves, schedule = (lua / "index_moves.lua").read_text(), (lua / "schedule.lua").read_text()
    for text, name, value in (
        (moves, "STALE_BATCH", STALE_BATCH),
        (moves, "PLACEMENT_STALE_BATCH", PLACEMENT_BATCH),
        (moves, "STALE_BUCKET_READS", STALE_BUCKET_READS),
        (schedule, "UNSWEPT_PICK_TRIES", TRIES),
        (schedule, "UNSWEPT_CALL_TRIES", CALL_TRIES),
    ):
        assert re.search(rf"^local {name} = {value}\b", text, re.M), name


def _beat(s: Scheduler, which: range | list[int]) -> None:
    pipe = s.client.pipeline(transaction=False)
    for i in which:
        call = s.ops.heartbeat(
            hb(f"d{i:04d}", cpu=16 if i % 2 else 32, allocated_cpu=i % 9, sandbox_count=i % 5)
        )
        s.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
    pipe.execute()


def _dark_cell(
    redis_client: Any, name: str, dark: frozenset[int] = DARK, fleet: int = FLEET
) -> tuple[Scheduler, int]:
    """A fleet of which ``dark`` (three nodes in five, of both shapes) went
    silent a report TTL ago; the others heartbeat on."""
    s = Scheduler(redis_client, cell=name)
    s.sync_policy(POLICY, overwrite=True)
    s.advance_clock(0, "freeze")
    _beat(s, range(fleet))
    s.advance_clock(REPORT_TTL_MS * 2 // 3)
    _beat(s, [i for i in range(fleet) if i not in dark])
    now = s.advance_clock(REPORT_TTL_MS // 2)
    return s, now


def _listed_stale(s: Scheduler, now: int) -> int:
    """Index entries whose node's last heartbeat is older than the TTL."""
    return int(s.client.zcount(s.keys.base + "idx-seen", "-inf", f"({now - REPORT_TTL_MS}"))


def test_placements_pick_around_stale_nodes_instead_of_reading_the_fleet(
    redis_client: Any,
) -> None:
    s, now = _dark_cell(redis_client, "dark")
    dark = {f"d{i:04d}" for i in DARK}
    assert _listed_stale(s, now) == len(dark) > 2 * STALE_BATCH
    placed_behind = 0
    while _listed_stale(s, now):
        req = Request.cold(1, 512)
        ex = s.explain(req)  # (a dry run: the full scan, nothing swept)
        best = min(v.pressure for v in ex.verdicts if v.reason is None)
        before = _hmgets(s)
        placed = s.schedule(req)
        # the sweep's records, the picks' and their checks: never the fleet
        # (the full scan reads every one of the 600)
        assert _hmgets(s) - before <= PLACEMENT_BATCH + STALE_BUCKET_READS + 2 * TRIES + 8
        assert placed.node_id not in dark
        assert placed.pressure == best
        placed_behind += 1
        assert placed_behind < FLEET
    assert placed_behind >= len(dark) // (PLACEMENT_BATCH + STALE_BUCKET_READS + TRIES)
    # the sweeps done: the model's decisions, turn for turn
    check_stream(s, POLICY, [Request.cold(1, 512)] * 4)
    index_is_consistent(s, POLICY, now)


def test_a_batch_behind_the_sweeps_sweeps_once_and_reads_no_fleet(redis_client: Any) -> None:
    """The coalesced path: one call of 16 decisions sweeps once (32 nodes),
    not once a decision, and its decisions share one allowance of picks
    that meet a stale node (16), so the call stays bounded however many it
    decides: each decision places on a live node at the least pressure, or,
    the call's picks spent, is refused BEHIND with nothing reserved; the
    next calls go on from what it took out."""
    s, now = _dark_cell(redis_client, "dark-batch")
    dark = {f"d{i:04d}" for i in DARK}
    reqs = [Request.cold(*size) for size in [(1, 512), (2, 1024)] * 8]
    placed_all = False
    for _ in range(4):
        best = {  # (a dry run: the full scan, nothing swept)
            req: min(v.pressure for v in s.explain(req).verdicts if v.reason is None)
            for req in set(reqs)
        }
        before, left, pending = _hmgets(s), _listed_stale(s, now), s.stats().pending
        placed = s.run(s.ops.schedule_batch([s.ops.schedule(req) for req in reqs]))
        ok = [p for p in placed if not isinstance(p, Exception)]
        assert all(isinstance(p, IndexBehind) for p in placed if isinstance(p, Exception)), placed
        assert all(p.node_id not in dark for p in ok), placed
        # (the first of a size at its best; the later ones see the earlier)
        for req in set(reqs):
            first = next((p for q, p in zip(reqs, placed, strict=True) if q == req), None)
            if first is not None and not isinstance(first, Exception):
                assert first.pressure == best[req]
        assert s.stats().pending == pending + len(ok)
        # the sweep's records, each decision's pick, the call's stale picks
        # and their checks, their buckets' stale members
        most = PLACEMENT_BATCH + STALE_BUCKET_READS + 2 * len(reqs) + 2 * CALL_TRIES + 8
        assert _hmgets(s) - before <= most
        assert left - _listed_stale(s, now) <= PLACEMENT_BATCH + STALE_BUCKET_READS + CALL_TRIES
        if len(ok) == len(reqs):
            placed_all = True
            break
    assert placed_all
    assert _listed_stale(s, now) > 0  # (still behind: the next calls go on)


def test_the_periodic_sweep_takes_stale_nodes_out_with_no_placement(redis_client: Any) -> None:
    s, now = _dark_cell(redis_client, "dark-idle")
    left = _listed_stale(s, now)
    sweeps = 0
    while left:
        s.sweep()
        sweeps += 1
        now_left = _listed_stale(s, now)
        assert left - now_left == min(left, STALE_BATCH)
        left = now_left
    assert sweeps == -(-len(DARK) // STALE_BATCH)
    index_is_consistent(s, POLICY, now)


def test_a_fleet_gone_dark_is_refused_behind_until_the_steps_catch_up(
    redis_client: Any,
) -> None:
    """Every node silent (a settle's first moments look the same: every node
    must heartbeat again): the picks meet only stale nodes.  On a fleet
    larger than the full scan reads (FULL_SCAN_MAX) the decision is refused
    BEHIND, retryable, naming the stale nodes still listed, reading a
    bounded number of records and reserving nothing; the monitors' index
    steps take them out, 64 a step; then the refusals count the reasons as
    ever, and a node that heartbeats again is placed on at once."""
    assert FLEET > FULL_SCAN_MAX
    s, now = _dark_cell(redis_client, "all-dark", frozenset(range(FLEET)))
    before = _hmgets(s)
    with pytest.raises(
        IndexBehind,
        match=rf"no decision without reading all {FLEET} nodes \(a Schedule reads at most "
        rf"{FULL_SCAN_MAX}\): nodes whose heartbeat went stale are still listed",
    ):
        s.schedule(Request.cold(1, 512))
    # the sweep's records, the picks', their checks and their buckets' stale
    # members: never the fleet
    assert _hmgets(s) - before <= PLACEMENT_BATCH + STALE_BUCKET_READS + 2 * TRIES + 8
    assert s.stats().pending == 0
    left = _listed_stale(s, now)
    assert 0 < left < FLEET
    steps = 0
    while not s.index_rebuild().done:
        steps += 1
    assert steps == left // STALE_BATCH
    assert _listed_stale(s, now) == 0
    for _ in range(3):
        before = _hmgets(s)
        with pytest.raises(NoNodesAvailable, match=f"0/{FLEET} nodes available.*stale heartbeat"):
            s.schedule(Request.cold(1, 512))
        assert _hmgets(s) - before <= 64 + 8  # (the first 64 by id, counted)
    # a node that heartbeats again is placed on at once
    _beat(s, [7])
    assert s.schedule(Request.cold(1, 512)).node_id == "d0007"
    index_is_consistent(s, POLICY, now)


def test_a_small_fleet_gone_dark_is_read_once_not_once_a_call(redis_client: Any) -> None:
    """The same on a fleet the full scan may read: it decides, and takes
    every stale node it reads out of the index, so the fleet is read once
    for the lot: every later call reads a bounded number of records."""
    fleet = FULL_SCAN_MAX
    s, now = _dark_cell(redis_client, "all-dark-small", frozenset(range(fleet)), fleet)
    before = _hmgets(s)
    with pytest.raises(NoNodesAvailable, match=f"0/{fleet} nodes available.*stale heartbeat"):
        s.schedule(Request.cold(1, 512))
    assert _hmgets(s) - before >= fleet  # (the one full scan)
    assert _listed_stale(s, now) == 0
    for _ in range(3):
        before = _hmgets(s)
        with pytest.raises(NoNodesAvailable, match=f"0/{fleet} nodes available.*stale heartbeat"):
            s.schedule(Request.cold(1, 512))
        assert _hmgets(s) - before <= 64 + 8
    _beat(s, [7])
    assert s.schedule(Request.cold(1, 512)).node_id == "d0007"
    index_is_consistent(s, POLICY, now)


def test_a_warm_node_gone_dark_never_wins_locality(redis_client: Any) -> None:
    """With locality on, the warm candidates of a decision made through the
    index are read from their buckets, as the pick's node is: a node that
    holds the template but went dark, still listed while the sweeps are
    behind, fails the status check on its own heartbeat time and never
    wins; a live warm node does."""
    policy = Policy(
        report_ttl_ms=REPORT_TTL_MS, locality=Locality(weight=0.5, max_pressure_gap=0.25)
    )
    s = Scheduler(redis_client, cell="dark-warm")
    s.sync_policy(policy, overwrite=True)
    s.advance_clock(0, "freeze")

    # the dark nodes a little busier than the live ones, so the picks find a
    # live node at once and the sweep (the first 64 by id) leaves dark399
    # listed when locality reads it
    dark = [f"dark{i:03d}" for i in range(400)]
    lit = [f"lit{i:03d}" for i in range(50)]
    for node_id in dark:
        beat(s, node_id, alloc=6)
    for node_id in lit:
        beat(s, node_id, alloc=7 if node_id == "lit007" else 4)
    s.record_artifact("c1", "bt", "snap", "dark399")
    s.record_artifact("c1", "bt", "snap", "lit007")
    s.advance_clock(REPORT_TTL_MS * 2 // 3)
    for node_id in lit:
        beat(s, node_id, alloc=7 if node_id == "lit007" else 4)
    now = s.advance_clock(REPORT_TTL_MS // 2)
    assert _listed_stale(s, now) == len(dark) > STALE_BATCH
    req = Request(cpu=1, memory_bytes=GIB, locality=(LR(key="snap", size_bytes=GIB),))
    placed = s.schedule(req)
    # (pressure - bonus: dark399 (6 + 1) / 16 - 0.5 would beat lit007's
    # (7 + 1) / 16 - 0.5, both within the gap of the coolest, 5 / 16)
    assert (placed.node_id, placed.warmth) == ("lit007", "full")
    assert s.client.hget(s.keys.node("dark399"), "idx") not in (None, b"")  # (still listed)
    for _ in range(8):
        assert not s.schedule(req).node_id.startswith("dark")
    # (and heard from again, it is the one that wins)
    beat(s, "dark399", alloc=6)
    assert s.schedule(req).node_id == "dark399"


def test_a_replicas_monitor_takes_stale_nodes_out_step_after_step(
    make_replica: Any, redis_client: Any
) -> None:
    """No placement and no periodic sweep: a running replica's monitor takes
    the index's steps while stale nodes are listed (64 a step, back to back),
    until none is, and places nothing."""
    r = make_replica(POLICY, cell="dark-monitor")
    assert r.replica is not None
    s, now = _dark_cell(redis_client, "dark-monitor", frozenset(range(FLEET)))
    deadline = time.monotonic() + 60  # (a bound on the wait, not a figure)
    while _listed_stale(s, now) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _listed_stale(s, now) == 0
    assert s.stats().pending == 0
    index_is_consistent(s, POLICY, now)
