"""Counted exactly once, as real nodes behave (issue #28): one test per scenario.

Each test drives one scenario of the issue against a real ``redis-server``
(through real ``schedctl serve`` replicas where the scenario involves more
than one, or a field only the wire carries) and asserts the invariant of
docs/design.md "What each event does to a creation's count": never counted
twice once the node's numbers include it, never dropped before an event that
ends it, capacity held by a creation that provably did not happen or already
ended given back within two heartbeat intervals of its node, and no event in
any order putting a node over a ceiling.

Each scenario the issue names has a test that failed on the code before
the rule that fixed it (none is marked xfail any more); the others guard
an invariant that held then and must keep holding, such as a late or
too-early heartbeat never releasing a creation still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import redis

from scheduler import (
    Limits,
    NoNodesAvailable,
    Policy,
    Request,
    SandboxEvent,
    Scheduler,
)
from scheduler.domain.catalog import STAMP_MARGIN_MS
from scheduler.domain.records import Placement
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.testing.redis_server import RedisServer, free_port
from scheduler.testing.replicas import ServeProcess, close_all
from tests.helpers import cold, endpoint_md, hb, hb_request

pytestmark = pytest.mark.real_only
Make = Callable[..., Scheduler]
EP = "n1.local:5000"


def view(s: Scheduler, node_id: str = "n1") -> Any:
    return next(v for v in s.nodes() if v.node_id == node_id)


def counted(s: Scheduler, node_id: str = "n1") -> int:
    """What a count ceiling compares for the node: running + starting + pending."""
    v = view(s, node_id)
    return int(v.sandbox_count + v.sandbox_starting_count + v.pending_reservations)


def pending(s: Scheduler, node_id: str = "n1") -> int:
    return int(view(s, node_id).pending_reservations)


def state(s: Scheduler, p: Placement) -> str:
    """The state of the reservation ``p`` was placed under."""
    assert p.reservation_id
    return str(s.reservation(p.reservation_id).state)


def ev(sandbox_id: str, kind: str) -> SandboxEvent:
    return SandboxEvent(sandbox_id=sandbox_id, event_type=kind)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Capacity held by sandboxes that are gone
# ---------------------------------------------------------------------------
def test_a_sandbox_created_and_deleted_between_heartbeats_with_its_delete_lost(
    make_scheduler: Make,
) -> None:
    """Never listed, its DELETE lost: two heartbeats later its slot is back.
    (The node's heartbeats carry create_successes, as the reference reporter
    sends them: the two rosters are taken after sb1 was created.)"""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1, create_successes=1))
    p = s.schedule(Request.cold(1, 1024))
    s.assign("sb1", "n1", EP)  # as the reference gateway: no reservation id
    assert counted(s) == 2
    # sb1 lived half a second: created and gone between two heartbeats
    s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1, create_successes=2))
    assert state(s, p) == "assigned"  # one roster is not yet two
    s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1, create_successes=2))
    assert state(s, p) not in ("pending", "assigned", "acked")
    assert counted(s) == 1


def test_late_rosters_taken_before_an_assigned_sandbox_was_created_keep_it(
    make_scheduler: Make,
) -> None:
    """Heartbeats that arrive after an assignment but were taken before its
    sandbox existed (a node that reports three heartbeats late, as
    test_bench's ceiling scenario) do not count as absent: its counter had
    not reached the creation yet.  The creation is never dropped early."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1, create_successes=1))
    p = s.schedule(Request.cold(1, 1024))
    other = s.schedule(Request.cold(1, 1024))
    s.assign("sb1", "n1", EP, p.reservation_id)
    for _ in range(3):  # late: taken before sb1 (and the other) were created
        s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1, create_successes=1))
    assert state(s, p) == "assigned"
    assert state(s, other) == "pending"
    assert counted(s) == 3
    # now a roster taken after both creations: it lists sb1 (running)
    s.heartbeat(hb("n1", roster=["keep", "sb1", "sb2"], sandbox_count=3, create_successes=3))
    assert state(s, p) == "released"


@pytest.mark.parametrize("named", [True, False], ids=["named", "without-id"])
def test_a_gone_sandbox_is_released_while_another_creation_is_on_its_way(
    make_scheduler: Make, named: bool
) -> None:
    """Stamped heartbeats (reported_at_unix_ms, as the reference reporter
    stamps every one): of two received after the assignment, the second was
    taken after the first was answered, so after the assignment.  Another
    creation still on its way (its create never returns), or the one an
    assignment without id left unclaimed, no longer holds the release back."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    keep = {"roster": ["keep"], "sandbox_count": 1}
    s.heartbeat(hb("n1", **keep, create_successes=1, reported_at_unix_ms=1_000))
    s.schedule(Request.cold(1, 1024))  # its create never comes
    p = s.schedule(Request.cold(1, 1024))
    charged = s.assign("sb1", "n1", EP, p.reservation_id if named else None).reservation_id
    assert charged  # (without id: the newest unclaimed, its own)
    assert counted(s) == 3
    # sb1 was created (create_successes 2) and is gone, its DELETE lost
    s.heartbeat(hb("n1", **keep, create_successes=2, reported_at_unix_ms=6_000))
    assert s.reservation(charged).state == "assigned"  # one heartbeat is not yet two
    s.heartbeat(hb("n1", **keep, create_successes=2, reported_at_unix_ms=11_000))
    assert s.reservation(charged).state == "released"
    assert counted(s) == 2  # keep + the creation still on its way


def test_a_gone_sandbox_is_released_across_a_restart_of_the_nodes_agent(
    make_scheduler: Make,
) -> None:
    """The new instance counts from 0, so its counter never reaches the
    creation's; its stamped heartbeats still count as received after the
    assignment."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    keep = {"roster": ["keep"], "sandbox_count": 1}
    s.heartbeat(hb("n1", sid="boot-1", **keep, create_successes=5, reported_at_unix_ms=1_000))
    p = s.schedule(Request.cold(1, 1024))
    s.assign("sb1", "n1", EP, p.reservation_id)
    s.heartbeat(hb("n1", sid="boot-1", **keep, create_successes=6, reported_at_unix_ms=6_000))
    assert state(s, p) == "assigned"
    s.heartbeat(hb("n1", sid="boot-2", **keep, create_successes=0, reported_at_unix_ms=11_000))
    assert state(s, p) == "released"
    assert counted(s) == 1


