"""Reservation lifecycle and bindings: every release path, exactly once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from scheduler import (
    FailedPrecondition,
    InvalidArgument,
    Limits,
    NotFound,
    Policy,
    Request,
    SandboxEvent,
    Scheduler,
    UnknownNode,
)
from tests.helpers import (
    GIB,
    bound_sandboxes_are_in_their_nodes_sets,
    hb,
    records_name_only_registered_nodes,
    snapshot_keys,
)

Make = Callable[..., Scheduler]
EP = "n1.local:5000"


def pending(s: Scheduler, node_id: str = "n1") -> tuple[int, int, int]:
    v = next(v for v in s.nodes() if v.node_id == node_id)
    return v.pending_reservations, v.cpu_reserved, v.memory_reserved_bytes


def projected_cpu(s: Scheduler, node_id: str = "n1") -> int:
    return next(v.cpu_projected for v in s.nodes() if v.node_id == node_id)


def test_timeline_place_assign_heartbeat_delete(make_scheduler: Make) -> None:
    s = make_scheduler()
    s.heartbeat(hb("n1", roster=["old"], sandbox_count=1, allocated_cpu=2))
    p = s.schedule(Request.cold(2, 4096))
    assert pending(s) == (1, 2, 4 * GIB) and projected_cpu(s) == 4
    a = s.assign("sb1", "n1", EP, p.reservation_id)
    assert a.reservation_id == p.reservation_id and not a.released
    assert s.lookup("sb1").node_id == "n1"
    assert s.reservation(p.reservation_id).state == "assigned"
    # heartbeat without the sandbox: still reserved, counted once
    s.heartbeat(hb("n1", roster=["old"], sandbox_count=1, allocated_cpu=2))
    assert pending(s) == (1, 2, 4 * GIB) and projected_cpu(s) == 4
    # heartbeat with it: released, still counted once (now by the node's own numbers)
    r = s.heartbeat(hb("n1", roster=["old", "sb1"], sandbox_count=2, allocated_cpu=4))
    assert r.released == 1
    assert pending(s) == (0, 0, 0) and projected_cpu(s) == 4
    assert s.reservation(p.reservation_id).state == "released"
    assert s.lookup("sb1").listed
    # delete: binding gone
    s.events("n1", [SandboxEvent(sandbox_id="sb1", event_type="DELETE")])
    with pytest.raises(NotFound, match="sandbox assignment not found"):
        s.lookup("sb1")
    st = s.stats()
    assert (st.reserved_total, st.assigned_total, st.released_total, st.pending) == (1, 1, 1, 0)


def test_assignment_after_the_roster_listed_it_releases_at_once(make_scheduler: Make) -> None:
    s = make_scheduler()
    s.heartbeat(hb("n1"))
    p = s.schedule(Request.cold(2, 1024))
    s.heartbeat(hb("n1", roster=["sb1"], sandbox_count=1, allocated_cpu=2))
    assert pending(s)[0] == 1  # the roster lists sb1, but nothing tied it to the reservation
    a = s.assign("sb1", "n1", EP)  # no reservation id: the node's newest unclaimed one
    assert a.reservation_id == p.reservation_id and a.released
    assert pending(s) == (0, 0, 0) and projected_cpu(s) == 2


@pytest.mark.parametrize("how", ["assign", "CREATE", "FORK"])
def test_a_sandbox_listed_by_a_node_gone_silent_is_still_counted_once(
    make_scheduler: Make, how: str
) -> None:
    """Past binding_ttl without a heartbeat, lookups no longer answer for a
    node's listed sandboxes, but its last numbers still include them: a
    reservation charged to one then is released at once, never left pending
    beside the snapshot that counts the sandbox (counted twice)."""
    s = make_scheduler(Policy(binding_ttl_ms=30_000, reservation_ttl_ms=600_000))
    s.heartbeat(hb("n1", roster=["a"], sandbox_count=1, allocated_cpu=1))
    p = s.schedule(Request.cold(2, 0))
    s.advance_clock(31_000)
    with pytest.raises(NotFound):
        s.lookup("a")  # (expired for lookups)
    if how == "assign":
        a = s.assign("a", "n1", EP)  # no reservation id: the node's newest unclaimed one
        assert a.reservation_id == p.reservation_id and a.released
        assert s.reservation(p.reservation_id or "").state == "released"
        assert pending(s) == (0, 0, 0) and projected_cpu(s) == 1
    else:
        # an event of a sandbox no reservation is charged to takes none: "a"
        # is the node's own (counted by its numbers), p's creation is on its way
        ev = s.events("n1", [SandboxEvent(sandbox_id="a", event_type=how)])
        assert (ev.acked, ev.released) == (0, 0)
        assert s.reservation(p.reservation_id or "").state == "pending"
        assert pending(s)[0] == 1 and projected_cpu(s) == 3
    assert s.lookup("a").node_id == "n1"  # (the node just reported it: bound again)


def test_counter_mode_releases_oldest_first_never_more_than_there_are(make_scheduler: Make) -> None:
    s = make_scheduler()
    s.heartbeat(hb("n1", create_successes=5))
    rids = [s.schedule(Request.cold(1, 0)).reservation_id for _ in range(3)]
    r = s.heartbeat(hb("n1", create_successes=7, sandbox_count=2))
    assert r.released == 2 and not r.roster_mode
    assert [s.reservation(x).state for x in rids] == ["released", "released", "pending"]  # type: ignore[arg-type]
    r = s.heartbeat(hb("n1", create_successes=12, sandbox_count=7))
    assert r.released == 1 and pending(s)[0] == 0
    assert s.stats().released_total == 3


def test_first_heartbeat_and_restart_baselines(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(static_nodes=True))
    s.sync_nodes([("n1", EP)])
    s.schedule(Request.cold(1, 0))
    # first heartbeat ever: its counter has no baseline, so it releases nothing
    assert s.heartbeat(hb("n1", create_successes=40)).released == 0
    s.schedule(Request.cold(1, 0))
    # restarted node: its counter starts again from 0
    r = s.heartbeat(hb("n1", sid="boot-2", create_successes=1))
    assert r.restarted and r.released == 1 and pending(s)[0] == 1


def test_create_event_acknowledges_and_the_next_heartbeat_releases(make_scheduler: Make) -> None:
    s = make_scheduler()
    s.heartbeat(hb("n1"))
    p1 = s.schedule(Request.cold(1, 0))
    p2 = s.schedule(Request.cold(1, 0))
    s.assign("sbA", "n1", EP)  # no reservation id: the newest unclaimed, p2
    ev = s.events("n1", [SandboxEvent(sandbox_id="sbA", event_type="CREATE")])
    assert ev.acked == 1
    assert s.reservation(p2.reservation_id or "").state == "acked"
    assert s.lookup("sbA").node_id == "n1"
    # counter mode, create_successes moved by the one creation: one release, not two
    r = s.heartbeat(hb("n1", create_successes=1, sandbox_count=1))
    assert r.released == 1
    assert s.reservation(p1.reservation_id or "").state == "pending"
    # a FORK child is charged no reservation (forks are never reserved): it
    # takes none of a creation on its way, and its DELETE releases none
    ev = s.events("n1", [SandboxEvent(sandbox_id="child", event_type="FORK")])
    assert (ev.acked, ev.released) == (0, 0)
    assert s.events("n1", [SandboxEvent(sandbox_id="child", event_type="DELETE")]).released == 0
    assert s.reservation(p1.reservation_id or "").state == "pending"
    assert pending(s)[0] == 1


def test_counter_mode_assigned_then_deleted_is_released_once(make_scheduler: Make) -> None:
    s = make_scheduler()
    s.heartbeat(hb("n1", create_successes=0))
    first = s.schedule(Request.cold(1, 0))
    second = s.schedule(Request.cold(1, 0))
    s.assign("short-lived", "n1", EP, first.reservation_id)
    ev = s.events("n1", [SandboxEvent(sandbox_id="short-lived", event_type="DELETE")])
    assert ev.released == 1 and pending(s)[0] == 1  # released at once, the baseline moved
    r = s.heartbeat(hb("n1", create_successes=1))  # the rise that covered it: nothing more
    assert r.released == 0 and pending(s)[0] == 1
    assert s.reservation(second.reservation_id or "").state == "pending"


def test_an_ack_alone_never_releases_before_the_node_counts_it(make_scheduler: Make) -> None:
    """Heartbeats and events race: a heartbeat whose snapshot predates the
    creation must not release the acknowledged reservation."""
    s = make_scheduler()
    s.heartbeat(hb("roster", roster=["old"], sandbox_count=1))
    assert s.schedule(Request.cold(1, 0)).node_id == "roster"
    s.heartbeat(hb("counter", create_successes=3))
    s.set_lingering("roster", True)
    assert s.schedule(Request.cold(1, 0)).node_id == "counter"
    s.set_lingering("roster", False)
    s.assign("r-new", "roster", "roster.local:5000")
    s.assign("c-new", "counter", "counter.local:5000")
    s.events("roster", [SandboxEvent(sandbox_id="r-new", event_type="CREATE")])
    s.events("counter", [SandboxEvent(sandbox_id="c-new", event_type="CREATE")])
    # snapshots taken before the creations: nothing is released
    assert s.heartbeat(hb("roster", roster=["old"], sandbox_count=1)).released == 0
    assert s.heartbeat(hb("counter", create_successes=3)).released == 0
    assert pending(s, "roster")[0] == 1 and pending(s, "counter")[0] == 1
    # the snapshots that include them release them
    assert s.heartbeat(hb("roster", roster=["old", "r-new"], sandbox_count=2)).released == 1
    assert s.heartbeat(hb("counter", create_successes=4, sandbox_count=1)).released == 1
    assert s.stats().pending == 0


def test_assignment_after_the_node_reported_the_delete(make_scheduler: Make) -> None:
    s = make_scheduler()
    s.heartbeat(hb("n1", roster=["old"], sandbox_count=1))
    p = s.schedule(Request.cold(1, 0))
    s.heartbeat(hb("n1", roster=["old", "brief"], sandbox_count=2))
    s.events("n1", [SandboxEvent(sandbox_id="brief", event_type="DELETE")])
    # the gateway's RecordAssignment arrives last: nothing may stay charged
    a = s.assign("brief", "n1", EP, p.reservation_id)
    assert a.reservation_id == p.reservation_id and a.released
    assert pending(s)[0] == 0
    with pytest.raises(NotFound, match="sandbox assignment not found"):
        s.lookup("brief")


def test_a_late_delete_from_the_node_a_sandbox_left_keeps_the_new_nodes_binding(
    make_scheduler: Make,
) -> None:
    """The sandbox moved to n2 (its roster lists it); n1's DELETE of its own
    copy comes after.  n2's binding stays: lookups answer n2, and n2's
    numbers still count the sandbox, so a reservation charged to it now is
    released at once."""
    s = make_scheduler()
    s.heartbeat(hb("n1", cpu=1, roster=["a"], sandbox_count=1, allocated_cpu=1))  # (full)
    s.heartbeat(hb("n2", roster=["a"], sandbox_count=1))
    assert s.lookup("a").node_id == "n2"
    s.events("n1", [SandboxEvent(sandbox_id="a", event_type="DELETE")])
    assert s.lookup("a").node_id == "n2"
    bound_sandboxes_are_in_their_nodes_sets(s)
    p = s.schedule(Request.cold(1, 0))
    assert p.node_id == "n2"
    a = s.assign("a", "n2", "n2.local:5000", p.reservation_id)
    assert a.reservation_id == p.reservation_id and a.released
    assert pending(s, "n2")[0] == 0
    # and a roster of n2 without it ends its binding as before
    s.heartbeat(hb("n2", roster=[], sandbox_count=0))
    with pytest.raises(NotFound):
        s.lookup("a")


def test_a_late_assignment_never_charges_a_deleted_sandbox_twice(make_scheduler: Make) -> None:
    """A roster listed the sandbox and its CREATE came (it takes no
    reservation: none is charged to it yet); the node deleted the sandbox;
    the gateway's RecordAssignment comes last.  It charges the sandbox one
    reservation, ended at once (the node reported it deleted): the other
    placement's reservation must stay (found by the stateful test)."""
    s = make_scheduler()
    s.heartbeat(hb("n1", roster=["old"], sandbox_count=1))
    first = s.schedule(Request.cold(1, 0))
    second = s.schedule(Request.cold(1, 0))
    s.heartbeat(hb("n1", roster=["old", "sb"], sandbox_count=2))
    ev = s.events("n1", [SandboxEvent(sandbox_id="sb", event_type="CREATE")])
    assert (ev.acked, ev.released) == (0, 0)
    s.events("n1", [SandboxEvent(sandbox_id="sb", event_type="DELETE")])
    late = s.assign("sb", "n1", EP)
    assert late.reservation_id == first.reservation_id and late.released
    assert s.reservation(first.reservation_id or "").state == "released"
    assert s.reservation(second.reservation_id or "").state == "pending"
    assert pending(s)[0] == 1
    late = s.assign("sb", "n1", EP)  # again: nothing more
    assert late.reservation_id is None and not late.released
    assert pending(s)[0] == 1


