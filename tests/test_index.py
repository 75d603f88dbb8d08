"""The placement index against the reference model, aimed where it can go wrong.

Every Schedule below goes through the index (least_loaded creations); the
dry run and the model use full scans.  check_stream (shared with
test_model_equivalence) requires the same choice, pressure and refusal, and
index_is_consistent requires every node to sit in exactly the bucket its
record implies, after every step.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import (
    Heartbeat,
    Limits,
    NodeSnapshot,
    NoNodesAvailable,
    Overcommit,
    Policy,
    Request,
    Scheduler,
)
from scheduler.domain.catalog import FULL_SCAN_MAX
from scheduler.testing.model import Demand, NodeState, decide, derive_status, evaluate
from tests.helpers import GIB, node_states, rr_value, schedule_argv
from tests.test_model_equivalence import check_stream


def expected_bucket(n: NodeState, policy: Policy, now: int) -> str:
    """What lua/includes/index.lua must file the node under ('' = not indexed)."""
    bare = Policy(report_ttl_ms=policy.report_ttl_ms)
    route = evaluate(n, bare, Demand.of(Request.route(), bare), now)
    if route.reason is not None:  # status, endpoint
        return ""
    limits = policy.limits.active()
    if "max_cpu_used_percent" in limits and n.cpu_percent > limits["max_cpu_used_percent"]:
        return ""
    if (
        "max_memory_used_percent" in limits
        and n.memory_total_bytes > 0
        and n.memory_used_bytes * 100 > limits["max_memory_used_percent"] * n.memory_total_bytes
    ):
        return ""
    assert derive_status(n, policy, now) in ("READY", "CONNECTING")
    # the ranking counts first, 9 digits each, so byte order is rank order
    counts = (
        f"{n.sandbox_starting_count + n.pending_count:09d}{n.sandbox_count:09d}"
        f"{n.paused_sandbox_count:09d}"
    )
    parts = [
        n.cpu_count,
        n.memory_total_bytes,
        n.allocated_cpu + n.paused_allocated_cpu + n.pending_cpu,
        n.allocated_memory_bytes + n.paused_allocated_memory_bytes + n.pending_memory_bytes,
        n.allocated_cpu,
        n.pending_cpu,
        n.allocated_memory_bytes,
        n.pending_memory_bytes,
        n.sandbox_starting_count,
        n.pending_count,
    ]
    return counts + ":" + ":".join(str(p) for p in parts)


def index_is_consistent(s: Scheduler, policy: Policy, now: int) -> None:
    c = s.client
    base = s.keys.base
    members: dict[str, str] = {}
    for shape in (x.decode() for x in c.smembers(base + "idx-shapes")):
        cpu_scores = {
            b.decode(): sc for b, sc in c.zrange(base + "idx-cpu:" + shape, 0, -1, withscores=True)
        }
        mem_scores = {
            b.decode(): sc for b, sc in c.zrange(base + "idx-mem:" + shape, 0, -1, withscores=True)
        }
        by_cpu = set(cpu_scores)
        # (a shape left empty is dropped from idx-shapes by the next pick)
        assert by_cpu == set(mem_scores), shape
        cap_cpu, cap_mem = (int(x) for x in shape.split(":"))
        for bucket in by_cpu:
            fields = bucket.split(":")
            assert ":".join(fields[1:3]) == shape, bucket
            # scored by load in the dimension, 0 where the capacity is unknown
            assert cpu_scores[bucket] == (int(fields[3]) if cap_cpu > 0 else 0), bucket
            assert mem_scores[bucket] == (int(fields[4]) if cap_mem > 0 else 0), bucket
            nodes = [x.decode() for x in c.zrange(base + "idx-bucket:" + bucket, 0, -1)]
            assert nodes, bucket
            for node_id in nodes:
                assert node_id not in members, node_id
                members[node_id] = bucket
    stale_cut = now - policy.report_ttl_ms
    for n in node_states(s):
        raw = {k.decode(): v.decode() for k, v in c.hgetall(s.keys.node(n.node_id)).items()}
        want = expected_bucket(n, policy, now)
        if n.last_seen_ms is not None and n.last_seen_ms < stale_cut:
            # stale nodes leave lazily: by the next schedule's sweep at the latest
            want = raw.get("idx", "")
        assert raw.get("idx", "") == want, n.node_id
        assert members.get(n.node_id, "") == want, n.node_id


SHAPES = [(16, 64), (16, 64), (32, 128), (64, 256), (8, 32), (8, 0), (0, 16)]


@st.composite
def fleets(draw: Any) -> list[tuple[str, NodeSnapshot]]:
    out = []
    for i in range(draw(st.integers(2, 12))):
        cpu, mem_gib = draw(st.sampled_from(SHAPES))
        used = draw(st.integers(0, max(cpu, 1)))
        out.append(
            (
                f"ix-{i:02d}",
                NodeSnapshot(
                    cpu_count=cpu,
                    memory_total_bytes=mem_gib * GIB,
                    allocated_cpu=used,
                    allocated_memory_bytes=draw(
                        st.sampled_from([0, used * 2 * GIB, used * 4 * GIB])
                    ),
                    sandbox_count=draw(st.integers(0, 9)),
                    sandbox_starting_count=draw(st.integers(0, 2)),
                    paused_sandbox_count=draw(st.integers(0, 2)),
                    cpu_percent=draw(st.integers(0, 100)),
                    memory_used_bytes=draw(st.integers(0, mem_gib * GIB)),
                ),
            )
        )
    return out


steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("schedule"),
            st.sampled_from([0, 1, 2, 4, 8]),
            st.sampled_from([0, 512, 4096, 16384]),
        ),
        st.tuples(st.just("route"), st.just(0), st.just(0)),
        st.tuples(st.just("advance"), st.sampled_from([5_000, 20_000]), st.just(0)),
        st.tuples(st.just("beat"), st.integers(0, 11), st.just(0)),
        st.tuples(st.just("created"), st.integers(0, 11), st.integers(1, 3)),
        st.tuples(st.just("linger"), st.integers(0, 11), st.just(0)),
        # the node says it stops (or starts again) accepting sandboxes
        st.tuples(st.just("admit"), st.integers(0, 11), st.integers(0, 2)),
    ),
    min_size=1,
    max_size=25,
)

policies = st.builds(
    Policy,
    report_ttl_ms=st.just(30_000),
    limits=st.builds(
        Limits,
        max_sandbox_count=st.sampled_from([0, 6, 10]),
        max_cpu_used_percent=st.sampled_from([0, 80]),
        max_memory_allocated_percent=st.sampled_from([0, 90]),
        max_sandbox_starting_count=st.sampled_from([0, 3]),
    ),
    overcommit=st.builds(
        Overcommit, cpu=st.sampled_from([1.0, 2.0, 4.0]), memory=st.sampled_from([1.0, 1.5])
    ),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(fleet=fleets(), policy=policies, script=steps)
def test_index_decides_like_the_model_while_the_fleet_changes(
    redis_client: Any,
    fleet: list[tuple[str, NodeSnapshot]],
    policy: Policy,
    script: list[tuple[str, int, int]],
) -> None:
    """Nodes go stale and come back, linger, fill up to ceilings that bind
    before pressure does, under overcommit; shapes tie."""
    s = Scheduler(redis_client, cell="index")
    s.client.flushall()
    s.sync_policy(policy, overwrite=True)
    now = s.advance_clock(0, "freeze")
    snaps = dict(fleet)
    ids = list(snaps)
    for node_id, snap in fleet:
        s.heartbeat(
            Heartbeat(
                node_id=node_id, service_instance_id="b", endpoint=f"{node_id}:1", snapshot=snap
            )
        )
    for kind, a, b in script:
        if kind == "schedule":
            check_stream(s, policy, [Request.cold(a, b)])
        elif kind == "route":
            check_stream(s, policy, [Request.route()])
        elif kind == "advance":
            now = s.advance_clock(a)
        elif kind == "beat":
            node_id = ids[a % len(ids)]
            s.heartbeat(
                Heartbeat(node_id=node_id, service_instance_id="b", snapshot=snaps[node_id])
            )
        elif kind == "created":
            # the node counts b more creations (and runs them): as many of
            # its reservations are released, oldest first
            node_id = ids[a % len(ids)]
            snap = snaps[node_id]
            snaps[node_id] = snap = msgspec.structs.replace(
                snap,
                create_successes=snap.create_successes + b,
                sandbox_count=snap.sandbox_count + b,
                allocated_cpu=snap.allocated_cpu + b,
            )
            s.heartbeat(Heartbeat(node_id=node_id, service_instance_id="b", snapshot=snap))
        elif kind == "admit":
            node_id = ids[a % len(ids)]
            snaps[node_id] = snap = msgspec.structs.replace(
                snaps[node_id],
                accepting_sandboxes=(None, False, True)[b],
                admission_reason=("UNSPECIFIED", "DISK_CLEANUP", "READY")[b],
            )
            s.heartbeat(Heartbeat(node_id=node_id, service_instance_id="b", snapshot=snap))
        else:
            node_id = ids[a % len(ids)]
            s.set_lingering(
                node_id, not any(v.lingering for v in s.nodes() if v.node_id == node_id)
            )
        index_is_consistent(s, policy, now)


def test_mass_staleness_falls_back_to_the_full_scan_and_catches_up(redis_client: Any) -> None:
    """More nodes go stale at once than one sweep takes (64), and they are
    the index's best entries (the survivors are busier): every pick of the
    first decision meets a stale node, so it scans fully and takes every
    stale node it reads out; the decisions are the model's throughout.  (A
    fleet the full scan may read, FULL_SCAN_MAX nodes; on a larger one the
    decision is refused BEHIND while the index catches up:
    tests/test_stale_sweep.py.)"""
    policy = Policy(report_ttl_ms=30_000)
    s = Scheduler(redis_client, cell="mass")
    s.sync_policy(policy, overwrite=True)
    s.advance_clock(0, "freeze")
    pipe = s.client.pipeline(transaction=False)
    for i in range(FULL_SCAN_MAX):
        call = s.ops.heartbeat(
            Heartbeat(
                node_id=f"m{i:03d}",
                service_instance_id="b",
                endpoint=f"m{i}:1",
                snapshot=NodeSnapshot(cpu_count=16, memory_total_bytes=64 * GIB),
            )
        )
        s.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
    pipe.execute()
    now = s.advance_clock(31_000)
    survivors = ["m100", f"m{FULL_SCAN_MAX - 1:03d}"]
    for node_id in survivors:
        s.heartbeat(
            Heartbeat(
                node_id=node_id,
                service_instance_id="b",
                snapshot=NodeSnapshot(cpu_count=16, memory_total_bytes=64 * GIB, allocated_cpu=4),
            )
        )
    for _ in range(4):  # 198 stale nodes: the first decision's scan takes them out
        check_stream(s, policy, [Request.cold(2, 1024)])
    assert {v.node_id: v.pending_reservations for v in s.nodes() if v.pending_reservations} == {
        node_id: 2 for node_id in survivors
    }
    seen = s.client.zrange(s.keys.base + "idx-seen", 0, -1)
    assert sorted(x.decode() for x in seen) == survivors
    index_is_consistent(s, policy, now)


def test_an_index_of_an_earlier_layout_is_never_read_and_is_rebuilt(redis_client: Any) -> None:
    """A cell whose index an earlier version built (its bucket ids and scores
    mean something else) is decided by the full scan until a replica syncs
    the policy, which drops every index key and builds this layout."""
    policy = Policy(report_ttl_ms=3_600_000)
    s = Scheduler(redis_client, cell="upgrade")
    s.sync_policy(policy, overwrite=True)
    now = s.advance_clock(0, "freeze")
    for i, used in enumerate([12, 2, 8]):
        s.heartbeat(
            Heartbeat(
                node_id=f"u{i}",
                service_instance_id="b",
                endpoint=f"u{i}:1",
                snapshot=NodeSnapshot(
                    cpu_count=16, memory_total_bytes=64 * GIB, allocated_cpu=used
                ),
            )
        )
    c, base = s.client, s.keys.base
    # What an earlier version left: its own bucket ids (shape first, fractions as
    # scores), a packed policy of 20 fields and no index_format.  Its lowest
    # entry names the fullest node, u0.
    for key in [k.decode() for k in c.keys(base + "idx-*")]:
        c.delete(key)
    old = "16:68719476736:0:0:0:0:0:0:0:0:0:0"
    c.zadd(base + "idx-bucket:" + old, {"u0": 0})
    c.zadd(base + "idx-cpu:16:68719476736", {old: 0.0})
    c.zadd(base + "idx-mem:16:68719476736", {old: 0.0})
    c.sadd(base + "idx-shapes", "16:68719476736")
    for i in range(3):
        c.hset(s.keys.node(f"u{i}"), "idx", old if i == 0 else "")
    c.hdel(s.keys.policy, "index_format")
    packed = c.hget(s.keys.policy, "packed").decode()
    c.hset(s.keys.policy, "packed", packed.rsplit("\t", 1)[0])
    # the full scan decides (the index would have said u0)
    check_stream(s, policy, [Request.cold(1, 1024), Request.cold(1, 1024)])
    assert s.stats().reserved_total == 2
    assert {v.node_id for v in s.nodes() if v.pending_reservations} == {"u1"}
    # a replica starts: same policy, and the index is built anew
    assert s.sync_policy(policy) == "same"
    assert c.hget(s.keys.policy, "index_format") == b"2"
    assert not c.exists(base + "idx-bucket:" + old)
    index_is_consistent(s, policy, now)
    check_stream(s, policy, [Request.cold(1, 1024)] * 6)
    index_is_consistent(s, policy, now)


def test_a_lagging_seen_score_makes_the_sweep_look_early_never_late(redis_client: Any) -> None:
    """A heartbeat writes its node's idx-seen and seen scores only when they
    lag its instant by more than a quarter of report_ttl (the record says
    what it last wrote).  A lagging score makes the stale sweep look at a
    fresh node early, which then stays and gets its score moved; a node that
    did go stale still leaves on time."""
    policy = Policy(report_ttl_ms=30_000)
    s = Scheduler(redis_client, cell="lag")
    s.client.flushall()
    s.sync_policy(policy, overwrite=True)
    t0 = s.advance_clock(0, "freeze")
    base, node = s.keys.base, s.keys.node("a")

    def beat(cpu: int = 0) -> None:
        s.heartbeat(
            Heartbeat(
                node_id="a",
                service_instance_id="b",
                endpoint="a:1",
                snapshot=NodeSnapshot(cpu_count=16, memory_total_bytes=64 * GIB, allocated_cpu=cpu),
            )
        )

    def scores() -> tuple[float | None, float | None]:
        return s.client.zscore(base + "idx-seen", "a"), s.client.zscore(s.keys.seen, "a")

    beat()
    assert scores() == (t0, t0)
    s.advance_clock(5_000)
    beat()  # steady: the record's clock moves, the scores stay
    assert int(s.client.hget(node, "last_seen_ms")) == t0 + 5_000
    assert scores() == (t0, t0)
    s.advance_clock(2_000)
    beat(cpu=2)  # changed, 7 s after the scores: under a quarter of report_ttl
    assert scores() == (t0, t0)
    s.advance_clock(1_000)
    beat()  # 8 s: both are written again
    assert scores() == (t0 + 8_000, t0 + 8_000)
    assert s.client.hmget(node, "idx_seen_ms", "seen_ms") == [str(t0 + 8_000).encode()] * 2
    s.advance_clock(5_000)
    beat()  # steady at 13 s: the score stays at 8 s
    assert scores()[0] == t0 + 8_000
    # 39 s: the score is 31 s old, past the cutoff, but the node last beat 26 s
    # ago: the sweep looks at it, it stays, and its score moves to its last beat
    now = s.advance_clock(26_000)
    assert s.schedule(Request.cold(1, 1024)).node_id == "a"
    assert scores()[0] == t0 + 13_000
    index_is_consistent(s, policy, now)
    # 44 s: 31 s since its last heartbeat, it is stale and leaves the index
    now = s.advance_clock(5_000)
    with pytest.raises(NoNodesAvailable, match="stale heartbeat"):
        s.schedule(Request.cold(1, 1024))
    assert scores()[0] is None
    index_is_consistent(s, policy, now)


def _commands_per_schedule(s: Scheduler, n: int, req: Request) -> dict[str, int]:
    """Commands Redis ran (INFO commandstats, scripts' calls included) for
    each of three Schedules of ``req`` among ``n`` identical empty nodes,
    after a first one."""
    s.client.flushall()
    s.sync_policy(Policy(), overwrite=True)
    pipe = s.client.pipeline(transaction=False)
    for i in range(n):
        call = s.ops.heartbeat(
            Heartbeat(
                node_id=f"f{i:05d}",
                service_instance_id="b",
                endpoint=f"f{i}:1",
                snapshot=NodeSnapshot(cpu_count=16, memory_total_bytes=64 * GIB),
            )
        )
        s.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
    pipe.execute()
    s.schedule(req)
    s.client.config_resetstat()
    for _ in range(3):
        s.schedule(req)
    stats = s.client.info("commandstats")
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items() if k != "cmdstat_info"}


@pytest.mark.real_only
@pytest.mark.parametrize("req", [Request.cold(1, 1024), Request.route()], ids=["create", "route"])
def test_a_pick_among_one_large_bucket_costs_the_same_at_any_size(
    redis_client: Any, req: Request
) -> None:
    """One tied bucket of 80 nodes or of 2,000: a pick makes the same calls,
    none of which walks the bucket (no union of it is built)."""
    s = Scheduler(redis_client, cell="flat")
    small = _commands_per_schedule(s, 80, req)
    large = _commands_per_schedule(s, 2_000, req)
    assert "zunionstore" not in large
    assert small == large


@pytest.mark.real_only
def test_a_batchs_picks_among_large_tied_buckets_are_the_models(
    redis_client: Any,
) -> None:
    """Two shapes of equal pressure for a 1-CPU request, 200 nodes each:
    every pick of a batch is the k-th node of both buckets' union in byte
    order (a bisection of the larger: index_pick.lua kth_union), one size
    or four mixed, with a young rotation counter or one far past the tie's
    size, the model's choice each time."""
    policy = Policy(report_ttl_ms=3_600_000)
    s = Scheduler(redis_client, cell="turns")
    s.sync_policy(policy, overwrite=True)
    pipe = s.client.pipeline(transaction=False)
    for i in range(400):
        snap = (
            NodeSnapshot(
                cpu_count=32,
                memory_total_bytes=128 * GIB,
                allocated_cpu=9,
                allocated_memory_bytes=33 * GIB,
            )
            if i % 2
            else NodeSnapshot(
                cpu_count=16,
                memory_total_bytes=64 * GIB,
                allocated_cpu=4,
                allocated_memory_bytes=16 * GIB,
            )
        )
        call = s.ops.heartbeat(
            Heartbeat(
                node_id=f"t{i:05d}", service_instance_id="b", endpoint=f"t{i}:1", snapshot=snap
            )
        )
        s.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
    pipe.execute()
    s.schedule(Request.cold(1, 1024))
    mixed = [(1, 1024), (2, 2048), (1, 512), (4, 4096)]
    for sizes, counter in (([(1, 1024)], None), (mixed, None), (mixed, 1_000_003)):
        if counter is not None:  # (a cell's counter long past the tie's size)
            s.client.set(s.keys.rr, counter)
        states, rr = node_states(s), rr_value(s)
        reqs = [Request.cold(*sizes[i % len(sizes)]) for i in range(16)]
        calls = [s.ops.schedule(req) for req in reqs]
        placed = s.run(s.ops.schedule_batch(calls))
        for i, (req, call, got) in enumerate(zip(reqs, calls, placed, strict=True)):
            assert not isinstance(got, Exception), got
            want = decide(states, policy, req, got.now_ms, rr + 1 + i, schedule_argv(call).random)
            assert got.node_id == want.chosen, (sizes, i)
            states = [
                n.with_reservation(got.cpu, got.memory_bytes) if n.node_id == got.node_id else n
                for n in states
            ]

    index_is_consistent(s, policy, placed[-1].now_ms)
