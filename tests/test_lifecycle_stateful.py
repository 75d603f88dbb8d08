"""Hypothesis stateful test: schedules, creations, assignments, heartbeats
(with and without roster, through two replicas whose deltas may meet each
other's records), node agents starting again, events, cancels and expiries
interleaved at random, on Redis (real and fake) and in the reference model
(CellModel).

After every step:
- the stored node records (snapshot + pending aggregates) equal the model's;
- the live reservations, their states and claimed sandboxes equal the model's;
- every binding lookup agrees with the model;
- no sandbox is counted twice: no live reservation is charged to a sandbox
  that its node's last ingested roster already lists;
- nothing is dropped early: until an expiry has happened, each node's
  pending count is at least the number of its placements that are neither
  cancelled nor yet in the node's own numbers.

A create may also fail on its node (its create_fails counts it), with the
gateway cancelling the reservation or recording nothing (#28).

The clock is frozen (a drill clock in the cell's policy) so the model knows
the exact instant of every script call; expiry is driven by advancing it.

LossyLifecycle loses DELETEs and delivers heartbeats late, MovingLifecycle
moves sandboxes between nodes, and WireLifecycle runs the lossy machine
through two real ``schedctl serve`` replicas over the gRPC contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import grpc
import redis
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from scheduler import (
    FailedPrecondition,
    Heartbeat,
    Limits,
    NodeSnapshot,
    NoNodesAvailable,
    NotFound,
    Policy,
    Request,
    SandboxEvent,
    Scheduler,
)
from scheduler.domain.catalog import STAMP_MARGIN_MS
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.testing.model import CellModel, NodeState
from scheduler.testing.replicas import ServeProcess, close_all
from tests.helpers import (
    GIB,
    bound_sandboxes_are_in_their_nodes_sets,
    cold,
    node_states,
    records_name_only_registered_nodes,
)
from tests.test_index import index_is_consistent

MIB = 1024 * 1024
#: how far the lossy machine's node clock runs ahead of the cell's (stamps)
NODE_CLOCK_AHEAD = 3_600_000
ROSTER_NODES = ("r0", "r1")
COUNTER_NODES = ("c0",)
NODES = ROSTER_NODES + COUNTER_NODES
POLICY = Policy(
    limits=Limits(max_sandbox_count=5),
    reservation_ttl_ms=20_000,
    binding_ttl_ms=30_000,
    report_ttl_ms=10**9,
)


def ep(node_id: str) -> str:
    return f"{node_id}.local:5000"


@dataclass
class Placement:
    rid: str
    node_id: str
    cpu: int
    mem: int
    sandbox: str
    created: bool = False
    created_index: int = 0
    created_epoch: int = 0
    assigned: bool = False
    cancelled: bool = False
    #: its create failed on the node (the node's create_fails counts it)
    failed: bool = False


@dataclass
class World:
    """What really runs on the simulated nodes."""

    running: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    #: creations since the node's agent last started (its create_successes)
    created_total: dict[str, int] = field(default_factory=dict)
    #: creates that failed since the node's agent last started (its create_fails)
    failed_total: dict[str, int] = field(default_factory=dict)
    #: how many times each node's agent started again, and the start the
    #: last ingested heartbeat came from
    epoch: dict[str, int] = field(default_factory=dict)
    ingested_epoch: dict[str, int] = field(default_factory=dict)
    ingested_roster: dict[str, set[str]] = field(default_factory=dict)
    ingested_cs: dict[str, int] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    #: sandboxes whose DELETE event reached the scheduler
    delete_sent: set[str] = field(default_factory=set)


class Lifecycle(RuleBasedStateMachine):
    client: Any = None
    cell = "life"
    #: each example starts from an empty Redis (WireLifecycle's cells are new)
    flush = True

    def __init__(self) -> None:
        super().__init__()
        if self.flush:
            self.client.flushall()
        self.s = Scheduler(self.client, cell=self.cell)
        self.s.sync_policy(POLICY, overwrite=True)
        self.s.sync_nodes([(n, ep(n)) for n in NODES])
        self.s.advance_clock(0, "freeze")
        #: a second replica: its own memo of what it last wrote, so heartbeats
        #: through both go as deltas that may meet the other's record (RESYNC)
        self.s2 = Scheduler(self.client, cell=self.cell)
        #: what the steps drive the cell through, as two replicas: here the
        #: two library clients; WireLifecycle's are two `schedctl serve`
        self.a, self.b = self.drivers()
        self.m = CellModel(POLICY)
        self.w = World()
        self.placements: dict[str, Placement] = {}
        self.seen_sandboxes: set[str] = set()
        self.n = 0
        for node_id in NODES:
            self.m.add_node(node_id, ep(node_id))
            self.w.running[node_id] = {}
            self.w.created_total[node_id] = 0
            self.w.failed_total[node_id] = 0
            self.w.epoch[node_id] = 0
            self.heartbeat(node_id)

    def drivers(self) -> tuple[Any, Any]:
        return self.s, self.s2

    def now(self) -> int:
        return int(self.client.hget(self.s.keys.policy, "frozen_now_ms"))

    # -- rules ---------------------------------------------------------------
    @rule(cpu=st.sampled_from([1, 2, 4]), mem_mb=st.sampled_from([512, 2048, 8192]))
    def schedule(self, cpu: int, mem_mb: int) -> None:
        self.n += 1
        rid = f"res{self.n}"
        req = Request.cold(cpu, mem_mb)
        try:
            p = self.a.schedule(req, reservation_id=rid)
        except NoNodesAvailable as e:
            want = self.m.schedule(req, rid, self.now(), 0.0)
            assert want.chosen is None and str(e) == want.refusal
            return
        if self.a is self.s:
            assert p.reservation_id == rid
        rid = p.reservation_id  # (a replica names its own)
        want = self.m.schedule(req, rid, self.now(), 0.0)
        assert p.node_id == want.chosen
        note(f"{rid} placed on {p.node_id}")
        self.placements[rid] = Placement(rid, p.node_id, cpu, mem_mb * MIB, f"sb-{rid}")

    @rule(data=st.data())
    def node_creates(self, data: st.DataObject) -> None:
        todo = [
            p
            for p in self.placements.values()
            if not p.created and not p.cancelled and not p.failed
        ]
        if not todo:
            return
        p = data.draw(st.sampled_from(todo))
        note(f"{p.node_id} creates {p.sandbox} for {p.rid}")
        p.created = True
        self.w.created_total[p.node_id] += 1
        p.created_index = self.w.created_total[p.node_id]
        p.created_epoch = self.w.epoch[p.node_id]
        self.w.running[p.node_id][p.sandbox] = (p.cpu, p.mem)
        self.seen_sandboxes.add(p.sandbox)

    @rule(data=st.data(), with_rid=st.booleans())
    def gateway_assigns(self, data: st.DataObject, with_rid: bool) -> None:
        todo = [p for p in self.placements.values() if p.created and not p.assigned]
        if not todo:
            return
        p = data.draw(st.sampled_from(todo))
        p.assigned = True
        wanted = p.rid if with_rid else None
        note(f"gateway assigns {p.sandbox} to {p.node_id} naming {wanted}")
        got = self.a.assign(p.sandbox, p.node_id, ep(p.node_id), wanted)
        assert got.reservation_id == self.m.assign(p.sandbox, p.node_id, wanted, self.now())

    @rule(node_id=st.sampled_from(NODES), second=st.booleans())
    def heartbeat(self, node_id: str, second: bool = False) -> None:
        self.send_heartbeat(node_id, self.b if second else self.a)

    def send_heartbeat(self, node_id: str, replica: Any, reported: int = 0) -> None:
        """The node's heartbeat now, through ``replica`` (``reported``: its
        reported_at_unix_ms, 0 = none)."""
        running = self.w.running[node_id]
        cpu = sum(c for c, _ in running.values())
        mem = sum(m for _, m in running.values())
        roster = sorted(running) if node_id in ROSTER_NODES else []
        cs = self.w.created_total[node_id]
        cf = self.w.failed_total[node_id]
        snap = NodeSnapshot(
            cpu_count=16,
            memory_total_bytes=64 * GIB,
            allocated_cpu=cpu,
            allocated_memory_bytes=mem,
            sandbox_count=len(running),
            create_successes=cs,
            create_fails=cf,
            reported_at_unix_ms=reported,
        )
        sid = f"boot-{self.w.epoch[node_id]}"
        beat = Heartbeat(
            node_id=node_id, service_instance_id=sid, snapshot=snap, sandbox_ids=roster
        )
        r = replica.heartbeat(beat)
        state = NodeState(
            node_id=node_id,
            reported_status="READY",
            cpu_count=16,
            memory_total_bytes=64 * GIB,
            allocated_cpu=cpu,
            allocated_memory_bytes=mem,
            sandbox_count=len(running),
        )
        released = self.m.heartbeat(node_id, sid, state, cs, roster, r.now_ms, reported, cf)
        assert r.released is None or r.released == released  # (None: the wire says nothing)
        self.sent(node_id, beat, state)
        self.w.ingested_roster[node_id] = set(roster)
        self.w.ingested_cs[node_id] = cs
        self.w.ingested_epoch[node_id] = self.w.epoch[node_id]

    def sent(self, node_id: str, beat: Heartbeat, state: NodeState) -> None:
        """A heartbeat was delivered and its answer checked (a hook)."""

    @rule(node_id=st.sampled_from(NODES))
    def node_agent_restarts(self, node_id: str) -> None:
        """The node's agent starts again (a new service_instance_id): its
        sandboxes keep running, its create_successes counts from 0."""
        note(f"{node_id} restarts")
        self.w.epoch[node_id] += 1
        self.w.created_total[node_id] = 0
        self.w.failed_total[node_id] = 0

    @rule(data=st.data(), kind=st.sampled_from(["CREATE", "PAUSE"]))
    def node_reports_event(self, data: st.DataObject, kind: str) -> None:
        live = [(n, sb) for n in NODES for sb in self.w.running[n]]
        if not live:
            return
        node_id, sb = data.draw(st.sampled_from(live))
        note(f"{node_id} reports {kind} {sb}")
        sid = f"boot-{self.w.epoch[node_id]}"  # (events carry the instance that sent them)
        self.a.events(node_id, [SandboxEvent(sandbox_id=sb, event_type=kind)], sid)  # type: ignore[arg-type]
        self.m.events(node_id, [(sb, kind)], self.now(), sid)

    @rule(data=st.data())
    def node_deletes(self, data: st.DataObject) -> None:
        live = [(n, sb) for n in NODES for sb in self.w.running[n]]
        if not live:
            return
        node_id, sb = data.draw(st.sampled_from(live))
        note(f"{node_id} deletes {sb}")
        del self.w.running[node_id][sb]
        self.w.deleted.add(sb)
        self.w.delete_sent.add(sb)
        self.send_delete(node_id, sb, f"boot-{self.w.epoch[node_id]}")

    def send_delete(self, node_id: str, sb: str, sid: str) -> None:
        """A DELETE of ``sb`` from ``node_id``'s instance ``sid`` reaches the scheduler."""
        self.a.events(node_id, [SandboxEvent(sandbox_id=sb, event_type="DELETE")], sid)
        self.m.events(node_id, [(sb, "DELETE")], self.now(), sid)

    @rule(data=st.data(), cancel=st.booleans())
    def node_fails_a_create(self, data: st.DataObject, cancel: bool) -> None:
        """The create reached the node and failed: its create_fails counts it;
        the gateway cancels the reservation (ours) or records nothing (the
        reference one)."""
        todo = [
            p
            for p in self.placements.values()
            if not p.created and not p.cancelled and not p.failed
        ]
        if not todo:
            return
        p = data.draw(st.sampled_from(todo))
        note(f"{p.node_id} fails the create of {p.rid}; the gateway cancels: {cancel}")
        p.failed = True
        self.w.failed_total[p.node_id] += 1
        if cancel:
            want = self.m.cancel(p.rid, self.now())
            try:
                self.s.cancel(p.rid)
                got = "cancelled"
            except FailedPrecondition as e:
                got = str(e).replace(f"reservation {p.rid} ", "")
            except NotFound:
                got = "not found"
            assert got == want
            p.cancelled = True

    @rule(data=st.data())
    def gateway_cancels(self, data: st.DataObject) -> None:
        """The create failed: only placements whose sandbox never came up."""
        todo = [p for p in self.placements.values() if not p.created]
        if not todo:
            return
        p = data.draw(st.sampled_from(todo))
        note(f"gateway cancels {p.rid}")
        want = self.m.cancel(p.rid, self.now())
        try:
            self.s.cancel(p.rid)
            got = "cancelled"
        except FailedPrecondition as e:
            got = str(e).replace(f"reservation {p.rid} ", "")
        except NotFound:
            got = "not found"
        assert got == want
        p.cancelled = True

    @rule(ms=st.sampled_from([500, 5_000, 19_000]))
    def time_passes(self, ms: int) -> None:
        self.s.advance_clock(ms)

    # -- invariants ------------------------------------------------------------
    @invariant()
    def same_state_as_the_model(self) -> None:
        assert node_states(self.s) == self.m.states()
        live = {x.decode() for x in self.client.zrange(self.s.keys.expiry, 0, -1)}
        assert live == set(self.m.res)
        for r in self.s.reservations():
            mr = self.m.res[r.reservation_id]
            assert (r.state, r.sandbox_id, r.node_id) == (mr.state, mr.sandbox_id, mr.node_id)
        expired = sum(r.state == "expired" for r in self.m.ended.values())
        assert self.s.stats().expired_total == expired

    @invariant()
    def index_agrees(self) -> None:
        """Every node sits in exactly the bucket its record implies (releases
        and snapshots change a heartbeat's node in hand, written once)."""
        index_is_consistent(self.s, POLICY, self.now())
        records_name_only_registered_nodes(self.s)
        bound_sandboxes_are_in_their_nodes_sets(self.s)

    @invariant()
    def bindings_agree(self) -> None:
        now = self.now()
        for sb in self.seen_sandboxes:
            want = self.m.lookup(sb, now)
            try:
                got: str | None = self.s.lookup(sb).node_id
            except NotFound:
                got = None
            assert got == want, sb

    @invariant()
    def never_counted_twice(self) -> None:
        for r in self.s.reservations():
            assert r.sandbox_id not in self.w.ingested_roster.get(r.node_id, set()), r

    @invariant()
    def never_dropped_early(self) -> None:
        if self.s.stats().expired_total:
            return  # expiry is the fourth way out; its timing is checked by the model
        views = {v.node_id: v.pending_reservations for v in self.s.nodes()}
        for node_id in NODES:
            outstanding = 0
            for p in self.placements.values():
                if p.node_id != node_id or p.cancelled or p.failed:
                    continue
                outstanding += not self.accounted(p, node_id)
            assert views[node_id] >= outstanding, node_id

    def accounted(self, p: Placement, node_id: str) -> bool:
        """May placement ``p`` be out of ``node_id``'s pending count: its node's
        numbers include it, or an event ended it (never_dropped_early)."""
        if node_id in ROSTER_NODES:
            return (
                p.sandbox in self.w.ingested_roster.get(node_id, set())
                or p.sandbox in self.w.deleted
            )
        # (in the numbers of a heartbeat after it: counted by a later start's
        # snapshot, or by this start's counter; or its DELETE came: it ends
        # the creation, in counter mode too)
        seen = self.w.ingested_epoch[node_id]
        return (
            p.sandbox in self.w.delete_sent
            or p.created
            and (
                p.created_epoch < seen
                or (p.created_epoch == seen and p.created_index <= self.w.ingested_cs[node_id])
            )
        )