def test_a_roster_node_that_restarts_empty_keeps_giving_gone_sandboxes_back(
    make_scheduler: Make,
) -> None:
    """LossyLifecycle's failure after the moves merge: a roster node's last
    listed sandbox ends (its DELETE lost) and its agent restarts, so the new
    instance's rosters are empty.  The restart keeps the node in roster mode
    (an empty roster is an empty node): the new instance's counter rise does
    not release a reservation by guess (here the older gone creation's,
    leaving the newer one's to its expiry), and the two-heartbeat rule gives
    both gone creations back."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    keep = {"roster": ["keep"], "sandbox_count": 1}
    s.heartbeat(hb("n1", sid="boot-0", **keep, create_successes=0, reported_at_unix_ms=1_000))
    older = s.schedule(Request.cold(1, 1024))
    s.assign("sb-old", "n1", EP, older.reservation_id)
    # sb-old and keep end, their DELETEs lost; the agent restarts (boot-1)
    # and creates sb-new, which is assigned and ends, its DELETE lost
    newer = s.schedule(Request.cold(1, 1024))
    s.assign("sb-new", "n1", EP, newer.reservation_id)
    assert counted(s) == 3
    empty = {"roster": [], "sandbox_count": 0, "create_successes": 1}
    r = s.heartbeat(hb("n1", sid="boot-1", **empty, reported_at_unix_ms=6_000))
    assert r.roster_mode
    assert (state(s, older), state(s, newer)) == ("assigned", "assigned")
    s.heartbeat(hb("n1", sid="boot-1", **empty, reported_at_unix_ms=11_000))
    assert (state(s, older), state(s, newer)) == ("released", "released")
    assert counted(s) == 0


def test_a_stamped_heartbeat_taken_before_the_sandbox_started_counts_once(
    make_scheduler: Make,
) -> None:
    """The heartbeat on its way at the assignment, taken before sb1 started,
    does not list it: it counts as one absence, and nothing more when it
    comes again (a retry: the same stamp).  The next one, taken after its
    answer, lists sb1: the creation is never dropped early."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    keep = {"roster": ["keep"], "sandbox_count": 1}
    s.heartbeat(hb("n1", **keep, create_successes=1, reported_at_unix_ms=1_000))
    p = s.schedule(Request.cold(1, 1024))
    s.assign("sb1", "n1", EP, p.reservation_id)
    on_its_way = hb("n1", **keep, create_successes=1, reported_at_unix_ms=6_000)
    for _ in range(3):
        s.heartbeat(on_its_way)
    assert state(s, p) == "assigned"
    assert counted(s) == 2
    s.heartbeat(
        hb(
            "n1",
            roster=["keep", "sb1"],
            sandbox_count=2,
            create_successes=2,
            reported_at_unix_ms=11_000,
        )
    )
    assert state(s, p) == "released"
    assert counted(s) == 2


class NodeClock:
    """A node's reporter on a frozen cell clock: its stamps are the cell's
    instant plus the node's own clock offset, and each heartbeat reaches
    the cell ``transit`` ms after it was stamped."""

    OFFSET = 3_600_123  # the node's clock runs an hour and change ahead

    def __init__(self, s: Scheduler) -> None:
        self.s = s
        self.now = s.advance_clock(0, "freeze")

    def passes(self, ms: int) -> None:
        self.now = self.s.advance_clock(ms)

    def stamped(self, transit: int = 0, **fields: Any) -> Any:
        """A heartbeat stamped now, taken ``transit`` ms before the cell hears it."""
        return hb("n1", reported_at_unix_ms=self.now - transit + self.OFFSET, **fields)


KEEP = {"roster": ["keep"], "sandbox_count": 1}


def test_a_gone_sandbox_is_released_by_the_first_heartbeat_taken_after_it(
    make_scheduler: Make,
) -> None:
    """sb1 is created, assigned and gone between two heartbeats, its DELETE
    lost.  The first heartbeat whose stamp, placed on the cell's clock by
    the node's own earlier heartbeats, says it was taken a margin after the
    assignment gives the slot back: its roster was read after sb1 started
    (on main: not before the second heartbeat, 5-10 s of a slot held by a
    sandbox that is gone)."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    c = NodeClock(s)
    s.heartbeat(c.stamped(transit=3, **KEEP, create_successes=1))
    c.passes(5_000)
    s.heartbeat(c.stamped(transit=40, **KEEP, create_successes=1))  # (a slower one)
    p = s.schedule(Request.cold(1, 1024))
    c.passes(300)
    s.assign("sb1", "n1", EP)  # as the reference gateway: no reservation id
    assert counted(s) == 2
    c.passes(4_700)  # sb1 lived half a second
    s.heartbeat(c.stamped(transit=5, **KEEP, create_successes=2))
    assert state(s, p) == "released"
    assert counted(s) == 1


def test_a_heartbeat_taken_within_the_margin_of_the_assignment_does_not_count_alone(
    make_scheduler: Make,
) -> None:
    """A heartbeat stamped less than the margin after the assignment may have
    read its roster before sb1 started: one absence, not a release; sb1 is
    listed by the next one and counted once."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    c = NodeClock(s)
    s.heartbeat(c.stamped(**KEEP))
    c.passes(5_000)
    s.heartbeat(c.stamped(**KEEP))
    p = s.schedule(Request.cold(1, 1024))
    s.assign("sb1", "n1", EP, p.reservation_id)
    c.passes(STAMP_MARGIN_MS - 1)
    s.heartbeat(c.stamped(**KEEP))
    assert state(s, p) == "assigned"
    assert counted(s) == 2
    c.passes(5_000)
    s.heartbeat(c.stamped(roster=["keep", "sb1"], sandbox_count=2))
    assert state(s, p) == "released"
    assert counted(s) == 2


@pytest.mark.parametrize("restart", [False, True], ids=["same-instance", "restarted"])
def test_a_late_heartbeat_taken_before_the_sandbox_started_does_not_count_alone(
    make_scheduler: Make, restart: bool
) -> None:
    """A heartbeat taken before sb1 started and stuck in a queue until long
    after its assignment: its stamp places it before the assignment, so it
    is one absence (the two-heartbeat rule's), never a release.  A restarted
    agent's first heartbeat has no lead of its instance to place it: one
    absence too.  sb1, still running, is listed by the next one and counted
    once; it is never dropped early."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    c = NodeClock(s)
    s.heartbeat(c.stamped(**KEEP))
    c.passes(5_000)
    s.heartbeat(c.stamped(**KEEP))
    c.passes(2_000)
    sid = "boot-2" if restart else "boot-1"
    late = c.stamped(sid=sid, **KEEP)
    p = s.schedule(Request.cold(1, 1024))
    c.passes(500)
    s.assign("sb1", "n1", EP, p.reservation_id)
    c.passes(30_000)  # the late one arrives 30.5 s after it was taken
    s.heartbeat(late)
    assert state(s, p) == "assigned"
    assert counted(s) == 2
    s.heartbeat(c.stamped(sid=sid, roster=["keep", "sb1"], sandbox_count=2))
    assert state(s, p) == "released"
    assert counted(s) == 2


def test_a_sandbox_created_and_deleted_between_heartbeats_with_its_delete(
    make_scheduler: Make,
) -> None:
    """Roster mode, the DELETE arrives: the reservation ends at once, once."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1))
    other = s.schedule(Request.cold(1, 1024))
    s.schedule(Request.cold(1, 1024))
    s.assign("sb1", "n1", EP)  # (no id: the newest unclaimed, not other's)
    s.events("n1", [ev("sb1", "CREATE"), ev("sb1", "DELETE")])
    assert counted(s) == 2  # keep + the other creation still on its way
    s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1))
    assert counted(s) == 2
    assert state(s, other) == "pending"  # never dropped early


