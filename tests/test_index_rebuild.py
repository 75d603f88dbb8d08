"""The placement index rebuilt in bounded steps (lua/index_rebuild-5.lua).

A policy change (or a pick that finds the index inconsistent) no longer
rebuilds the whole index in one call: it marks the index stale and bounded
steps reindex the nodes by a shared cursor.  Here, against a real Redis:
each step's work is bounded (nodes read, counted by Redis itself); while a
rebuild is under way placement never passes a ceiling, and after a change
that only tightens it decides exactly like the model; an interrupted
rebuild resumes from its cursor; a replica's monitor drives a rebuild to its
end; and index_is_consistent holds once it has.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from scheduler import IndexBehind, Limits, Policy, Request, Scheduler
from scheduler.domain.catalog import FULL_SCAN_MAX
from scheduler.store.calls import REBUILD_STEP
from scheduler.store.scripts import library
from scheduler.testing.model import Demand, decide, evaluate
from tests.helpers import hb, node_states, rr_value, schedule_argv
from tests.test_index import index_is_consistent
from tests.test_model_equivalence import check_stream

pytestmark = pytest.mark.real_only

#: The fleet: more nodes than a sync_policy's first step takes
#: (REBUILD_STEP), so a rebuild is still under way when the change returns.
FLEET = 500
#: Nodes a placement's own step reindexes (REBUILD.PLACEMENT_STEP).
PLACEMENT_STEP = 32
HOT = 90  # cpu_percent of every third node: out under a ceiling of 80
#: Nodes a drop step walks per node of its budget (UPGRADE.WALK).
DROP_WALK = 2


def _fleet(s: Scheduler, n: int = FLEET) -> list[str]:
    ids = [f"r{i:04d}" for i in range(n)]
    pipe = s.client.pipeline(transaction=False)
    for i, node_id in enumerate(ids):
        beat = hb(
            node_id,
            cpu=16 if i % 2 else 32,
            mem_gib=64,
            allocated_cpu=i % 9,
            sandbox_count=i % 5,
            cpu_percent=HOT if i % 3 == 0 else 10,
        )
        call = s.ops.heartbeat(beat)
        s.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
    pipe.execute()
    return ids


def _stale(s: Scheduler) -> bool:
    return s.client.hget(s.keys.policy, "index_rebuild") is not None


def _calls(s: Scheduler, command: str) -> int:
    """How many times Redis has served ``command``."""
    stats = s.client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def _hmgets(s: Scheduler) -> int:
    """HMGET calls Redis has served (every node a step reindexes reads its
    record with one)."""
    return _calls(s, "hmget")


def _cell(redis_client: Any, policy: Policy, name: str) -> tuple[Scheduler, int]:
    s = Scheduler(redis_client, cell=name)
    s.sync_policy(policy, overwrite=True)
    now = s.advance_clock(0, "freeze")
    return s, now


def test_the_step_sizes_are_the_scripts_own() -> None:
    text = library().text
    assert f"STEP = {REBUILD_STEP}," in text
    assert f"PLACEMENT_STEP = {PLACEMENT_STEP}," in text
    assert f"WALK = {DROP_WALK}," in text


def test_each_step_reindexes_at_most_its_budget_and_the_pass_ends_whole(
    redis_client: Any,
) -> None:
    loose = Policy(report_ttl_ms=3_600_000)
    s, now = _cell(redis_client, loose, "steps")
    _fleet(s)
    index_is_consistent(s, loose, now)
    tight = Policy(report_ttl_ms=3_600_000, limits=Limits(max_cpu_used_percent=80))
    before = _hmgets(s)
    assert s.sync_policy(tight, overwrite=True) == "overwritten"
    # the change itself took one step of REBUILD_STEP nodes, no more
    first = _hmgets(s) - before
    assert first <= REBUILD_STEP + 8, first
    assert _stale(s)
    budget, steps, total = 50, 0, 0
    cursors: list[str] = []
    while True:
        before = _hmgets(s)
        step = s.index_rebuild("step", budget)
        read = _hmgets(s) - before
        assert step.reindexed <= budget
        # one HMGET per node reindexed, plus the step's own reads
        assert read <= step.reindexed + 2, (read, step.reindexed)
        total += step.reindexed
        steps += 1
        if step.done:
            break
        cursors.append(step.cursor)
    assert cursors == sorted(cursors) and len(set(cursors)) == len(cursors)
    assert total == FLEET - REBUILD_STEP
    assert steps == (FLEET - REBUILD_STEP) // budget + 1
    assert not _stale(s)
    index_is_consistent(s, tight, now)
    # a step with nothing under way reads nothing of the fleet
    before = _hmgets(s)
    assert s.index_rebuild().done
    assert _hmgets(s) - before <= 1


def test_placement_during_a_tightening_rebuild_decides_like_the_model(
    redis_client: Any,
) -> None:
    """A ceiling on observed CPU that a third of the fleet breaks: while the
    rebuild is under way those nodes still sit in the index, yet no placement
    goes to one, and every decision is the model's (full scan) under the new
    policy."""
    loose = Policy(report_ttl_ms=3_600_000, limits=Limits(max_sandbox_count=6))
    s, now = _cell(redis_client, loose, "tighten")
    _fleet(s)
    tight = Policy(
        report_ttl_ms=3_600_000, limits=Limits(max_sandbox_count=6, max_cpu_used_percent=80)
    )
    s.sync_policy(tight, overwrite=True)
    decided_stale = 0
    while _stale(s):
        decided_stale += 1
        # (each placement takes one step of 32 nodes itself)
        check_stream(s, tight, [Request.cold(2, 1024)])
        assert decided_stale < FLEET
    assert decided_stale >= (FLEET - REBUILD_STEP) // PLACEMENT_STEP
    check_stream(s, tight, [Request.cold(2, 1024)] * 4)
    index_is_consistent(s, tight, now)


def test_a_batch_of_placements_during_a_tightening_rebuild_decides_like_the_model(
    redis_client: Any,
) -> None:
    """The coalesced path (one call, 16 decisions, one rebuild step): the
    picks it keeps from one decision to the next, the members it knows and
    the nodes the stale checks take out of the index all stay exact."""
    loose = Policy(report_ttl_ms=3_600_000)
    s, now = _cell(redis_client, loose, "batch")
    _fleet(s)
    tight = Policy(report_ttl_ms=3_600_000, limits=Limits(max_cpu_used_percent=80))
    s.sync_policy(tight, overwrite=True)
    batches = 0
    while _stale(s):
        batches += 1
        assert batches < FLEET
        states, rr = node_states(s), rr_value(s)
        reqs = [Request.cold(*size) for size in [(1, 512), (2, 1024), (4, 4096), (1, 512)] * 4]
        calls = [s.ops.schedule(req) for req in reqs]
        placed = s.run(s.ops.schedule_batch(calls))
        for i, (req, call, got) in enumerate(zip(reqs, calls, placed, strict=True)):
            want = decide(states, tight, req, now, rr + 1 + i, float(schedule_argv(call).random))
            assert not isinstance(got, Exception), got
            assert got.node_id == want.chosen, i
            states = [
                n.with_reservation(got.cpu, got.memory_bytes) if n.node_id == got.node_id else n
                for n in states
            ]
    index_is_consistent(s, tight, now)


def test_placement_during_a_loosening_rebuild_never_passes_a_ceiling(
    redis_client: Any,
) -> None:
    """The ceiling goes: nodes it kept out join the index as the pass reaches
    them.  Until then a placement may go elsewhere, but always to a node the
    model finds eligible, of the least pressure among the nodes indexed;
    once the pass ends, the model's choice exactly."""
    tight = Policy(
        report_ttl_ms=3_600_000, limits=Limits(max_sandbox_count=6, max_cpu_used_percent=80)
    )
    s, now = _cell(redis_client, tight, "loosen")
    _fleet(s)
    loose = Policy(report_ttl_ms=3_600_000, limits=Limits(max_sandbox_count=6))
    s.sync_policy(loose, overwrite=True)
    rounds = 0
    while _stale(s):
        rounds += 1
        assert rounds < FLEET
        req = Request.cold(2, 1024)
        ex = s.explain(req)
        states = {n.node_id: n for n in node_states(s)}
        indexed = [
            k for k in states if (s.client.hget(s.keys.node(k), "idx") or b"").decode() != ""
        ]
        placed = s.schedule(req)
        verdict = evaluate(states[placed.node_id], loose, Demand.of(req, loose), ex.now_ms)
        assert verdict.reason is None, (placed.node_id, verdict.reason)
        assert placed.pressure == verdict.pressure
        # no node the index held before this call was a better choice (its own
        # step may only have added nodes: the change lets more in)
        best_indexed = min(
            v.pressure
            for v in (evaluate(states[k], loose, Demand.of(req, loose), ex.now_ms) for k in indexed)
            if v.reason is None
        )
        assert placed.pressure <= best_indexed
        # and no node anywhere was better than the model's optimum
        assert placed.pressure >= min(v.pressure for v in ex.verdicts if v.reason is None)
    check_stream(s, loose, [Request.cold(2, 1024)] * 4)
    index_is_consistent(s, loose, now)