def run_machine(machine: type[RuleBasedStateMachine], examples: int) -> None:
    """Run ``machine`` at its committed size: ``examples`` of 40 steps."""
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )


def test_lifecycle_against_the_model(redis_client: Any) -> None:
    Lifecycle.client = redis_client
    run_machine(Lifecycle, 60)


class LossyLifecycle(Lifecycle):
    """The same lifecycle with what real nodes also do (#28): a sandbox ends
    and its DELETE is lost, and a heartbeat arrives after a newer one of the
    same service instance (through the other replica, or late out of a
    queue).  Every heartbeat carries ``reported_at_unix_ms`` from one clock,
    as the reporter stamps it.  Two more invariants, the rules of
    docs/design.md "What each event does to a creation's count":

    - a heartbeat older than the stored one changes no count: each node's
      record holds the numbers of its newest heartbeat;
    - capacity is given back: no reservation of a roster node stays live
      once its sandbox is gone (nothing runs it) and its node sent two
      heartbeats since it was assigned and gone.
    """

    #: its heartbeats go in heartbeat batches (the model then sweeps due
    #: reservations before a late one too)
    batched = False

    def __init__(self) -> None:
        self.reported = 0
        #: per node: the heartbeats delivered (in order) and what each said
        self.beats: dict[str, list[tuple[Heartbeat, NodeState]]] = {}
        #: per node: heartbeats delivered (late ones not counted)
        self.hbs: dict[str, int] = {}
        #: sandbox -> (its node, the node's heartbeat count) when it ended silently
        self.gone: dict[str, tuple[str, int]] = {}
        #: reservation id -> its node's heartbeat count when first seen assigned
        self.assigned_at: dict[str, int] = {}
        super().__init__()
        # a long-lived sandbox on each roster node, made outside the scheduler:
        # the node is in roster mode (a node that never listed one counts by
        # its counter, which releases a short-lived creation by itself), and
        # stays in it when the resident ends and the agent restarts
        for node_id in ROSTER_NODES:
            self.w.running[node_id][f"resident-{node_id}"] = (1, 512 * MIB)
            self.seen_sandboxes.add(f"resident-{node_id}")
            self.send_heartbeat(node_id, self.a)

    def send_heartbeat(self, node_id: str, replica: Scheduler, reported: int = 0) -> None:
        # the node's clock: the cell's an hour ahead, each stamp past the last
        # (a heartbeat is taken as it is sent; the late ones are sent again)
        self.reported = max(self.reported + 1, self.now() + NODE_CLOCK_AHEAD)
        super().send_heartbeat(node_id, replica, self.reported)

    def sent(self, node_id: str, beat: Heartbeat, state: NodeState) -> None:
        self.beats.setdefault(node_id, []).append((beat, state))
        self.hbs[node_id] = self.hbs.get(node_id, 0) + 1

    @rule(data=st.data())
    def sandbox_ends_its_delete_lost(self, data: st.DataObject) -> None:
        live = [(n, sb) for n in NODES for sb in self.w.running[n]]
        if not live:
            return
        node_id, sb = data.draw(st.sampled_from(live))
        note(f"{sb} ends on {node_id}; its DELETE is lost")
        del self.w.running[node_id][sb]
        self.w.deleted.add(sb)
        self.gone[sb] = (node_id, self.hbs.get(node_id, 0))

    @rule(with_rid=st.booleans(), wait=st.sampled_from([0, 1_000, 2_500]))
    def a_sandbox_lives_between_two_heartbeats(self, with_rid: bool, wait: int) -> None:
        """Placed, created, assigned and gone before its node's next
        heartbeat, its DELETE lost: no roster will ever list it.  Then,
        ``wait`` ms later, the node's next two heartbeats come (the first,
        taken STAMP_MARGIN_MS after the assignment or more, releases it alone:
        the one-heartbeat release)."""
        p = None
        for _ in range(len(NODES)):  # until one lands on a roster node (the others stay placed)
            self.schedule(1, 512)
            p = self.placements.get(f"res{self.n}")
            if p is None or p.node_id in ROSTER_NODES:
                break
        if p is None or p.node_id not in ROSTER_NODES:
            return
        p.created = True
        self.w.created_total[p.node_id] += 1
        p.created_index = self.w.created_total[p.node_id]
        p.created_epoch = self.w.epoch[p.node_id]
        self.seen_sandboxes.add(p.sandbox)
        p.assigned = True
        wanted = p.rid if with_rid else None
        note(f"{p.sandbox} created on {p.node_id}, assigned, gone; its DELETE is lost")
        got = self.a.assign(p.sandbox, p.node_id, ep(p.node_id), wanted)
        assert got.reservation_id == self.m.assign(p.sandbox, p.node_id, wanted, self.now())
        if got.reservation_id:
            self.assigned_at[got.reservation_id] = self.hbs.get(p.node_id, 0)
        self.w.deleted.add(p.sandbox)
        self.gone[p.sandbox] = (p.node_id, self.hbs.get(p.node_id, 0))
        sid = f"boot-{self.w.epoch[p.node_id]}"
        beats = self.beats.get(p.node_id, [])
        placed = bool(beats) and beats[-1][0].service_instance_id == sid  # (a lead of sid)
        if wait:
            self.s.advance_clock(wait)
        self.send_heartbeat(p.node_id, self.a)
        if got.reservation_id and placed and wait >= STAMP_MARGIN_MS + 1_000:
            # (1 s of slack: stamps of one frozen instant step by 1 ms)
            live = {r.reservation_id for r in self.s.reservations()}
            assert got.reservation_id not in live, "the one-heartbeat release"
        self.send_heartbeat(p.node_id, self.a)

    @rule(data=st.data(), node_id=st.sampled_from(NODES))
    def an_older_heartbeat_arrives_late(self, data: st.DataObject, node_id: str) -> None:
        sid = f"boot-{self.w.epoch[node_id]}"
        older = [b for b in self.beats.get(node_id, [])[:-1] if b[0].service_instance_id == sid]
        if not older:
            return
        beat, state = data.draw(st.sampled_from(older))
        note(f"a late heartbeat of {node_id} (reported {beat.snapshot.reported_at_unix_ms})")
        r = self.b.heartbeat(beat)
        # (the model does what the scripts do; the invariants say what they should)
        self.m.heartbeat(
            node_id,
            sid,
            state,
            beat.snapshot.create_successes,
            beat.sandbox_ids,
            r.now_ms,
            beat.snapshot.reported_at_unix_ms,
            batched=self.batched,
        )

    @invariant()
    def the_newest_heartbeat_holds(self) -> None:
        stored = {n.node_id: n for n in node_states(self.s)}
        for node_id, beats in self.beats.items():
            newest = beats[-1][1]
            got = stored[node_id]
            assert (got.sandbox_count, got.allocated_cpu) == (
                newest.sandbox_count,
                newest.allocated_cpu,
            ), node_id

    @invariant()
    def capacity_is_given_back(self) -> None:
        for r in self.s.reservations():
            if r.state in ("assigned", "acked") and r.reservation_id not in self.assigned_at:
                self.assigned_at[r.reservation_id] = self.hbs.get(r.node_id, 0)
            if r.node_id not in ROSTER_NODES or r.sandbox_id not in self.gone:
                continue
            node_id, at = self.gone[r.sandbox_id]
            since = max(at, self.assigned_at.get(r.reservation_id, at))
            assert node_id != r.node_id or self.hbs[node_id] - since < 2, r