def test_roster_mode_delete_releases_what_will_never_be_listed(make_scheduler: Make) -> None:
    s = make_scheduler()
    s.heartbeat(hb("n1", roster=["old"], sandbox_count=1))
    p = s.schedule(Request.cold(1, 0))
    s.assign("gone-fast", "n1", EP, p.reservation_id)
    ev = s.events("n1", [SandboxEvent(sandbox_id="gone-fast", event_type="DELETE")])
    assert ev.released == 1 and pending(s)[0] == 0


def test_cancel(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=1)))
    s.heartbeat(hb("n1"))
    p = s.schedule(Request.cold(2, 1024))
    assert s.cancel(p.reservation_id or "") == "n1"
    assert pending(s) == (0, 0, 0)
    s.schedule(Request.cold(2, 1024))  # the room is free again
    again = f"reservation {p.reservation_id} already cancelled"
    with pytest.raises(FailedPrecondition, match=again):
        s.cancel(p.reservation_id or "")
    with pytest.raises(NotFound, match="reservation nope not found"):
        s.cancel("nope")
    with pytest.raises(InvalidArgument):
        s.cancel("bad:id")
    assert s.stats().cancelled_total == 1


def test_expiry_after_ttl_frees_the_room(make_scheduler: Make) -> None:
    """A caller that dies after scheduling: its reservation holds until the TTL."""
    s = make_scheduler(
        Policy(
            limits=Limits(max_sandbox_count=1), reservation_ttl_ms=60_000, report_ttl_ms=3_600_000
        )
    )
    s.heartbeat(hb("n1"))
    s.advance_clock(0, "freeze")
    dead = s.schedule(Request.cold(1, 0))  # ... and the caller is gone
    s.advance_clock(59_999)
    with pytest.raises(Exception, match="1 at max_sandbox_count"):
        s.schedule(Request.cold(1, 0))
    s.advance_clock(1)
    p = s.schedule(Request.cold(1, 0))  # the sweep inside this call freed the room
    assert p.node_id == "n1"
    assert s.reservation(dead.reservation_id or "").state == "expired"
    assert s.stats().expired_total == 1


