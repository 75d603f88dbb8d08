"""The client API of one cell: sync (:class:`Scheduler`) and asyncio (:class:`AsyncScheduler`).

Every operation is written once, in :class:`_Client`, as a *plan*: a
generator that yields the :class:`~scheduler.calls.Call` s it needs and gets
their results back.  That is where the behaviour lives: the heartbeat's
RESYNC retry and its CPU-config exchange, a Schedule's placement cancelled
when its answer is lost, a cell that Redis lost put back from the
configuration this client keeps.  The two classes differ only in how they
run one call (:meth:`Scheduler.run`, :meth:`AsyncScheduler.run`) and drive a
plan; tests/test_client_parity.py holds them to the same methods.

Failures reach callers as :mod:`scheduler.errors` (see
:mod:`scheduler.translate`); calls are built by :mod:`scheduler.calls`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import msgspec
import redis
from redis.crc import key_slot

from scheduler.calls import Beat, Call, Ops, Plan, Resync
from scheduler.connection import (
    DEFAULT_TIMEOUT_S,
    Durability,
    Fence,
    PrimaryCheck,
    async_client,
    describe_target,
    is_cluster_client,
    is_sentinel_client,
    sync_client,
)
from scheduler.cpuconfig import CpuConfigOps, exchange
from scheduler.errors import (
    CellNotInitialised,
    NotFound,
    NotReplicated,
    PolicyConflict,
    SchedulerError,
    StaticNodesConflict,
    StoreUnavailable,
)
from scheduler.keys import DEFAULT_CELL, DEFAULT_PREFIX, CellKeys, validate_id
from scheduler.p2p import DEFAULT_STORE_CAPACITY, Peer, PeerOps
from scheduler.policy import Policy
from scheduler.records import (
    AssignResult,
    Binding,
    EventsResult,
    Explanation,
    Heartbeat,
    HeartbeatResult,
    ListedNode,
    NodeView,
    ObservedNode,
    Placement,
    Request,
    Reservation,
    SandboxEvent,
    Stats,
)
from scheduler.scripts import EVAL, AsyncScriptRegistry, ScriptRegistry
from scheduler.translate import translated

T = TypeVar("T")
log = logging.getLogger("scheduler.client")

#: Placements whose callers gave up are cancelled for at most this long (their
#: reservations expire by then anyway) and at most this many are remembered.
FORGET_FOR_S = 15 * 60
FORGET_MAX = 10_000

#: What a Redis Cluster answers while a slot moves, a shard fails over or the
#: cluster is down: nothing ran, so the call is sent again until its deadline.
SLOT_UNSETTLED = (redis.exceptions.TryAgainError, redis.exceptions.ClusterError,
                  redis.exceptions.SlotNotCoveredError)
SLOT_RETRY_S = 0.05

#: Told of every script call made in a :meth:`_Client.scoped` block: the
#: script's name, the seconds it took, and the error it raised (None: it answered).
Observer = Callable[[str, float, "BaseException | None"], None]


@dataclass(frozen=True)
class _Scope:
    deadline: float | None  # time.monotonic() instant
    observe: Observer | None


_SCOPE: ContextVar[_Scope | None] = ContextVar("scheduler_scope", default=None)


@dataclass(frozen=True)
class CellSetup:
    """What a client that keeps its cell stores there: the policy and the
    static node list ([] = nodes register by heartbeat)."""

    policy: Policy
    nodes: tuple[tuple[str, str], ...] = ()


def nodes_conflict(stored: Sequence[tuple[str, str]], wanted: Sequence[tuple[str, str]]) -> str:
    lines = ["the cell's stored static node list differs from this replica's configuration",
             "  stored:     " + (", ".join(f"{i}={e}" for i, e in stored) or "-"),
             "  configured: " + (", ".join(f"{i}={e}" for i, e in wanted) or "-"),
             "start with --overwrite-policy to replace the stored node list"]
    return "\n".join(lines)


class _Client:
    """State and plans both clients share: every operation, written once."""

    scripts: Any

    def __init__(self, client: Any, cell: str, prefix: str, url: str | None,
                 durability: Durability | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.client = client
        self.keys = CellKeys(cell, prefix)
        self.ops = Ops(self.keys)
        self.peer_ops = PeerOps(self.keys, lambda: self.ops.bounds)
        self.cpu_ops = CpuConfigOps(self.keys)
        self.url = url
        self.target = describe_target(url)
        self.cluster = is_cluster_client(client)
        if self.cluster:  # a cell is one hash slot: name it in every error
            self.target += f" (slot {key_slot(self.keys.policy.encode())} of cell {cell})"
        self.durability = durability or Durability()
        self.timeout_s = timeout_s
        #: what this client last wrote per node (bases of delta heartbeats)
        self.beats: dict[str, Beat] = {}
        #: reservation id -> since (monotonic): placements to cancel once Redis answers
        self.forgotten: dict[str, float] = {}
        #: writes held while Sentinel fails the primary over (SentinelWatch closes it)
        self.fence = Fence()
        #: the cell this client keeps (keep_cell): put back when Redis lost it
        self.cell: CellSetup | None = None

    # -- what every call goes through --------------------------------------
    @contextmanager
    def scoped(self, *, timeout: float | None = None,
               observe: Observer | None = None) -> Iterator[None]:
        """Calls made inside this block (in this thread or asyncio task) are
        bounded by ``timeout`` seconds from now (the asyncio client; a
        caller's deadline) and reported to ``observe``: how a replica bounds
        and meters the calls of one RPC."""
        outer = _SCOPE.get()
        deadline = None if timeout is None else time.monotonic() + timeout
        if outer is not None:  # an inner block keeps the outer deadline and observer
            if outer.deadline is not None:
                deadline = outer.deadline if deadline is None else min(deadline, outer.deadline)
            observe = observe or outer.observe
        token = _SCOPE.set(_Scope(deadline, observe))
        try:
            yield
        finally:
            _SCOPE.reset(token)

    @staticmethod
    def _observe(script: str, start: float, error: BaseException | None) -> None:
        scope = _SCOPE.get()
        if scope is not None and scope.observe is not None:
            scope.observe(script, time.perf_counter() - start, error)

    def _fenced(self, call: Call[Any]) -> None:
        why = self.fence.held() if call.acked else ""
        if why:
            raise StoreUnavailable(f"Redis at {self.target}: {why}")

    def _waits(self, call: Call[Any]) -> bool:
        return self.durability.replicas > 0 and call.acked

    def _check_acked(self, acked: int) -> None:
        d = self.durability
        if acked < d.replicas:
            raise NotReplicated(
                f"Redis at {self.target}: the write reached {acked} of the {d.replicas} "
                f"replica(s) min_replicas_acked asks for within {d.timeout_ms}ms")

    def _remember(self, rid: str) -> None:
        if len(self.forgotten) >= FORGET_MAX:
            self.forgotten.pop(next(iter(self.forgotten)))
        self.forgotten.setdefault(rid, time.monotonic())

    def _stale_forgotten(self) -> None:
        horizon = time.monotonic() - FORGET_FOR_S
        for rid in [r for r, since in self.forgotten.items() if since < horizon]:
            del self.forgotten[rid]

    # -- the cell this client keeps -----------------------------------------
    def keep_cell(self, policy: Policy, nodes: Sequence[tuple[str, str]] = ()) -> None:
        """Keep the cell: :meth:`prepare_cell` stores this policy and static
        node list, and a call that finds the cell without a policy (Redis
        lost its data) puts them back (:meth:`restore_cell`) and is sent again."""
        self.cell = CellSetup(policy, tuple(nodes))

    def _kept(self) -> CellSetup:
        if self.cell is None:
            raise RuntimeError("keep_cell() first: this client keeps no cell")
        return self.cell

    def _step(self, call: Call[T]) -> Plan[T]:
        """One call; a cell Redis lost is restored first when this client keeps it."""
        try:
            return cast(T, (yield call))
        except CellNotInitialised:
            if self.cell is None:
                raise
            log.warning("the cell's policy is gone from Redis (data lost?); restoring it")
            yield from self._restore()
            return cast(T, (yield call))

    def _prepare(self, overwrite: bool) -> Plan[str]:
        setup = self._kept()
        outcome = cast(str, (yield self.ops.sync_policy(setup.policy, overwrite=overwrite)))
        if setup.nodes and not overwrite:
            _, views = cast(tuple[int, list[NodeView]], (yield self.ops.nodes()))
            stored = sorted((v.node_id, v.endpoint) for v in views if v.static)
            if stored and stored != sorted(setup.nodes):
                raise StaticNodesConflict(nodes_conflict(stored, sorted(setup.nodes)))
        yield self.ops.sync_nodes(list(setup.nodes))
        return outcome

    def _restore(self) -> Plan[None]:
        setup = self._kept()
        try:
            outcome = yield self.ops.sync_policy(setup.policy, overwrite=False, restore=True)
        except PolicyConflict:
            return  # another replica restored (and changed) it first; the stored one rules
        if outcome == "created":
            log.warning("restored the cell's policy in Redis (its data was lost); nodes take "
                        "placements again once they heartbeat")
            yield self.ops.sync_nodes(list(setup.nodes))

    # -- plans of more than one call ----------------------------------------
    def _heartbeat(self, hb: Heartbeat, cpu_config: bool) -> Plan[HeartbeatResult]:
        try:
            result = yield from self._step(self.ops.heartbeat(hb, self.beats))
        except Resync:  # another writer came between: this one goes in full
            result = yield from self._step(self.ops.heartbeat(hb, self.beats))
        if cpu_config:
            config = yield from exchange(self._step, self.cpu_ops, hb.node_id.strip(),
                                         hb.cluster_id.strip(), hb.machine_info.cpu_config_json,
                                         result.restarted)
            result = msgspec.structs.replace(result, cpu_config_json=config)
        return result

    def _reservation(self, reservation_id: str) -> Plan[Reservation]:
        found = yield from self._step(self.ops.reservations(None, reservation_id))
        if not found:
            raise NotFound(f"reservation {reservation_id} not found")
        return found[0]

    def _observed_node(self, node_id: str, cluster_id: str) -> Plan[ObservedNode]:
        rows = yield from self._step(self.ops.observed(validate_id("node_id", node_id),
                                                       cluster_id))
        if not rows:
            raise NotFound("observed node not found")
        return rows[0]

    def _nodes(self) -> Plan[list[NodeView]]:
        _, views = yield from self._step(self.ops.nodes())
        return views


class Scheduler(_Client):
    """Synchronous client of one cell."""

    @classmethod
    def connect(cls, url: str | None = None, *, cell: str = DEFAULT_CELL,
                prefix: str = DEFAULT_PREFIX, policy: Policy | None = None,
                overwrite_policy: bool = False, durability: Durability | None = None,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> Scheduler:
        with translated(describe_target(url)):  # (a cluster client connects at once)
            client = sync_client(url, timeout_s)
        s = cls(client, cell, prefix, url, durability, timeout_s)
        if policy is not None:
            s.sync_policy(policy, overwrite=overwrite_policy)
        return s

    def __init__(self, client: Any, cell: str = DEFAULT_CELL, prefix: str = DEFAULT_PREFIX,
                 url: str | None = None, durability: Durability | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
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
            if self.forgotten:
                self._cancel_forgotten()
            with translated(self.target):
                result = call.parse(self._send(call))
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
                    reply, acked = self.scripts.call_acked(
                        call.script, call.keys, call.args, self.durability.replicas,
                        self.durability.timeout_ms)
                    self._check_acked(acked)
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

    def _cancel_forgotten(self) -> None:
        """Cancel the placements whose callers gave up, now that Redis may answer."""
        self._stale_forgotten()
        pending, self.forgotten = self.forgotten, {}
        for rid, since in pending.items():
            try:
                self.run(self.ops.forget(rid))
            except StoreUnavailable:
                self.forgotten[rid] = since
            except SchedulerError as e:
                log.warning("could not cancel abandoned placement %s: %s", rid, e.message)

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
        return self._one(self.ops.sync_nodes(nodes))

    def policy(self) -> Policy | None:
        return self._one(self.ops.policy())

    def settle(self) -> int:
        return self._one(self.ops.settle())

    def sweep(self) -> tuple[int, int]:
        return self._one(self.ops.sweep())

    def advance_clock(self, ms: int, mode: str = "") -> int:
        return self._one(self.ops.advance_clock(ms, mode))

    def probe(self) -> bool:
        return self.run(self.ops.probe(write=self.scripts.mode == EVAL))

    # -- nodes ---------------------------------------------------------------
    def heartbeat(self, hb: Heartbeat, *, cpu_config: bool = False) -> HeartbeatResult:
        """Record a node's heartbeat.  ``cpu_config``: also run the cluster's
        CPU config exchange; the result then carries what to hand the node."""
        return self._drive(self._heartbeat(hb, cpu_config))

    def events(self, node_id: str, events: list[SandboxEvent]) -> EventsResult:
        return self._one(self.ops.events(node_id, events))

    def unregister(self, node_id: str, service_instance_id: str) -> bool:
        return self._one(self.ops.unregister(node_id, service_instance_id))

    def set_lingering(self, node_id: str, lingering: bool) -> bool:
        return self._one(self.ops.set_lingering(node_id, lingering))

    def nodes(self) -> list[NodeView]:
        return self._drive(self._nodes())

    def list_nodes(self) -> list[ListedNode]:
        return self._one(self.ops.listed())

    def observed_nodes(self, cluster_id: str = "") -> list[ObservedNode]:
        return self._one(self.ops.observed("", cluster_id))

    def observed_node(self, node_id: str, cluster_id: str = "") -> ObservedNode:
        return self._drive(self._observed_node(node_id, cluster_id))

    # -- placement -----------------------------------------------------------
    def schedule(self, req: Request, strategy: str | None = None,
                 reservation_id: str | None = None) -> Placement:
        """Place (and for a creation, reserve).  When the answer is lost (Redis
        unreachable mid-call, or the placement not replicated as asked), the
        reservation is cancelled, now or on a later call, so none stays behind."""
        call = self.ops.schedule(req, strategy, reservation_id)
        try:
            return self._one(call)
        except StoreUnavailable:
            if call.args[5]:
                self._remember(call.args[5])
            raise

    def forget(self, reservation_id: str) -> None:
        """Cancel this placement, now or on a later call: its caller gave up."""
        self._remember(reservation_id)
        with contextlib.suppress(StoreUnavailable):
            self._cancel_forgotten()

    def explain(self, req: Request, strategy: str | None = None) -> Explanation:
        return self._one(self.ops.explain(req, strategy))

    def assign(self, sandbox_id: str, node_id: str, endpoint: str,
               reservation_id: str | None = None) -> AssignResult:
        return self._one(self.ops.assign(sandbox_id, node_id, endpoint, reservation_id))

    def cancel(self, reservation_id: str) -> str:
        return self._one(self.ops.cancel(reservation_id))

    def reservations(self, node_id: str | None = None) -> list[Reservation]:
        return self._one(self.ops.reservations(node_id))

    def reservation(self, reservation_id: str) -> Reservation:
        return self._drive(self._reservation(reservation_id))

    def lookup(self, sandbox_id: str) -> Binding:
        return self._one(self.ops.lookup(sandbox_id))

    def stats(self) -> Stats:
        return self._one(self.ops.stats())

    # -- P2P -----------------------------------------------------------------
    def peers(self, cluster_id: str = "", backend: str = "",
              exclude_node_id: str = "") -> list[Peer]:
        return self._one(self.peer_ops.peers(cluster_id, backend, exclude_node_id))

    def record_artifact(self, cluster_id: str, backend: str, key: str, node_id: str,
                        capacity: int = DEFAULT_STORE_CAPACITY) -> int:
        return self._one(self.peer_ops.record(cluster_id, backend, key, node_id, capacity))

    def forget_artifact(self, cluster_id: str, backend: str, key: str, node_id: str) -> bool:
        return self._one(self.peer_ops.forget(cluster_id, backend, key, node_id))

    def lookup_artifact(self, cluster_id: str, backend: str, key: str,
                        exclude_node_id: str = "", limit: int = 0) -> list[Peer]:
        return self._one(self.peer_ops.lookup(cluster_id, backend, key, exclude_node_id, limit))


class AsyncScheduler(_Client):
    """asyncio client of one cell; the same operations as :class:`Scheduler`."""

    @classmethod
    async def connect(cls, url: str | None = None, *, cell: str = DEFAULT_CELL,
                      prefix: str = DEFAULT_PREFIX, policy: Policy | None = None,
                      overwrite_policy: bool = False, durability: Durability | None = None,
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> AsyncScheduler:
        s = cls(async_client(url, timeout_s), cell, prefix, url, durability, timeout_s)
        if policy is not None:
            await s.sync_policy(policy, overwrite=overwrite_policy)
        return s

    def __init__(self, client: Any, cell: str = DEFAULT_CELL, prefix: str = DEFAULT_PREFIX,
                 url: str | None = None, durability: Durability | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(client, cell, prefix, url, durability, timeout_s)
        self.scripts = AsyncScriptRegistry(client)
        self._reaper: asyncio.Task[None] | None = None

    async def run(self, call: Call[T], timeout: float | None = None) -> T:
        """Run one call, bounded by ``timeout`` (a caller's deadline, also a
        :meth:`scoped` one) and the client's own timeout, whichever is shorter."""
        scope = _SCOPE.get()
        if scope is not None and scope.deadline is not None:
            left = scope.deadline - time.monotonic()
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
                        f"{limit:.3g}s)") from None
                raise StoreUnavailable(f"Redis at {self.target} did not answer within "
                                       f"{limit:.3g}s") from None
            with translated(self.target):
                result = call.parse(reply)
        except BaseException as e:
            self._observe(call.script, start, e)
            raise
        self._observe(call.script, start, None)
        return result

    async def _send(self, call: Call[Any], unsettled: list[Exception]) -> Any:
        while True:
            try:
                if self._waits(call):
                    reply, acked = await self.scripts.call_acked(
                        call.script, call.keys, call.args, self.durability.replicas,
                        self.durability.timeout_ms)
                    self._check_acked(acked)
                    return reply
                return await self.scripts[call.script](keys=call.keys, args=call.args)
            except SLOT_UNSETTLED as e:
                if not self.cluster:
                    raise
                unsettled.append(e)
                await asyncio.sleep(SLOT_RETRY_S)  # (the caller's deadline bounds the loop)

    async def _drive(self, plan: Plan[T]) -> T:
        """Run a plan's calls one after another; its value is the answer."""
        try:
            call = next(plan)
            while True:
                try:
                    reply = await self.run(call)
                except Exception as e:  # the plan may handle it (Resync, a lost cell)
                    call = plan.throw(e)
                else:
                    call = plan.send(reply)
        except StopIteration as done:
            return cast(T, done.value)

    def _one(self, call: Call[T]) -> Awaitable[T]:
        return self._drive(self._step(call))

    def forget(self, reservation_id: str) -> None:
        """Cancel this placement in the background: its caller gave up, or its
        answer was lost.  Retried until Redis answers (idempotent)."""
        self._remember(reservation_id)
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._cancel_forgotten(), name="forget")

    async def _cancel_forgotten(self) -> None:
        _SCOPE.set(None)  # (a task copies its creator's context: not that RPC's deadline)
        delay = 0.05
        while self.forgotten:
            self._stale_forgotten()
            for rid, since in list(self.forgotten.items()):
                try:
                    await self.run(self.ops.forget(rid))
                except StoreUnavailable:
                    break
                except SchedulerError as e:
                    log.warning("could not cancel abandoned placement %s: %s", rid, e.message)
                if self.forgotten.get(rid) == since:
                    del self.forgotten[rid]
            else:
                continue
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)

    async def close(self) -> None:
        if self._reaper is not None and not self._reaper.done():
            # a last chance for abandoned placements, then give up on them
            await asyncio.wait([self._reaper], timeout=1.0)
            self._reaper.cancel()
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

    def sync_policy(self, policy: Policy, overwrite: bool = False,
                    restore: bool = False) -> Awaitable[str]:
        return self.run(self.ops.sync_policy(policy, overwrite, restore))

    def sync_nodes(self, nodes: list[tuple[str, str]]) -> Awaitable[tuple[int, int]]:
        return self._one(self.ops.sync_nodes(nodes))

    def policy(self) -> Awaitable[Policy | None]:
        return self._one(self.ops.policy())

    def settle(self) -> Awaitable[int]:
        return self._one(self.ops.settle())

    def sweep(self) -> Awaitable[tuple[int, int]]:
        return self._one(self.ops.sweep())

    def advance_clock(self, ms: int, mode: str = "") -> Awaitable[int]:
        return self._one(self.ops.advance_clock(ms, mode))

    def probe(self, timeout: float | None = None) -> Awaitable[bool]:
        return self.run(self.ops.probe(write=self.scripts.mode == EVAL), timeout)

    # -- nodes ---------------------------------------------------------------
    def heartbeat(self, hb: Heartbeat, *, cpu_config: bool = False) -> Awaitable[HeartbeatResult]:
        """Record a node's heartbeat.  ``cpu_config``: also run the cluster's
        CPU config exchange; the result then carries what to hand the node."""
        return self._drive(self._heartbeat(hb, cpu_config))

    def events(self, node_id: str, events: list[SandboxEvent]) -> Awaitable[EventsResult]:
        return self._one(self.ops.events(node_id, events))

    def unregister(self, node_id: str, service_instance_id: str) -> Awaitable[bool]:
        return self._one(self.ops.unregister(node_id, service_instance_id))

    def set_lingering(self, node_id: str, lingering: bool) -> Awaitable[bool]:
        return self._one(self.ops.set_lingering(node_id, lingering))

    def nodes(self) -> Awaitable[list[NodeView]]:
        return self._drive(self._nodes())

    def list_nodes(self) -> Awaitable[list[ListedNode]]:
        return self._one(self.ops.listed())

    def observed_nodes(self, cluster_id: str = "") -> Awaitable[list[ObservedNode]]:
        return self._one(self.ops.observed("", cluster_id))

    def observed_node(self, node_id: str, cluster_id: str = "") -> Awaitable[ObservedNode]:
        return self._drive(self._observed_node(node_id, cluster_id))

    # -- placement -----------------------------------------------------------
    async def schedule(self, req: Request, strategy: str | None = None,
                       reservation_id: str | None = None, *,
                       timeout: float | None = None) -> Placement:
        """Place (and for a creation, reserve), within ``timeout``.  When the
        caller gives up (cancelled, deadline) or the answer is lost (Redis
        unreachable mid-call, or not replicated as asked), the reservation is
        cancelled in the background, so none stays behind."""
        call = self.ops.schedule(req, strategy, reservation_id)
        rid = call.args[5]
        try:
            if timeout is None:
                return await self._one(call)
            with self.scoped(timeout=timeout):
                return await self._one(call)
        except (StoreUnavailable, asyncio.CancelledError):
            if rid:
                self.forget(rid)
            raise

    def explain(self, req: Request, strategy: str | None = None) -> Awaitable[Explanation]:
        return self._one(self.ops.explain(req, strategy))

    def assign(self, sandbox_id: str, node_id: str, endpoint: str,
               reservation_id: str | None = None) -> Awaitable[AssignResult]:
        return self._one(self.ops.assign(sandbox_id, node_id, endpoint, reservation_id))

    def cancel(self, reservation_id: str) -> Awaitable[str]:
        return self._one(self.ops.cancel(reservation_id))

    def reservations(self, node_id: str | None = None) -> Awaitable[list[Reservation]]:
        return self._one(self.ops.reservations(node_id))

    def reservation(self, reservation_id: str) -> Awaitable[Reservation]:
        return self._drive(self._reservation(reservation_id))

    def lookup(self, sandbox_id: str) -> Awaitable[Binding]:
        return self._one(self.ops.lookup(sandbox_id))

    def stats(self) -> Awaitable[Stats]:
        return self._one(self.ops.stats())

    # -- P2P -----------------------------------------------------------------
    def peers(self, cluster_id: str = "", backend: str = "",
              exclude_node_id: str = "") -> Awaitable[list[Peer]]:
        return self._one(self.peer_ops.peers(cluster_id, backend, exclude_node_id))

    def record_artifact(self, cluster_id: str, backend: str, key: str, node_id: str,
                        capacity: int = DEFAULT_STORE_CAPACITY) -> Awaitable[int]:
        return self._one(self.peer_ops.record(cluster_id, backend, key, node_id, capacity))

    def forget_artifact(self, cluster_id: str, backend: str, key: str,
                        node_id: str) -> Awaitable[bool]:
        return self._one(self.peer_ops.forget(cluster_id, backend, key, node_id))

    def lookup_artifact(self, cluster_id: str, backend: str, key: str,
                        exclude_node_id: str = "", limit: int = 0) -> Awaitable[list[Peer]]:
        return self._one(self.peer_ops.lookup(cluster_id, backend, key, exclude_node_id, limit))


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


__all__ = ["AsyncScheduler", "Call", "CellSetup", "Observer", "Ops", "Scheduler",
           "SchedulerError", "async_client", "describe_target", "sync_client"]