def test_lifecycle_with_lost_events_and_late_heartbeats(redis_client: Any) -> None:
    LossyLifecycle.client = redis_client
    run_machine(LossyLifecycle, 60)


class MovingLifecycle(Lifecycle):
    """The lifecycle with sandboxes two nodes claim (#28 point 4), in every
    order and with their events lost: a sandbox moves to the other roster
    node (its DELETE from the node it left sent or lost), a stale copy is
    listed by both (and goes again, with its DELETE or silently), a
    placement is created on the other node than the one it was placed on
    (the gateway records it where it was placed: an assignment on another
    node), and a DELETE of a node's previous agent instance arrives late.
    Every event carries its instance's ``service_instance_id``.  The rules
    of docs/design.md, row "a sandbox moving, or listed by two nodes":

    - never counted twice: no live reservation is charged to a sandbox any
      roster node's last ingested roster lists (less the sandboxes that
      node reported deleted since);
    - never dropped early: a placement's reservation lives until some
      node's roster listed its sandbox (then the node it moves to counts it
      when its roster lists it), or a DELETE of it came, or (created
      on the other node) two rosters of its own node came since its
      assignment without it (the two-heartbeat rule, which cannot know the
      sandbox runs elsewhere until that node lists it or reports it);
    - bindings agree with the model, which restores a listed binding on
      every heartbeat (the scripts' steady path must fall through to it).
    """

    def __init__(self) -> None:
        #: per roster node: sandboxes its DELETE came for since its last heartbeat
        self.dropped: dict[str, set[str]] = {n: set() for n in ROSTER_NODES}
        #: sandboxes a DELETE came for from some node (moved or gone)
        self.delete_came: set[str] = set()
        #: per node: heartbeats delivered
        self.hbs: dict[str, int] = {}
        #: every sandbox a delivered roster listed (a node's numbers counted it)
        self.ever_listed: set[str] = set()
        #: placements created on the other node -> their placed node's
        #: heartbeat count when their assignment was first seen (None: not yet)
        self.elsewhere: dict[str, int | None] = {}
        super().__init__()
        # a long-lived sandbox on each roster node, made outside the
        # scheduler: both nodes count by their rosters from the start
        for node_id in ROSTER_NODES:
            self.w.running[node_id][f"resident-{node_id}"] = (1, 512 * MIB)
            self.seen_sandboxes.add(f"resident-{node_id}")
            self.send_heartbeat(node_id, self.a)

    def sent(self, node_id: str, beat: Heartbeat, state: NodeState) -> None:
        self.dropped.setdefault(node_id, set()).clear()
        self.hbs[node_id] = self.hbs.get(node_id, 0) + 1
        self.ever_listed.update(beat.sandbox_ids)

    def send_delete(self, node_id: str, sb: str, sid: str) -> None:
        super().send_delete(node_id, sb, sid)
        if sid == f"boot-{self.w.epoch[node_id]}":
            self.dropped.setdefault(node_id, set()).add(sb)
            self.delete_came.add(sb)

    def counts_by_roster(self, node_id: str) -> bool:
        """The node is in roster mode and no restart of it is unheard."""
        return (
            node_id in ROSTER_NODES
            and self.m.meta[node_id].roster_mode
            and self.w.ingested_epoch.get(node_id) == self.w.epoch[node_id]
        )

    @staticmethod
    def other(node_id: str) -> str:
        return ROSTER_NODES[1 - ROSTER_NODES.index(node_id)]

    def beats_follow(self, first: str, then: str, replica: int) -> None:
        """``first``'s heartbeat, then ``then``'s, through one replica (0, 1)
        or none (-1: they come later, in whatever order the steps make)."""
        if replica >= 0:
            for node_id in (first, then):
                self.send_heartbeat(node_id, self.b if replica else self.a)

    @rule(data=st.data(), delete_lost=st.booleans(), beats=st.sampled_from([-1, 0, 1]))
    def a_sandbox_moves(self, data: st.DataObject, delete_lost: bool, beats: int) -> None:
        live = [
            (n, sb)
            for n in ROSTER_NODES
            for sb in self.w.running[n]
            if sb not in self.w.running[self.other(n)]
            and self.counts_by_roster(n)
            and self.counts_by_roster(self.other(n))
        ]
        if not live:
            return
        src, sb = data.draw(st.sampled_from(live))
        dst = self.other(src)
        note(f"{sb} moves from {src} to {dst}; its DELETE on {src} lost: {delete_lost}")
        self.w.running[dst][sb] = self.w.running[src].pop(sb)
        if not delete_lost:
            self.send_delete(src, sb, f"boot-{self.w.epoch[src]}")
        self.beats_follow(dst, src, beats)

    @rule(data=st.data(), beats=st.sampled_from([-1, 0, 1]))
    def a_copy_is_listed_by_another_node(self, data: st.DataObject, beats: int) -> None:
        live = [
            (n, sb)
            for n in ROSTER_NODES
            for sb in self.w.running[n]
            if sb not in self.w.running[self.other(n)] and self.counts_by_roster(self.other(n))
        ]
        if not live:
            return
        src, sb = data.draw(st.sampled_from(live))
        note(f"a stale copy of {sb} (on {src}) runs on {self.other(src)} too")
        self.w.running[self.other(src)][sb] = self.w.running[src][sb]
        self.beats_follow(self.other(src), src, beats)

    @rule(data=st.data())
    def a_copy_goes_silently(self, data: st.DataObject) -> None:
        both = [
            (n, sb)
            for n in ROSTER_NODES
            for sb in self.w.running[n]
            if sb in self.w.running[self.other(n)]
        ]
        if not both:
            return
        node_id, sb = data.draw(st.sampled_from(both))
        note(f"the copy of {sb} on {node_id} goes; no DELETE")
        del self.w.running[node_id][sb]

    @rule(data=st.data())
    def node_creates_on_the_other_node(self, data: st.DataObject) -> None:
        """The placement's sandbox comes up on the other roster node (which
        counts the creation); the gateway records it where it was placed."""
        todo = [
            p
            for p in self.placements.values()
            if not p.created
            and not p.cancelled
            and not p.failed
            and p.node_id in ROSTER_NODES
            and self.counts_by_roster(self.other(p.node_id))
        ]
        if not todo:
            return
        p = data.draw(st.sampled_from(todo))
        dst = self.other(p.node_id)
        note(f"{dst} creates {p.sandbox} for {p.rid}, placed on {p.node_id}")
        self.elsewhere[p.rid] = None
        p.created = True
        self.w.created_total[dst] += 1
        p.created_index = self.w.created_total[dst]
        p.created_epoch = self.w.epoch[dst]
        self.w.running[dst][p.sandbox] = (p.cpu, p.mem)
        self.seen_sandboxes.add(p.sandbox)

    @rule(
        order=st.sampled_from(["listed-first", "assigned-first", "created-event", "later"]),
        with_rid=st.booleans(),
    )
    def an_assignment_on_another_node(self, order: str, with_rid: bool) -> None:
        """Placed on one roster node, created on the other, recorded where
        it was placed, in one of these orders: the lister's heartbeat then
        the assignment, the assignment then the heartbeat, the assignment,
        the lister's CREATE event then its heartbeat, or the assignment
        alone (what follows comes in later steps)."""
        p = None
        for _ in range(len(NODES)):  # until one lands on a roster node
            self.schedule(1, 512)
            p = self.placements.get(f"res{self.n}")
            if p is None or p.node_id in ROSTER_NODES:
                break
        if p is None or p.node_id not in ROSTER_NODES:
            return
        lister = self.other(p.node_id)
        if not self.counts_by_roster(lister):
            return
        self.elsewhere[p.rid] = None
        p.created = True
        self.w.created_total[lister] += 1
        p.created_index = self.w.created_total[lister]
        p.created_epoch = self.w.epoch[lister]
        self.w.running[lister][p.sandbox] = (p.cpu, p.mem)
        self.seen_sandboxes.add(p.sandbox)
        note(f"{lister} creates {p.sandbox} for {p.rid}, placed on {p.node_id}: {order}")
        if order == "listed-first":
            self.send_heartbeat(lister, self.a)
        p.assigned = True
        wanted = p.rid if with_rid else None
        got = self.a.assign(p.sandbox, p.node_id, ep(p.node_id), wanted)
        assert got.reservation_id == self.m.assign(p.sandbox, p.node_id, wanted, self.now())
        if order == "created-event":
            sid = f"boot-{self.w.epoch[lister]}"
            self.a.events(lister, [SandboxEvent(sandbox_id=p.sandbox, event_type="CREATE")], sid)
            self.m.events(lister, [(p.sandbox, "CREATE")], self.now(), sid)
        if order in ("assigned-first", "created-event"):
            self.send_heartbeat(lister, self.s2)

    @rule(data=st.data())
    def a_late_delete_of_the_previous_instance(self, data: st.DataObject) -> None:
        """The node's agent restarted (now, if it had not) and its new
        instance's heartbeat came; then a DELETE its previous instance sent
        arrives, for a sandbox that still runs."""
        live = [(n, sb) for n in NODES for sb in self.w.running[n]]
        if not live:
            return
        node_id, sb = data.draw(st.sampled_from(live))
        if (
            self.w.epoch[node_id] == 0
            or self.w.ingested_epoch.get(node_id) != self.w.epoch[node_id]
        ):
            if self.w.epoch[node_id] == 0:
                self.node_agent_restarts(node_id)
            self.send_heartbeat(node_id, self.a)
        old = f"boot-{self.w.epoch[node_id] - 1}"
        note(f"a late DELETE of {sb} from {node_id}'s previous instance {old}")
        self.send_delete(node_id, sb, old)

    @invariant()
    def never_counted_twice(self) -> None:
        listed: set[str] = set()
        for n in ROSTER_NODES:
            listed |= self.w.ingested_roster.get(n, set()) - self.dropped.get(n, set())
        for r in self.s.reservations():
            assert r.sandbox_id not in listed, r

    @invariant()
    def never_dropped_early(self) -> None:
        if self.s.stats().expired_total:
            return  # expiry is the fourth way out; its timing is checked by the model
        for rid, at in self.elsewhere.items():
            if at is None and self.placements[rid].assigned:
                self.elsewhere[rid] = self.hbs.get(self.placements[rid].node_id, 0)
        super().never_dropped_early()

    def accounted(self, p: Placement, node_id: str) -> bool:
        # (once a roster listed it, a node's numbers counted it: a sandbox
        # that moved on is the next node's to list)
        if super().accounted(p, node_id) or p.sandbox in self.ever_listed:
            return True
        if node_id not in ROSTER_NODES:
            return False
        # (created on the other node and assigned here: this node's two
        # rosters since, which never listed it, may end it before the node
        # running it lists it, docs/design.md)
        at = self.elsewhere.get(p.rid)
        return p.sandbox in self.delete_came or (
            at is not None and self.hbs.get(node_id, 0) - at >= 2
        )