def test_counter_mode_a_short_sandbox_is_released_by_the_counter(make_scheduler: Make) -> None:
    """Counter mode, every event lost: create_successes rising releases it, once."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("n1", create_successes=5))
    s.schedule(Request.cold(1, 1024))
    s.assign("sb1", "n1", EP)
    second = s.schedule(Request.cold(1, 1024))
    # sb1 was created and is gone: the counter rose by one, nothing runs
    s.heartbeat(hb("n1", create_successes=6))
    assert counted(s) == 1
    assert state(s, second) == "pending"
    s.heartbeat(hb("n1", create_successes=6))
    assert counted(s) == 1


def test_the_switch_from_counter_to_roster_mode_keeps_no_dead_reservation(
    make_scheduler: Make,
) -> None:
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("n1", create_successes=0))
    s.schedule(Request.cold(1, 1024))
    s.assign("sb1", "n1", EP)
    # sb1 was created and deleted; then the node's first roster (another sandbox)
    s.heartbeat(hb("n1", roster=["sb2"], sandbox_count=1, create_successes=2))
    s.heartbeat(hb("n1", roster=["sb2"], sandbox_count=1, create_successes=2))
    s.heartbeat(hb("n1", roster=["sb2"], sandbox_count=1, create_successes=2))
    assert counted(s) == 1


def test_counter_mode_delete_releases_its_reservation_once(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("n1", create_successes=0))
    first = s.schedule(Request.cold(1, 1024))
    s.assign("sb1", "n1", EP)
    second = s.schedule(Request.cold(1, 1024))  # its create still on the way
    s.events("n1", [ev("sb1", "CREATE"), ev("sb1", "DELETE")])
    assert state(s, first) == "released"
    assert counted(s) == 1
    # the counter rose for sb1: the DELETE already accounted for it
    s.heartbeat(hb("n1", create_successes=1))
    assert state(s, second) == "pending"
    assert counted(s) == 1


def test_counter_mode_an_assignment_after_its_rise_takes_no_other_reservation(
    make_scheduler: Make,
) -> None:
    """The lifecycle machine's failure on counter-mode c0: the rise that
    counted sb1 came before sb1's assignment and released its reservation
    (then unclaimed).  The assignment, without a reservation id as the
    reference gateway sends it, must take that one, already ended, not the
    placement on its way since: sb1's DELETE would end that one early."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=5)))
    s.heartbeat(hb("n1", create_successes=0))
    first = s.schedule(Request.cold(1, 1024))
    assert s.heartbeat(hb("n1", create_successes=1, sandbox_count=1)).released == 1
    on_its_way = s.schedule(Request.cold(1, 1024))
    assert s.assign("sb1", "n1", EP).reservation_id == first.reservation_id
    s.events("n1", [ev("sb1", "DELETE")])
    assert state(s, on_its_way) == "pending"
    # the DELETE ended nothing: the next heartbeat's numbers drop sb1
    assert s.heartbeat(hb("n1", create_successes=1)).released == 0
    assert state(s, on_its_way) == "pending"
    assert counted(s) == 1
    # its own creation's assignment takes it; the rise that counts it ends it
    assert s.assign("sb2", "n1", EP).reservation_id == on_its_way.reservation_id
    assert s.heartbeat(hb("n1", create_successes=2, sandbox_count=1)).released == 1
    assert state(s, on_its_way) == "released"
    assert counted(s) == 1


def test_counter_mode_an_assignment_after_its_rise_and_its_delete_takes_no_other(
    make_scheduler: Make,
) -> None:
    """As above with sb1's DELETE before its assignment: the tombstone takes
    the reservation the rise released, and the next creation's assignment
    its own pending one, which a DELETE then ends once."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=5)))
    s.heartbeat(hb("n1", create_successes=0))
    first = s.schedule(Request.cold(1, 1024))
    s.heartbeat(hb("n1", create_successes=1, sandbox_count=1))
    on_its_way = s.schedule(Request.cold(1, 1024))
    s.events("n1", [ev("sb1", "DELETE")])
    assert s.assign("sb1", "n1", EP).reservation_id == first.reservation_id
    assert state(s, on_its_way) == "pending"
    assert s.assign("sb2", "n1", EP).reservation_id == on_its_way.reservation_id
    assert s.assign("sb1", "n1", EP).reservation_id is None  # (charged once)
    assert state(s, on_its_way) == "assigned"
    s.events("n1", [ev("sb2", "DELETE")])
    assert state(s, on_its_way) == "released"
    # sb2's creation moved the counter: its DELETE's baseline move covers it
    assert s.heartbeat(hb("n1", create_successes=2)).released == 0
    assert counted(s) == 0


@pytest.mark.parametrize("named", [True, False], ids=["named", "without-id"])
def test_counter_mode_a_delete_of_a_creation_the_rise_counted_drops_no_other(
    make_scheduler: Make, named: bool
) -> None:
    """The lifecycle machine's failure on counter-mode c0 (MovingLifecycle,
    issue #28): one rise counted sb1 (assigned) and sb4 (created, its
    assignment still to come) and released sb1's and, by guess, the oldest
    pending one, third's, whose creation was still on its way.  Third's
    sandbox then came up and its assignment took third's reservation (the
    rise's unclaimed one); sb4's assignment took its own, fourth's.  sb4's
    DELETE must not end it: sb4 was counted already, and fourth's
    reservation is what holds sb3's room until a rise counts sb3."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=5)))
    s.heartbeat(hb("n1", create_successes=0))
    first = s.schedule(Request.cold(1, 1024))
    third = s.schedule(Request.cold(1, 1024))
    fourth = s.schedule(Request.cold(1, 1024))
    assert s.assign("sb1", "n1", EP, first.reservation_id).reservation_id == first.reservation_id
    # sb1 and sb4 created: the rise of 2 releases first's and the oldest pending, third's
    assert s.heartbeat(hb("n1", create_successes=2, sandbox_count=2)).released == 2
    assert (state(s, first), state(s, third), state(s, fourth)) == (
        "released",
        "released",
        "pending",
    )
    # sb3 comes up (not counted yet) and is recorded under its own id
    assert s.assign("sb3", "n1", EP, third.reservation_id).reservation_id == third.reservation_id
    got = s.assign("sb4", "n1", EP, fourth.reservation_id if named else None)
    assert got.reservation_id == fourth.reservation_id
    s.events("n1", [ev("sb4", "DELETE")])
    # sb3 runs, no heartbeat counted it: fourth's reservation holds its room
    assert pending(s) == 1
    assert state(s, fourth) == "assigned"
    # the rise that counts sb3 ends it; nothing is left over or counted twice
    assert s.heartbeat(hb("n1", create_successes=3, sandbox_count=2)).released == 1
    assert state(s, fourth) == "released"
    assert counted(s) == 2