def test_an_inconsistent_index_is_rebuilt_in_steps_and_the_decision_is_the_models(
    redis_client: Any,
) -> None:
    """A foreign write puts a node in a bucket its record does not name: the
    pick that finds it takes the member out and starts a rebuild, and, the
    fleet being larger than the full scan reads (FULL_SCAN_MAX), that
    decision is refused BEHIND, retryable, with nothing reserved; steps end
    the rebuild and the index is whole."""
    policy = Policy(report_ttl_ms=3_600_000)
    s, now = _cell(redis_client, policy, "foreign")
    _fleet(s)
    c, base = s.client, s.keys.base
    # the bucket of the model's choice holds, instead of its nodes, one whose
    # record names another bucket
    req = Request.cold(1, 512)
    chosen = s.explain(req).chosen
    assert chosen is not None
    bucket = c.hget(s.keys.node(chosen), "idx").decode()
    stray = next(
        x.decode()
        for x in c.zrange(s.keys.nodes, 0, -1)
        if c.hget(s.keys.node(x.decode()), "idx").decode() not in ("", bucket)
    )
    c.delete(base + "idx-bucket:" + bucket)
    c.zadd(base + "idx-bucket:" + bucket, {stray: 0})
    assert len(s.client.zrange(s.keys.nodes, 0, -1)) > FULL_SCAN_MAX
    for _ in range(40):
        ex = s.explain(req)
        pending = s.stats().pending
        try:
            placed = s.schedule(req)
        except IndexBehind as e:
            assert "the placement index is being rebuilt; retry" in e.message, e.message
            assert s.stats().pending == pending
            break
        # (the index may be wrong here: the placement never is)
        assert {v.node_id: v.reason for v in ex.verdicts}[placed.node_id] is None
        assert not _stale(s)
    assert _stale(s), "the stray was never picked"
    assert c.zscore(base + "idx-bucket:" + bucket, stray) is None
    while not s.index_rebuild().done:
        pass
    index_is_consistent(s, policy, now)
    check_stream(s, policy, [Request.cold(1, 512)] * 3)