def test_lifecycle_with_moves_against_the_model(redis_client: Any) -> None:
    MovingLifecycle.client = redis_client
    run_machine(MovingLifecycle, 60)


class Wire:
    """One ``schedctl serve`` replica as the steps drive it: the reference
    system's gRPC calls, answered as the library answers them where the wire
    says as much (a Schedule's reservation id from its trailing metadata; an
    assignment's charge from the binding it wrote; a heartbeat says nothing
    of what it released)."""

    def __init__(self, address: str, lib: Scheduler, now: Any) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.SchedulerStub(self.channel)
        self.lib, self.now = lib, now

    def schedule(self, req: Request, reservation_id: str = "") -> Any:
        cpu, mem = req.cpu or 0, (req.memory_bytes or 0) // MIB
        try:
            resp, call = self.stub.Schedule.with_call(cold(cpu, mem), timeout=10)
        except grpc.RpcError as e:
            raise NoNodesAvailable(e.details() or "") from None
        rid = dict(call.trailing_metadata() or ()).get("x-reservation-id", "")
        return SimpleNamespace(node_id=resp.node.node_id, reservation_id=rid)

    def assign(self, sb: str, node_id: str, endpoint: str, wanted: str | None) -> Any:
        md = (("x-reservation-id", wanted),) if wanted else ()
        self.stub.RecordAssignment(
            pb.RecordAssignmentRequest(
                sandbox_id=sb, node=pb.Node(node_id=node_id, endpoint=endpoint)
            ),
            metadata=md,
            timeout=10,
        )
        rid = self.lib.client.hget(self.lib.keys.bind(sb), "reservation_id")
        return SimpleNamespace(reservation_id=(rid or b"").decode() or None)

    def heartbeat(self, beat: Heartbeat) -> Any:
        n = beat.snapshot
        self.stub.Heartbeat(
            pb.HeartbeatRequest(
                node_id=beat.node_id,
                service_instance_id=beat.service_instance_id,
                snapshot=pb.NodeSnapshot(
                    status=pb.NODE_STATUS_READY,
                    cpu_count=n.cpu_count,
                    memory_total_bytes=n.memory_total_bytes,
                    allocated_cpu=n.allocated_cpu,
                    allocated_memory_bytes=n.allocated_memory_bytes,
                    sandbox_count=n.sandbox_count,
                    create_successes=n.create_successes,
                    create_fails=n.create_fails,
                    reported_at_unix_ms=n.reported_at_unix_ms,
                ),
                sandbox_ids=beat.sandbox_ids,
            ),
            timeout=10,
        )
        return SimpleNamespace(released=None, now_ms=self.now())

    def events(self, node_id: str, events: list[SandboxEvent], sid: str = "") -> None:
        self.stub.ReportSandboxEvent(
            pb.ReportSandboxEventRequest(
                node_id=node_id,
                service_instance_id=sid,
                events=[
                    pb.SandboxEvent(
                        sandbox_id=e.sandbox_id,
                        event_type=pb.SandboxEventType.Value(f"SANDBOX_EVENT_TYPE_{e.event_type}"),
                    )
                    for e in events
                ],
            ),
            timeout=10,
        )