# ---------------------------------------------------------------------------
# Reservations that end without a trace
# ---------------------------------------------------------------------------
#: the default of unassigned_reservation_ttl (docs/design.md)
UNASSIGNED_TTL_MS = 90_000


def test_a_schedule_never_followed_by_a_create_gives_its_room_back(make_scheduler: Make) -> None:
    """The gateway never sent the create (or never learnt the id: its deadline
    passed as the answer came).  Nothing will ever claim the reservation."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=2)))
    s.heartbeat(hb("n1"))
    lost = s.schedule(Request.cold(1, 1024))
    s.advance_clock(UNASSIGNED_TTL_MS + 5_000)
    s.heartbeat(hb("n1"))
    s.heartbeat(hb("n1"))
    assert state(s, lost) not in ("pending", "assigned", "acked")
    assert counted(s) == 0


def test_a_placement_being_created_is_not_dropped_before_its_create_could_finish(
    make_scheduler: Make,
) -> None:
    """The other side of the rule: a create the node may still finish (the
    slowest reports after tens of seconds) keeps its reservation meanwhile."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=2)))
    s.heartbeat(hb("n1"))
    slow = s.schedule(Request.cold(1, 1024))
    for _ in range(6):  # 30 s of 5 s heartbeats, the create still starting
        s.advance_clock(5_000)
        s.heartbeat(hb("n1"))
    assert state(s, slow) == "pending"
    assert counted(s) == 1


def test_a_failed_create_releases_its_reservation(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=2)))
    s.heartbeat(hb("n1", create_fails=3))
    failed = s.schedule(Request.cold(1, 1024))
    s.heartbeat(hb("n1", create_fails=4))  # the node says the create failed
    # (one heartbeat for the gateway to cancel it, if it does)
    s.heartbeat(hb("n1", create_fails=4))
    assert state(s, failed) not in ("pending", "assigned", "acked")
    assert counted(s) == 0


def test_a_failed_create_the_gateway_cancelled_ends_once(make_scheduler: Make) -> None:
    """A gateway that cancels its failed create (ours) and the node's
    create_fails rise end one reservation for one failure, not two: the
    creation still on its way keeps its reservation."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1, create_fails=3))
    failed = s.schedule(Request.cold(1, 1024))
    on_its_way = s.schedule(Request.cold(1, 1024))
    assert failed.reservation_id
    s.cancel(failed.reservation_id)
    s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1, create_fails=4))
    assert state(s, on_its_way) == "pending"
    assert counted(s) == 2
    # the next failure is the next rise's
    s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1, create_fails=5))
    s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1, create_fails=5))
    assert state(s, on_its_way) == "released"
    assert counted(s) == 1


def test_a_failed_create_cancelled_after_the_nodes_rise_ends_once(make_scheduler: Make) -> None:
    """The node's heartbeat reports the failure before the gateway's cancel
    comes: the rise is owed until the next heartbeat, the cancel pays it."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1, create_fails=3))
    on_its_way = s.schedule(Request.cold(1, 1024))  # the oldest
    failed = s.schedule(Request.cold(1, 1024))
    assert failed.reservation_id
    s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1, create_fails=4))
    s.cancel(failed.reservation_id)
    s.heartbeat(hb("n1", roster=["keep"], sandbox_count=1, create_fails=4))
    assert state(s, failed) == "cancelled"
    assert state(s, on_its_way) == "pending"
    assert counted(s) == 2


def test_create_fails_going_backwards_or_a_restart_releases_nothing(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("n1", create_fails=5))
    p = s.schedule(Request.cold(1, 1024))
    s.heartbeat(hb("n1", create_fails=3))  # an older count
    s.heartbeat(hb("n1", create_fails=5))  # back where it was: no new failure
    assert state(s, p) == "pending"
    s.heartbeat(hb("n1", sid="boot-2", create_fails=0))  # a restart counts from 0
    assert state(s, p) == "pending"
    assert counted(s) == 1


# ---------------------------------------------------------------------------
# Ceilings
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["FORK", "CREATE"])
def test_a_fork_or_outside_create_never_takes_a_creation_in_flight(
    make_scheduler: Make, kind: str
) -> None:
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=3)))
    s.heartbeat(hb("n1", roster=["a", "b"], sandbox_count=2))
    flight = s.schedule(Request.cold(1, 1024))  # the node is full: 2 + 1
    s.events("n1", [ev("child", kind)])  # not placed by the scheduler
    s.heartbeat(hb("n1", roster=["a", "b", "child"], sandbox_count=3))
    # the creation in flight is still on its way: it must still be counted
    assert state(s, flight) == "pending"
    assert counted(s) == 4  # 3 running + the one on its way: over, so nothing more
    with pytest.raises(NoNodesAvailable):
        s.schedule(Request.cold(1, 1024))


def test_a_counter_going_backwards_releases_nothing(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("n1", create_successes=10))
    for _ in range(3):
        s.schedule(Request.cold(1, 1024))
    s.heartbeat(hb("n1", create_successes=8))  # an older count, late
    # one real creation since 10: it runs, and two are still on their way
    s.heartbeat(hb("n1", roster=[], sandbox_count=1, create_successes=11))
    assert pending(s) == 2
    assert counted(s) == 3


def test_a_restart_counts_from_the_new_instance(make_scheduler: Make) -> None:
    """A node agent restart (new service_instance_id, counters from 0) keeps
    what the new instance reports and releases nothing for the reset."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("n1", sid="boot-1", create_successes=7, sandbox_count=1))
    p = s.schedule(Request.cold(1, 1024))
    s.heartbeat(hb("n1", sid="boot-2", create_successes=0, sandbox_count=1))
    assert state(s, p) == "pending"
    assert counted(s) == 2
    s.heartbeat(hb("n1", sid="boot-2", create_successes=1, sandbox_count=2))
    assert counted(s) == 2


def test_a_delete_before_a_restarted_instances_first_heartbeat_counts_once(
    make_scheduler: Make,
) -> None:
    """The lifecycle machine's shrunk failure (merged #28 rules, both
    backends): a counter-mode node's agent restarts; before the new
    instance's first heartbeat a creation is assigned and its DELETE comes.
    The new instance's create_successes (1) counts that creation; the DELETE
    already released it, so the heartbeat must release nothing more: the
    creation placed since is still on its way."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("n1", sid="boot-0", create_successes=0))
    s.schedule(Request.cold(1, 1024))
    # the agent restarts (boot-1, counting from 0) and creates sb1 at once
    s.assign("sb1", "n1", EP)  # as the reference gateway: no reservation id
    s.events("n1", [ev("sb1", "DELETE")])
    assert counted(s) == 0
    on_its_way = s.schedule(Request.cold(1, 1024))
    assert s.heartbeat(hb("n1", sid="boot-1", create_successes=1)).released == 0
    assert state(s, on_its_way) == "pending"
    assert counted(s) == 1


