"""The client API of one cell: :class:`Scheduler` (synchronous) here,
:class:`~scheduler.client.aio.AsyncScheduler` (asyncio) beside it, both with the same
operations, written once as plans (:mod:`scheduler.client.plans`).

Failures reach callers as :mod:`scheduler.domain.errors` (see
:mod:`scheduler.store.translate`); calls are built by :mod:`scheduler.store.calls`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any, TypeVar, cast

from scheduler.client.aio import AsyncScheduler, wrote_nothing
from scheduler.client.plans import (
    SLOT_RETRY_S,
    SLOT_UNSETTLED,
    BaseClient,
    CellSetup,
    Observer,
    Owed,
    log,
)
from scheduler.domain.errors import (
    SchedulerError,
    StoreUnavailable,
)
from scheduler.domain.history import REWOUND_GRACE_MS, Probe
from scheduler.domain.policy import Policy
from scheduler.domain.records import (
    AssignResult,
    Binding,
    Census,
    EventsResult,
    Explanation,
    Heartbeat,
    HeartbeatResult,
    ListedNode,
    NodeView,
    ObservedNode,
    Placement,
    RebuildStep,
    Request,
    Reservation,
    SandboxEvent,
    Stats,
)
from scheduler.store.address import DEFAULT_TIMEOUT_S, describe_target
from scheduler.store.calls import CENSUS_STEP, REBUILD_STEP, Call, Ops, Plan, schedule_argv
from scheduler.store.connection import async_client, sync_client
from scheduler.store.durability import Durability
from scheduler.store.keys import DEFAULT_CELL, DEFAULT_PREFIX
from scheduler.store.p2p import DEFAULT_STORE_CAPACITY, Peer
from scheduler.store.replies import parsed
from scheduler.store.scripts import EVAL, ScriptRegistry
from scheduler.store.sentinel import PrimaryCheck, is_sentinel_client
from scheduler.store.translate import translated

T = TypeVar("T")


class Scheduler(BaseClient):
    """Synchronous client of one cell."""

    @classmethod
    def connect(
        cls,
        url: str | None = None,
        *,
        cell: str = DEFAULT_CELL,
        prefix: str = DEFAULT_PREFIX,
        policy: Policy | None = None,
        overwrite_policy: bool = False,
        durability: Durability | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> Scheduler:
        with translated(describe_target(url)):  # (a cluster client connects at once)
            client = sync_client(url, timeout_s)
        s = cls(client, cell, prefix, url, durability, timeout_s)
        if policy is not None:
            s.sync_policy(policy, overwrite=overwrite_policy)
        return s

    def __init__(
        self,
        client: Any,
        cell: str = DEFAULT_CELL,
        prefix: str = DEFAULT_PREFIX,
        url: str | None = None,
        durability: Durability | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__(client, cell, prefix, url, durability, timeout_s)
        self.scripts = ScriptRegistry(client)
        self._primary_check = PrimaryCheck(client) if is_sentinel_client(client) else None

    def run(self, call: Call[T]) -> T:
        """Run one call."""
        start = time.perf_counter()
        try:
            self._fenced(call)
            if self._primary_check is not None:
                with translated(self.target):
                    self._primary_check()
            if self.abandoned:
                self._cancel_abandoned()
            if self.owed:
                self._write_owed()
            with translated(self.target):
                result = parsed(call.script, call.parse, self._send(call))
        except BaseException as e:
            self._observe(call.script, start, e)
            raise
        self._observe(call.script, start, None)
        return result

    def _send(self, call: Call[Any]) -> Any:
        give_up = time.monotonic() + self.timeout_s
        while True:
            try:
                if self._waits(call):
                    wanted = self._wait_for()
                    reply, acked = self.scripts.call_acked(
                        call.script,
                        call.keys,
                        call.args,
                        wanted,
                        self.durability.timeout_ms,
                    )
                    self._check_acked(acked, wanted)
                    return reply
                return self.scripts[call.script](keys=call.keys, args=call.args)
            except SLOT_UNSETTLED:
                if not self.cluster or time.monotonic() + SLOT_RETRY_S > give_up:
                    raise
                time.sleep(SLOT_RETRY_S)

    def _drive(self, plan: Plan[T]) -> T:
        """Run a plan's calls one after another; its value is the answer."""
        try:
            call = next(plan)
            while True:
                try:
                    reply = self.run(call)
                except BaseException as e:  # the plan may handle it (Resync, a lost cell)
                    call = plan.throw(e)
                else:
                    call = plan.send(reply)
        except StopIteration as done:
            return cast(T, done.value)

    def _one(self, call: Call[T]) -> T:
        return self._drive(self._step(call))

    def _cancel_abandoned(self) -> None:
        """Cancel the placements whose callers gave up, now that Redis may answer."""
        self._stale_abandoned()
        pending, self.abandoned = self.abandoned, {}
        for rid, since in pending.items():
            try:
                self.run(self.ops.abandon(rid))
            except StoreUnavailable:
                self.abandoned[rid] = since
            except SchedulerError as e:
                log.warning("could not cancel abandoned placement %s: %s", rid, e.message)

    def _write_owed(self) -> None:
        """Write the assignments refused for Redis, now that it may answer."""
        self._stale_owed()
        pending, self.owed = self.owed, {}
        items = list(pending.items())
        for i, (sb, o) in enumerate(items):
            try:
                self.assign(sb, o.node_id, o.endpoint, o.reservation_id)
            except StoreUnavailable:
                for left, owed in items[i:]:
                    self.owed.setdefault(left, owed)
                return
            except SchedulerError as e:
                log.warning("could not write the assignment of %s refused earlier: %s", sb, e)

    def close(self) -> None:
        self.client.close()

    def ping(self) -> None:
        with translated(self.target):
            self.client.ping()

    # -- the cell ------------------------------------------------------------
    def prepare_cell(self, overwrite: bool = False) -> str:
        """Store or check the kept policy and static node list (a replica's
        start-up): "created", "same" or "overwritten"; PolicyConflict or
        StaticNodesConflict when the cell says otherwise (unless ``overwrite``)."""
        return self._drive(self._prepare(overwrite))

    def restore_cell(self) -> None:
        """Put the kept policy and node list back if Redis lost them."""
        self._drive(self._restore())

    def sync_policy(self, policy: Policy, overwrite: bool = False, restore: bool = False) -> str:
        return self.run(self.ops.sync_policy(policy, overwrite, restore))

    def sync_nodes(self, nodes: list[tuple[str, str]]) -> tuple[int, int]:
        return self._drive(self._sync_nodes(nodes))

    def sync_discovered(
        self, positions: Sequence[int], nodes: Sequence[tuple[str, str, bool]]
    ) -> tuple[bool, int, int]:
        return self._drive(self._sync_discovered(positions, nodes))

    def policy(self) -> Policy | None:
        return self._one(self.ops.policy())

    def settle(self) -> int:
        return self._one(self.ops.settle())

    def sweep(self) -> tuple[int, int]:
        return self._one(self.ops.sweep())

    def advance_clock(self, ms: int, mode: str = "") -> int:
        return self._one(self.ops.advance_clock(ms, mode))

    def probe(self) -> bool:
        return self.probe_cell().has_policy

    def probe_cell(self) -> Probe:
        return self.run(self.ops.probe(write=self.scripts.mode == EVAL))

    def rewound(
        self, generation: int, expected_now_ms: int | None, bound_ms: int, probed: int | None = None
    ) -> tuple[bool, int, int, int, int]:
        return self.run(self.ops.rewound(generation, expected_now_ms, bound_ms, probed))

    def reconcile_rewound(self, before_ms: int, most: int) -> tuple[int, bool]:
        return self.run(self.ops.reconcile_rewound(before_ms, most))

    # -- nodes ---------------------------------------------------------------
    def heartbeat(self, hb: Heartbeat, *, cpu_config: bool = False) -> HeartbeatResult:
        """Record a node's heartbeat.  ``cpu_config``: also run the cluster's
        CPU config exchange; the result then carries what to hand the node."""
        return self._drive(self._heartbeat(hb, cpu_config))

    def events(
        self, node_id: str, events: list[SandboxEvent], service_instance_id: str = ""
    ) -> EventsResult:
        return self._one(self.ops.events(node_id, events, service_instance_id))

    def unregister(self, node_id: str, service_instance_id: str) -> bool:
        return self._drive(self._unregister(node_id, service_instance_id))

    def set_lingering(self, node_id: str, lingering: bool) -> bool:
        return self._one(self.ops.set_lingering(node_id, lingering))

    def nodes(self) -> list[NodeView]:
        return self._drive(self._nodes())

    def list_nodes(self) -> list[ListedNode]:
        return self._drive(self._listed())

    def observed_nodes(self, cluster_id: str = "") -> list[ObservedNode]:
        return self._drive(self._observed(cluster_id))

    def observed_node(self, node_id: str, cluster_id: str = "") -> ObservedNode:
        return self._drive(self._observed_node(node_id, cluster_id))

    # -- placement -----------------------------------------------------------
    def schedule(
        self, req: Request, strategy: str | None = None, reservation_id: str | None = None
    ) -> Placement:
        """Place (and for a creation, reserve).  When the answer is lost (Redis
        unreachable mid-call, or the placement not replicated as asked), the
        reservation is cancelled, now or on a later call, so none stays behind."""
        call = self.ops.schedule(req, strategy, reservation_id)
        try:
            placed = self._one(call)
        except Exception as e:
            rid = schedule_argv(call).reservation_id
            if rid and not wrote_nothing(e):
                self._remember(rid)
            raise
        self._remember_placement(placed)
        return placed

    def abandon(self, reservation_id: str) -> None:
        """Cancel this placement, now or on a later call: its caller gave up
        (the placement is abandoned)."""
        self._remember(reservation_id)
        with contextlib.suppress(StoreUnavailable):
            self._cancel_abandoned()

    #: the former name of :meth:`abandon` (kept for callers of earlier versions)
    forget = abandon

    def explain(self, req: Request, strategy: str | None = None) -> Explanation:
        return self._one(self.ops.explain(req, strategy))

    def assign(
        self, sandbox_id: str, node_id: str, endpoint: str, reservation_id: str | None = None
    ) -> AssignResult:
        result = self._one(self.ops.assign(sandbox_id, node_id, endpoint, reservation_id))
        self._remember_assignment(sandbox_id, node_id, endpoint, result, reservation_id)
        return result

    def owe_assignment(
        self, sandbox_id: str, node_id: str, endpoint: str, reservation_id: str | None = None
    ) -> None:
        """As :meth:`AsyncScheduler.owe_assignment`: written now if Redis
        answers, else before a later call of this client."""
        self._owe(Owed(sandbox_id, node_id, endpoint, reservation_id, time.monotonic()))
        with contextlib.suppress(StoreUnavailable):
            self._write_owed()

    def replay_assignments(self) -> tuple[int, int]:
        """As :meth:`AsyncScheduler.replay_assignments`."""
        return self._drive(self._replay())

    def replay_reservations(self, grace_ms: int = REWOUND_GRACE_MS) -> tuple[int, int, int, int]:
        """As :meth:`AsyncScheduler.replay_reservations`."""
        return self._drive(self._replay_reservations(grace_ms))

    def cancel(self, reservation_id: str) -> str:
        return self._one(self.ops.cancel(reservation_id))

    def reservations(self, node_id: str | None = None) -> list[Reservation]:
        return self._drive(self._reservations(node_id))

    def reservation(self, reservation_id: str) -> Reservation:
        return self._drive(self._reservation(reservation_id))

    def lookup(self, sandbox_id: str) -> Binding:
        return self._one(self.ops.lookup(sandbox_id))

    def stats(self) -> Stats:
        return self._one(self.ops.stats())

    def census(self, step: int = CENSUS_STEP) -> Census:
        """One bounded step of the cell's node census; the last finished pass back."""
        return self._one(self.ops.census(step))

    def index_rebuild(self, mode: str = "step", step: int = REBUILD_STEP) -> RebuildStep:
        """One bounded step of the placement index's rebuild (``mode`` "start":
        a new rebuild first); whether the index is whole again."""
        return self._one(self.ops.index_rebuild(mode, step))

    # -- P2P -----------------------------------------------------------------
    def peers(
        self, cluster_id: str = "", backend: str = "", exclude_node_id: str = ""
    ) -> list[Peer]:
        return self._drive(self._peers(cluster_id, backend, exclude_node_id))

    def record_artifact(
        self,
        cluster_id: str,
        backend: str,
        key: str,
        node_id: str,
        capacity: int = DEFAULT_STORE_CAPACITY,
    ) -> int:
        return self._one(self.peer_ops.record(cluster_id, backend, key, node_id, capacity))

    def forget_artifact(self, cluster_id: str, backend: str, key: str, node_id: str) -> bool:
        return self._one(self.peer_ops.forget(cluster_id, backend, key, node_id))

    def lookup_artifact(
        self, cluster_id: str, backend: str, key: str, exclude_node_id: str = "", limit: int = 0
    ) -> list[Peer]:
        return self._drive(self._lookup(cluster_id, backend, key, exclude_node_id, limit))


__all__ = [
    "AsyncScheduler",
    "Call",
    "CellSetup",
    "Observer",
    "Ops",
    "Scheduler",
    "SchedulerError",
    "async_client",
    "describe_target",
    "sync_client",
]
