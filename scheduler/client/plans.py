"""What both clients share: their state, and every operation written once as a plan.

A *plan* is a generator that yields the :class:`~scheduler.store.calls.Call` s an
operation needs and gets their results back (or their errors thrown in).
That is where the behaviour lives: the heartbeat's RESYNC retry and its
CPU-config exchange, a cell that Redis lost put back from the configuration
the client keeps, and the placements whose answers were lost, to cancel.
:class:`~scheduler.client.sync.Scheduler` and
:class:`~scheduler.client.aio.AsyncScheduler` only differ in how they run one call
and drive a plan (tests/test_client_parity.py holds them to the same
methods).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import msgspec
import redis
from redis.crc import key_slot

from scheduler.domain.errors import (
    CellNotInitialised,
    FailedPrecondition,
    NotFound,
    NotReplicated,
    PolicyConflict,
    StaticNodesConflict,
    StoreUnavailable,
    SyncSuperseded,
    UnknownNode,
)
from scheduler.domain.history import (
    REWOUND_GRACE_MS,
    Assigned,
    AssignmentMemo,
    Placed,
    PlacementMemo,
)
from scheduler.domain.policy import Policy
from scheduler.domain.records import (
    AssignResult,
    Heartbeat,
    HeartbeatResult,
    ListedNode,
    NodeView,
    ObservedNode,
    Placement,
    Reservation,
)
from scheduler.store.address import DEFAULT_TIMEOUT_S, describe_target
from scheduler.store.calls import (
    LIST_PAGE,
    PEER_PAGE,
    Beat,
    Call,
    Followed,
    Ops,
    Page,
    Plan,
    Resync,
    SyncList,
)
from scheduler.store.cluster import is_cluster_client
from scheduler.store.contracts import DISCOVERY_STALE, SYNC_DONE
from scheduler.store.cpuconfig import CpuConfigOps, Outcome, exchange
from scheduler.store.durability import Durability
from scheduler.store.keys import CellKeys, validate_id
from scheduler.store.p2p import Peer, PeerOps
from scheduler.store.sentinel import Fence

T = TypeVar("T")
log = logging.getLogger("scheduler.client.sync")

#: Placements whose callers gave up are cancelled for at most this long (their
#: reservations expire by then anyway) and at most this many are remembered.
ABANDON_FOR_S = 15 * 60
ABANDON_MAX = 10_000
#: Assignments refused for Redis (owe_assignment) are written for at most
#: this long (a placement's reservation lives placement_reservation_ttl, 10
#: min by default; after that the binding alone is still LookupNode's) and at
#: most this many are kept.
OWED_FOR_S = 10 * 60
OWED_MAX = 10_000
#: Placements one replay call writes back at most (bounded work per call).
REPLAY_BATCH = 200

#: Passes of a node-list sync one call begins at most when each is
#: superseded (plans' _sync): a pass of the same list is joined, never
#: superseded, so only another list's (or a pass that expired) starts one over.
SYNC_ATTEMPTS = 3

#: What a Redis Cluster answers while a slot moves, a shard fails over or the
#: cluster is down: nothing ran, so the call is sent again until its deadline.
SLOT_UNSETTLED = (
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterError,
    redis.exceptions.SlotNotCoveredError,
)
SLOT_RETRY_S = 0.05

#: Told of every script call made in a :meth:`BaseClient.scoped` block: the
#: script's name, the seconds it took, and the error it raised (None: it answered).
Observer = Callable[[str, float, "BaseException | None"], None]


@dataclass(frozen=True)
class _Scope:
    deadline: float | None  # time.monotonic() instant
    observe: Observer | None


_SCOPE: ContextVar[_Scope | None] = ContextVar("scheduler_scope", default=None)
#: set inside checking(): the calls that check Redis's data pass
#: the hold (``unchecked``) that keeps every other write out until then
_CHECKING: ContextVar[bool] = ContextVar("scheduler_checking", default=False)


@dataclass(frozen=True)
class CellSetup:
    """What a client that keeps its cell stores there: the policy and the
    static node list ([] = nodes register by heartbeat)."""

    policy: Policy
    nodes: tuple[tuple[str, str], ...] = ()
    #: the node list is discovery's (scheduler.server.kubernetes writes it): this
    #: client neither checks nor replaces it
    discovered: bool = False


@dataclass(frozen=True, slots=True)
class Owed:
    """An assignment whose RecordAssignment was refused for Redis (unavailable,
    writes held): the sandbox was created on its node, so it is written once
    Redis answers (:meth:`AsyncScheduler.owe_assignment`)."""

    sandbox_id: str
    node_id: str
    endpoint: str
    reservation_id: str | None
    #: this client's monotonic clock when it was refused, s
    since: float


def nodes_conflict(stored: Sequence[tuple[str, str]], wanted: Sequence[tuple[str, str]]) -> str:
    lines = [
        "the cell's stored static node list differs from this replica's configuration",
        "  stored:     " + (", ".join(f"{i}={e}" for i, e in stored) or "-"),
        "  configured: " + (", ".join(f"{i}={e}" for i, e in wanted) or "-"),
        "start with --overwrite-policy to replace the stored node list",
    ]
    return "\n".join(lines)


@contextmanager
def checking() -> Iterator[None]:
    """Calls made inside this block (this task) pass a client's ``unchecked``
    hold, not its fence: a replica checking a Redis's data before writes go on."""
    token = _CHECKING.set(True)
    try:
        yield
    finally:
        _CHECKING.reset(token)