def test_the_same_late_heartbeat_twice_through_one_replica_changes_nothing(
    make_scheduler: Make,
) -> None:
    """The lossy lifecycle machine's shrunk failure: a late heartbeat goes as
    a steady one (only its stamp differs from what the replica last wrote);
    its answer must not let the replica take it for the record, or the same
    late heartbeat again goes steady without its stamp and moves the clock."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    older = hb("n1", create_successes=0, reported_at_unix_ms=3_000)
    s.heartbeat(older)
    s.heartbeat(hb("n1", create_successes=0, reported_at_unix_ms=6_000))
    before = s.client.hgetall(s.keys.node("n1"))
    for _ in range(3):
        s.heartbeat(older)
    assert s.client.hgetall(s.keys.node("n1")) == before


# ---------------------------------------------------------------------------
# Through real replicas: order across replicas, fields only the wire carries
# ---------------------------------------------------------------------------
@pytest.fixture
def cell(request: pytest.FixtureRequest) -> str:
    """A cell of this test's own: nothing another test left is in it."""
    name: str = request.node.name
    return "counted-" + name.split("[")[0][-40:].replace("_", "-")


@pytest.fixture
def two_replicas(redis_server: RedisServer, cell: str) -> Iterator[list[ServeProcess]]:
    """Two ``schedctl serve`` processes on one cell, max_sandbox_count 2."""
    config = {"scheduler": {"node_resource_limit": {"max_sandbox_count": 2}}}
    procs = [ServeProcess(config, redis_server.url, cell=cell) for _ in range(2)]
    try:
        for p in procs:
            p.wait_serving(60)
        yield procs
    finally:
        close_all(procs)


@pytest.fixture
def stubs(two_replicas: list[ServeProcess]) -> Iterator[list[pb_grpc.SchedulerStub]]:
    channels = [grpc.insecure_channel(p.address) for p in two_replicas]
    yield [pb_grpc.SchedulerStub(c) for c in channels]
    for c in channels:
        c.close()


@pytest.fixture
def cell_view(redis_server: RedisServer, cell: str) -> Iterator[Scheduler]:
    s = Scheduler(redis.Redis.from_url(redis_server.url), cell=cell)
    yield s
    s.close()


def _place_and_create(
    stub: pb_grpc.SchedulerStub, sandbox_id: str, node_id: str
) -> pb.ScheduleResponse:
    resp = stub.Schedule(cold(1, 1024), timeout=5)
    assert resp.node.node_id == node_id
    stub.RecordAssignment(pb.RecordAssignmentRequest(sandbox_id=sandbox_id, node=resp.node))
    return resp  # type: ignore[no-any-return]


def test_an_older_heartbeat_through_another_replica_changes_no_count(
    stubs: list[pb_grpc.SchedulerStub], cell_view: Scheduler
) -> None:
    a, b = stubs
    node, md = "old-hb", endpoint_md("old-hb:5000")
    older = hb_request(node, roster=["x"], reported_at_unix_ms=1_000_000)
    a.Heartbeat(hb_request(node, roster=["x"], reported_at_unix_ms=999_000), metadata=md)
    _place_and_create(a, "y", node)
    # the newer heartbeat lists both (via B)
    b.Heartbeat(hb_request(node, roster=["x", "y"], reported_at_unix_ms=1_005_000), metadata=md)
    assert counted(cell_view, node) == 2
    # the older one, stuck in a queue, arrives last (via A)
    a.Heartbeat(older, metadata=md)
    assert counted(cell_view, node) == 2
    with pytest.raises(grpc.RpcError) as e:
        a.Schedule(cold(1, 1024), timeout=5)  # the node holds 2 of 2
    assert "no nodes available" in (e.value.details() or "")


def test_a_gone_sandbox_gives_its_slot_back_through_two_replicas(
    stubs: list[pb_grpc.SchedulerStub], cell_view: Scheduler
) -> None:
    """The issue's starved fleet, small: a roster node at its ceiling of 2,
    one creation on its way (its create never comes) and one created,
    recorded as the reference gateway does (no reservation id) and gone
    before any roster listed it, its DELETE lost.  The node's stamped
    heartbeats, through the two replicas in turn, give the slot back at the
    second; the creation on its way keeps its own."""
    a, b = stubs
    node, md = "gone-hb", endpoint_md("gone-hb:5000")
    stamp = iter(range(1_000_000, 2_000_000, 5_000))

    def beat(stub: pb_grpc.SchedulerStub, roster: list[str], created: int) -> None:
        stub.Heartbeat(
            hb_request(
                node, roster=roster, create_successes=created, reported_at_unix_ms=next(stamp)
            ),
            metadata=md,
        )

    beat(a, ["keep"], 1)
    beat(b, [], 1)  # keep ended, its DELETE lost: an empty roster, roster mode stays
    on_its_way = b.Schedule(cold(1, 1024), timeout=5)
    assert on_its_way.node.node_id == node
    _place_and_create(a, "sb1", node)
    assert counted(cell_view, node) == 2
    with pytest.raises(grpc.RpcError):
        a.Schedule(cold(1, 1024), timeout=5)  # at its ceiling
    beat(b, [], 2)  # sb1 was created and is gone
    assert counted(cell_view, node) == 2  # one heartbeat is not yet two
    beat(a, [], 2)
    assert counted(cell_view, node) == 1  # the creation on its way
    assert b.Schedule(cold(1, 1024), timeout=5).node.node_id == node


def test_a_gone_sandbox_gives_its_slot_back_at_the_first_heartbeat_through_replicas(
    stubs: list[pb_grpc.SchedulerStub], cell_view: Scheduler
) -> None:
    """The same starved node, its heartbeats stamped by the machine's clock as
    the reference reporter stamps them: the first heartbeat taken a margin
    after sb1's assignment gives its slot back (on main: the second)."""
    a, b = stubs
    node, md = "first-hb", endpoint_md("first-hb:5000")

    def beat(stub: pb_grpc.SchedulerStub, roster: list[str], created: int) -> None:
        stamp = int(time.time() * 1000)
        stub.Heartbeat(
            hb_request(node, roster=roster, create_successes=created, reported_at_unix_ms=stamp),
            metadata=md,
        )

    beat(a, ["keep"], 1)
    beat(b, [], 1)  # keep ended, its DELETE lost
    on_its_way = b.Schedule(cold(1, 1024), timeout=5)
    assert on_its_way.node.node_id == node
    _place_and_create(a, "sb1", node)
    assigned = time.time()
    assert counted(cell_view, node) == 2
    # sb1 lives a moment and is gone, its DELETE lost; the next snapshot is
    # taken a margin and some after the assignment
    time.sleep(max(0.0, assigned + STAMP_MARGIN_MS / 1000 + 0.3 - time.time()))
    beat(b, [], 2)
    assert counted(cell_view, node) == 1  # the creation on its way
    assert a.Schedule(cold(1, 1024), timeout=5).node.node_id == node


