"""The asyncio client of one cell: the operations of
:class:`~scheduler.client.sync.Scheduler`, awaitable, each Redis call bounded by a
caller's deadline (``timeout``, or a :meth:`~scheduler.client.plans.BaseClient.scoped`
block's).
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar, cast

from scheduler.client.plans import _SCOPE, SLOT_RETRY_S, SLOT_UNSETTLED, BaseClient, Owed, log
from scheduler.domain.errors import (
    CellNotInitialised,
    FailedPrecondition,
    IndexBehind,
    InvalidArgument,
    NoNodesAvailable,
    NotFound,
    SchedulerError,
    StoreUnavailable,
    UnknownNode,
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
from scheduler.store.address import DEFAULT_TIMEOUT_S
from scheduler.store.calls import (
    CENSUS_STEP,
    HEARTBEAT_SCRIPTS,
    REBUILD_STEP,
    Call,
    Plan,
    schedule_argv,
)
from scheduler.store.connection import async_client
from scheduler.store.durability import Durability
from scheduler.store.keys import DEFAULT_CELL, DEFAULT_PREFIX
from scheduler.store.p2p import DEFAULT_STORE_CAPACITY, Peer
from scheduler.store.replies import parsed
from scheduler.store.scripts import EVAL, AsyncScriptRegistry
from scheduler.store.translate import translated

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

#: A script's own refusals: it answers them before its first write
#: (lua/includes/base.lua ``fail``), so a Schedule refused so reserved nothing.
_REFUSED_BEFORE_WRITING = (
    InvalidArgument,
    NoNodesAvailable,
    IndexBehind,
    UnknownNode,
    NotFound,
)


def wrote_nothing(e: BaseException) -> bool:
    """Did a Schedule that raised ``e`` surely leave no reservation?  True for
    the scripts' own refusals (no policy, bad input, nothing eligible); False
    for everything else: a lost answer, a cancelled caller, an ACL refusal or
    a runtime error in the middle of a script or of a batch."""
    if isinstance(e, FailedPrecondition):
        return type(e) in (FailedPrecondition, CellNotInitialised)
    return isinstance(e, _REFUSED_BEFORE_WRITING)


class AsyncScheduler(BaseClient):
    """asyncio client of one cell; the same operations as :class:`Scheduler`."""

    @classmethod
    async def connect(
        cls,
        url: str | None = None,
        *,
        cell: str = DEFAULT_CELL,
        prefix: str = DEFAULT_PREFIX,
        policy: Policy | None = None,
        overwrite_policy: bool = False,
        durability: Durability | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> AsyncScheduler:
        s = cls(async_client(url, timeout_s), cell, prefix, url, durability, timeout_s)
        if policy is not None:
            await s.sync_policy(policy, overwrite=overwrite_policy)
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
        self.scripts = AsyncScriptRegistry(client)
        self._reaper: asyncio.Task[None] | None = None
        self._payer: asyncio.Task[None] | None = None
        #: told (with the monotonic times it was sent and answered) of every Schedule with a
        #: fresh reservation id answered with a placement (HistoryWatch)
        self.on_placed: Callable[[float, float], None] | None = None
        #: Schedules, and heartbeats, that arrive while one is on its way go
        #: together as one call
        self.coalescer: Coalescer[Placement] = Coalescer(
            self, "schedule", self.ops.schedule_batch, frozenset({"schedule"})
        )
        #: (heartbeats and the CPU config exchange's steps: results of either kind)
        self.beat_coalescer: Coalescer[Any] = Coalescer(
            self, "heartbeat", self.ops.heartbeat_batch, frozenset(HEARTBEAT_SCRIPTS)
        )

    async def run(self, call: Call[T], timeout: float | None = None) -> T:
        """Run one call, bounded by ``timeout`` (a caller's deadline, also a
        :meth:`scoped` one) and the client's own timeout, whichever is shorter."""
        left = self._deadline_left()
        if left is not None:
            timeout = left if timeout is None else min(timeout, left)
        limit = self.timeout_s if timeout is None else max(0.0, min(timeout, self.timeout_s))
        start = time.perf_counter()
        try:
            self._fenced(call)
            try:
                unsettled: list[Exception] = []
                async with _deadline(limit):
                    with translated(self.target):
                        reply = await self._send(call, unsettled)
            except TimeoutError:
                if unsettled:
                    raise StoreUnavailable(
                        f"Redis at {self.target} cannot serve: its slot is moving or its "
                        f"primary is failing over ({type(unsettled[-1]).__name__} for "
                        f"{limit:.3g}s)"
                    ) from None
                raise StoreUnavailable(
                    f"Redis at {self.target} did not answer within {limit:.3g}s"
                ) from None
            with translated(self.target):
                result = parsed(call.script, call.parse, reply)
        except BaseException as e:
            self._observe(call.script, start, e)
            raise
        self._observe(call.script, start, None)
        return result

    async def _send(self, call: Call[Any], unsettled: list[Exception]) -> Any:
        while True:
            try:
                if self._waits(call):
                    wanted = self._wait_for()
                    reply, acked = await self.scripts.call_acked(
                        call.script,
                        call.keys,
                        call.args,
                        wanted,
                        self.durability.timeout_ms,
                    )
                    self._check_acked(acked, wanted)
                    return reply
                return await self.scripts[call.script](keys=call.keys, args=call.args)
            except SLOT_UNSETTLED as e:
                if not self.cluster:
                    raise
                unsettled.append(e)
                await asyncio.sleep(SLOT_RETRY_S)  # (the caller's deadline bounds the loop)

    async def _drive(self, plan: Plan[T], via: Coalescer[Any] | None = None) -> T:
        """Run a plan's calls one after another; its value is the answer.
        ``via``: a coalescer its calls of that kind go through."""
        try:
            call = next(plan)
            while True:
                try:
                    if via is not None and via.enabled and call.script in via.takes:
                        reply = await via.submit(call)
                    else:
                        reply = await self.run(call)
                except Exception as e:  # the plan may handle it (Resync, a lost cell)
                    call = plan.throw(e)
                else:
                    call = plan.send(reply)
        except StopIteration as done:
            return cast(T, done.value)

    def _one(self, call: Call[T]) -> Awaitable[T]:
        return self._drive(self._step(call))

    def abandon(self, reservation_id: str) -> None:
        """Cancel this placement in the background: its caller gave up, or its
        answer was lost (the placement is abandoned).  Retried until Redis
        answers (idempotent)."""
        self._remember(reservation_id)
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._cancel_abandoned(), name="abandon")

    #: the former name of :meth:`abandon` (kept for callers of earlier versions)
    forget = abandon

    async def _cancel_abandoned(self) -> None:
        async def cancel(rid: str, since: float) -> None:
            try:
                await self.run(self.ops.abandon(rid))
            except StoreUnavailable:
                raise
            except SchedulerError as e:
                log.warning("could not cancel abandoned placement %s: %s", rid, e.message)

        await self._until_answered(self.abandoned, cancel, self._stale_abandoned)

    async def _until_answered(
        self,
        pending: dict[K, V],
        send: Callable[[K, V], Awaitable[None]],
        stale: Callable[[], None],
    ) -> None:
        """Send each of ``pending`` (a background task's work: abandoned
        placements, owed assignments) until Redis answers, dropping each once
        sent (unless it was replaced meanwhile) and what ``stale`` drops; the
        whole pass again after a backoff (50 ms to 1 s) while Redis does not."""
        self._unscoped()  # (a task copies its creator's context: not that RPC's deadline)
        delay = 0.05
        while pending:
            stale()
            for key, value in list(pending.items()):
                try:
                    await send(key, value)
                except StoreUnavailable:
                    break
                if pending.get(key) is value:
                    del pending[key]
            else:
                continue
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)

    def owe_assignment(
        self, sandbox_id: str, node_id: str, endpoint: str, reservation_id: str | None = None
    ) -> None:
        """Write this assignment in the background once Redis answers: its
        record was refused for Redis (StoreUnavailable: down, failing over,
        writes held until a new primary is checked).  The gateway sends a
        RecordAssignment once, after the create succeeded, so the sandbox is
        on its node; unwritten, its reservation would stay pending, counted
        beside the node's own count of it, until unassigned_reservation_ttl.
        Written as :meth:`assign` writes it (idempotent: an assignment the
        cell has already changes nothing), retried until Redis answers, for
        at most :data:`~scheduler.client.plans.OWED_FOR_S`."""
        self._owe(Owed(sandbox_id, node_id, endpoint, reservation_id, time.monotonic()))
        if self._payer is None or self._payer.done():
            self._payer = asyncio.create_task(self._write_owed(), name="owed-assignments")

    async def _write_owed(self) -> None:
        async def write(sb: str, o: Owed) -> None:
            try:
                await self.assign(sb, o.node_id, o.endpoint, o.reservation_id)
            except StoreUnavailable:
                raise
            except SchedulerError as e:
                log.warning("could not write the assignment of %s refused earlier: %s", sb, e)
            else:
                log.info(
                    "wrote the assignment of %s to %s, refused %.1f s ago for Redis",
                    sb,
                    o.node_id,
                    time.monotonic() - o.since,
                )

        await self._until_answered(self.owed, write, self._stale_owed)

    async def close(self) -> None:
        if self._payer is not None and not self._payer.done():
            # a last chance for owed assignments, then give up on them
            await asyncio.wait([self._payer], timeout=1.0)
            self._payer.cancel()
        if self._reaper is not None and not self._reaper.done():
            # a last chance for abandoned placements, then give up on them
            await asyncio.wait([self._reaper], timeout=1.0)
            self._reaper.cancel()
        await self.scripts.close()
        await self.client.aclose()

    async def ping(self) -> None:
        with translated(self.target):
            await self.client.ping()

    # -- the cell ------------------------------------------------------------
    def prepare_cell(self, overwrite: bool = False) -> Awaitable[str]:
        """Store or check the kept policy and static node list (a replica's
        start-up): "created", "same" or "overwritten"; PolicyConflict or
        StaticNodesConflict when the cell says otherwise (unless ``overwrite``)."""
        return self._drive(self._prepare(overwrite))

    def restore_cell(self) -> Awaitable[None]:
        """Put the kept policy and node list back if Redis lost them."""
        return self._drive(self._restore())

    def sync_policy(
        self, policy: Policy, overwrite: bool = False, restore: bool = False
    ) -> Awaitable[str]:
        return self.run(self.ops.sync_policy(policy, overwrite, restore))

    def sync_nodes(self, nodes: list[tuple[str, str]]) -> Awaitable[tuple[int, int]]:
        return self._drive(self._sync_nodes(nodes))

    def sync_discovered(
        self, positions: Sequence[int], nodes: Sequence[tuple[str, str, bool]]
    ) -> Awaitable[tuple[bool, int, int]]:
        return self._drive(self._sync_discovered(positions, nodes))

    def policy(self) -> Awaitable[Policy | None]:
        return self._one(self.ops.policy())

    def settle(self) -> Awaitable[int]:
        return self._one(self.ops.settle())

    def sweep(self) -> Awaitable[tuple[int, int]]:
        return self._one(self.ops.sweep())

    def advance_clock(self, ms: int, mode: str = "") -> Awaitable[int]:
        return self._one(self.ops.advance_clock(ms, mode))

    async def probe(self, timeout: float | None = None) -> bool:
        """Can this client write to the cell?  True when it has its policy."""
        return (await self.probe_cell(timeout)).has_policy

    def probe_cell(self, timeout: float | None = None) -> Awaitable[Probe]:
        """The health probe, with what it read of the cell's history."""
        return self.run(self.ops.probe(write=self.scripts.mode == EVAL), timeout)

    def rewound(
        self, generation: int, expected_now_ms: int | None, bound_ms: int, probed: int | None = None
    ) -> Awaitable[tuple[bool, int, int, int, int]]:
        """Settle a cell whose data went back in time or whose clock jumped
        (see Ops.rewound)."""
        return self.run(self.ops.rewound(generation, expected_now_ms, bound_ms, probed))

    def reconcile_rewound(self, before_ms: int, most: int) -> Awaitable[tuple[int, bool]]:
        return self.run(self.ops.reconcile_rewound(before_ms, most))

    # -- nodes ---------------------------------------------------------------
    def heartbeat(self, hb: Heartbeat, *, cpu_config: bool = False) -> Awaitable[HeartbeatResult]:
        """Record a node's heartbeat.  ``cpu_config``: also run the cluster's
        CPU config exchange; the result then carries what to hand the node."""
        return self._drive(self._heartbeat(hb, cpu_config), self.beat_coalescer)

    def events(
        self, node_id: str, events: list[SandboxEvent], service_instance_id: str = ""
    ) -> Awaitable[EventsResult]:
        return self._one(self.ops.events(node_id, events, service_instance_id))

    def unregister(self, node_id: str, service_instance_id: str) -> Awaitable[bool]:
        return self._drive(self._unregister(node_id, service_instance_id))

    def set_lingering(self, node_id: str, lingering: bool) -> Awaitable[bool]:
        return self._one(self.ops.set_lingering(node_id, lingering))

    def nodes(self) -> Awaitable[list[NodeView]]:
        return self._drive(self._nodes())

    def list_nodes(self) -> Awaitable[list[ListedNode]]:
        return self._drive(self._listed())

    def observed_nodes(self, cluster_id: str = "") -> Awaitable[list[ObservedNode]]:
        return self._drive(self._observed(cluster_id))

    def observed_node(self, node_id: str, cluster_id: str = "") -> Awaitable[ObservedNode]:
        return self._drive(self._observed_node(node_id, cluster_id))

    # -- placement -----------------------------------------------------------
    async def schedule(
        self,
        req: Request,
        strategy: str | None = None,
        reservation_id: str | None = None,
        *,
        timeout: float | None = None,
    ) -> Placement:
        """Place (and for a creation, reserve), within ``timeout``.  When the
        caller gives up (cancelled, deadline), the answer is lost (Redis
        unreachable mid-call, or not replicated as asked), or the call failed
        after it may have written (a batch refused a command mid-way: Redis
        keeps what a script wrote before its error), the reservation is
        cancelled in the background, so none outlives a Schedule answered
        anything but a placement."""
        call = self.ops.schedule(req, strategy, reservation_id)
        rid = schedule_argv(call).reservation_id
        sent_at = time.monotonic()
        try:
            if timeout is None:
                placed = await self.coalescer.submit(call)
            else:
                with self.scoped(timeout=timeout):
                    placed = await self.coalescer.submit(call)
            if reservation_id is None and placed.reservation_id and self.on_placed is not None:
                # (a fresh id: a new reservation in Redis; sent, answered)
                self.on_placed(sent_at, time.monotonic())
            self._remember_placement(placed)
            return placed
        except (Exception, asyncio.CancelledError) as e:
            if rid and not wrote_nothing(e):
                self.abandon(rid)
            raise

    def explain(self, req: Request, strategy: str | None = None) -> Awaitable[Explanation]:
        return self._one(self.ops.explain(req, strategy))

    async def assign(
        self, sandbox_id: str, node_id: str, endpoint: str, reservation_id: str | None = None
    ) -> AssignResult:
        """Record an assignment; one that attached a reservation is kept a
        while, to be written again after a failover settle or a rewind
        (:meth:`replay_assignments`)."""
        result = await self._one(self.ops.assign(sandbox_id, node_id, endpoint, reservation_id))
        self._remember_assignment(sandbox_id, node_id, endpoint, result, reservation_id)
        return result

    async def replay_assignments(self) -> tuple[int, int]:
        """Write again the assignments this client answered in the last
        :data:`~scheduler.domain.history.REPLAY_WINDOW_S` (what a Redis that
        lost its last writes may lack: :class:`AssignmentMemo`).  Returns
        (written, refused): one refused (its node unregistered since, or not
        registered in the data that came back) is skipped; a reservation the
        data no longer knows is no refusal (the binding alone is written)."""
        return await self._drive(self._replay())

    async def replay_reservations(
        self, grace_ms: int = REWOUND_GRACE_MS
    ) -> tuple[int, int, int, int]:
        """Write back the placements this client answered in the last
        :data:`~scheduler.domain.history.REPLAY_PLACEMENTS_WINDOW_S` that the
        cell lacks (lua/replay-5.lua; :class:`PlacementMemo`): (written
        pending, written ended, left as they were, not written).  Call it
        after a settle, before :meth:`replay_assignments`."""
        return await self._drive(self._replay_reservations(grace_ms))

    def cancel(self, reservation_id: str) -> Awaitable[str]:
        return self._one(self.ops.cancel(reservation_id))

    def reservations(self, node_id: str | None = None) -> Awaitable[list[Reservation]]:
        return self._drive(self._reservations(node_id))

    def reservation(self, reservation_id: str) -> Awaitable[Reservation]:
        return self._drive(self._reservation(reservation_id))

    def lookup(self, sandbox_id: str) -> Awaitable[Binding]:
        return self._one(self.ops.lookup(sandbox_id))

    def stats(self) -> Awaitable[Stats]:
        return self._one(self.ops.stats())

    def census(self, step: int = CENSUS_STEP) -> Awaitable[Census]:
        """One bounded step of the cell's node census; the last finished pass back."""
        return self._one(self.ops.census(step))

    def index_rebuild(self, mode: str = "step", step: int = REBUILD_STEP) -> Awaitable[RebuildStep]:
        """One bounded step of the placement index's rebuild (``mode`` "start":
        a new rebuild first); whether the index is whole again."""
        return self._one(self.ops.index_rebuild(mode, step))

    # -- P2P -----------------------------------------------------------------
    def peers(
        self, cluster_id: str = "", backend: str = "", exclude_node_id: str = ""
    ) -> Awaitable[list[Peer]]:
        return self._drive(self._peers(cluster_id, backend, exclude_node_id))

    def record_artifact(
        self,
        cluster_id: str,
        backend: str,
        key: str,
        node_id: str,
        capacity: int = DEFAULT_STORE_CAPACITY,
    ) -> Awaitable[int]:
        return self._one(self.peer_ops.record(cluster_id, backend, key, node_id, capacity))

    def forget_artifact(
        self, cluster_id: str, backend: str, key: str, node_id: str
    ) -> Awaitable[bool]:
        return self._one(self.peer_ops.forget(cluster_id, backend, key, node_id))

    def lookup_artifact(
        self, cluster_id: str, backend: str, key: str, exclude_node_id: str = "", limit: int = 0
    ) -> Awaitable[list[Peer]]:
        return self._drive(self._lookup(cluster_id, backend, key, exclude_node_id, limit))