#: the replicas' config: the machine's POLICY as upstream's keys spell it
WIRE_CONFIG = {
    "scheduler": {
        "node_resource_limit": {"max_sandbox_count": POLICY.limits.max_sandbox_count},
        "placement_reservation_ttl": f"{POLICY.reservation_ttl_ms}ms",
        "binding_ttl": f"{POLICY.binding_ttl_ms}ms",
        "report_ttl": f"{POLICY.report_ttl_ms}ms",
    }
}


class WireLifecycle(LossyLifecycle):
    """The lossy lifecycle through two real ``schedctl serve`` replicas on a
    cell of its own (#28): Schedules, assignments, heartbeats (the late ones
    through the other replica) and events go over the reference system's
    gRPC contract; cancels, the clock and every check go to Redis through
    the library (the wire has no cancel).  Each example starts the two
    replicas afresh, so no replica's memory of an earlier example's cell
    (its placements, its heartbeat memo) meets this one."""

    redis_url = ""
    examples = 0
    flush = False
    #: (a replica sends a Heartbeat RPC's heartbeat and its CPU config
    #: ingest as one batch)
    batched = True

    def __init__(self) -> None:
        WireLifecycle.examples += 1
        self.cell = f"wire{WireLifecycle.examples}"
        self.procs = [ServeProcess(WIRE_CONFIG, self.redis_url, cell=self.cell) for _ in range(2)]
        for proc in self.procs:
            proc.wait_serving(60)
        super().__init__()

    def drivers(self) -> tuple[Any, Any]:
        assert self.s.policy() == POLICY, "the replicas' config is the machine's policy"
        self.wires = [Wire(p.address, self.s, self.now) for p in self.procs]
        return self.wires[0], self.wires[1]

    def teardown(self) -> None:
        for w in getattr(self, "wires", []):
            w.channel.close()
        close_all(self.procs)


def test_lifecycle_through_two_replicas_against_the_model(real_url: str) -> None:
    WireLifecycle.client = redis.Redis.from_url(real_url)
    WireLifecycle.redis_url = real_url
    run_machine(WireLifecycle, 12)