def test_a_late_delete_from_the_previous_instance_keeps_the_listed_binding(
    stubs: list[pb_grpc.SchedulerStub], cell_view: Scheduler
) -> None:
    a, b = stubs
    node, md = "late-del", endpoint_md("late-del:5000")
    a.Heartbeat(hb_request(node, sid="i1", roster=["kept"]), metadata=md)
    b.Heartbeat(hb_request(node, sid="i2", roster=["kept"]), metadata=md)  # restarted
    a.ReportSandboxEvent(
        pb.ReportSandboxEventRequest(
            node_id=node,
            service_instance_id="i1",
            events=[pb.SandboxEvent(sandbox_id="kept", event_type=pb.SANDBOX_EVENT_TYPE_DELETE)],
        )
    )
    for _ in range(2):  # steady heartbeats of the current instance
        b.Heartbeat(hb_request(node, sid="i2", roster=["kept"]), metadata=md)
    assert b.LookupNode(pb.LookupNodeRequest(sandbox_id="kept")).node.node_id == node


class HoldingProxy:
    """A TCP proxy in front of a replica that can hold its answers: while
    ``hold`` is set, bytes from the replica wait ``hold_s`` before going on
    (a slow link back to the gateway; what reaches the replica is not held)."""

    def __init__(self, port: int, hold_s: float) -> None:
        self.target = port
        self.hold_s = hold_s
        self.hold = False
        self.port = free_port()
        #: the connections being served, ended by close() (an unclosed socket
        #: is a ResourceWarning, an error in this suite, in whatever test
        #: happens to collect it)
        self.tasks: set[asyncio.Task[None]] = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(5)

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        writers = [client_w]
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
            writers.append(up_w)

            async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, held: bool) -> None:
                with contextlib.suppress(OSError):
                    while data := await r.read(65536):
                        if held and self.hold:
                            await asyncio.sleep(self.hold_s)
                        w.write(data)
                        await w.drain()
                w.close()

            # (close() cancels: the stream's callback would log a cancelled task)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(pipe(client_r, up_w, False), pipe(up_r, client_w, True))
        finally:
            for w in writers:
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()
            self.tasks.discard(task)

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def test_a_schedule_answered_after_its_callers_deadline_gives_its_room_back(
    redis_server: RedisServer, cell: str, processes: list[ServeProcess]
) -> None:
    """The replica wrote its answer in time, the gateway's deadline passed
    before the answer reached it: the replica saw no cancel, the gateway
    never learnt the reservation id, and nothing will ever claim it."""
    config = {"scheduler": {"node_resource_limit": {"max_sandbox_count": 2}}}
    replica = ServeProcess(config, redis_server.url, cell=cell)
    processes.append(replica)
    replica.wait_serving(60)
    proxy = HoldingProxy(replica.port, hold_s=1.5)
    s = Scheduler(redis.Redis.from_url(redis_server.url), cell=cell)
    try:
        with grpc.insecure_channel(replica.address) as direct:
            node = pb_grpc.SchedulerStub(direct)
            node.Heartbeat(hb_request("slow-link"), metadata=endpoint_md("slow-link:5000"))
        with grpc.insecure_channel(f"127.0.0.1:{proxy.port}") as ch:
            gateway = pb_grpc.SchedulerStub(ch)
            gateway.ListNodes(pb.ListNodesRequest(), timeout=5)  # the connection is up
            proxy.hold = True
            with pytest.raises(grpc.RpcError) as e:
                gateway.Schedule(cold(1, 1024), timeout=1.0)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert pending(s, "slow-link") == 1  # placed, and the caller never knew
        s.advance_clock(UNASSIGNED_TTL_MS + 5_000)
        for _ in range(2):
            s.heartbeat(hb("slow-link", endpoint="slow-link:5000", sid="i1"))
        assert counted(s, "slow-link") == 0
    finally:
        proxy.close()
        s.close()


#: a script that holds Redis busy for 2 s (Redis runs one command at a time)
BUSY = """local t0 = redis.call('TIME')
while true do
  local t = redis.call('TIME')
  if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 2000000 then return 1 end
end"""


def test_a_schedule_placed_after_its_callers_deadline_is_cancelled_by_the_replica(
    redis_server: RedisServer, cell: str, processes: list[ServeProcess]
) -> None:
    """The placement takes longer than the caller's deadline (Redis busy):
    the replica knows the deadline and the id it reserved, and cancels it
    itself: the room is back at once, not after unassigned_reservation_ttl."""
    config = {"scheduler": {"node_resource_limit": {"max_sandbox_count": 2}}}
    replica = ServeProcess(config, redis_server.url, cell=cell)
    processes.append(replica)
    replica.wait_serving(60)
    s = Scheduler(redis.Redis.from_url(redis_server.url), cell=cell)
    busy = redis.Redis.from_url(redis_server.url)
    try:
        with grpc.insecure_channel(replica.address) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            stub.Heartbeat(hb_request("late"), metadata=endpoint_md("late:5000"))
            stub.ListNodes(pb.ListNodesRequest(), timeout=5)  # the connection is up
            blocker = threading.Thread(target=lambda: busy.eval(BUSY, 0))
            blocker.start()
            while True:  # until the script runs: Redis answers no one then
                probe = redis.Redis.from_url(redis_server.url, socket_timeout=0.05)
                try:
                    probe.ping()
                except redis.TimeoutError:
                    break
                finally:
                    probe.close()
            try:
                with pytest.raises(grpc.RpcError) as e:
                    stub.Schedule(cold(1, 1024), timeout=0.4)
                # (no placement reached the caller: its deadline, or the
                # replica's answer that Redis did not answer within it)
                assert e.value.code() in (
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.UNAVAILABLE,
                )
            finally:
                blocker.join(10)
            # the replica's cancel runs as soon as Redis answers again
            for _ in range(100):
                if not s.reservations():
                    break
                threading.Event().wait(0.05)
        assert [r.state for r in s.reservations()] == []
        assert counted(s, "late") == 0
        assert s.stats().expired_total == 0  # cancelled, not expired
    finally:
        busy.close()
        s.close()