STEPPER = """
import sys, time
from scheduler import Scheduler
s = Scheduler.connect(sys.argv[1], cell=sys.argv[2])
while not s.index_rebuild("step", 1).done:
    time.sleep(0.01)
"""


def test_a_rebuild_interrupted_by_a_killed_caller_resumes_from_its_cursor(
    redis_client: Any, redis_server: Any
) -> None:
    loose = Policy(report_ttl_ms=3_600_000)
    s, now = _cell(redis_client, loose, "killed")
    _fleet(s)
    tight = Policy(report_ttl_ms=3_600_000, limits=Limits(max_cpu_used_percent=80))
    s.sync_policy(tight, overwrite=True)
    epoch = s.client.hget(s.keys.base + "idx-rebuild", "epoch")
    start = s.client.hget(s.keys.base + "idx-rebuild", "cursor").decode()
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    child = subprocess.Popen([sys.executable, "-c", STEPPER, redis_server.url, "killed"], env=env)
    try:
        # (it takes one node a step: kill it once it has taken one)
        deadline = time.monotonic() + 60
        while s.client.hget(s.keys.base + "idx-rebuild", "cursor").decode() <= start:
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert _stale(s)
    assert s.client.hget(s.keys.base + "idx-rebuild", "epoch") == epoch
    cursor = s.client.hget(s.keys.base + "idx-rebuild", "cursor").decode()
    assert cursor > start
    left = sum(1 for x in s.client.zrange(s.keys.nodes, 0, -1) if x.decode() > cursor)
    # another caller resumes where the killed one stopped: no node again
    total = 0
    while True:
        step = s.index_rebuild("step", 64)
        total += step.reindexed
        if step.done:
            break
    assert total == left
    index_is_consistent(s, tight, now)


