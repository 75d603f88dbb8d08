"""The Lua path and the reference model decide the same, on random fleets.

Random fleets (mixed shapes, unknown capacity, limits, overcommit, stale,
lingering, never-heard-from and endpoint-less nodes, paused load) and random
request streams go through the scripts (on a real redis-server and on
fakeredis) and through scheduler/testing/model.py.  For every request: the dry run
must give every node the model's verdict (status, reason, exact pressure,
tie-break values), the real Schedule must choose the model's node (or refuse
with the model's counted message), and the pending load stored in Redis must
equal the model's afterwards.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import (
    DefaultRequest,
    Heartbeat,
    Limits,
    NodeSnapshot,
    NoNodesAvailable,
    Overcommit,
    Policy,
    Request,
    Scheduler,
)
from scheduler.domain.records import LocalityRequirement
from scheduler.testing.model import NodeState, decide
from tests.helpers import GIB, node_states, rr_cursor, rr_value, schedule_argv

MIB = 1024 * 1024

shapes = st.sampled_from(
    [(0, 0), (2, 8), (8, 32), (16, 64), (16, 64), (64, 256), (192, 768), (8, 0), (0, 16)]
)


@st.composite
def nodes(draw: Any, i: int) -> dict[str, Any]:
    cpu, mem_gib = draw(shapes)
    mem = mem_gib * GIB
    return {
        "id": f"node-{i:02d}",
        "kind": draw(
            st.sampled_from(
                ["fresh"] * 6 + ["stale", "quiet", "no-endpoint", "lingering", "unsettled"]
            )
        ),
        "status": draw(
            st.sampled_from(["READY"] * 6 + ["UNSPECIFIED", "UNHEALTHY", "LINGERING", "CONNECTING"])
        ),
        "snap": NodeSnapshot(
            cpu_count=cpu,
            memory_total_bytes=mem,
            allocated_cpu=draw(st.integers(0, int(cpu * 1.2) + 1)),
            allocated_memory_bytes=draw(st.integers(0, int(mem * 1.1) + 1)),
            paused_allocated_cpu=draw(st.sampled_from([0, 0, 1, 4])),
            paused_allocated_memory_bytes=draw(st.sampled_from([0, 0, GIB, 8 * GIB])),
            sandbox_count=draw(st.integers(0, 12)),
            sandbox_starting_count=draw(st.integers(0, 4)),
            paused_sandbox_count=draw(st.integers(0, 4)),
            cpu_percent=draw(st.integers(0, 100)),
            memory_used_bytes=draw(st.integers(0, mem)),
        ),
    }


@st.composite
def fleets(draw: Any) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 10))
    return [draw(nodes(i)) for i in range(n)]


def limit(values: list[int]) -> Any:
    return st.sampled_from([0, 0, *values])


policies = st.builds(
    Policy,
    strategy=st.sampled_from(["least_loaded", "least_loaded", "round_robin", "random"]),
    limits=st.builds(
        Limits,
        max_sandbox_count=limit([4, 10, 12]),
        max_sandbox_starting_count=limit([2, 5]),
        max_cpu_used_percent=limit([50, 90]),
        max_cpu_allocated_percent=limit([80, 100, 150]),
        max_memory_used_percent=limit([60, 95]),
        max_memory_allocated_percent=limit([80, 120]),
        max_sandbox_count_including_paused=limit([8, 14]),
        max_allocated_cpu_including_paused=limit([16, 40]),
        max_allocated_memory_bytes_including_paused=limit([32 * GIB, 200 * GIB]),
    ),
    overcommit=st.builds(
        Overcommit, cpu=st.sampled_from([1.0, 1.5, 4.0]), memory=st.sampled_from([1.0, 1.25])
    ),
    default_request=st.builds(
        DefaultRequest, cpu=st.sampled_from([0, 1, 2]), memory_mb=st.sampled_from([0, 512, 2048])
    ),
)

requests = st.one_of(
    st.builds(
        Request.cold, st.sampled_from([0, 1, 2, 4, 8]), st.sampled_from([0, 256, 1024, 4096, 16384])
    ),
    st.just(Request.template()),
    st.just(Request.route()),
    # locality inputs under these policies' locality.weight 0: decided exactly as without
    st.builds(
        Request,
        cpu=st.sampled_from([None, 1, 4]),
        memory_bytes=st.sampled_from([None, GIB]),
        template_id=st.sampled_from(["", "tpl"]),
        images=st.sampled_from([(), ("img",)]),
        locality=st.sampled_from([(), (LocalityRequirement(key="snap", size_bytes=GIB),)]),
    ),
)


def build(s: Scheduler, fleet: list[dict[str, Any]], policy: Policy, settle: bool = False) -> None:
    s.client.flushall()
    s.sync_policy(policy, overwrite=True)
    s.sync_nodes([(n["id"], f"{n['id']}:5000") for n in fleet if n["kind"] != "no-endpoint"])

    def beat(n: dict[str, Any]) -> None:
        s.heartbeat(
            Heartbeat(
                node_id=n["id"],
                service_instance_id="b1",
                snapshot=NodeSnapshot(**{**_fields(n["snap"]), "status": n["status"]}),
            )
        )

    for n in fleet:
        if n["kind"] == "stale":
            beat(n)
    s.advance_clock(policy.report_ttl_ms + 1_000)
    for n in fleet:
        if n["kind"] in ("fresh", "no-endpoint", "lingering", "unsettled"):
            beat(n)
        if n["kind"] == "lingering":
            s.set_lingering(n["id"], True)
    if settle:
        # Redis may have lost placements: only nodes that heartbeat again take new ones
        s.settle()
        s.advance_clock(1)
        for n in fleet:
            if n["kind"] == "fresh":
                beat(n)


def _fields(snap: NodeSnapshot) -> dict[str, Any]:
    return {f: getattr(snap, f) for f in snap.__struct_fields__}


def check_stream(s: Scheduler, policy: Policy, stream: list[Request]) -> None:
    for req in stream:
        states = node_states(s)
        ex = s.explain(req)
        assert ex.rotation == rr_value(s) + 1
        call = s.ops.schedule(req)
        rand = float(schedule_argv(call).random)
        settle = s.client.hget(s.keys.policy, "settle_ms")
        want = decide(
            states,
            policy,
            req,
            ex.now_ms,
            ex.rotation,
            rand,
            settle_ms=int(settle) if settle else None,
            rr_after=rr_cursor(s),
        )
        got = {v.node_id: v for v in ex.verdicts}
        assert list(got) == [v.node_id for v in want.verdicts]
        for m in want.verdicts:
            g = got[m.node_id]
            assert (
                g.status,
                g.reason,
                g.pressure,
                g.known_capacity,
                g.starting,
                g.running,
                g.paused,
                g.projected_cpu,
                g.projected_memory_bytes,
            ) == (
                m.status,
                m.reason,
                m.pressure,
                m.known,
                m.starting,
                m.running,
                m.paused,
                m.projected_cpu,
                m.projected_memory_bytes,
            ), m.node_id
        if want.chosen is None:
            assert ex.chosen is None and ex.refusal == want.refusal
            try:
                s.run(call)
            except NoNodesAvailable as e:
                assert str(e) == want.refusal
            else:
                raise AssertionError("schedule placed where the model refuses")
            assert node_states(s) == states
            continue
        if policy.strategy != "random":
            assert ex.chosen == want.chosen
        placed = s.run(call)
        assert placed.node_id == want.chosen
        expected: list[NodeState] = []
        for n in states:
            if n.node_id == placed.node_id and req.create:
                n = n.with_reservation(placed.cpu, placed.memory_bytes)
            expected.append(n)
        assert node_states(s) == expected


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fleet=fleets(),
    policy=policies,
    stream=st.lists(requests, min_size=1, max_size=12),
    settle=st.booleans(),
)
def test_lua_and_model_agree(
    redis_client: Any,
    fleet: list[dict[str, Any]],
    policy: Policy,
    stream: list[Request],
    settle: bool,
) -> None:
    s = Scheduler(redis_client, cell="prop")
    build(s, fleet, policy, settle)
    check_stream(s, policy, stream)


ties = st.lists(st.sampled_from([(16, 64), (16, 64), (32, 128), (8, 32)]), min_size=2, max_size=8)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shapes_=ties, n=st.integers(5, 30))
def test_ties_rotate_like_the_model_on_empty_fleets(
    redis_client: Any, shapes_: list[tuple[int, int]], n: int
) -> None:
    """Identical empty nodes of several shapes: ties everywhere."""
    fleet = [
        {
            "id": f"t{i}",
            "kind": "fresh",
            "status": "READY",
            "snap": NodeSnapshot(cpu_count=c, memory_total_bytes=m * GIB),
        }
        for i, (c, m) in enumerate(shapes_)
    ]
    policy = Policy()
    s = Scheduler(redis_client, cell="ties")
    build(s, fleet, policy)
    check_stream(s, policy, [Request.cold(2, 4096)] * n + [Request.route()] * 3)


def test_rotation_over_large_equal_buckets_is_the_models(redis_client: Any) -> None:
    """Equal buckets too large to read whole (over 64 nodes each) rotate through
    a union in Redis; small ones are merged in Lua: both as the model does."""
    fleet = [
        {
            "id": f"big{i:03d}",
            "kind": "fresh",
            "status": "READY",
            "snap": NodeSnapshot(cpu_count=c, memory_total_bytes=m * GIB),
        }
        for i, (c, m) in enumerate([(16, 64), (8, 32)] * 70)
    ]
    fleet += [
        {
            "id": f"small{i}",
            "kind": "fresh",
            "status": "READY",
            "snap": NodeSnapshot(cpu_count=4, memory_total_bytes=16 * GIB),
        }
        for i in range(3)
    ]
    policy = Policy()
    s = Scheduler(redis_client, cell="big")
    build(s, fleet, policy)
    check_stream(s, policy, [Request.route()] * 9 + [Request.cold(1, 1024)] * 5)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.sampled_from([0, 3, 70, 130]), min_size=2, max_size=4),
    turns=st.lists(st.integers(0, 10_000), min_size=1, max_size=6),
)
def test_rotation_over_several_large_buckets_is_the_models(
    redis_client: Any, sizes: list[int], turns: list[int]
) -> None:
    """Equal buckets of mixed sizes, ids interleaved across them, at any turn
    of the rotation: the pick bisects the large ones without building their
    union, and chooses the model's node."""
    shapes_ = [(16, 64), (8, 32), (32, 128), (4, 16)]
    fleet = [
        {
            "id": f"n{(j * 7919 + b) % 100_000:05d}-{b}",
            "kind": "fresh",
            "status": "READY",
            "snap": NodeSnapshot(cpu_count=shapes_[b][0], memory_total_bytes=shapes_[b][1] * GIB),
        }
        for b, size in enumerate(sizes)
        for j in range(size)
    ]
    if not fleet:
        return
    policy = Policy()
    s = Scheduler(redis_client, cell="turns")
    build(s, fleet, policy)
    for turn in turns:
        s.client.set(s.keys.rr, turn)
        check_stream(s, policy, [Request.route()])
