"""Placements a replica answered OK come back after a Redis that lost them
(a restart from an old snapshot) settled: each replica remembers them
(scheduler/domain/history.py PlacementMemo) and writes back those the cell
lacks (lua/replay-5.lua), charged once, never reviving one that ended, and
released at once when the node already lists its sandbox (issue #29,
"acknowledged is kept").  Real redis-server processes, restarted from their
own RDB snapshot."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from scheduler import Limits, Policy, Request, Scheduler
from scheduler.domain.errors import InvalidArgument, NotFound
from scheduler.domain.history import (
    REPLAY_PLACEMENTS_MOST,
    REPLAY_PLACEMENTS_WINDOW_S,
    HistoryWatch,
    Placed,
    PlacementMemo,
)
from scheduler.domain.records import Placement
from scheduler.store.connection import async_client
from scheduler.testing.redis_server import RedisServer, wait_until
from scheduler.testing.replicas import ThreadedReplica, settings_for
from tests.helpers import cold, endpoint_md, hb, hb_request

pytestmark = pytest.mark.real_only
CELL = "replay"
EP = "n1.local:5000"
#: a grace that keeps every placement of these tests "in flight"
LONG_GRACE_MS = 3_600_000
POLICY = Policy(limits=Limits(max_sandbox_count=8))


@pytest.fixture
def server(redis_server: object) -> Iterator[RedisServer]:  # (skips without redis-server)
    with RedisServer() as rs:
        yield rs


def ask(server: RedisServer, command: str, *args: Any) -> Any:
    with server.client() as c:
        return getattr(c, command)(*args)


def connect(server: RedisServer, memo_of: Scheduler | None = None) -> Scheduler:
    """A client of the cell; ``memo_of``: it carries that client's memory
    (the replica that answered, after Redis came back)."""
    s = Scheduler.connect(server.url, cell=CELL)
    if memo_of is None:
        s.sync_policy(POLICY, overwrite=True)
        s.heartbeat(hb("n1"))
    else:
        s.placed, s.assigned = memo_of.placed, memo_of.assigned
    return s


def pending(s: Scheduler) -> int:
    return int(next(v for v in s.nodes() if v.node_id == "n1").pending_reservations)


def restart_from_snapshot(server: RedisServer, s: Scheduler) -> Scheduler:
    s.close()
    server.kill()
    server.start()  # it loads its last snapshot
    t = connect(server, memo_of=s)
    t.settle()
    return t


def placed_after_a_snapshot(server: RedisServer, s: Scheduler) -> Placement:
    """One placement the snapshot holds, then ``b``, the one it lacks."""
    s.schedule(Request.cold(1, 1024))
    ask(server, "save")
    b = s.schedule(Request.cold(1, 1024))
    assert b.reservation_id
    return b


def test_a_placement_the_snapshot_lacks_comes_back_charged_once(server: RedisServer) -> None:
    s = connect(server)
    a = s.schedule(Request.cold(1, 1024))
    ask(server, "save")  # the snapshot: `a` only
    b = s.schedule(Request.cold(1, 1024))
    assert b.reservation_id
    before = s.reservation(b.reservation_id)
    t = restart_from_snapshot(server, s)
    try:
        with pytest.raises(NotFound):
            t.reservation(b.reservation_id)  # lost with the data
        assert pending(t) == 1
        assert t.replay_reservations(LONG_GRACE_MS) == (1, 0, 1, 0)
        back = t.reservation(b.reservation_id)
        assert back.state == "pending" and back.node_id == "n1"
        assert (back.cpu, back.memory_bytes) == (before.cpu, before.memory_bytes)
        # its TTLs count from its own Schedule: it never lives longer than it would have
        assert (back.created_ms, back.expires_ms) == (before.created_ms, before.expires_ms)
        assert pending(t) == 2
        # written again: what the cell has is left as it is, nothing charged twice
        assert t.replay_reservations(LONG_GRACE_MS) == (0, 0, 2, 0)
        assert pending(t) == 2
        assert {r.reservation_id for r in t.reservations()} == {a.reservation_id, b.reservation_id}
    finally:
        t.close()


def test_one_made_before_the_grace_comes_back_ended(server: RedisServer) -> None:
    """A placement made longer than the grace before the settle is in its
    node's roster by now (the settle waits for that heartbeat) or it ended:
    it comes back as a tombstone, charging nothing."""
    s = connect(server)
    b = placed_after_a_snapshot(server, s)
    t = restart_from_snapshot(server, s)
    try:
        assert t.replay_reservations(0) == (0, 1, 1, 0)
        assert t.reservation(b.reservation_id).state == "released"
        assert pending(t) == 1
    finally:
        t.close()


def test_one_whose_sandbox_the_node_lists_is_released_not_charged_again(
    server: RedisServer,
) -> None:
    s = connect(server)
    b = placed_after_a_snapshot(server, s)
    s.assign("s2", "n1", EP, b.reservation_id)  # this client answered its assignment too
    t = restart_from_snapshot(server, s)
    try:
        # the node's next heartbeat lists the sandbox: its numbers count it
        t.heartbeat(hb("n1", roster=["s2"], sandbox_count=1))
        assert t.replay_reservations(LONG_GRACE_MS) == (0, 1, 1, 0)
        back = t.reservation(b.reservation_id)
        assert back.state == "released" and back.sandbox_id == "s2"
        assert pending(t) == 1  # the snapshot's own one alone
        # the assignment written again charges the sandbox nothing more
        t.replay_assignments()
        assert pending(t) == 1
        assert t.reservation(b.reservation_id).state == "released"
    finally:
        t.close()


def test_an_assignment_written_after_it_attaches_it_and_a_roster_releases_it(
    server: RedisServer,
) -> None:
    """In flight (not listed yet): it comes back pending, the assignment
    written again attaches it, and the roster that lists the sandbox
    releases it: the usual rules."""
    s = connect(server)
    b = placed_after_a_snapshot(server, s)
    s.assign("s2", "n1", EP, b.reservation_id)
    t = restart_from_snapshot(server, s)
    try:
        assert t.replay_reservations(LONG_GRACE_MS) == (1, 0, 1, 0)
        t.replay_assignments()
        assert t.reservation(b.reservation_id).state == "assigned"
        assert pending(t) == 2
        t.heartbeat(hb("n1", roster=["s2"], sandbox_count=1))
        assert t.reservation(b.reservation_id).state == "released"
        assert pending(t) == 1
    finally:
        t.close()


def test_an_assignment_that_came_first_through_another_replica_claims_it(
    server: RedisServer,
) -> None:
    """The gateway's assignment reached another replica after the rewind and
    before the replica that answered the placement wrote it back: the cell
    had no record of the reservation, and the binding keeps its id as a
    claim.  Written back, the reservation attaches to that sandbox at once
    (before, it stayed pending, unclaimed, for unassigned_reservation_ttl),
    and the roster that lists the sandbox releases it."""
    s = connect(server)
    b = placed_after_a_snapshot(server, s)
    t = restart_from_snapshot(server, s)
    other = Scheduler.connect(server.url, cell=CELL)  # knows nothing of `b`
    try:
        assert other.assign("s2", "n1", EP, b.reservation_id).reservation_id is None
        assert t.replay_reservations(LONG_GRACE_MS) == (1, 0, 1, 0)
        back = t.reservation(b.reservation_id)
        assert back.state == "assigned" and back.sandbox_id == "s2"
        assert back.expires_ms == back.created_ms + POLICY.reservation_ttl_ms
        assert pending(t) == 2
        # the assignment sent again charges nothing more
        other.assign("s2", "n1", EP, b.reservation_id)
        assert pending(t) == 2
        t.heartbeat(hb("n1", roster=["s2"], sandbox_count=1))
        assert t.reservation(b.reservation_id).state == "released"
        assert pending(t) == 1
    finally:
        other.close()
        t.close()


@pytest.mark.parametrize("claimed", [False, True])
def test_a_written_back_one_whose_sandbox_ended_is_released_by_two_heartbeats(
    server: RedisServer, claimed: bool
) -> None:
    """Its sandbox ran and ended before the settle (never listed again, its
    DELETE lost): the two-heartbeat rule releases it, also on a node that
    stamps nothing and creates nothing more.  Counted from the node's live
    reservations, as for a fresh assignment, it waited for as many more
    creations as were written back (189 stuck in the rdb-rollback-replica
    row)."""
    s = connect(server)
    s.heartbeat(hb("n1", roster=["s0"], sandbox_count=1))  # (roster mode)
    b = placed_after_a_snapshot(server, s)
    if not claimed:
        s.assign("s2", "n1", EP, b.reservation_id)
    t = restart_from_snapshot(server, s)
    other = Scheduler.connect(server.url, cell=CELL)
    try:
        if claimed:  # (through another replica, after the rewind)
            other.assign("s2", "n1", EP, b.reservation_id)
        assert t.replay_reservations(LONG_GRACE_MS)[0] == 1
        t.replay_assignments()
        assert t.reservation(b.reservation_id).state == "assigned"
        t.heartbeat(hb("n1", roster=["s0"], sandbox_count=1))
        assert t.reservation(b.reservation_id).state == "assigned"  # one is not enough
        t.heartbeat(hb("n1", roster=["s0"], sandbox_count=1))
        assert t.reservation(b.reservation_id).state == "released"
    finally:
        other.close()
        t.close()


def test_an_ended_one_is_not_revived(server: RedisServer) -> None:
    s = connect(server)
    a = s.schedule(Request.cold(1, 1024))
    b = s.schedule(Request.cold(1, 1024))
    assert a.reservation_id and b.reservation_id
    s.cancel(b.reservation_id)  # its tombstone says it ended
    try:
        assert s.replay_reservations(LONG_GRACE_MS) == (0, 0, 2, 0)
        assert s.reservation(b.reservation_id).state == "cancelled"
        assert pending(s) == 1
    finally:
        s.close()


def test_one_past_its_ttl_comes_back_expired(server: RedisServer) -> None:
    s = connect(server)
    b = placed_after_a_snapshot(server, s)
    t = restart_from_snapshot(server, s)
    try:
        t.advance_clock(POLICY.unassigned_reservation_ttl_ms + 1_000)
        live, ended, _, _ = t.replay_reservations(LONG_GRACE_MS)
        assert (live, ended) == (0, 1)
        assert t.reservation(b.reservation_id).state == "expired"
    finally:
        t.close()


def test_bad_input_is_refused_and_writes_nothing(server: RedisServer) -> None:
    s = connect(server)
    try:
        good = Placed(0.0, "r-good", "n1", 1, 1024, 1, 0.0)
        bad = Placed(0.0, "r-bad", "n1", -1, 1024, 1, 0.0)
        with pytest.raises(InvalidArgument) as e:
            s.run(s.ops.replay([(good, ""), (bad, "")], 0))
        assert "placements[1].cpu" in str(e.value)
        for rid in ("r-good", "r-bad"):
            with pytest.raises(NotFound):
                s.reservation(rid)
        assert pending(s) == 0
    finally:
        s.close()


def test_the_memo_is_bounded_by_count_and_window() -> None:
    memo = PlacementMemo(window_s=10.0, most=3)
    for i in range(5):
        memo.record(Placed(float(i), f"r{i}", "n1", 1, 1, i, 0.0))
    assert len(memo) == 3  # the oldest went first
    assert [p.reservation_id for p in memo.recent(5.0)] == ["r2", "r3", "r4"]
    assert [p.reservation_id for p in memo.recent(13.5)] == ["r4"]  # older than 10 s: gone
    assert memo.recent(100.0) == [] and len(memo) == 0
    # the default covers the rdb-rollback rows' 120 s snapshot, and stays bounded
    default = PlacementMemo()
    assert default.window_s >= 120 and default.most == REPLAY_PLACEMENTS_MOST
    assert default.window_s == REPLAY_PLACEMENTS_WINDOW_S


def _placed_id(call: Any) -> str:
    return str(dict(call.trailing_metadata() or ())["x-reservation-id"])


def test_every_replica_writes_back_what_it_answered_after_a_rewind(server: RedisServer) -> None:
    """Two replicas, one placement answered by each after the snapshot.  One
    replica settles the rewind; the other takes the new generation without
    settling again, and writes back its own placements too (before, only the
    settling replica replayed, and only assignments)."""
    settings = settings_for(POLICY, cell=CELL)
    with (
        ThreadedReplica(settings, lambda: async_client(server.url), server.url) as r1,
        ThreadedReplica(settings, lambda: async_client(server.url), server.url) as r2,
    ):
        assert r1.replica is not None and r2.replica is not None
        md = endpoint_md(EP)
        r1.stub.Heartbeat(hb_request("n1"), metadata=md, timeout=5)
        r1.stub.Schedule(cold(1, 16), timeout=5)
        ask(server, "save")
        ids = []
        for r in (r1, r2):
            _, call = r.stub.Schedule.with_call(cold(1, 16), timeout=5)
            ids.append(_placed_id(call))
        # each replica's probe has seen the cell after its placement
        wanted = int(ask(server, "hget", f"sched:{{{CELL}}}:stats", "probes") or 0) + 2
        for h in (r1.replica.history, r2.replica.history):

            def probed(h: HistoryWatch = h) -> bool:
                return h.last is not None and h.last.sequence >= wanted

            wait_until(probed, 10, "a probe")
        server.kill()
        server.start()
        s = Scheduler.connect(server.url, cell=CELL)
        try:

            def back() -> bool:
                try:
                    return all(s.reservation(rid).state == "pending" for rid in ids)
                except NotFound:
                    return False

            wait_until(back, 20, "both placements written back")
            assert pending(s) == 3  # the snapshot's one and the two written back, once each
            # one settle
            assert int(ask(server, "hget", f"sched:{{{CELL}}}:stats", "rewinds")) == 1
            replayed = 0.0
            for r in (r1, r2):
                assert r.replica is not None
                replayed += (
                    r.replica.metrics.registry.get_sample_value(
                        "sched_replayed_reservations_total", {"outcome": "live"}
                    )
                    or 0.0
                )
            assert replayed == 2
        finally:
            s.close()


@pytest.mark.parametrize("discovery", ["static", "heartbeat"])
def test_a_replica_writes_back_what_it_answered_after_redis_came_back_empty(
    server: RedisServer, discovery: str
) -> None:
    """Redis killed and restarted without its data: the replica's monitor
    finds no policy, restores the cell, and writes back the placement it
    answered, charged once.  A static list's node is restored with the
    policy, so at once; a node that registers by heartbeat only once it
    heartbeats again, by a later pass (before, the restore forgot the
    replica's history and the placement was lost)."""
    nodes = [("n1", EP)] if discovery == "static" else None
    settings = settings_for(POLICY, cell=CELL, nodes=nodes)
    with ThreadedReplica(settings, lambda: async_client(server.url), server.url) as r:
        assert r.replica is not None
        md = endpoint_md(EP)
        r.stub.Heartbeat(hb_request("n1"), metadata=md, timeout=5)
        _, call = r.stub.Schedule.with_call(cold(1, 16), timeout=5)
        rid = _placed_id(call)
        server.kill()
        server.wipe()
        server.start()
        s = Scheduler.connect(server.url, cell=CELL)
        try:
            # the replica's monitor restores the cell: nothing else calls it
            wait_until(
                lambda: ask(server, "exists", f"sched:{{{CELL}}}:policy") == 1, 20, "a restore"
            )
            if discovery == "heartbeat":
                with pytest.raises(NotFound):
                    s.reservation(rid)  # its node is unknown until it heartbeats
                r.stub.Heartbeat(hb_request("n1"), metadata=md, timeout=5)

            def back() -> bool:
                try:
                    return s.reservation(rid).state == "pending"
                except NotFound:
                    return False

            wait_until(back, 20, "the placement written back")
            assert pending(s) == 1  # charged once
            live = r.replica.metrics.registry.get_sample_value(
                "sched_replayed_reservations_total", {"outcome": "live"}
            )
            assert live == 1
        finally:
            s.close()