#: what stands in Coalescer.flying for a lone call its caller's task sends
_ALONE = object()


class Coalescer(Generic[T]):
    """Calls of one kind go to Redis together, as one batch script call that
    runs them in order exactly as if they had come one by one, each getting
    its own answer or error: Schedules (lua/schedule_batch-5.lua) and
    heartbeats (lua/heartbeat_batch-5.lua).  A call that finds nothing in
    flight leads: it waits until the event loop has run what was ready when
    it came, so calls that arrived in the same wake-up go with it; while a
    batch is in flight, and for one turn of the loop after it answered, more
    queue, and go together next (a batch in flight longer than OVERDUE_S
    lets the next go behind it).  No timer delays a call: a lone call goes
    at once (one turn of the loop later), by itself, from its caller's own
    task, within its caller's deadline; a batch goes from a task of its own
    (no caller's cancellation cuts it short), driven by loop callbacks, not
    a task that waits: a lone call costs about what it costs with
    coalescing off (docs/performance.md).  ``enabled`` False sends each on its own."""

    #: most calls in one batch call
    MAX = 64
    #: most arguments in one (a call with more goes alone): a batch holds
    #: Redis for as long as its calls' work, so heartbeats in full with long
    #: rosters (every node's, after Redis lost its data) go a few at a time,
    #: letting other clients' calls in between, as they would one by one
    MAX_ARGS = 4096
    #: a batch in flight this long lets the next one go, pipelined behind it:
    #: a Redis that stalled still receives what queues meanwhile, as it did
    #: one call at a time (it runs it when it resumes), instead of the queue
    #: holding it past its callers' deadlines
    OVERDUE_S = 0.05

    def __init__(
        self,
        sched: AsyncScheduler,
        name: str,
        batch: Callable[[list[Call[T]]], Call[list[Any]]],
        takes: frozenset[str],
        enabled: bool = True,
    ) -> None:
        self.sched = sched
        self.name = name  # (of the single call, for metrics and errors)
        self.batch = batch
        #: the scripts whose calls ``batch`` runs
        self.takes = takes
        self.enabled = enabled
        self.queue: list[tuple[Call[T], asyncio.Future[T], Any]] = []
        #: batches in flight, oldest first: (the task sending it, or _ALONE for a
        #: lone call its caller's task sends; when it went)
        self.flying: list[tuple[object, float]] = []
        #: a turn of the loop is due that sends what queued (:meth:`_go`)
        self._due = False
        #: while calls wait behind the newest batch in flight: the timer for
        #: when it is overdue (:attr:`OVERDUE_S`)
        self._overdue: asyncio.TimerHandle | None = None
        #: the context the coalescer's callbacks run in, and (a new one each)
        #: its batches: no caller's deadline, not metered (each waiting call
        #: keeps its own)
        self._context = contextvars.Context()
        #: batch calls sent, the calls they carried, the most in one (to see it work)
        self.batches = 0
        self.batched = 0
        self.largest = 0

    @property
    def busy(self) -> bool:
        """Calls queued or batches in flight."""
        return bool(self.queue or self.flying)

    async def submit(self, call: Call[T]) -> T:
        if not self.enabled:
            return await self.sched._one(call)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        scope = _SCOPE.get()
        self.queue.append((call, fut, scope))
        if not self.flying and not self._due:
            # Nothing in flight: this call leads.  Once the loop has run what
            # was ready with it, it goes alone from its caller's own task (as
            # with coalescing off), or with what joined meanwhile as a batch.
            self._due = True
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                fut.cancel()  # (not sent: the next call leads)
                self._handed_on()
                raise
            if len(self.queue) == 1 and not self.flying:
                self._due = False
                self.queue = []
                self.flying.append((_ALONE, time.perf_counter()))
                try:
                    (result,) = await self._results([call])
                finally:
                    self._answered(_ALONE)
                if isinstance(result, BaseException):
                    raise result
                return cast(T, result)
            self._go()
        elif self.flying:  # (it waits behind a batch: until that one answers or is overdue)
            self._wait_overdue()
        left = self.sched._deadline_left()
        # a call may wait for the batch before its own, then for its own
        limit = 2 * self.sched.timeout_s if left is None else max(0.0, left)
        start = time.perf_counter()
        # (a timer on the future, not asyncio.timeout: no Timeout, no shielded future)
        timer = loop.call_later(limit, self._expire, fut, scope, limit, start)
        try:
            return await fut
        except asyncio.CancelledError as e:  # the caller gave up: not sent, if not yet
            if scope is not None and scope.observe is not None:
                scope.observe(call.script, time.perf_counter() - start, e)
            raise
        finally:
            timer.cancel()

    def _handed_on(self) -> None:
        """The leading call gave up before it went: what queued with it goes
        one turn later."""
        self._due = False
        self._answered(None)

    def _expire(self, fut: asyncio.Future[T], scope: Any, limit: float, start: float) -> None:
        if fut.done():
            return
        error = StoreUnavailable(f"Redis at {self.sched.target} did not answer within {limit:.3g}s")
        if scope is not None and scope.observe is not None:
            scope.observe(self.name, time.perf_counter() - start, error)
        fut.set_exception(error)

    def _go(self) -> None:
        """Send what queued as the next batch: called one turn of the loop
        after the first call that found nothing in flight, one turn after a
        batch answered (the callers just answered finish their RPCs, and what
        arrives meanwhile joins: about 2.2 Schedules a call at 32 in flight
        instead of 1.7, docs/performance.md), and when the newest batch in
        flight is overdue."""
        self._due = False
        if not self.queue:
            return
        now = time.perf_counter()
        if self.flying and now - self.flying[-1][1] < self.OVERDUE_S:
            self._wait_overdue()  # (its answer, or its timer, sends what waits)
            return
        taken, self.queue = self._take()
        batch = [x for x in taken if not x[1].done()]
        if batch:
            loop = asyncio.get_running_loop()
            task = loop.create_task(self._send(batch), context=contextvars.Context())
            task.add_done_callback(self._answered, context=self._context)
            self.flying.append((task, now))
        if self.queue:  # (more than one batch holds, or every call taken had given up)
            if batch:
                self._wait_overdue()
            else:
                self._go()

    def _wait_overdue(self) -> None:
        """Calls wait behind the newest batch in flight: a timer for when it is overdue."""
        if self._overdue is None:
            age = time.perf_counter() - self.flying[-1][1]
            self._overdue = asyncio.get_running_loop().call_later(
                max(0.0, self.OVERDUE_S - age), self._late, context=self._context
            )

    def _late(self) -> None:
        """The newest batch in flight may be overdue: what queued meanwhile
        goes behind it (and what queues behind that one, once it is overdue)."""
        self._overdue = None
        if self.queue and self.flying:
            if time.perf_counter() - self.flying[-1][1] >= self.OVERDUE_S:
                self._go()
            else:
                self._wait_overdue()

    def _answered(self, task: object) -> None:
        """A batch answered (a task's callers were told a turn ago; a lone
        call's is told now): what queued meanwhile goes one turn later
        (:meth:`_go`)."""
        self.flying = [f for f in self.flying if f[0] is not task]
        if not self.flying and self._overdue is not None:
            self._overdue.cancel()
            self._overdue = None
        if self.queue and not self._due:
            self._due = True
            asyncio.get_running_loop().call_soon(self._go, context=self._context)

    async def _send(self, batch: list[tuple[Call[T], asyncio.Future[T], Any]]) -> None:
        """One batch call (a lone call as itself, but one with a follower,
        :meth:`Call.then`); each caller gets its answer."""
        start = time.perf_counter()
        results: list[Any]  # (each a T or the exception it raised)
        lone = len(batch) == 1 and batch[0][0].follow is None
        try:
            results = await self._results([c for c, _, _ in batch])
        except Exception as e:  # the whole call failed: every request with it
            results = [e] * len(batch)
        except asyncio.CancelledError:  # (the loop is closing: nobody will answer)
            for _, fut, _ in batch:
                if not fut.done():
                    fut.set_exception(StoreUnavailable("the scheduler client closed"))
            raise
        elapsed = time.perf_counter() - start
        # (a call that gave up meanwhile was told, and metered, already)
        for (call, fut, scope), result in zip(batch, results, strict=True):
            if fut.done():
                continue
            error = result if isinstance(result, BaseException) else None
            if scope is not None and scope.observe is not None:
                scope.observe(call.script if lone else self.batch_name, elapsed, error)
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)

    async def _results(self, calls: list[Call[T]]) -> list[Any]:
        """What ``calls`` answer, each a T or the exception it raised: a lone
        call as itself, any other (a lone call with a follower,
        :meth:`Call.then`, among them) in one batch call."""
        if len(calls) == 1 and calls[0].follow is None:
            return [await self.sched._one(calls[0])]
        if len(calls) > 1:  # (coalesced: not a lone call with its follower)
            self.batches += 1
            self.batched += len(calls)
            self.largest = max(self.largest, len(calls))
        together: Call[list[Any]] = self.batch(calls)
        return await self.sched._one(together)

    def _take(
        self,
    ) -> tuple[
        list[tuple[Call[T], asyncio.Future[T], Any]], list[tuple[Call[T], asyncio.Future[T], Any]]
    ]:
        """The next batch off the queue (at least one call), and what stays."""
        args = 0
        for i, (call, _, _) in enumerate(self.queue):
            args += len(call.args)
            if i == self.MAX or (i > 0 and args > self.MAX_ARGS):
                return self.queue[:i], self.queue[i:]
        return self.queue, []

    @property
    def batch_name(self) -> str:
        return f"{self.name}_batch"


if sys.version_info >= (3, 11):
    _deadline = asyncio.timeout
else:  # pragma: no cover - Python 3.10

    @asynccontextmanager
    async def _deadline(seconds: float) -> AsyncIterator[None]:
        task = asyncio.current_task()
        assert task is not None
        handle = asyncio.get_running_loop().call_later(seconds, task.cancel)
        try:
            yield
        except asyncio.CancelledError:
            if handle.cancelled() or asyncio.get_running_loop().time() < handle.when():
                raise
            raise TimeoutError from None
        finally:
            handle.cancel()