# ---------------------------------------------------------------------------
# Moves: a sandbox two nodes claim
# ---------------------------------------------------------------------------
def test_a_sandbox_recorded_on_one_node_while_another_lists_it_is_counted_once(
    make_scheduler: Make,
) -> None:
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("a", roster=["sbx"], sandbox_count=1))
    s.heartbeat(hb("b"))
    p = s.schedule(Request.cold(1, 1024))
    assert p.node_id == "b"
    s.assign("sbx", "b", "b.local:5000", p.reservation_id)  # the gateway says: on b
    # a still lists it (the sandbox is a's): a's numbers include it
    s.heartbeat(hb("a", roster=["sbx"], sandbox_count=1))
    for _ in range(2):
        s.heartbeat(hb("b"))
    assert counted(s, "a") + counted(s, "b") == 1


def test_a_listed_sandbox_stays_found_after_another_node_listed_it_once(
    make_scheduler: Make,
) -> None:
    s = make_scheduler(Policy())
    s.heartbeat(hb("a", roster=["sbx"], sandbox_count=1))
    s.heartbeat(hb("b", roster=["sbx"], sandbox_count=1))  # b listed it once (a stale copy)
    s.heartbeat(hb("b"))  # and no more
    for _ in range(2):  # a's heartbeats, unchanged: it runs there all along
        s.heartbeat(hb("a", roster=["sbx"], sandbox_count=1))
    assert s.lookup("sbx").node_id == "a"


def test_a_sandbox_recorded_on_one_node_then_listed_by_another_is_counted_once(
    make_scheduler: Make,
) -> None:
    """The other order: the assignment on b comes first, then a's roster
    lists the sandbox: the roster takes it, and b's reservation ends."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("a", roster=["other"], sandbox_count=1))
    s.heartbeat(hb("b"))
    p = s.schedule(Request.cold(1, 1024))
    assert p.node_id == "b"
    s.assign("sbx", "b", "b.local:5000", p.reservation_id)
    assert pending(s, "b") == 1  # nothing lists it yet: it is b's to count
    s.heartbeat(hb("a", roster=["other", "sbx"], sandbox_count=2))
    assert state(s, p) == "released"
    assert counted(s, "a") + counted(s, "b") == 2
    assert s.lookup("sbx").node_id == "a"


FULL_A = ["sbx", "a-2", "a-3", "a-4"]


def test_a_repeated_assignment_on_another_node_charges_once(make_scheduler: Make) -> None:
    """The gateway records the sandbox a lists on b twice, naming no
    reservation: one of b's reservations ends, the other (a creation still
    on its way) stays."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("a", roster=FULL_A, sandbox_count=4))  # at its ceiling: b is placed on
    s.heartbeat(hb("b", roster=["b-own", "b-two"], sandbox_count=2))
    first = s.schedule(Request.cold(1, 1024))
    second = s.schedule(Request.cold(1, 1024))
    assert (first.node_id, second.node_id) == ("b", "b")
    for _ in range(2):
        s.assign("sbx", "b", "b.local:5000", None)
    assert (state(s, first), state(s, second)) == ("released", "pending")
    assert counted(s, "b") == 3
    assert s.lookup("sbx").node_id == "a"


def test_an_event_of_another_node_leaves_a_listed_sandbox_with_its_lister(
    make_scheduler: Make,
) -> None:
    s = make_scheduler(Policy())
    s.heartbeat(hb("a", roster=["sbx"], sandbox_count=1))
    s.heartbeat(hb("b"))
    s.events("b", [ev("sbx", "CREATE"), ev("sbx", "PAUSE")])
    for _ in range(2):  # a's heartbeats, unchanged
        s.heartbeat(hb("a", roster=["sbx"], sandbox_count=1))
    assert s.lookup("sbx").node_id == "a"
    assert counted(s, "a") + counted(s, "b") == 1


def test_a_counter_node_recorded_with_a_sandbox_another_lists_counts_once(
    make_scheduler: Make,
) -> None:
    """b counts by its counter: its reservation ends at the assignment, and
    its baseline moves on, so the rise of b's counter for that creation
    releases nothing more (a creation still on its way keeps its room)."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("a", roster=FULL_A, sandbox_count=4))  # at its ceiling: b is placed on
    s.heartbeat(hb("b", create_successes=0, sandbox_count=2))
    p = s.schedule(Request.cold(1, 1024))
    assert p.node_id == "b"
    s.assign("sbx", "b", "b.local:5000", p.reservation_id)
    s.heartbeat(hb("a", roster=FULL_A, sandbox_count=4))
    assert state(s, p) == "released"
    assert (counted(s, "a"), counted(s, "b")) == (4, 2)
    on_its_way = s.schedule(Request.cold(1, 1024))
    assert on_its_way.node_id == "b"
    s.heartbeat(hb("b", create_successes=1, sandbox_count=2))  # b's counter saw one creation
    assert state(s, on_its_way) == "pending"


@pytest.mark.parametrize("named", [True, False], ids=["named", "without-id"])
def test_a_counter_nodes_rise_before_an_assignment_another_lists_takes_no_other(
    make_scheduler: Make, named: bool
) -> None:
    """b counts by its counter, and its rise for sbx came first: it released
    b's oldest reservation, unclaimed (counted_unclaimed).  Then a's roster
    lists sbx, and the gateway records sbx on b.  The assignment must take
    the reservation the rise released, already ended, not end another one:
    that one stands for a creation still on its way (its room is kept)."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("a", roster=FULL_A[1:], sandbox_count=3))
    s.heartbeat(hb("b", create_successes=0))
    s.heartbeat(hb("a", roster=["a-0", *FULL_A[1:]], sandbox_count=4))  # at its ceiling
    older = s.schedule(Request.cold(1, 1024))
    placed = s.schedule(Request.cold(1, 1024))  # sbx's placement
    assert (older.node_id, placed.node_id) == ("b", "b")
    # b created sbx; its rise releases the oldest, older's (still on its way)
    assert s.heartbeat(hb("b", create_successes=1, sandbox_count=1)).released == 1
    assert (state(s, older), state(s, placed)) == ("released", "pending")
    # sbx moved to a (or a lists a stale copy): a's numbers include it
    s.heartbeat(hb("a", roster=["a-0", *FULL_A], sandbox_count=4))
    got = s.assign("sbx", "b", "b.local:5000", placed.reservation_id if named else None)
    assert got.reservation_id == older.reservation_id
    assert state(s, placed) == "pending"  # (older's creation, on its way, holds it)
    assert pending(s, "b") == 1
    # b's next heartbeat (sbx gone from it) releases nothing more
    assert s.heartbeat(hb("b", create_successes=1)).released == 0
    assert state(s, placed) == "pending"
    assert s.lookup("sbx").node_id == "a"


def _placed_on_b_listed_by_a_then_buried(s: Scheduler) -> tuple[Placement, list[str]]:
    """Placed on b, listed by a (whose agent restarted twice), then a late
    DELETE of a's instance two back buries the listed binding: the
    placement, and a's roster."""
    s.heartbeat(hb("a", sid="i0", roster=["a-own"], sandbox_count=1, allocated_cpu=8))
    s.heartbeat(hb("b", roster=["b-own"], sandbox_count=1))
    p = s.schedule(Request.cold(1, 1024))
    assert p.node_id == "b"
    listed = ["a-own", "sbx"]
    s.heartbeat(hb("a", sid="i1", roster=listed, sandbox_count=2, allocated_cpu=9))
    s.heartbeat(hb("a", sid="i2", roster=listed, sandbox_count=2, allocated_cpu=9))
    s.events("a", [ev("sbx", "DELETE")], "i0")  # late, from two instances back
    return p, listed


