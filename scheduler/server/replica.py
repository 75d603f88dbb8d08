"""One stateless replica: the gRPC server, gRPC health, /metrics, and a monitor
loop that watches Redis.

Start-up stores or checks the cell's shared policy (a replica whose limits
differ from the stored ones refuses to start, unless told to overwrite) and
the static node list.  Health is SERVING only while this replica can write
to the cell: the monitor's probe is a write (and, with min_replicas_acked, is
replicated), so a primary that became a replica, a full or paused Redis, or
one that is down all read NOT_SERVING, and every RPC fails fast with
UNAVAILABLE.  A call that finds Redis unable to serve wakes the monitor at
once.  Under Sentinel the replica follows the primary the sentinels
announce.  When Redis is back the replica restores the cell's policy if Redis
lost it and serves again, without a restart.

Its ports listen from the first second (:meth:`Replica.listen`), before Redis
has answered: health reads NOT_SERVING, ``/metrics`` says ``sched_redis_up 0``,
``/healthz`` is 200 (alive) and ``/readyz`` 503, and every scheduler call is
UNAVAILABLE until the cell's policy is checked (:meth:`Replica.open`), so a
liveness probe does not restart a replica that waits for Redis.  A
``-query-only`` replica answers LookupNode alone (every other call
UNAVAILABLE, naming the mode) and never writes the cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, make_server

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from scheduler.client.aio import AsyncScheduler
from scheduler.client.plans import checking, is_checking
from scheduler.domain.errors import FailedPrecondition, SchedulerError, StoreUnavailable
from scheduler.domain.history import RECONCILE_BATCH, REWOUND_GRACE_MS, HistoryWatch, Probe
from scheduler.domain.limits import max_message_bytes
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.server.config import Settings
from scheduler.server.frames import add_guarded
from scheduler.server.metrics import Metrics
from scheduler.server.service import SchedulerService
from scheduler.server.tls import ReloadingCredentials, TlsError, is_loopback
from scheduler.store.calls import this_replica
from scheduler.store.connection import RestartGuard, server_run_id
from scheduler.store.durability import EvictionRisk, EvictionWatch, connected_replicas
from scheduler.store.sentinel import SentinelWatch, is_sentinel_client
from scheduler.store.translate import translated

log = logging.getLogger("scheduler.server.replica")
T = TypeVar("T")
#: A replica writes its assignments again these long (s) after its first
#: replay: the reservations they name may be another replica's placements,
#: which that replica writes back after its own next probe (about 1 s; a
#: few on a loaded host).
REPLAY_AGAIN_S = (2.0, 5.0)

SERVICE_NAME = "scheduler.v1.Scheduler"
LOOKUP_METHOD = f"/{SERVICE_NAME}/LookupNode"
#: health of the reads alone (LookupNode, GetNode, the list calls): SERVING
#: while Redis answers them, also when it refuses writes (OOM, CLIENT PAUSE
#: WRITE), which turn "" and SERVICE_NAME NOT_SERVING
READS_SERVICE_NAME = "scheduler.v1.Scheduler/reads"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
#: the services gRPC reflection lists (``grpcurl ADDR list``)
REFLECTED = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)


class ListenError(Exception):
    """An address this replica should listen on is not available."""


class _Handlers:
    """Takes the generated code's method handlers instead of a server."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, _handlers: object) -> None:
        pass

    def add_registered_method_handlers(
        self, _service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self.handlers = handlers


class _Gate:
    """The scheduler's methods, each refused UNAVAILABLE while ``refusal`` has a
    reason (before the cell is checked; every one but LookupNode when
    query-only).  They stay registered methods: the generic-handler path
    instead made a burst of calls on a new connection measurably later
    (tests/test_multi_replica.py's silent replicas lost every race)."""

    def __init__(self, refusal: Callable[[str], str | None]) -> None:
        self.refusal = refusal
        #: nothing is refused any more (open, not query-only): one attribute test a call
        self.open = False

    def wrap(self, handlers: dict[str, grpc.RpcMethodHandler]) -> dict[str, grpc.RpcMethodHandler]:
        return {
            name: grpc.unary_unary_rpc_method_handler(
                self._gated(f"/{SERVICE_NAME}/{name}", h.unary_unary),
                request_deserializer=h.request_deserializer,
                response_serializer=h.response_serializer,
            )
            for name, h in handlers.items()
        }

    def _gated(self, method: str, behaviour: Callable[..., Any]) -> Callable[..., Any]:
        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if not self.open:
                why = self.refusal(method)
                if why is not None:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, why)
            return await behaviour(request, context)

        return call


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class Replica:
    def __init__(
        self,
        settings: Settings,
        sched: AsyncScheduler,
        *,
        overwrite_policy: bool = False,
        monitor_interval_s: float = 1.0,
        cell_stats_interval_s: float | None = 5.0,
        reuse_port: bool = False,
    ) -> None:
        self.settings = settings
        #: share the gRPC port with other processes (``schedctl serve --workers``);
        #: off otherwise, so a second replica on a taken port fails to start
        self.reuse_port = reuse_port
        self.sched = sched
        self.overwrite_policy = overwrite_policy
        self.monitor_interval_s = monitor_interval_s
        self.cell_stats_interval_s = cell_stats_interval_s
        self.metrics = Metrics()
        self.metrics.owed_assignments.set_function(lambda: len(self.sched.owed))
        self.metrics.watch_batches({"schedule": sched.coalescer, "heartbeat": sched.beat_coalescer})
        self.health = health.aio.HealthServicer()
        #: the cell this replica keeps: stored at start-up, put back if Redis loses it
        # (kubernetes: discovery writes the node list; preparing leaves it alone)
        sched.keep_cell(settings.policy, settings.nodes, discovered=settings.kubernetes is not None)
        self.service = SchedulerService(
            sched,
            self.metrics,
            strategy=settings.policy.strategy,
            artifact_store_capacity=settings.artifact_store_capacity,
            artifact_lookup_node_limit=settings.artifact_lookup_node_limit,
            on_unavailable=self.check_now,
            heartbeat_endpoint=(settings.heartbeat_scheme, settings.heartbeat_port)
            if settings.heartbeat_port
            else None,
            decision_log=settings.decision_log,
        )
        #: the cell's policy is checked (query-only: from the start): calls are served
        self._open = False
        #: stop() has run
        self.stopped = False
        self._http: ThreadingWSGIServer | None = None
        self._gate: _Gate | None = None
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.metrics_port: int | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._redis_ok = False
        self._reads_ok = False
        self._stopping = False
        #: maxmemory-policy and evictions, at start and in every probe
        self.eviction = EvictionWatch(allowed=settings.allow_eviction)
        #: the cell's history as this replica's probes saw it (data that went
        #: back in time, a clock that jumped)
        self.history = HistoryWatch()
        self.rewind_grace_ms = REWOUND_GRACE_MS
        self._history_lock = asyncio.Lock()
        self._history_at = 0.0
        #: second passes of replay_assignments under way
        self._replays: set[asyncio.Task[None]] = set()
        sched.on_placed = self.history.placement
        #: new connections to another Redis server hold writes until checked
        self.restart_guard: RestartGuard | None = getattr(sched.client, "restart_guard", None)
        if self.restart_guard is not None and not settings.query_only:
            self.restart_guard.bypass = is_checking
            self.restart_guard.on_other = self._other_server
        self.tls: ReloadingCredentials | None = None
        self.sentinel = (
            SentinelWatch(sched.client, sched.fence, self.after_failover)
            if is_sentinel_client(sched.client)
            else None
        )

    # -- cell policy and node list ------------------------------------------
    async def prepare_cell(self) -> str:
        """Check that Redis keeps what it is given (no eviction policy, unless
        allowed), then store or check the shared policy and static node list
        (start-up)."""
        await self._check_eviction()
        await self._count_replicas()
        return await self.sched.prepare_cell(overwrite=self.overwrite_policy)

    async def _count_replicas(self) -> None:
        """With min_replicas_acked: writes wait for every connected replica."""
        if self.settings.durability.replicas == 0 or self.sched.url is None:
            return
        with translated(self.sched.target):
            n = await connected_replicas(self.sched.client)
        if n != self.sched.replicas_connected:
            log.info(
                "Redis at %s has %d connected replica(s): writes wait for each",
                self.sched.target,
                n,
            )
        self.sched.replicas_connected = n

    async def _check_eviction(self) -> None:
        if self.sched.url is None:
            return  # the embedded store (fakeredis) evicts nothing and knows no INFO
        with translated(self.sched.target):
            await self.eviction.check(self.sched.client, self.sched.target)
        self.metrics.redis_evicted_keys.set(self.eviction.total())

    async def restore_cell(self) -> None:
        """Redis came back empty: put this replica's policy and nodes back, and
        let nodes place again only once they have heartbeated since (settle)."""
        await self.sched.restore_cell()

    async def after_failover(self) -> None:
        """Sentinel named a new primary.  Before writes go on, check its history
        (it may be behind what this replica saw, or its clock off: see
        :meth:`check_history`).  Without min_replicas_acked it may lack
        placements the old one answered: settle the cell, so nodes must
        heartbeat (with what they really hold) before they take more."""
        self.sched.unchecked = (
            "a new primary: writes wait until this replica has checked its data and clock"
        )
        try:
            with checking():
                run_id = await self._server_run_id()
                probe = await self.sched.probe_cell(self._probe_timeout_s)
                if probe.has_policy:
                    await self.check_history(probe)
                    if run_id is not None and self.restart_guard is not None:
                        self.restart_guard.verified = run_id
        except (SchedulerError, asyncio.TimeoutError) as e:
            # writes stay held; the monitor's next probe checks again (same baseline)
            log.warning("could not check the new primary's history: %s", getattr(e, "message", e))
        else:
            self.sched.unchecked = ""
        if self.settings.durability.replicas > 0:
            return  # every answered placement reached a replica: nothing to settle
        try:
            await self.sched.settle()
            log.warning(
                "settled the cell after the failover: nodes take placements again "
                "once they heartbeat to the new primary"
            )
        except SchedulerError as e:
            log.warning("could not settle the cell after the failover: %s", e.message)
            return
        # the promoted replica may lack assignments the old primary answered:
        # their reservations would wait for unassigned_reservation_ttl
        await self.replay_assignments("the failover")

    async def replay_assignments(self, why: str) -> None:
        """Write back what Redis may have lost with its last writes: first the
        placements this replica answered that the cell lacks
        (:class:`~scheduler.domain.history.PlacementMemo`, lua/replay-5.lua),
        before writes go on (a creation in flight whose reservation went is
        counted by no one until its node lists it); then, in the
        background, the assignments it answered lately
        (:class:`~scheduler.domain.history.AssignmentMemo`), at once and
        again at each of :data:`REPLAY_AGAIN_S`: the reservations they name
        may be another replica's placements, which that replica writes back
        after its own probe.  A failure is logged; the reservations then end
        by their TTL as before."""
        unknown = await self._replay_reservations(why)
        if self._stopping:
            return
        again = self._replay_assignments(why, unknown)
        task = asyncio.create_task(again, name="replay-assignments")
        self._replays.add(task)
        task.add_done_callback(self._replays.discard)

    async def _replay_reservations(self, why: str) -> int:
        """One write-back of the placements the cell lacks (logged, counted);
        how many were not written for their node being unknown (a node that
        registers with its heartbeat after Redis came back empty), or 0 after
        a failure (logged)."""
        try:
            live, ended, kept, unknown = await self.sched.replay_reservations(self.rewind_grace_ms)
        except SchedulerError as e:
            log.warning("could not write back the placements after %s: %s", why, e.message)
            return 0
        else:
            if live or ended:
                self.metrics.replayed_reservations.labels("live").inc(live)
                self.metrics.replayed_reservations.labels("ended").inc(ended)
                log.warning(
                    "after %s, wrote back %d placement(s) this replica answered in the last "
                    "%.0f s that Redis lacked: %d pending (in flight), %d ended (in their "
                    "nodes' rosters or over); %d it had%s",
                    why,
                    live + ended,
                    self.sched.placed.window_s,
                    live,
                    ended,
                    kept,
                    f", {unknown} not written (node unknown)" if unknown else "",
                )
            return unknown

    async def _replay_assignments(self, why: str, unknown: int) -> None:
        """The assignments written again, at once and at each of
        :data:`REPLAY_AGAIN_S`; before each later pass, while placements
        were left unwritten for an unknown node, the placements again (one
        the cell has by then is left as it is)."""
        waited = 0.0
        for at in (0.0, *REPLAY_AGAIN_S):
            await asyncio.sleep(at - waited)
            waited = at
            if self._stopping:
                return
            if at > 0.0 and unknown:
                unknown = await self._replay_reservations(why)
            try:
                written, refused = await self.sched.replay_assignments()
            except SchedulerError as e:
                log.warning("could not write the assignments again after %s: %s", why, e.message)
                continue
            if at == 0.0 and (written or refused):
                self.metrics.replayed_assignments.inc(written)
                log.warning(
                    "after %s, wrote again %d assignment(s) this replica answered in the last "
                    "%.0f s (Redis may have lost them; one it has changes nothing)%s",
                    why,
                    written,
                    self.sched.assigned.window_s,
                    f"; {refused} refused (node unknown)" if refused else "",
                )

    # -- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        """Listen and serve (the cell is already checked)."""
        await self.listen()
        await self.open()

    def refusal(self, method: str) -> str | None:
        """Why a call of ``method`` is refused now; None when it is served."""
        if self.settings.query_only and method != LOOKUP_METHOD:
            name = method.rpartition("/")[2]
            return (
                f"{name}: this replica is query-only (-query-only): it answers LookupNode "
                f"alone; send {name} to a scheduling replica"
            )
        if not self._open:
            return (
                f"Redis at {self.sched.target} has not answered since this replica "
                "started: it serves once the cell's policy is checked"
            )
        return None

    async def listen(self) -> None:
        """Open the gRPC port and /metrics now, Redis or not: health NOT_SERVING,
        every scheduler call UNAVAILABLE until :meth:`open`."""
        limit = max_message_bytes(self.settings.policy.max_roster_ids)
        self.server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", int(self.reuse_port)),
                ("grpc.max_receive_message_length", limit),
            ]
        )
        self._gate = gate = _Gate(self.refusal)

        def add_gated(servicer: Any, server: Any) -> None:
            taken = _Handlers()
            pb_grpc.add_SchedulerServicer_to_server(servicer, taken)
            server.add_registered_method_handlers(SERVICE_NAME, gate.wrap(taken.handlers))

        # malformed frames are refused first (frames.py), then the gate, then the call
        add_guarded(add_gated, self.service, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if self.settings.grpc_reflection:
            reflection.enable_server_reflection(REFLECTED, self.server)
        try:
            self.port = self._add_port(self.server)
        except RuntimeError as e:
            raise ListenError(f"gRPC cannot listen on {self.settings.grpc_listen}: {e}") from None
        if self.port == 0:
            raise ListenError(f"gRPC cannot listen on {self.settings.grpc_listen}")
        if self.settings.metrics_listen:
            try:
                self.metrics_port = self._serve_http(self.settings.metrics_listen)
            except OSError as e:
                raise ListenError(
                    f"/metrics cannot listen on {self.settings.metrics_listen}: {e.strerror or e}"
                ) from None
        # NOT_SERVING, reads too, until the monitor has asked Redis
        self._redis_ok = self._reads_ok = False
        self.metrics.redis_up.set(0)
        for name in ("", SERVICE_NAME, READS_SERVICE_NAME):
            await self.health.set(name, NOT_SERVING)
        await self.server.start()

    async def open(self) -> None:
        """The cell is checked (a query-only replica checks none): serve calls,
        and watch Redis from now on."""
        self._open = True
        if not self.settings.query_only:
            if self._gate is not None:
                self._gate.open = True
            await self._set_serving(True)
        if self.sentinel is not None:
            self.sentinel.start()
        self._monitor = asyncio.create_task(self._watch_redis(), name="redis-monitor")

    def _serve_http(self, listen: str) -> int:
        """/metrics, /healthz (alive: 200 while the process runs) and /readyz
        (200 while this replica serves, else 503) on ``host:port``, in a thread;
        returns the bound port."""
        metrics_app = make_wsgi_app(self.metrics.registry)

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/healthz":
                start_response("200 OK", [("Content-Type", "text/plain")])
                return [b"ok\n"]
            if path == "/readyz":
                if self._open and self._redis_ok:
                    start_response("200 OK", [("Content-Type", "text/plain")])
                    return [b"ready\n"]
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [f"not ready: Redis at {self.sched.target} does not serve\n".encode()]
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]

        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        if host == "::":
            host = "0.0.0.0"
        server = make_server(host, int(port), app, ThreadingWSGIServer, handler_class=_QuietHandler)
        self._http = server
        thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
        thread.start()
        return int(server.server_address[1])

    def _add_port(self, server: grpc.aio.Server) -> int:
        listen, files = self.settings.grpc_listen, self.settings.grpc_tls
        if files is None:
            if not is_loopback(listen):
                log.warning(
                    "gRPC on %s is plaintext and not loopback-only: anyone who can "
                    "reach the port can drive the cell; set scheduler.grpc_tls "
                    "(docs/operations.md: Security)",
                    listen,
                )
            return int(server.add_insecure_port(listen))
        try:
            self.tls = ReloadingCredentials(files)
        except TlsError as e:
            raise ListenError(str(e)) from None
        return int(server.add_secure_port(listen, self.tls.server_credentials()))

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop taking calls, let in-flight ones finish (up to the grace), close."""
        self._stopping = True
        self.stopped = True
        await self.health.enter_graceful_shutdown()
        if self.sentinel is not None:
            await self.sentinel.stop()
        for task in list(self._replays):
            task.cancel()
        if self._monitor is not None:
            self._monitor.cancel()
            # wait_for() before Python 3.12 can swallow a cancellation; the loop
            # also checks _stopping, so a bounded wait is enough.
            await asyncio.wait([self._monitor], timeout=5)
        if self.server is not None:
            await self.server.stop(self.settings.drain_timeout_s if grace_s is None else grace_s)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        self.metrics.close()

    # -- monitoring ----------------------------------------------------------
    async def _set_serving(self, ok: bool, why: str = "") -> None:
        if self._stopping:
            return
        if ok != self._redis_ok:
            if ok:
                log.info("Redis at %s takes writes: serving", self.sched.target)
            else:
                log.error(
                    "%s: NOT_SERVING until this replica can write again",
                    why or f"Redis at {self.sched.target} is unreachable",
                )
        await self._publish(ok)

    async def _publish(self, ok: bool) -> None:
        self._redis_ok = ok
        self.metrics.redis_up.set(1 if ok else 0)
        status = SERVING if ok else NOT_SERVING
        await self.health.set("", status)
        await self.health.set(SERVICE_NAME, status)
        if ok:
            await self._set_reads(True)
        else:  # which of the two is degraded: are reads still answered?
            await self._set_reads(await self._reads_answer())

    async def _reads_answer(self) -> bool:
        try:
            with self.sched.scoped(timeout=self._probe_timeout_s):
                await self.sched.stats()  # (a no-writes function: runs while writes are refused)
        except (SchedulerError, asyncio.TimeoutError):
            return False
        return True

    async def _set_reads(self, ok: bool) -> None:
        if self._stopping:
            return
        if ok != self._reads_ok and not self._redis_ok:
            log.warning(
                "Redis at %s %s reads (LookupNode, GetNode, the list calls)",
                self.sched.target,
                "still answers" if ok else "does not answer",
            )
        self._reads_ok = ok
        await self.health.set(READS_SERVICE_NAME, SERVING if ok else NOT_SERVING)

    def check_now(self) -> None:
        """A call found Redis unable to serve: probe at once, not at the next tick."""
        self._wake.set()

    async def _watch_redis(self) -> None:
        loop = asyncio.get_running_loop()
        next_stats = 0.0
        while not self._stopping:
            try:
                due = self.cell_stats_interval_s is not None and loop.time() >= next_stats
                await self._check_redis(refresh_stats=due)
                if not self.settings.query_only:  # (it writes nothing)
                    await self.sched.run(
                        self.sched.ops.replica_seen(
                            this_replica(self.settings.grpc_listen, self.port),
                            self.monitor_interval_s,
                        )
                    )
                if due and self.cell_stats_interval_s is not None:
                    next_stats = loop.time() + self.cell_stats_interval_s
            except (StoreUnavailable, EvictionRisk) as e:
                # (a restarted or replaced server is held by the RestartGuard:
                # refusals of the same server, OOM or READONLY, hold nothing)
                await self._set_serving(False, e.message)
            except asyncio.TimeoutError:
                await self._set_serving(False)
            except SchedulerError as e:
                log.warning("monitor: %s", e.message)
            except Exception:
                log.exception("monitor failed; retrying")
            self._wake.clear()
            # (wait_for on an Event: a wake-up cuts the pause short)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.monitor_interval_s)

    def _other_server(self, run_id: str) -> None:
        if not self.sched.unchecked:
            log.warning(
                "Redis at %s is another server now (run_id %s): writes wait until this "
                "replica has checked its data",
                self.sched.target,
                run_id[:12],
            )
        self._hold_writes()
        self.check_now()

    def _hold_writes(self) -> None:
        """Another Redis server answers: it may be another history (an old
        snapshot, a replica that was behind) or another clock; writes wait
        until the monitor has compared (:meth:`check_history`)."""
        if not self.settings.query_only:
            self.sched.unchecked = (
                f"Redis at {self.sched.target} is another server: writes wait until this "
                "replica has checked its data"
            )

    async def _check_redis(self, refresh_stats: bool) -> None:
        with checking():
            await self._check_redis_data(refresh_stats)
        self.sched.unchecked = ""

    async def _check_redis_data(self, refresh_stats: bool) -> None:
        if self.settings.query_only:  # reads alone: nothing of the cell to keep
            await asyncio.wait_for(self.sched.ping(), self._probe_timeout_s)
            await self._set_serving(True)
            return
        was_ok = self._redis_ok
        if self.sentinel is not None:
            try:
                moved = await self.sentinel.check()
            except Exception as e:  # no sentinel answers: the probe below tells the truth
                log.debug("sentinels: %s", e)
            else:
                if moved:
                    await self.after_failover()
        await self._bounded(self._count_replicas())
        run_id = await self._server_run_id()  # (read before the data it vouches for)
        probe = await self.sched.probe_cell(self._probe_timeout_s)
        has_policy = probe.has_policy
        await self._bounded(self._check_eviction())
        if not was_ok or not has_policy:
            await self.restore_cell()
        if has_policy:
            await self.check_history(probe)  # (before any write: its clock may have jumped)
        else:
            self.history.forget()  # restored empty (and settled): a new baseline
            # what this replica answered went with the data: written back for
            # the nodes the cell knows (a static list's, restored above), and
            # again as nodes register with their heartbeats
            await self.replay_assignments("Redis came back empty")
        if run_id is not None and self.restart_guard is not None:
            self.restart_guard.verified = run_id
        try:
            if refresh_stats:
                await self.refresh_cell_metrics()
            elif self.cell_stats_interval_s is not None:  # (None: no cell metrics at all)
                await self.take_census()
        except FailedPrecondition:
            await self.restore_cell()  # Redis lost the cell between two probes
        await self.rebuild_index()
        await self._set_serving(True)

    async def rebuild_index(self) -> None:
        """Steps of the placement index's rebuild under way (a policy change
        starts one, lua/index_rebuild-5.lua) until it ends, each call bounded
        (REBUILD_STEP nodes, about 2 ms of Redis), other calls served between
        them; at most one tick's time, the rest at the next tick.  With none
        under way, one call that reads two fields."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self.monitor_interval_s
        while not (await self.sched.index_rebuild()).done:
            if self._stopping or loop.time() >= until:
                return
            await asyncio.sleep(0)

    @property
    def _probe_timeout_s(self) -> float:
        return max(self.monitor_interval_s, 1.0)

    async def _bounded(self, read: Awaitable[T]) -> T:
        """A read of the health check that is not a script call (INFO), bounded
        like the probe: a Redis that stops answering (SIGSTOP, a hung host)
        fails the check within the bound, and health goes NOT_SERVING, instead
        of the check waiting until Redis answers again while health still says
        SERVING (``schedctl serve``'s connections have no socket timeout: every
        call through AsyncScheduler.run is bounded by its caller, a bare
        redis-py command is not)."""
        limit = self._probe_timeout_s
        try:
            return await asyncio.wait_for(read, limit)
        except asyncio.TimeoutError:
            raise StoreUnavailable(
                f"Redis at {self.sched.target} did not answer within {limit:.3g}s"
            ) from None

    async def _server_run_id(self) -> str | None:
        """The run_id of the server that answers, for the restart guard (None
        without one), bounded like the probe."""
        if self.restart_guard is None:
            return None
        with translated(self.sched.target):
            return server_run_id(await self._bounded(self.sched.client.info("server")))

    async def check_history(self, probe: Probe) -> None:
        """Compare a probe with the history this replica saw
        (:mod:`scheduler.domain.history`).  Data that went back in time, or a clock
        that jumped beyond the bound, settles the cell as after a failover
        (nodes take placements again once they heartbeat; a jumped clock is
        put back first); live reservations made more than ``rewind_grace_ms``
        before the settle end (their nodes' next heartbeats count what runs)."""
        async with self._history_lock:
            # (by when each was sent: a probe in flight to the old primary at a
            # failover may be answered after one the new primary answered, and
            # compared with it, it read as data from the past: a second settle)
            order = probe.sent or probe.at
            if order < self._history_at:
                return  # an older probe than one already compared
            self._history_at = order
            before = self.history.last
            verdict = self.history.observe(probe)
            if before is not None and probe.generation > before.generation:
                self.sched.beats.clear()  # another replica settled: resend in full
                if verdict is None:
                    # what this replica answered the settled data may lack too
                    # (the settling replica wrote back only its own)
                    await self.replay_assignments("another replica's settle of the cell")
                    return
            if verdict is None:
                return
            self.sched.beats.clear()
            bound = self.history.clock_bound_ms
            expected = verdict.expected_now_ms if abs(verdict.skew_ms) > bound else None
            # (a lower generation than this replica saw: settled only where the
            # data really is from before that settle)
            probed = probe.generation if probe.generation < verdict.generation else None
            settled, generation, now_ms, moved, age = await self.sched.rewound(
                verdict.generation, expected, bound, probed
            )
            if not settled and probed is not None:
                # the probe was another server's (the old primary, answering
                # late): not a baseline; the next probe compares again
                log.info(
                    "a probe read generation %d, older than the %d this replica saw, "
                    "while the primary has %d: another server's answer, ignored",
                    probed,
                    verdict.generation,
                    generation,
                )
                return
            self.history.settled(probe, generation, now_ms)
            if settled:
                self.metrics.redis_rewinds.labels(verdict.reason).inc()
                if verdict.reason == "rewound":
                    log.warning(
                        "Redis at %s holds older data than this replica saw (the cell's "
                        "sequence is %d, it was at least %d; last recorded %.1f s ago): "
                        "settled the cell (nodes take placements again once they "
                        "heartbeat)%s",
                        self.sched.target,
                        verdict.sequence,
                        verdict.expected_sequence,
                        age / 1000,
                        f"; its clock moved by {moved:+d} ms" if moved else "",
                    )
                else:
                    log.warning(
                        "Redis time at %s jumped %+d ms against this replica's clock: "
                        "moved the cell's clock by %+d ms and settled the cell (nodes "
                        "take placements again once they heartbeat)",
                        self.sched.target,
                        verdict.skew_ms,
                        moved,
                    )
            # either way what the cell holds is not trusted: data from the past, or
            # (a clock that jumped forward) bindings Redis itself expired by its
            # clock, so that no roster releases the reservations they charged
            await self._reconcile_rewound(now_ms - self.rewind_grace_ms)
            # the younger reservations stay: the assignments they may have lost
            # are written again (the roster rules then end them)
            await self.replay_assignments(
                "data from the past" if verdict.reason == "rewound" else "a clock jump"
            )

    async def _reconcile_rewound(self, before_ms: int) -> None:
        ended, more = 0, True
        while more:
            n, more = await self.sched.reconcile_rewound(before_ms, RECONCILE_BATCH)
            ended += n
        if ended:
            self.metrics.rewound_reservations.inc(ended)
            log.warning(
                "ended %d reservation(s) made more than %.0f s before the settle (the "
                "cell's data is not trusted): their nodes' next heartbeats count what runs",
                ended,
                self.rewind_grace_ms / 1000,
            )

    async def refresh_cell_metrics(self) -> None:
        # the cell's bounded sweeps, for cells whose calls all take cheap paths;
        # the stored policy, whose input bounds this replica checks first; and a
        # census step (nothing here reads the whole fleet: docs/performance.md)
        await self.sched.sweep()
        await self.sched.policy()
        stats = await self.sched.stats()
        census = await self.sched.census()
        self.metrics.cell.update(
            census.nodes,
            stats.pending,
            {
                "released": stats.released_total,
                "cancelled": stats.cancelled_total,
                "expired": stats.expired_total,
            },
        )

    async def take_census(self) -> None:
        """One bounded step of the cell's node census (every tick; all replicas
        share its pass): the node gauge shows the last finished pass."""
        self.metrics.cell.update_nodes((await self.sched.census()).nodes)