def test_sweep_is_bounded_per_call(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(reservation_ttl_ms=1000))
    s.heartbeat(hb("n1", cpu=0, mem_gib=0))
    for _ in range(100):
        s.schedule(Request.cold(0, 0))
    s.advance_clock(5000)
    s.heartbeat(hb("n1", cpu=0, mem_gib=0))  # one call: at most 64 expire
    assert s.stats().pending == 36 and s.stats().expired_total == 64
    s.heartbeat(hb("n1", cpu=0, mem_gib=0))
    assert s.stats().pending == 0 and s.stats().expired_total == 100
    assert pending(s) == (0, 0, 0)


def test_bindings_follow_rosters(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(binding_ttl_ms=10_000))
    s.heartbeat(hb("n1", roster=["a", "b"]))
    s.heartbeat(hb("n2", roster=["c"]))
    assert [s.lookup(x).node_id for x in "abc"] == ["n1", "n1", "n2"]
    assert s.lookup("a").endpoint == EP
    # b moves to n2; a drops out of n1's roster
    s.heartbeat(hb("n2", roster=["c", "b"]))
    s.heartbeat(hb("n1", roster=[]))
    with pytest.raises(NotFound):
        s.lookup("a")
    assert s.lookup("b").node_id == "n2"
    assert s.client.smembers(s.keys.node_sbx("n1")) == set()
    # an assignment not yet listed survives an empty roster, but not its TTL
    s.assign("fresh", "n1", EP)
    s.heartbeat(hb("n1", roster=[]))
    assert s.lookup("fresh").node_id == "n1"
    s.advance_clock(10_001)
    with pytest.raises(NotFound, match="sandbox assignment not found"):
        s.lookup("fresh")
    # rosters refresh the TTL
    s.heartbeat(hb("n2", roster=["c", "b"]))
    s.advance_clock(9_000)
    assert s.lookup("c").node_id == "n2"