def test_a_replicas_monitor_drives_a_rebuild_to_its_end(
    redis_client: Any, make_replica: Any
) -> None:
    loose = Policy(report_ttl_ms=3_600_000)
    s, now = _cell(redis_client, loose, "test")
    _fleet(s, 2_000)
    tight = Policy(report_ttl_ms=3_600_000, limits=Limits(max_cpu_used_percent=80))
    s.sync_policy(tight, overwrite=True)
    assert _stale(s)
    make_replica(tight)  # (the fixture stops it after the test)
    deadline = time.monotonic() + 60
    while _stale(s):
        assert time.monotonic() < deadline, "the monitor never ended the rebuild"
        time.sleep(0.05)
    index_is_consistent(s, tight, now)


def test_a_change_during_a_rebuild_starts_the_pass_over(redis_client: Any) -> None:
    """Nodes the pass under way reindexed went by the policy it started
    under: a second change starts a new epoch from the first node, and the
    index ends as the last policy implies."""
    first = Policy(report_ttl_ms=3_600_000)
    s, now = _cell(redis_client, first, "again")
    _fleet(s)
    mid = Policy(report_ttl_ms=3_600_000, limits=Limits(max_cpu_used_percent=50))
    s.sync_policy(mid, overwrite=True)
    s.index_rebuild("step", 100)
    key = s.keys.base + "idx-rebuild"
    epoch, cursor = (x.decode() for x in s.client.hmget(key, "epoch", "cursor"))
    assert cursor != ""
    last = Policy(report_ttl_ms=3_600_000, limits=Limits(max_cpu_used_percent=95))
    s.sync_policy(last, overwrite=True)
    again = s.client.hmget(key, "epoch", "cursor")
    assert int(again[0]) == int(epoch) + 1
    # the new pass's first step (in the change) reached fewer nodes than the old one had
    assert again[1].decode() < cursor
    total = REBUILD_STEP
    while True:
        step = s.index_rebuild("step", 100)
        total += step.reindexed
        if step.done:
            break
    assert total == FLEET
    index_is_consistent(s, last, now)


def _commands(s: Scheduler) -> int:
    """Commands Redis has served, but for the test's own INFO and FCALLs."""
    stats = s.client.info("commandstats")
    return sum(
        int(v.get("calls", 0))
        for k, v in stats.items()
        if k not in ("cmdstat_info", "cmdstat_fcall", "cmdstat_fcall_ro")
    )


def _old_layout(s: Scheduler, ids: list[str]) -> set[str]:
    """Replace the cell's index by one of another layout, as an earlier
    version left it (shape-first bucket ids, in streams whose key names the
    present layout shares, plus a shape the present one never makes), with
    no index_format.  Returns the old index's keys."""
    c, base = s.client, s.keys.base
    for key in c.scan_iter(match=base + "idx-*"):
        if not key.endswith(b"idx-rebuild"):
            c.delete(key)
    keys: set[str] = set()
    pipe = c.pipeline(transaction=False)
    for i, node_id in enumerate(ids):
        shape = f"{16 if i % 2 else 32}:{64 << 30}"
        # (buckets of about 83 nodes: more than SMALL_BUCKET, which a drop
        # empties member by member before it deletes what is left)
        old = f"{shape}:{i % 3}:0:0:0:0:0:0:0:0:0"
        pipe.zadd(base + "idx-bucket:" + old, {node_id: 0})
        pipe.zadd(base + "idx-cpu:" + shape, {old: 0.0})
        pipe.zadd(base + "idx-mem:" + shape, {old: 0.0})
        pipe.sadd(base + "idx-shapes", shape)
        pipe.hset(s.keys.node(node_id), "idx", old)
        keys |= {"idx-bucket:" + old, "idx-cpu:" + shape, "idx-mem:" + shape}
    pipe.zadd(base + "idx-cpu:1:1", {"1:1:0": 0.0})
    pipe.sadd(base + "idx-shapes", "1:1")
    pipe.zadd(base + "idx-seen", {ids[0]: 1})
    pipe.hdel(s.keys.policy, "index_format")
    pipe.execute()
    return keys | {"idx-cpu:1:1", "idx-shapes", "idx-seen"}