def is_checking() -> bool:
    return _CHECKING.get()


class BeatMemo(dict[str, Beat]):
    """The heartbeat memo: what this client last wrote per node.  A delta
    heartbeat needs its node's entry; a missing one only costs that node one
    heartbeat in full.  So it is bounded: at most ``max_entries`` nodes (the
    one written longest ago goes first) and ``max_age_s`` since an entry was
    written (a node silent that long is stale, and forgotten by the cell
    later: its entry is of no use), and dropped on unregister.  Without the
    bounds 1,000 ghost nodes with 200-id rosters kept about 66 MB for good.

    ``max_entries`` covers a 100,000-node cell (issue #31).  A fleet past the
    bound that heartbeats in turn misses every time (the entry it needs is
    the one written longest ago, gone first), so every heartbeat goes in
    full: with 10,000 it cost a 100,000-node cell's steady heartbeats about
    4 times their Redis CPU.  An entry is about 4.5 KB of Python memory with
    30-id rosters (2.1 KB with bench.fleet's 11-id mean), so about 450 MB in
    a replica that hears every node of such a cell."""

    MAX_ENTRIES = 100_000
    MAX_AGE_S = 600.0

    def __init__(
        self,
        max_entries: int = MAX_ENTRIES,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.max_entries = max_entries
        self.max_age_s = max_age_s
        self.clock = clock
        #: node -> when its entry was written (insertion order = write order)
        self.written: dict[str, float] = {}

    def __setitem__(self, node_id: str, beat: Beat) -> None:
        now = self.clock()
        super().__setitem__(node_id, beat)
        self.written.pop(node_id, None)
        self.written[node_id] = now
        self._expire(now)
        while len(self) > self.max_entries:
            self.pop(next(iter(self.written)), None)

    def get(self, node_id: str, default: Any = None) -> Any:
        at = self.written.get(node_id)
        if at is not None and self.clock() - at > self.max_age_s:
            self.pop(node_id, None)
            return default
        return super().get(node_id, default)

    def pop(self, node_id: str, default: Any = None) -> Any:
        self.written.pop(node_id, None)
        return super().pop(node_id, default)

    def clear(self) -> None:
        self.written.clear()
        super().clear()

    def _expire(self, now: float) -> None:
        """Drop entries older than max_age_s (the oldest first; stops at the
        first young one, so a write costs O(1) amortised)."""
        while self.written:
            node_id, at = next(iter(self.written.items()))
            if now - at <= self.max_age_s:
                break
            self.pop(node_id, None)


class BaseClient:
    """State and plans both clients share: every operation, written once."""

    scripts: Any

    def __init__(
        self,
        client: Any,
        cell: str,
        prefix: str,
        url: str | None,
        durability: Durability | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
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
        #: Redis replicas connected to the primary, as a replica's monitor last
        #: read them (INFO replication); writes wait for all of them
        self.replicas_connected = 0
        self.timeout_s = timeout_s
        #: what this client last wrote per node (bases of delta heartbeats),
        #: bounded by size and age, dropped when the node is unregistered
        self.beats: BeatMemo = BeatMemo()
        #: the assignments answered OK lately (replay_assignments)
        self.assigned = AssignmentMemo()
        #: the placements answered OK lately (replay_reservations)
        self.placed = PlacementMemo()
        #: reservation id -> since (monotonic): placements to cancel once Redis answers
        self.abandoned: dict[str, float] = {}
        #: sandbox id -> assignment refused for Redis, to write once it answers
        self.owed: dict[str, Owed] = {}
        #: writes held while Sentinel fails the primary over (SentinelWatch closes it)
        self.fence = Fence()
        #: writes held (this reason; "" = not) until a replica has checked the
        #: data of a Redis that was unreachable or is a new primary (the
        #: cell's history, scheduler/domain/history.py); its own checks pass (checking())
        self.unchecked = ""
        #: the cell this client keeps (keep_cell): put back when Redis lost it
        self.kept: CellSetup | None = None

    def _remember_assignment(
        self,
        sandbox_id: str,
        node_id: str,
        endpoint: str,
        result: AssignResult,
        named: str | None = None,
    ) -> None:
        """Keep an assignment that attached a reservation a while, to write it
        again after a failover settle or a rewind (:class:`AssignmentMemo`);
        also one that named a reservation the cell did not have (yet): another
        replica may write that one back after its settle (``lua/replay-5.lua``),
        and this assignment written again then attaches it."""
        rid = result.reservation_id or named
        if rid:
            self.assigned.record(Assigned(time.monotonic(), sandbox_id, node_id, endpoint, rid))

    def _remember_placement(self, placed: Placement) -> None:
        """Keep a placement answered OK a while, to write it back after a
        rewind or failover settle if the cell lacks it (:class:`PlacementMemo`)."""
        if placed.reservation_id:
            self.placed.record(
                Placed(
                    time.monotonic(),
                    placed.reservation_id,
                    placed.node_id,
                    placed.cpu,
                    placed.memory_bytes,
                    placed.now_ms,
                    placed.pressure,
                )
            )

    def _replay_reservations(
        self, grace_ms: int = REWOUND_GRACE_MS
    ) -> Plan[tuple[int, int, int, int]]:
        """Write back the recent placements the cell lacks, oldest first, in
        calls of :data:`REPLAY_BATCH` (lua/replay-5.lua), each with its
        sandbox when this client recorded its assignment: (written pending,
        written ended, left as they were, not written)."""
        sandboxes = {
            a.reservation_id: a.sandbox_id
            for a in self.assigned.recent(time.monotonic())
            if a.reservation_id
        }
        items = [
            (p, sandboxes.get(p.reservation_id, "")) for p in self.placed.recent(time.monotonic())
        ]
        totals = [0, 0, 0, 0]
        for i in range(0, len(items), REPLAY_BATCH):
            got = yield from self._step(self.ops.replay(items[i : i + REPLAY_BATCH], grace_ms))
            for k in range(4):
                totals[k] += got[k]
        return totals[0], totals[1], totals[2], totals[3]

    def _replay(self) -> Plan[tuple[int, int]]:
        """Write the recent assignments again, oldest first: (written,
        refused); one refused (its node unregistered since, or not registered
        in the data that came back) is skipped."""
        written = refused = 0
        for a in self.assigned.recent(time.monotonic()):
            try:
                yield from self._step(
                    self.ops.assign(a.sandbox_id, a.node_id, a.endpoint, a.reservation_id)
                )
                written += 1
            except (UnknownNode, FailedPrecondition):
                refused += 1
        return written, refused

    # -- what every call goes through --------------------------------------
    @contextmanager
    def scoped(
        self, *, timeout: float | None = None, observe: Observer | None = None
    ) -> Iterator[None]:
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
    def _deadline_left() -> float | None:
        """Seconds left of the :meth:`scoped` deadline (None: none)."""
        scope = _SCOPE.get()
        if scope is None or scope.deadline is None:
            return None
        return scope.deadline - time.monotonic()

    @staticmethod
    def _unscoped() -> None:
        """Calls from here on (this task) belong to no RPC: no deadline, not metered."""
        _SCOPE.set(None)

    @staticmethod
    def _observe(script: str, start: float, error: BaseException | None) -> None:
        scope = _SCOPE.get()
        if scope is not None and scope.observe is not None:
            scope.observe(script, time.perf_counter() - start, error)

    def _fenced(self, call: Call[Any]) -> None:
        why = ""
        if call.acked:
            why = self.fence.held() or ("" if _CHECKING.get() else self.unchecked)
        if why:
            raise StoreUnavailable(f"Redis at {self.target}: {why}")

    def _waits(self, call: Call[Any]) -> bool:
        return self.durability.replicas > 0 and call.acked

    def _wait_for(self) -> int:
        """How many Redis replicas a write waits for: every replica connected
        to the primary when last counted (``replicas_connected``; whichever
        Sentinel promotes then has it), and never fewer than min_replicas_acked."""
        return max(self.durability.replicas, self.replicas_connected)

    def _check_acked(self, acked: int, wanted: int | None = None) -> None:
        d = self.durability
        wanted = d.replicas if wanted is None else wanted
        if acked < wanted:
            every = "" if wanted == d.replicas else " (every connected replica)"
            raise NotReplicated(
                f"Redis at {self.target}: the write reached {acked} of the {wanted} "
                f"replica(s){every} min_replicas_acked asks for within {d.timeout_ms}ms"
            )

    def _remember(self, rid: str) -> None:
        if len(self.abandoned) >= ABANDON_MAX:
            self.abandoned.pop(next(iter(self.abandoned)))
        self.abandoned.setdefault(rid, time.monotonic())

    def _owe(self, owed: Owed) -> None:
        if len(self.owed) >= OWED_MAX and owed.sandbox_id not in self.owed:
            self.owed.pop(next(iter(self.owed)))
        self.owed[owed.sandbox_id] = owed

    def _stale_owed(self) -> None:
        horizon = time.monotonic() - OWED_FOR_S
        for sb in [sb for sb, o in self.owed.items() if o.since < horizon]:
            del self.owed[sb]

    def _stale_abandoned(self) -> None:
        horizon = time.monotonic() - ABANDON_FOR_S
        for rid in [r for r, since in self.abandoned.items() if since < horizon]:
            del self.abandoned[rid]

    # -- the cell this client keeps -----------------------------------------
    def keep_cell(
        self, policy: Policy, nodes: Sequence[tuple[str, str]] = (), *, discovered: bool = False
    ) -> None:
        """Keep the cell: :meth:`prepare_cell` stores this policy and static
        node list, and a call that finds the cell without a policy (Redis
        lost its data) puts them back (:meth:`restore_cell`) and is sent again.
        ``discovered``: the node list is Kubernetes discovery's; preparing
        and restoring leave it alone (an empty list would remove every
        discovered node, with its bindings and reservations)."""
        self.kept = CellSetup(policy, tuple(nodes), discovered)

    def _kept(self) -> CellSetup:
        if self.kept is None:
            raise RuntimeError("keep_cell() first: this client keeps no cell")
        return self.kept

    def _step(self, call: Call[T]) -> Plan[T]:
        """One call; a cell Redis lost is restored first when this client keeps it."""
        try:
            return cast(T, (yield call))
        except CellNotInitialised:
            if self.kept is None:
                raise
            log.warning("the cell's policy is gone from Redis (data lost?); restoring it")
            yield from self._restore()
            return cast(T, (yield call))

    def _prepare(self, overwrite: bool) -> Plan[str]:
        setup = self._kept()
        outcome = cast(str, (yield self.ops.sync_policy(setup.policy, overwrite=overwrite)))
        if setup.discovered:
            return outcome
        if setup.nodes and not overwrite:
            # (ListNodes' pages, not one read of every node: #31)
            listed = yield from self._listed()
            stored = sorted((v.node_id, v.endpoint) for v in listed if v.static)
            if stored and stored != sorted(setup.nodes):
                raise StaticNodesConflict(nodes_conflict(stored, sorted(setup.nodes)))
        yield from self._sync(self.ops.static_list(setup.nodes), raw=True)
        return outcome

    def _restore(self) -> Plan[None]:
        setup = self._kept()
        try:
            outcome = yield self.ops.sync_policy(setup.policy, overwrite=False, restore=True)
        except PolicyConflict:
            return  # another replica restored (and changed) it first; the stored one rules
        if outcome == "created":
            log.warning(
                "restored the cell's policy in Redis (its data was lost); nodes take "
                "placements again once they heartbeat"
            )
            if not setup.discovered:
                yield from self._sync(self.ops.static_list(setup.nodes), raw=True)

    # -- plans of more than one call ----------------------------------------
    def _sync(self, lst: SyncList, raw: bool = False) -> Plan[tuple[bool, int, int]]:
        """Make the cell's node list ``lst`` in bounded steps (a pass:
        lua/sync_begin-5.lua): begin (or join the pass of the same list
        another replica runs), stage the list in chunks, walk the nodes until
        the step that commits.  (applied, nodes added or changed, nodes
        removed); applied False: discovery's positions were behind the
        stored ones (nothing written).  A pass another list's superseded
        (or that expired, or whose cell was restored meanwhile) starts over,
        at most SYNC_ATTEMPTS times in all; then SyncSuperseded.
        ``raw``: the calls go as they are (the restore's own), not
        through the restore that a cell without a policy starts."""

        def one(call: Call[T]) -> Plan[T]:
            if raw:
                return cast(T, (yield call))
            return (yield from self._step(call))

        for attempt in range(1, SYNC_ATTEMPTS + 1):
            token = str(secrets.randbits(62))
            try:
                outcome, token = yield from one(self.ops.sync_begin(token, lst))
                if outcome == DISCOVERY_STALE:
                    return False, 0, 0
                if outcome == SYNC_DONE:  # (nothing to remove, nothing to stage)
                    return True, 0, 0
                for chunk in lst.chunks():
                    yield from one(self.ops.sync_stage(token, chunk))
                while True:
                    done, changed, removed = yield from one(self.ops.sync_walk(token))
                    if done:
                        return True, changed, removed
            except SyncSuperseded as e:
                if attempt == SYNC_ATTEMPTS:
                    raise SyncSuperseded(
                        f"{e.message}; {SYNC_ATTEMPTS} passes superseded in a row: another "
                        "replica syncs another node list"
                    ) from e
                log.info("node-list sync pass superseded (%s); starting over", e.message)
        raise AssertionError("unreachable")

    def _sync_nodes(self, nodes: Sequence[tuple[str, str]]) -> Plan[tuple[int, int]]:
        _, changed, removed = yield from self._sync(self.ops.static_list(nodes))
        return changed, removed

    def _sync_discovered(
        self, positions: Sequence[int], nodes: Sequence[tuple[str, str, bool]]
    ) -> Plan[tuple[bool, int, int]]:
        return (yield from self._sync(self.ops.discovered_list(positions, nodes)))

    def _heartbeat(self, hb: Heartbeat, cpu_config: bool) -> Plan[HeartbeatResult]:
        node_id, cluster_id = hb.node_id.strip(), hb.cluster_id.strip()
        carried = hb.machine_info.cpu_config_json
        # (the exchange's ingest goes after the heartbeat in the same trip where
        # a batch runs them: its `restarted` is then the heartbeat's answer's)
        ingest = self.cpu_ops.ingest(node_id, cluster_id, carried, False) if cpu_config else None
        reply: HeartbeatResult | Followed[HeartbeatResult, Outcome]
        try:
            reply = yield from self._step(self.ops.heartbeat(hb, self.beats).then(ingest))
        except Resync:  # another writer came between: this one goes in full (even
            # if meanwhile another heartbeat of the node gave the memo a new base)
            reply = yield from self._step(
                self.ops.heartbeat(hb, self.beats, full=True).then(ingest)
            )
        result, ingested = (
            (reply.first, reply.then) if isinstance(reply, Followed) else (reply, None)
        )
        if cpu_config:
            config = yield from exchange(
                self._step,
                self.cpu_ops,
                node_id,
                cluster_id,
                carried,
                result.restarted,
                ingested,
            )
            result = msgspec.structs.replace(result, cpu_config_json=config)
        return result

    def _unregister(self, node_id: str, service_instance_id: str) -> Plan[bool]:
        removed = yield from self._step(self.ops.unregister(node_id, service_instance_id))
        self.beats.pop(node_id.strip(), None)  # (whatever the answer: the next one goes in full)
        return removed

    def _reservation(self, reservation_id: str) -> Plan[Reservation]:
        found = yield from self._step(self.ops.reservations(None, reservation_id))
        if not found:
            raise NotFound(f"reservation {reservation_id} not found")
        return found[0]

    def _pages(self, page: Callable[[str], Call[Page[T]]]) -> Plan[list[T]]:
        """A list read page by page (each page one bounded call), stitched in
        node-id order: a node present for the whole listing is in it exactly
        once (docs/contract.md)."""
        out: list[T] = []
        after = ""
        while True:
            after, rows = yield from self._step(page(after))
            out.extend(rows)
            if not after:
                return out

    def _reservations(self, node_id: str | None) -> Plan[list[Reservation]]:
        """One node's live reservations (one call), or the cell's page by page."""
        if node_id:
            return (yield from self._step(self.ops.reservations(node_id)))
        return (yield from self._pages(lambda after: self.ops.reservations_page(after)))

    def _peers(self, cluster_id: str, backend: str, exclude: str) -> Plan[list[Peer]]:
        """A cluster's peers: its members' ids (one call), then their rows,
        PEER_PAGE ids a call; or the cell's page by page.  In node-id byte
        order."""
        if not cluster_id.strip():
            return (
                yield from self._pages(
                    lambda after: self.peer_ops.peers(
                        cluster_id, backend, exclude, after, LIST_PAGE
                    )
                )
            )
        self.peer_ops.filters(cluster_id, backend, exclude)  # (refused before any read)
        members = yield from self._step(self.peer_ops.members(cluster_id))
        return (yield from self._peer_rows(cluster_id, backend, exclude, members))

    def _lookup(
        self, cluster_id: str, backend: str, key: str, exclude: str, limit: int
    ) -> Plan[list[Peer]]:
        """An artifact's holders that are peers, in node-id byte order, at
        most ``limit`` (<= 0: all): their ids (one call), then their rows."""
        ids = yield from self._step(self.peer_ops.lookup(cluster_id, backend, key, exclude))
        return (yield from self._peer_rows(cluster_id, backend, exclude, ids, limit))

    def _peer_rows(
        self, cluster_id: str, backend: str, exclude: str, ids: list[str], limit: int = 0
    ) -> Plan[list[Peer]]:
        """Those of ``ids`` (sorted) that are peers, in their order, PEER_PAGE
        ids a call, until ``limit`` of them are found (<= 0: all)."""
        found: list[Peer] = []
        for i in range(0, len(ids), PEER_PAGE):
            page = ids[i : i + PEER_PAGE]
            _, rows = yield from self._step(
                self.peer_ops.peers(cluster_id, backend, exclude, ids=page)
            )
            found.extend(rows)
            if 0 < limit <= len(found):
                return found[:limit]
        return found

    def _listed(self) -> Plan[list[ListedNode]]:
        return (yield from self._pages(lambda after: self.ops.listed(after)))

    def _observed(self, cluster_id: str) -> Plan[list[ObservedNode]]:
        return (yield from self._pages(lambda after: self.ops.observed("", cluster_id, after)))

    def _observed_node(self, node_id: str, cluster_id: str) -> Plan[ObservedNode]:
        _, rows = yield from self._step(
            self.ops.observed(validate_id("node_id", node_id), cluster_id)
        )
        if not rows:
            raise NotFound("observed node not found")
        return rows[0]

    def _nodes(self) -> Plan[list[NodeView]]:
        return (yield from self._pages(lambda after: self.ops.nodes_page(after)))