@pytest.mark.parametrize("on", ["b", "a"])
def test_a_late_delete_of_an_older_instance_lets_no_assignment_count_twice(
    make_scheduler: Make, on: str
) -> None:
    """The lifecycle machine's failure on roster node r0 (MovingLifecycle,
    issue #28): placed on b, created on a, whose roster lists it; a's agent
    restarted twice, and a DELETE of its instance two back (not the one
    replaced last, so applied) buries the listed binding.  The gateway then
    records the sandbox without an id.  a's last roster lists it: a's
    numbers include it, so no reservation may be charged to it, on either
    node; a's next roster restores the binding."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    p, listed = _placed_on_b_listed_by_a_then_buried(s)
    s.assign("sbx", on, f"{on}.local:5000", None)
    assert all(r.sandbox_id != "sbx" for r in s.reservations())
    # (recorded on b, where it was placed: its reservation ends, as the
    # moves row says; recorded on a, b's stays unassigned, an over-count)
    assert state(s, p) == ("released" if on == "b" else "pending")
    held = 3 + (on == "a")
    assert counted(s, "a") + counted(s, "b") == held
    s.heartbeat(hb("a", sid="i2", roster=listed, sandbox_count=2, allocated_cpu=9))
    assert s.lookup("sbx").node_id == "a"
    assert counted(s, "a") + counted(s, "b") == held


@pytest.mark.parametrize("kind", ["CREATE", "RESUME"])
def test_an_event_after_a_late_delete_lets_no_assignment_count_twice(
    make_scheduler: Make, kind: str
) -> None:
    """As above, but b reports the sandbox (an event) before the gateway
    records it there: a's tombstone that its last roster listed is a's
    listed binding for the event as for the assignment (one rule,
    listed_elsewhere in lua/includes/bindings.lua), so the event writes no
    binding of b's, and the assignment charges nothing that a's numbers
    already include."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    p, listed = _placed_on_b_listed_by_a_then_buried(s)
    s.events("b", [ev("sbx", kind)])
    s.assign("sbx", "b", "b.local:5000", None)
    assert all(r.sandbox_id != "sbx" for r in s.reservations())
    assert state(s, p) == "released"
    assert counted(s, "a") + counted(s, "b") == 3
    s.heartbeat(hb("a", sid="i2", roster=listed, sandbox_count=2, allocated_cpu=9))
    assert s.lookup("sbx").node_id == "a"
    assert counted(s, "a") + counted(s, "b") == 3


def test_a_charge_follows_its_sandbox_to_the_node_whose_event_took_it(
    make_scheduler: Make,
) -> None:
    """Recorded on b, reported created by a (no roster lists it yet): the
    reservation stays live, never dropped before a's numbers include the
    sandbox, and ends once when a's roster lists it."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("a", roster=["a-own"], sandbox_count=1))
    s.heartbeat(hb("b", roster=["b-own"], sandbox_count=1))
    p = s.schedule(Request.cold(1, 1024), reservation_id="r-moving")
    s.assign("sbx", p.node_id, p.endpoint, p.reservation_id)
    other = "a" if p.node_id == "b" else "b"
    s.events(other, [ev("sbx", "CREATE")])
    assert s.lookup("sbx").node_id == other
    for _ in range(2):  # the placed node's rosters, without it: not its to count
        s.heartbeat(hb(p.node_id, roster=[f"{p.node_id}-own"], sandbox_count=1))
    assert state(s, p) == "assigned"
    s.heartbeat(hb(other, roster=[f"{other}-own", "sbx"], sandbox_count=2))
    assert state(s, p) == "released"
    assert counted(s, "a") + counted(s, "b") == 3


def test_events_of_the_replaced_instance_change_nothing(make_scheduler: Make) -> None:
    """A late DELETE of the node's previous instance leaves the sandbox the
    current one lists and its reservation; an instance not heard from yet
    (the next one, before its first heartbeat) is applied."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=4)))
    s.heartbeat(hb("n1", sid="i1", roster=["kept"], sandbox_count=1))
    s.heartbeat(hb("n1", sid="i2", roster=["kept"], sandbox_count=1))  # restarted
    p = s.schedule(Request.cold(1, 1024))
    s.assign("fresh", "n1", EP, p.reservation_id)
    late = s.events("n1", [ev("kept", "DELETE"), ev("fresh", "DELETE")], "i1")
    assert (late.acked, late.released) == (0, 0)
    assert s.lookup("kept").node_id == "n1"
    assert state(s, p) == "assigned"
    s.events("n1", [ev("fresh", "DELETE")], "i3")  # the next instance, not heard yet
    assert state(s, p) == "released"


def test_a_sandbox_recorded_on_another_node_through_replicas_counts_once(
    stubs: list[pb_grpc.SchedulerStub], cell_view: Scheduler
) -> None:
    """Through two ``schedctl serve`` replicas (max_sandbox_count 2): the
    gateway records on b a sandbox a lists, b's own event for it too; a's
    heartbeats keep it, and b keeps its room for two creations."""
    a, b = stubs
    md_a, md_b = endpoint_md("mv-a:5000"), endpoint_md("mv-b:5000")
    a.Heartbeat(hb_request("mv-a", roster=["sbx"]), metadata=md_a)
    b.Heartbeat(hb_request("mv-b"), metadata=md_b)
    _place_and_create(a, "sbx", "mv-b")  # the gateway says: on mv-b
    b.ReportSandboxEvent(
        pb.ReportSandboxEventRequest(
            node_id="mv-b",
            service_instance_id="i1",
            events=[pb.SandboxEvent(sandbox_id="sbx", event_type=pb.SANDBOX_EVENT_TYPE_CREATE)],
        )
    )
    for _ in range(2):  # a's heartbeats, unchanged (steady)
        b.Heartbeat(hb_request("mv-a", roster=["sbx"]), metadata=md_a)
    assert a.LookupNode(pb.LookupNodeRequest(sandbox_id="sbx")).node.node_id == "mv-a"
    assert counted(cell_view, "mv-a") + counted(cell_view, "mv-b") == 1
    placed = [a.Schedule(cold(1, 1024), timeout=5).node.node_id for _ in range(3)]
    assert sorted(placed) == ["mv-a", "mv-b", "mv-b"]
    with pytest.raises(grpc.RpcError) as e:
        b.Schedule(cold(1, 1024), timeout=5)  # 2 of 2 on each node
    assert "no nodes available" in (e.value.details() or "")