def test_an_index_of_another_layout_is_dropped_and_built_in_bounded_steps(
    redis_client: Any,
) -> None:
    """A version whose index layout differs finds the old index: its
    sync_policy no longer drops and builds it in one call of the fleet (442
    ms at 10,000 nodes) but starts a drop that steps of at most their budget
    walk, then the rebuild.  Meanwhile placements are refused BEHIND (the
    fleet is larger than the full scan reads) with nothing reserved,
    heartbeats write no entry, and at the end the old keys are gone and the
    index is whole."""
    policy = Policy(report_ttl_ms=3_600_000, limits=Limits(max_cpu_used_percent=80))
    s, now = _cell(redis_client, policy, "upgrade")
    ids = _fleet(s)
    index_is_consistent(s, policy, now)
    old = _old_layout(s, ids)
    c, base = s.client, s.keys.base
    before, zrem = _commands(s), _calls(s, "zrem")
    assert s.sync_policy(policy) == "same"
    # the large buckets lose members one by one (no step frees one whole)
    assert _calls(s, "zrem") - zrem > 0
    # the start took one step of the drop, at most DROP_WALK x REBUILD_STEP
    # nodes: an HGET, a ZCARD, a ZREM or DEL and an HSET each, and a few of
    # its own
    assert _commands(s) - before <= 4 * DROP_WALK * REBUILD_STEP + 12
    assert c.hget(s.keys.policy, "index_format") == b"dropping"
    # placements meanwhile: the index cannot decide and the fleet is larger
    # than the full scan reads
    assert FLEET > FULL_SCAN_MAX
    for _ in range(2):
        with pytest.raises(IndexBehind, match=r"being built anew \(index_format dropping\)"):
            s.schedule(Request.cold(1, 1 << 30))
    assert s.stats().pending == 0
    # heartbeats meanwhile, of nodes the drop walked and of nodes it has not:
    # they leave their old entries and write none of this layout
    for node_id in (ids[1], ids[FLEET - 2]):
        s.heartbeat(hb(node_id, cpu=16, mem_gib=64, allocated_cpu=2, sandbox_count=1))
        assert c.hget(s.keys.node(node_id), "idx") == b""
    buckets = [k for k in c.scan_iter(match=base + "idx-bucket:*")]
    assert all(k.endswith(b":0:0:0:0:0:0:0:0:0") for k in buckets), buckets
    budget, steps, walked = 50, 0, 0
    while True:
        before, was = _commands(s), _format(s)
        step = s.index_rebuild("step", budget)
        done, now_format = _commands(s) - before, _format(s)
        assert step.reindexed <= (DROP_WALK * budget if was == b"dropping" else budget)
        if was == now_format == b"dropping":
            # a drop step: an HGET, a ZCARD, a ZREM or DEL and an HSET a node
            assert done <= 4 * step.reindexed + 8, (done, step)
        elif was == b"2":
            # a rebuild step: a node's record, its bucket, its streams, its seen score
            assert done <= 8 * step.reindexed + 16, (done, step)
        else:
            # the step that ends the drop: the last nodes, idx-seen and the
            # shapes' streams (at most 64 shapes, a ZCARD and a DEL a stream);
            # the rebuild's first nodes are the next step's
            assert was == b"dropping" and now_format == b"2", (was, now_format)
            assert done <= 4 * step.reindexed + 4 * 64 + 24, (done, step)
        walked += step.reindexed
        steps += 1
        if step.done:
            break
        assert steps < 100, "the upgrade never ends"
    assert c.hget(s.keys.policy, "index_format") == b"2"
    assert not _stale(s)
    # every node walked twice (dropped, then built), the first step's excepted
    assert walked == 2 * FLEET - DROP_WALK * REBUILD_STEP
    left = {k.decode()[len(base) :] for k in c.scan_iter(match=base + "idx-*")}
    # (the streams' and sets' names are this layout's too: index_is_consistent
    # below finds any old member they kept)
    shared = {k for k in old if not k.startswith("idx-bucket:")} - {"idx-cpu:1:1"}
    assert not (old - shared) & left, (old - shared) & left
    assert not {k for k in c.hkeys(base + "idx-rebuild") if k.startswith(b"drop_")}
    index_is_consistent(s, policy, now)
    check_stream(s, policy, [Request.cold(1, 1 << 30)] * 6)
    index_is_consistent(s, policy, now)


