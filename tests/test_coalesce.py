"""Coalesced Schedules: one batch call decides exactly what the same requests
sent one by one decide (a property, on real Redis and fakeredis), and a
replica's client batches what queues while a call is in flight."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import msgspec.structs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import InvalidArgument, NoNodesAvailable, Policy, Request, Scheduler
from scheduler.client.aio import AsyncScheduler
from scheduler.domain.errors import FailedPrecondition, SchedulerError
from scheduler.domain.records import Placement
from scheduler.store.calls import Call, schedule_argv
from scheduler.testing.model import NodeState
from scheduler.testing.redis_server import RedisServer, wait_until
from tests.helpers import GIB, hb, node_states, rr_value
from tests.test_index import index_is_consistent
from tests.test_model_equivalence import build, fleets, policies

requests = st.one_of(
    st.builds(
        Request.cold,
        st.sampled_from([0, 1, 2, 4, 8, 64]),
        st.sampled_from([0, 256, 1024, 4096, 16384]),
    ),
    st.just(Request.template()),
    st.just(Request.route()),
)


def outcome(r: Placement | SchedulerError) -> Any:
    if isinstance(r, SchedulerError):
        return (type(r).__name__, r.message)
    return (r.node_id, r.endpoint, r.reservation_id, r.pressure, r.cpu, r.memory_bytes, r.status)


def calls_for(
    s: Scheduler,
    stream: list[tuple[Request, str | None, int]],
) -> list[Call[Placement]]:
    """The same calls (same reservation ids and random draws) for any cell."""
    out = []
    for req, strategy, i in stream:
        call = s.ops.schedule(req, strategy, f"r{i}" if req.create else None)
        # the same draw for "random" on both sides
        argv = msgspec.structs.replace(schedule_argv(call), random=repr((i * 0.37) % 1))
        out.append(call.with_argv(argv))
    return out


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fleet=fleets(),
    policy=policies,
    stream=st.lists(
        st.tuples(
            requests, st.sampled_from([None, None, "round_robin", "random"]), st.integers(0, 5)
        ),
        min_size=1,
        max_size=14,
    ),
)
def test_a_batch_decides_as_the_same_requests_one_by_one(
    redis_client: Any,
    fleet: list[dict[str, Any]],
    policy: Policy,
    stream: list[tuple[Request, str | None, int]],
) -> None:
    one = Scheduler(redis_client, cell="one")
    many = Scheduler(redis_client, cell="many")
    build(many, fleet, policy)  # (flushes the server first)
    _build_beside(one, fleet, policy)
    # repeated ids (same i) replay, a different request under an id is refused
    sequential: list[Placement | SchedulerError] = []
    for call in calls_for(one, stream):
        try:
            sequential.append(one.run(call))
        except SchedulerError as e:
            sequential.append(e)
    now = many.advance_clock(0, "freeze")
    batched = many.run(many.ops.schedule_batch(calls_for(many, stream)))
    assert [outcome(r) for r in batched] == [outcome(r) for r in sequential]
    # (each cell heard its fleet at its own instant: the rest must be equal)
    assert untimed(node_states(many)) == untimed(node_states(one))
    assert rr_value(many) == rr_value(one)
    assert many.stats() == one.stats()
    # the batch's index moves (and what the call kept of them) left every node
    # in exactly the bucket its record implies
    index_is_consistent(many, policy, now)


def test_a_long_batch_on_a_mixed_fleet_decides_as_one_by_one(redis_client: Any) -> None:
    """64 placements in one call over 120 nodes of four shapes at many loads:
    each decision reads the streams the ones before it moved (the call keeps
    their first members up to date instead of reading them again)."""
    import random

    rng = random.Random(5)
    fleet = []
    for i in range(120):
        cpu, mem = [(16, 64), (32, 128), (64, 256), (96, 384)][i % 4]
        fleet.append(
            {
                "node_id": f"m{i:03d}",
                "cpu": cpu,
                "mem_gib": mem,
                "allocated_cpu": rng.randrange(0, cpu // 2 + 1) // 2 * 2,
                "sandbox_count": rng.randrange(0, 4),
            }
        )
    one, many = Scheduler(redis_client, cell="one"), Scheduler(redis_client, cell="many")
    redis_client.flushall()
    for s in (one, many):
        s.sync_policy(Policy(strategy="least_loaded"))
        for f in fleet:
            s.heartbeat(
                hb(
                    f["node_id"],
                    cpu=f["cpu"],
                    mem_gib=f["mem_gib"],
                    allocated_cpu=f["allocated_cpu"],
                    allocated_memory_bytes=f["allocated_cpu"] * 2 * GIB,
                    sandbox_count=f["sandbox_count"],
                )
            )
    stream = [
        (Request.cold(rng.choice([1, 2, 2, 4]), rng.choice([2048, 4096, 8192])), None, i)
        for i in range(64)
    ]
    sequential = one_by_one_and_batched(one, many, stream, Policy(strategy="least_loaded"))
    assert len({r.node_id for r in sequential if isinstance(r, Placement)}) > 8


def test_a_batch_that_comes_back_to_its_buckets_decides_as_one_by_one(redis_client: Any) -> None:
    """Identical nodes share a bucket: a batch rotates through it, and the
    nodes it moved meet again in buckets its own moves made, which later
    decisions of the same call choose among (the call knows their members
    instead of reading them; ids whose byte order is not the order they
    arrive in, nor their length's)."""
    ids = ["n7", "n10", "n2", "n31", "n3", "n100", "n0", "n9", "n21"]
    one, many = Scheduler(redis_client, cell="one"), Scheduler(redis_client, cell="many")
    redis_client.flushall()
    for s in (one, many):
        s.sync_policy(Policy(strategy="least_loaded"))
        for node_id in ids:
            s.heartbeat(
                hb(
                    node_id,
                    cpu=16,
                    mem_gib=64,
                    allocated_cpu=2,
                    allocated_memory_bytes=4 * GIB,
                    sandbox_count=1,
                )
            )
    stream = [(Request.cold(1, 1024), None, i) for i in range(5 * len(ids) + 3)]
    sequential = one_by_one_and_batched(one, many, stream, Policy(strategy="least_loaded"))
    # every node took five or six: the rotation went round each bucket whole
    taken = [r.node_id for r in sequential if isinstance(r, Placement)]
    assert sorted(taken.count(i) for i in ids) == [5] * 6 + [6] * 3


def test_a_batch_decides_again_after_a_sweep_between_its_decisions(redis_client: Any) -> None:
    """A batch reuses what a pick found for the same size only while nothing
    but its own placements moved the index: here the second decision's
    expiry sweep (the first ended a full sweep batch, 64) frees a node that
    now ranks before the nodes the first decision chose among."""
    policy = Policy(strategy="least_loaded", reservation_ttl_ms=1_000, report_ttl_ms=3_600_000)
    one, many = Scheduler(redis_client, cell="one"), Scheduler(redis_client, cell="many")
    redis_client.flushall()
    for s in (one, many):
        s.sync_policy(policy)
        s.advance_clock(0, "freeze")
        s.heartbeat(hb("big", cpu=128, mem_gib=512))
        for i in range(64):  # expire first: the first decision's sweep ends exactly these
            s.schedule(Request.cold(1, 0), reservation_id=f"w1-{i}")
        s.advance_clock(100)
        for i in range(32):  # the second decision's sweep ends these
            s.schedule(Request.cold(1, 0), reservation_id=f"w2-{i}")
        s.advance_clock(100)
        for node_id in ("n1", "n3", "n4"):
            s.heartbeat(
                hb(node_id, cpu=16, mem_gib=64, allocated_cpu=2, allocated_memory_bytes=4 * GIB)
            )
        s.advance_clock(2_000)  # every reservation expired
    stream = [(Request.cold(1, 1024), None, i) for i in range(4)]
    sequential = one_by_one_and_batched(one, many, stream, policy)
    # big, loaded by the second wave at the first decision (33/128 of its CPU
    # against 3/16), is free at the second (1/128)
    placed = [r.node_id for r in sequential if isinstance(r, Placement)]
    assert placed[0] in ("n1", "n3", "n4") and placed[1] == "big"


def one_by_one_and_batched(
    one: Scheduler, many: Scheduler, stream: list[tuple[Request, str | None, int]], policy: Policy
) -> list[Placement | SchedulerError]:
    """``stream`` one by one in cell ``one`` and as one batch call in cell
    ``many`` (its clock frozen first): the same answers and node records, and
    every node in exactly the bucket its record implies after the batch's
    moves.  Returns the answers."""
    sequential: list[Placement | SchedulerError] = [
        one.run(call) for call in calls_for(one, stream)
    ]
    now = many.advance_clock(0, "freeze")
    batched = many.run(many.ops.schedule_batch(calls_for(many, stream)))
    assert [outcome(r) for r in batched] == [outcome(r) for r in sequential]
    assert untimed(node_states(many)) == untimed(node_states(one))
    index_is_consistent(many, policy, now)
    return sequential


def untimed(states: list[NodeState]) -> list[NodeState]:
    return [replace(n, last_seen_ms=None) for n in states]


def _build_beside(s: Scheduler, fleet: list[dict[str, Any]], policy: Policy) -> None:
    """build() without its flushall: the same fleet in a second cell of the same server."""
    flush = s.client.flushall
    s.client.flushall = lambda *a, **k: True
    try:
        build(s, fleet, policy)
    finally:
        s.client.flushall = flush


def test_each_request_of_a_batch_gets_its_own_error(make_scheduler: Any) -> None:
    s = make_scheduler()
    s.heartbeat(hb("n1", cpu=4, mem_gib=8))
    calls = [
        s.ops.schedule(Request.cold(2, 1024), None, "a"),
        s.ops.schedule(Request.cold(3, 1024), None, "b"),  # does not fit after a
        s.ops.schedule(Request.cold(2, 1024), None, "a"),  # a again: the same answer
        s.ops.schedule(Request.cold(1, 1024), None, "a"),
    ]  # a, another request
    got = s.run(s.ops.schedule_batch(calls))
    assert isinstance(got[0], Placement) and got[0].node_id == "n1"
    assert isinstance(got[1], NoNodesAvailable) and "insufficient cpu" in got[1].message
    assert isinstance(got[2], Placement) and got[2].reservation_id == "a"
    assert isinstance(got[3], InvalidArgument) and "already used" in got[3].message
    assert s.stats().pending == 1
    s.cancel("a")
    got = s.run(s.ops.schedule_batch(calls[:1]))
    assert isinstance(got[0], FailedPrecondition)


@pytest.mark.real_only
def test_a_replica_client_batches_what_queues_while_a_call_is_in_flight() -> None:
    with RedisServer() as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="co", policy=Policy())
            try:
                for k in range(8):
                    await a.heartbeat(hb(f"n{k}", cpu=64, mem_gib=256))
                placed = await asyncio.gather(
                    *(a.schedule(Request.cold(1, GIB // (1 << 20))) for _ in range(200))
                )
                assert a.coalescer.batches >= 1 and a.coalescer.batched > 1
                ids = {p.reservation_id for p in placed}
                assert len(ids) == 200
                stats = await a.stats()
                assert (stats.pending, stats.reserved_total) == (200, 200)
                # a lone request goes by itself, at once
                before = a.coalescer.batches
                await a.schedule(Request.cold(1, 1024))
                assert a.coalescer.batches == before
                # coalescing off: the same answers, one call each
                a.coalescer.enabled = False
                more = await asyncio.gather(*(a.schedule(Request.cold(1, 1024)) for _ in range(20)))
                assert a.coalescer.batches == before and len(more) == 20
            finally:
                await a.close()

        asyncio.run(scenario())


@pytest.mark.real_only
def test_a_request_that_gives_up_while_queued_leaves_no_reservation() -> None:
    with RedisServer() as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="gone", policy=Policy())
            try:
                await a.heartbeat(hb("n1"))
                rs.pause()  # the first call hangs in flight; the others queue
                try:
                    results = await asyncio.gather(
                        *(a.schedule(Request.cold(1, 1024), timeout=0.3) for _ in range(5)),
                        return_exceptions=True,
                    )
                finally:
                    rs.resume()
                assert all(isinstance(r, SchedulerError) for r in results), results
                await asyncio.to_thread(
                    wait_until,
                    lambda: not a.abandoned and not a.coalescer.busy,
                    10,
                    "abandoned ones cancelled",
                )
                st = await a.stats()
                assert st.pending == 0
            finally:
                await a.close()

        asyncio.run(scenario())


@pytest.mark.real_only
def test_a_leading_call_that_gives_up_before_it_goes_hands_its_turn_on() -> None:
    """The first call of a wake-up leads: it waits one turn of the loop for
    the calls that arrive with it.  Cancelled in that turn, it is not sent,
    and the calls that joined it still go, together."""
    with RedisServer() as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="lead", policy=Policy())
            try:
                await a.heartbeat(hb("n1", cpu=64, mem_gib=256))
                lead = asyncio.ensure_future(a.schedule(Request.cold(1, 1024)))
                await asyncio.sleep(0)  # (it waits its turn)
                assert a.coalescer.queue and a.coalescer.busy
                rest = [asyncio.ensure_future(a.schedule(Request.cold(1, 1024))) for _ in range(4)]
                lead.cancel()
                placed = await asyncio.gather(*rest)
                with pytest.raises(asyncio.CancelledError):
                    await lead
                assert len({p.reservation_id for p in placed}) == 4
                assert a.coalescer.batches == 1 and a.coalescer.largest == 4
                await asyncio.to_thread(
                    wait_until,
                    lambda: not a.abandoned and not a.coalescer.busy,
                    10,
                    "the leader's placement, abandoned, cancelled",
                )
                assert (await a.stats()).pending == 4
            finally:
                await a.close()

        asyncio.run(scenario())