def test_listed_bindings_carry_no_key_expiry(make_scheduler: Make, redis_client: Any) -> None:
    """A binding's key TTL only collects garbage: an assignment not yet listed
    has one, a roster lifts it (else Redis would drop a live binding), and a
    sandbox a roster lists first never gets one."""
    s = make_scheduler(Policy(binding_ttl_ms=60_000))
    s.heartbeat(hb("n1"))
    p = s.schedule(Request.cold(1, 0))
    s.assign("assigned", "n1", EP, p.reservation_id)
    assert 0 < redis_client.pttl(s.keys.bind("assigned")) <= 60_000
    r = s.heartbeat(hb("n1", roster=["assigned", "direct"], sandbox_count=2))
    assert r.released == 1
    assert redis_client.pttl(s.keys.bind("assigned")) == -1
    assert redis_client.pttl(s.keys.bind("direct")) == -1
    assert [s.lookup(x).node_id for x in ("assigned", "direct")] == ["n1", "n1"]
    # once a roster drops it, a reported delete leaves a tombstone that expires
    s.heartbeat(hb("n1", roster=["assigned"], sandbox_count=1))
    s.events("n1", [SandboxEvent(sandbox_id="direct", event_type="DELETE")])
    assert 0 < redis_client.pttl(s.keys.bind("direct")) <= 60_000