def test_a_replicas_monitor_drives_an_upgrade_to_its_end(redis_client: Any) -> None:
    """The drop and the rebuild after it are steps of index_rebuild, which
    every replica's monitor takes until done (server/replica.py)."""
    policy = Policy(report_ttl_ms=3_600_000)
    s, now = _cell(redis_client, policy, "upgrade-monitor")
    ids = _fleet(s, 300)
    _old_layout(s, ids)
    assert s.sync_policy(policy) == "same"
    assert _format(s) == b"dropping"
    while not s.index_rebuild().done:
        pass
    assert _format(s) == b"2"
    index_is_consistent(s, policy, now)


def _format(s: Scheduler) -> bytes | None:
    """The cell's index_format."""
    value: bytes | None = s.client.hget(s.keys.policy, "index_format")
    return value


def test_a_new_cell_is_of_this_layout_at_once(redis_client: Any) -> None:
    """A cell's first sync_policy has no index to drop and no node to build
    it from: its index is this layout's, whole, with no rebuild recorded (a
    drop and a rebuild would record when they ended, so two cells made a
    millisecond apart would differ by that stamp)."""
    s = Scheduler(redis_client, cell="new")
    assert s.sync_policy(Policy()) == "created"
    assert s.client.hget(s.keys.policy, "index_format") == b"2"
    assert not _stale(s)
    assert not s.client.exists(s.keys.base + "idx-rebuild")
    # and it places from the index like any other cell
    s.heartbeat(hb("n1", cpu=8, mem_gib=16))
    assert s.schedule(Request.cold(1, 512)).node_id == "n1"
    index_is_consistent(s, Policy(), s.advance_clock(0))


def test_a_drop_trims_large_index_keys_in_steps(redis_client: Any) -> None:
    """idx-seen and a shape's streams of another layout hold a member a node
    or a bucket: at 100,000 nodes deleting idx-seen in one step held Redis
    35 ms.  A drop step takes at most TRIM (1,024) members off them, then
    deletes each once small; the upgrade still ends whole."""
    policy = Policy(report_ttl_ms=3_600_000)
    s, now = _cell(redis_client, policy, "upgrade-trim")
    ids = _fleet(s, 40)
    _old_layout(s, ids)
    c, base = s.client, s.keys.base
    big = {"idx-seen": 3_000, "idx-cpu:16:68719476736": 2_500, "idx-mem:16:68719476736": 1_100}
    pipe = c.pipeline(transaction=False)
    for key, n in big.items():
        pipe.zadd(base + key, {f"x{i:05d}": i for i in range(n)})
    pipe.execute()
    assert s.sync_policy(policy) == "same"
    sizes = {key: c.zcard(base + key) for key in big}
    steps = 0
    while _format(s) == b"dropping":
        s.index_rebuild("step", REBUILD_STEP)
        now_sizes = {key: c.zcard(base + key) for key in big}
        # (the three keys' members taken off in one step, in all)
        assert sum(sizes.values()) - sum(now_sizes.values()) <= 1024, (sizes, now_sizes)
        sizes, steps = now_sizes, steps + 1
        assert steps < 100, "the drop never ends"
    assert steps >= sum(big.values()) // 1024
    while not s.index_rebuild().done:
        pass
    assert _format(s) == b"2"
    index_is_consistent(s, policy, now)