def test_a_listed_binding_is_the_whole_record(make_scheduler: Make, redis_client: Any) -> None:
    """A roster that lists an assigned sandbox rewrites only what changed of
    its binding, a tombstone it lists again is rewritten whole: either way
    the record reads as if written afresh (the node's endpoint of now)."""
    s = make_scheduler(Policy(binding_ttl_ms=60_000))
    s.heartbeat(hb("n1", endpoint="old.local:1"))
    p = s.schedule(Request.cold(1, 0))
    s.assign("sb", "n1", "old.local:1", p.reservation_id)

    def record(sb: str) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in redis_client.hgetall(s.keys.bind(sb)).items()}

    def expiry() -> str:  # binding_ttl after the node's last heartbeat
        seen = int(redis_client.hget(s.keys.node("n1"), "last_seen_ms"))
        return str(seen + 60_000)

    r = s.heartbeat(hb("n1", endpoint="new.local:2", roster=["sb"], sandbox_count=1))
    assert r.released == 1
    assert record("sb") == {
        "sandbox_id": "sb",
        "node_id": "n1",
        "endpoint": "new.local:2",
        "listed": "1",
        "reservation_id": p.reservation_id,
        "expires_ms": expiry(),
        "deleted": "0",
    }
    s.heartbeat(hb("n1", endpoint="new.local:2", roster=[], sandbox_count=0))
    s.events("n1", [SandboxEvent(sandbox_id="sb", event_type="DELETE")])
    assert record("sb")["deleted"] == "1"
    s.advance_clock(1000)
    s.heartbeat(hb("n1", endpoint="third.local:3", roster=["sb"], sandbox_count=1))
    # (the roster dropped it before the delete: its binding, and the charge
    # with it, went; the tombstone charged nothing)
    assert record("sb") == {
        "sandbox_id": "sb",
        "node_id": "n1",
        "endpoint": "third.local:3",
        "listed": "1",
        "reservation_id": "",
        "expires_ms": expiry(),
        "deleted": "0",
    }
    assert s.lookup("sb").endpoint == "third.local:3"


def test_heartbeats_collect_assignments_whose_binding_expired(
    make_scheduler: Make, redis_client: Any
) -> None:
    """An assignment never listed leaves its node's node-sbx set once Redis
    expired its binding: every other heartbeat samples two members.  So does
    a listed sandbox a version that kept every binding there left in it (a
    listed one belongs to the roster set only)."""
    s = make_scheduler(Policy(binding_ttl_ms=60_000))
    s.heartbeat(hb("n1", roster=["a"], sandbox_count=1))
    for sb in ("x1", "x2", "x3"):
        s.assign(sb, "n1", EP)
    for sb in ("x1", "x2"):
        redis_client.delete(s.keys.bind(sb))  # (as Redis expires a key past its TTL)
    redis_client.sadd(s.keys.node_sbx("n1"), "a")  # (as an older version left it)
    for i in range(80):  # each a delta: j<i> joins, j<i-1> leaves
        s.heartbeat(hb("n1", roster=["a", f"j{i}"], sandbox_count=2))
    # (missing one of the three over 40 samples of two among at most four: below 1e-9)
    assert s.client.smembers(s.keys.node_sbx("n1")) == {b"x3"}
    assert s.client.smembers(s.keys.node_roster("n1")) == {b"a", b"j79"}
    assert [s.lookup(sb).node_id for sb in ("a", "x3", "j79")] == ["n1"] * 3


def test_assignment_to_an_unknown_node_writes_nothing(make_scheduler: Make) -> None:
    s = make_scheduler()
    s.heartbeat(hb("n1"))
    before = snapshot_keys(s.client)
    with pytest.raises(UnknownNode, match="node is not in scheduler node list"):
        s.assign("sb1", "ghost", "ghost:1")
    with pytest.raises(UnknownNode, match="node is not in scheduler node list"):
        s.assign("sb1", "n1", "wrong-endpoint:1")
    with pytest.raises(InvalidArgument, match="node_id and endpoint are required"):
        s.assign("sb1", "n1", "")
    assert snapshot_keys(s.client) == before


def test_unregister(make_scheduler: Make) -> None:
    s = make_scheduler()
    s.heartbeat(hb("n1", roster=["a"]))
    s.schedule(Request.cold(1, 0))
    with pytest.raises(FailedPrecondition, match="service instance mismatch"):
        s.unregister("n1", "other-boot")
    assert s.unregister("n1", "boot-1") is True
    assert s.unregister("n1", "boot-1") is False  # idempotent
    with pytest.raises(NotFound):
        s.lookup("a")
    assert s.nodes() == [] and s.stats().pending == 0 and s.stats().cancelled_total == 1
    with pytest.raises(InvalidArgument, match="node_id and service_instance_id are required"):
        s.unregister("n1", " ")


def test_static_node_unregister_keeps_a_bare_record(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(static_nodes=True))
    s.sync_nodes([("n1", EP), ("n2", "n2:1")])
    s.heartbeat(hb("n1"))
    s.unregister("n1", "boot-1")
    v = next(v for v in s.nodes() if v.node_id == "n1")
    assert v.status == "CONNECTING" and v.endpoint == EP and v.last_seen_ms is None
    records_name_only_registered_nodes(s)
    s.heartbeat(hb("n1", sid="boot-2"))  # it may come back
    # leaving the static list removes a node entirely
    s.sync_nodes([("n1", EP)])
    assert [v.node_id for v in s.nodes()] == ["n1"]
    records_name_only_registered_nodes(s)
    with pytest.raises(UnknownNode):
        s.heartbeat(hb("n2"))


def test_counters_for_operators(make_scheduler: Make, redis_client: Any) -> None:
    s = make_scheduler(Policy(reservation_ttl_ms=1000))
    s.heartbeat(hb("n1"))
    a, b, c = (s.schedule(Request.cold(1, 0)) for _ in range(3))
    s.cancel(a.reservation_id or "")
    s.assign("sb", "n1", EP, b.reservation_id)
    s.heartbeat(hb("n1", roster=["sb"], sandbox_count=1))
    s.advance_clock(2000)
    s.heartbeat(hb("n1", roster=["sb"], sandbox_count=1))
    st = s.stats()
    assert (
        st.pending,
        st.reserved_total,
        st.cancelled_total,
        st.released_total,
        st.expired_total,
    ) == (0, 3, 1, 1, 1)
    raw = redis_client.hgetall(s.keys.stats)
    assert raw[b"expired_total"] == b"1" and raw[b"reserved_total"] == b"3"
    assert c.reservation_id


def test_a_sandbox_listed_again_after_its_delete_is_bound_and_in_its_nodes_set(
    make_scheduler: Make,
) -> None:
    """An assignment is in its node's node-sbx set until a roster lists it,
    then in the roster set only; a deletion's tombstone names the node but is
    in neither, so a sandbox its roster lists again after a DELETE event is
    bound and in the roster set again."""
    s = make_scheduler()
    s.heartbeat(hb("n1", roster=["a"], sandbox_count=1))
    p = s.schedule(Request.cold(1, 1024))
    s.assign("b", "n1", EP, p.reservation_id)  # assigned before it is listed
    assert s.client.smembers(s.keys.node_sbx("n1")) == {b"b"}
    bound_sandboxes_are_in_their_nodes_sets(s)
    s.heartbeat(hb("n1", roster=["a", "b"], sandbox_count=2))
    assert s.client.smembers(s.keys.node_sbx("n1")) == set()
    assert s.client.smembers(s.keys.node_roster("n1")) == {b"a", b"b"}
    s.events("n1", [SandboxEvent(sandbox_id="a", event_type="DELETE")])
    s.heartbeat(hb("n1", roster=["b"], sandbox_count=1))
    assert s.client.smembers(s.keys.node_roster("n1")) == {b"b"}
    s.heartbeat(hb("n1", roster=["a", "b"], sandbox_count=2))  # listed again
    assert s.lookup("a").node_id == "n1"
    assert s.client.smembers(s.keys.node_roster("n1")) == {b"a", b"b"}
    assert s.client.smembers(s.keys.node_sbx("n1")) == set()
    bound_sandboxes_are_in_their_nodes_sets(s)
