"""The gRPC servicer of ``scheduler.v1.Scheduler`` over the shared Redis state.

Every RPC is: translate the request (bad input -> ``InvalidArgument`` naming
the field, before anything reaches Redis), run one or two Lua scripts through
:class:`~scheduler.client.AsyncScheduler`, translate the reply.  The servicer
holds no scheduling state, so any number of replicas answer alike.  Errors
map to status codes by :data:`STATUS` (CONTRACT.md's table).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

import grpc
import msgspec

from scheduler.client import AsyncScheduler, Call, Resync
from scheduler.cpuconfig import CpuConfigOps, exchange
from scheduler.errors import (
    FailedPrecondition,
    InvalidArgument,
    NoNodesAvailable,
    NotFound,
    SchedulerError,
    StoreUnavailable,
    UnknownNode,
)
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.keys import validate_id
from scheduler.limits import (
    MAX_DISKS,
    MAX_EVENTS,
    MAX_IMAGES,
    MAX_METADATA,
    MAX_METADATA_BYTES,
    at_most,
)
from scheduler.limits import endpoint as valid_endpoint
from scheduler.metrics import Metrics
from scheduler.p2p import Peer, PeerOps
from scheduler.records import (
    MAX_BYTES,
    MAX_CPU,
    MIB,
    DiskMetric,
    Heartbeat,
    MachineInfo,
    NodeSnapshot,
    Placement,
    Request,
    SandboxEvent,
)

log = logging.getLogger("scheduler.service")
T = TypeVar("T")

RESERVATION_METADATA = "x-reservation-id"
ENDPOINT_METADATA = "x-node-endpoint"
NO_POLICY_PREFIX = "cell policy is not initialised"

STATUS: dict[type[SchedulerError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownNode: grpc.StatusCode.INVALID_ARGUMENT,
    NoNodesAvailable: grpc.StatusCode.UNAVAILABLE,
    StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    NotFound: grpc.StatusCode.NOT_FOUND,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
}

NODE_STATUS_NAMES = {
    pb.NODE_STATUS_UNSPECIFIED: "UNSPECIFIED", pb.NODE_STATUS_READY: "READY",
    pb.NODE_STATUS_CONNECTING: "CONNECTING", pb.NODE_STATUS_UNHEALTHY: "UNHEALTHY",
    pb.NODE_STATUS_LINGERING: "LINGERING",
}
NODE_STATUS_VALUES = {name: value for value, name in NODE_STATUS_NAMES.items()}
EVENT_NAMES = {
    pb.SANDBOX_EVENT_TYPE_CREATE: "CREATE", pb.SANDBOX_EVENT_TYPE_DELETE: "DELETE",
    pb.SANDBOX_EVENT_TYPE_PAUSE: "PAUSE", pb.SANDBOX_EVENT_TYPE_RESUME: "RESUME",
    pb.SANDBOX_EVENT_TYPE_FORK: "FORK",
}
SNAPSHOT_INTS = (
    "allocated_cpu", "allocated_memory_bytes", "cpu_percent", "cpu_count", "memory_used_bytes",
    "memory_total_bytes", "sandbox_count", "sandbox_starting_count", "create_successes",
    "create_fails", "reported_at_unix_ms", "paused_sandbox_count", "paused_allocated_cpu",
    "paused_allocated_memory_bytes",
)


#: The RPC being served (its deadline bounds every Redis call made for it).
_RPC: ContextVar[grpc.aio.ServicerContext[Any, Any] | None] = ContextVar("rpc", default=None)


def _remaining(context: grpc.aio.ServicerContext[Any, Any] | None) -> float | None:
    """Seconds until the caller's deadline (None: no deadline)."""
    if context is None:
        return None
    left: float | None = context.time_remaining()
    return left


def status_of(e: SchedulerError) -> grpc.StatusCode:
    for cls in type(e).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return grpc.StatusCode.INTERNAL


def _metadata(context: grpc.aio.ServicerContext[Any, Any], name: str) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return value if isinstance(value, str) else value.decode()
    return ""


def _text(field: str, value: str, limit: int = 1024) -> str:
    if len(value) > limit:
        raise InvalidArgument(field, f"is longer than {limit} characters")
    return value


# ---------------------------------------------------------------------------
# proto -> records
# ---------------------------------------------------------------------------
def heartbeat_of(req: pb.HeartbeatRequest, endpoint: str) -> Heartbeat:
    snap = req.snapshot
    status = NODE_STATUS_NAMES.get(snap.status)
    if status is None:
        raise InvalidArgument("snapshot.status", f"is not a node status: {snap.status}")
    at_most("snapshot.disks", snap.disks, MAX_DISKS)
    if endpoint.strip():
        endpoint = valid_endpoint(ENDPOINT_METADATA, endpoint)
    disks = [DiskMetric(
        mount_point=_text(f"snapshot.disks[{i}].mount_point", d.mount_point),
        device=_text(f"snapshot.disks[{i}].device", d.device),
        filesystem_type=_text(f"snapshot.disks[{i}].filesystem_type", d.filesystem_type),
        used_bytes=d.used_bytes, total_bytes=d.total_bytes) for i, d in enumerate(snap.disks)]
    mi = req.machine_info
    return Heartbeat(
        node_id=req.node_id, service_instance_id=req.service_instance_id,
        cluster_id=req.cluster_id, version=req.version, commit=req.commit,
        machine_info=MachineInfo(
            cpu_family=mi.cpu_family, cpu_model=mi.cpu_model, cpu_model_name=mi.cpu_model_name,
            cpu_architecture=mi.cpu_architecture, cpu_config_json=mi.cpu_config_json),
        snapshot=NodeSnapshot(status=status, disks=disks,  # type: ignore[arg-type]
                              **{name: getattr(snap, name) for name in SNAPSHOT_INTS}),
        sandbox_ids=list(req.sandbox_ids),
        p2p_backend=req.p2p_endpoint.backend, p2p_address=req.p2p_endpoint.address,
        endpoint=endpoint,
    )


def request_of(req: pb.ScheduleRequest) -> Request:
    """Hints map to creation requests: cold = cpu/memory, template = policy
    default size, none = routing (nothing reserved)."""
    kind = req.hint.WhichOneof("kind") if req.HasField("hint") else None
    if kind == "new_cold_sandbox":
        cold = req.hint.new_cold_sandbox
        at_most("hint.new_cold_sandbox.images", cold.images, MAX_IMAGES)
        _metadata_map("hint.new_cold_sandbox.metadata", cold.metadata)
        if cold.cpu_count > MAX_CPU:
            raise InvalidArgument("hint.new_cold_sandbox.cpu_count", f"must be at most {MAX_CPU}")
        if cold.memory_mb * MIB > MAX_BYTES:
            raise InvalidArgument("hint.new_cold_sandbox.memory_mb",
                                  f"must be at most {MAX_BYTES // MIB}")
        return Request.cold(cold.cpu_count, cold.memory_mb)
    if kind == "new_sandbox":
        _metadata_map("hint.new_sandbox.metadata", req.hint.new_sandbox.metadata)
        return Request.template()
    return Request.route()


def _metadata_map(field: str, m: Any) -> None:
    at_most(field, m, MAX_METADATA)
    if sum(len(k) + len(v) for k, v in m.items()) > MAX_METADATA_BYTES:
        raise InvalidArgument(field, f"holds more than {MAX_METADATA_BYTES} characters")


def events_of(req: pb.ReportSandboxEventRequest) -> list[SandboxEvent]:
    at_most("events", req.events, MAX_EVENTS)
    out = []
    for i, ev in enumerate(req.events):
        name = EVENT_NAMES.get(ev.event_type)
        if name is None:
            raise InvalidArgument(f"events[{i}].event_type", f"is not an event type: "
                                  f"{ev.event_type}")
        out.append(SandboxEvent(sandbox_id=ev.sandbox_id, event_type=name,  # type: ignore[arg-type]
                                requested_cpu=ev.requested_cpu,
                                requested_memory_bytes=ev.requested_memory_bytes,
                                requested_disk_bytes=ev.requested_disk_bytes))
    return out


# ---------------------------------------------------------------------------
# records -> proto
# ---------------------------------------------------------------------------
def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _rows(r: list[Any]) -> list[dict[str, str]]:
    out = []
    for row in r[1:]:
        it = iter(row)
        out.append({_s(k): _s(v) for k, v in zip(it, it, strict=False)})
    return out


def observed_call(sched: AsyncScheduler, node_id: str, cluster_id: str, with_unseen: bool,
                  full: bool) -> Call[list[dict[str, str]]]:
    """Nodes as observed (lua/observed-5.lua): full records, or id + endpoint + status."""
    args = [node_id, cluster_id, "1" if with_unseen else "0", "full" if full else "brief"]
    return Call("observed", sched.keys.fixed(), args, _rows, writes=False)


_disks = msgspec.json.Decoder(list[DiskMetric])


def observed_node(f: dict[str, str]) -> pb.ObservedNode:
    def i(name: str) -> int:
        return int(f.get(name) or 0)

    try:
        disks = _disks.decode(f["disks"]) if f.get("disks") else []
    except msgspec.DecodeError:
        disks = []
    snap = pb.NodeSnapshot(
        status=NODE_STATUS_VALUES.get(f.get("derived_status", ""), pb.NODE_STATUS_UNSPECIFIED),
        disks=[pb.DiskMetric(mount_point=d.mount_point, device=d.device,
                             filesystem_type=d.filesystem_type, used_bytes=d.used_bytes,
                             total_bytes=d.total_bytes) for d in disks],
        **{name: i(name) for name in SNAPSHOT_INTS})
    return pb.ObservedNode(
        node_id=f.get("node_id", ""), endpoint=f.get("endpoint", ""),
        cluster_id=f.get("cluster_id", ""), service_instance_id=f.get("service_instance_id", ""),
        version=f.get("version", ""), commit=f.get("commit", ""),
        machine_info=pb.MachineInfo(
            cpu_family=f.get("cpu_family", ""), cpu_model=f.get("cpu_model", ""),
            cpu_model_name=f.get("cpu_model_name", ""),
            cpu_architecture=f.get("cpu_architecture", ""),
            cpu_config_json=f.get("cpu_config_json", "")),
        snapshot=snap, last_seen_unix_ms=i("last_seen_ms"))


def _peer(p: Peer) -> pb.P2pPeer:
    return pb.P2pPeer(node_id=p.node_id,
                      endpoint=pb.P2pEndpoint(backend=p.backend, address=p.address))


# ---------------------------------------------------------------------------
# The servicer
# ---------------------------------------------------------------------------
class SchedulerService(pb_grpc.SchedulerServicer):  # type: ignore[misc]
    def __init__(self, sched: AsyncScheduler, metrics: Metrics, *, strategy: str,
                 artifact_store_capacity: int, artifact_lookup_node_limit: int,
                 restore_cell: Callable[[], Awaitable[None]] | None = None,
                 on_unavailable: Callable[[], None] = lambda: None) -> None:
        self.sched = sched
        self.metrics = metrics
        self.strategy = strategy
        self.capacity = artifact_store_capacity
        self.lookup_limit = artifact_lookup_node_limit
        self.peers = PeerOps(sched.keys, lambda: sched.ops.bounds)
        self.cpu = CpuConfigOps(sched.keys)
        self.restore_cell = restore_cell
        #: told of every call that found Redis unable to serve (health re-checks at once)
        self.on_unavailable = on_unavailable

    # -- plumbing ----------------------------------------------------------
    async def run(self, call: Call[T]) -> T:
        """One script call, bounded by the caller's deadline."""
        return await self._guarded(call.script,
                                   lambda: self.sched.run(call, _remaining(_RPC.get())))

    async def _guarded(self, script: str, send: Callable[[], Awaitable[T]]) -> T:
        """Send one script call, timed; a cell whose policy vanished (Redis lost
        its data) is restored from this replica's config and the call sent again."""
        for attempt in (1, 2):
            start = time.perf_counter()
            try:
                return await send()
            except StoreUnavailable:
                self.metrics.redis_errors.inc()
                self.on_unavailable()
                raise
            except FailedPrecondition as e:
                if attempt == 2 or self.restore_cell is None or \
                        not e.message.startswith(NO_POLICY_PREFIX):
                    raise
                log.warning("the cell's policy is gone from Redis (data lost?); restoring it")
                await self.restore_cell()
            finally:
                self.metrics.script_duration.labels(script).observe(time.perf_counter() - start)
        raise AssertionError("unreachable")

    async def _serve(self, rpc: str, context: grpc.aio.ServicerContext[Any, Any],
                     work: Callable[[], Awaitable[T]]) -> T:
        start = time.perf_counter()
        token = _RPC.set(context)
        code: grpc.StatusCode | None = None
        message = ""
        try:
            result = await work()
        except SchedulerError as e:
            code, message = status_of(e), e.message
            if code is grpc.StatusCode.INTERNAL:
                log.error("%s failed: %s", rpc, message)
        except Exception:
            code, message = grpc.StatusCode.INTERNAL, f"{rpc} failed; see the replica's log"
            log.exception("%s failed", rpc)
        finally:
            _RPC.reset(token)
        if code is None:
            self._observe(rpc, grpc.StatusCode.OK, start)
            return result
        # recorded before abort() sends the status, so a caller never sees it first
        self._observe(rpc, code, start)
        await context.abort(code, message)
        raise AssertionError("unreachable")  # abort() always raises

    def _observe(self, rpc: str, code: grpc.StatusCode, start: float) -> None:
        self.metrics.rpc_duration.labels(rpc, code.name).observe(time.perf_counter() - start)

    # -- placement ---------------------------------------------------------
    async def Schedule(self, request: pb.ScheduleRequest,
                       context: grpc.aio.ServicerContext[Any, Any]) -> pb.ScheduleResponse:
        async def work() -> pb.ScheduleResponse:
            req = request_of(request)
            start = time.perf_counter()
            code = "OK"
            try:
                placed = await self._place(req, context)
            except SchedulerError as e:
                code = status_of(e).name
                raise
            finally:
                self.metrics.schedule_duration.labels(self.strategy, code).observe(
                    time.perf_counter() - start)
            self.metrics.assignments.labels(self.strategy).inc()
            if placed.reservation_id:
                context.set_trailing_metadata(((RESERVATION_METADATA, placed.reservation_id),))
            return pb.ScheduleResponse(node=pb.Node(node_id=placed.node_id,
                                                    endpoint=placed.endpoint))

        return await self._serve("Schedule", context, work)

    async def _place(self, req: Request, context: grpc.aio.ServicerContext[Any, Any],
                     ) -> Placement:
        """Schedule within the caller's deadline.  A caller that is gone by the
        time its reservation exists gets it cancelled (by the library when the
        call is cut short, here when the answer can no longer be delivered)."""
        placed = await self._guarded("schedule", lambda: self.sched.schedule(
            req, timeout=_remaining(context)))
        rid = placed.reservation_id
        if rid:
            if context.cancelled() or context.done():
                self.sched.forget(rid)
                raise StoreUnavailable("the caller gave up before its placement was answered; "
                                       "its reservation is cancelled")
            # the answer may still not reach a caller that gives up now
            def undelivered(ctx: grpc.aio.ServicerContext[Any, Any]) -> None:
                if ctx.cancelled():
                    self.sched.forget(rid)

            context.add_done_callback(undelivered)
        return placed

    async def RecordAssignment(self, request: pb.RecordAssignmentRequest,
                               context: grpc.aio.ServicerContext[Any, Any],
                               ) -> pb.RecordAssignmentResponse:
        async def work() -> pb.RecordAssignmentResponse:
            rid = _metadata(context, RESERVATION_METADATA).strip() or None
            await self.run(self.sched.ops.assign(request.sandbox_id, request.node.node_id,
                                                 request.node.endpoint, rid))
            return pb.RecordAssignmentResponse()

        return await self._serve("RecordAssignment", context, work)

    async def LookupNode(self, request: pb.LookupNodeRequest,
                         context: grpc.aio.ServicerContext[Any, Any]) -> pb.LookupNodeResponse:
        async def work() -> pb.LookupNodeResponse:
            b = await self.run(self.sched.ops.lookup(request.sandbox_id))
            return pb.LookupNodeResponse(node=pb.Node(node_id=b.node_id, endpoint=b.endpoint))

        return await self._serve("LookupNode", context, work)

    # -- nodes -------------------------------------------------------------
    async def Heartbeat(self, request: pb.HeartbeatRequest,
                        context: grpc.aio.ServicerContext[Any, Any]) -> pb.HeartbeatResponse:
        async def work() -> pb.HeartbeatResponse:
            hb = heartbeat_of(request, _metadata(context, ENDPOINT_METADATA))
            try:
                result = await self.run(self.sched.ops.heartbeat(hb, self.sched.beats))
            except Resync:  # another writer came between: this one goes in full
                result = await self.run(self.sched.ops.heartbeat(hb, self.sched.beats))
            cluster = hb.cluster_id.strip()
            node_id = hb.node_id.strip()
            config = await exchange(self.run, self.cpu, node_id, cluster,
                                    hb.machine_info.cpu_config_json, result.restarted)
            return pb.HeartbeatResponse(cpu_config_json=config)

        return await self._serve("Heartbeat", context, work)

    async def ReportSandboxEvent(self, request: pb.ReportSandboxEventRequest,
                                 context: grpc.aio.ServicerContext[Any, Any],
                                 ) -> pb.ReportSandboxEventResponse:
        async def work() -> pb.ReportSandboxEventResponse:
            await self.run(self.sched.ops.events(request.node_id, events_of(request)))
            return pb.ReportSandboxEventResponse()

        return await self._serve("ReportSandboxEvent", context, work)

    def _observed(self, node_id: str, cluster_id: str, with_unseen: bool,
                  ) -> Call[list[dict[str, str]]]:
        return observed_call(self.sched, node_id, cluster_id, with_unseen, full=True)

    async def ListNodes(self, request: pb.ListNodesRequest,
                        context: grpc.aio.ServicerContext[Any, Any]) -> pb.ListNodesResponse:
        async def work() -> pb.ListNodesResponse:
            rows = await self.run(observed_call(self.sched, "", "", True, full=False))
            return pb.ListNodesResponse(nodes=[
                pb.Node(node_id=f.get("node_id", ""), endpoint=f.get("endpoint", ""))
                for f in rows])

        return await self._serve("ListNodes", context, work)

    async def ListObservedNodes(self, request: pb.ListObservedNodesRequest,
                                context: grpc.aio.ServicerContext[Any, Any],
                                ) -> pb.ListObservedNodesResponse:
        async def work() -> pb.ListObservedNodesResponse:
            cluster = validate_id("cluster_id", request.cluster_id) \
                if request.cluster_id.strip() else ""
            rows = await self.run(self._observed("", cluster, False))
            return pb.ListObservedNodesResponse(nodes=[observed_node(f) for f in rows])

        return await self._serve("ListObservedNodes", context, work)

    async def GetNode(self, request: pb.GetNodeRequest,
                      context: grpc.aio.ServicerContext[Any, Any]) -> pb.GetNodeResponse:
        async def work() -> pb.GetNodeResponse:
            node_id = validate_id("node_id", request.node_id)
            cluster = validate_id("cluster_id", request.cluster_id) \
                if request.cluster_id.strip() else ""
            rows = await self.run(self._observed(node_id, cluster, False))
            if not rows:
                raise NotFound("observed node not found")
            return pb.GetNodeResponse(node=observed_node(rows[0]))

        return await self._serve("GetNode", context, work)

    async def UnregisterNode(self, request: pb.UnregisterNodeRequest,
                             context: grpc.aio.ServicerContext[Any, Any],
                             ) -> pb.UnregisterNodeResponse:
        async def work() -> pb.UnregisterNodeResponse:
            await self.run(self.sched.ops.unregister(request.node_id,
                                                     request.service_instance_id))
            return pb.UnregisterNodeResponse()

        return await self._serve("UnregisterNode", context, work)

    # -- P2P ---------------------------------------------------------------
    async def ListP2pPeers(self, request: pb.ListP2pPeersRequest,
                           context: grpc.aio.ServicerContext[Any, Any],
                           ) -> pb.ListP2pPeersResponse:
        async def work() -> pb.ListP2pPeersResponse:
            peers = await self.run(self.peers.peers(request.cluster_id, request.backend,
                                                    request.exclude_node_id))
            return pb.ListP2pPeersResponse(peers=_peers(peers))

        return await self._serve("ListP2pPeers", context, work)

    async def RecordP2pArtifact(self, request: pb.RecordP2pArtifactRequest,
                                context: grpc.aio.ServicerContext[Any, Any],
                                ) -> pb.RecordP2pArtifactResponse:
        async def work() -> pb.RecordP2pArtifactResponse:
            await self.run(self.peers.record(request.cluster_id, request.backend, request.key,
                                             request.node_id, self.capacity))
            return pb.RecordP2pArtifactResponse()

        return await self._serve("RecordP2pArtifact", context, work)

    async def ForgetP2pArtifact(self, request: pb.ForgetP2pArtifactRequest,
                                context: grpc.aio.ServicerContext[Any, Any],
                                ) -> pb.ForgetP2pArtifactResponse:
        async def work() -> pb.ForgetP2pArtifactResponse:
            await self.run(self.peers.forget(request.cluster_id, request.backend, request.key,
                                             request.node_id))
            return pb.ForgetP2pArtifactResponse()

        return await self._serve("ForgetP2pArtifact", context, work)

    async def LookupP2pArtifact(self, request: pb.LookupP2pArtifactRequest,
                                context: grpc.aio.ServicerContext[Any, Any],
                                ) -> pb.LookupP2pArtifactResponse:
        async def work() -> pb.LookupP2pArtifactResponse:
            peers = await self.run(self.peers.lookup(
                request.cluster_id, request.backend, request.key, request.exclude_node_id,
                self.lookup_limit))
            return pb.LookupP2pArtifactResponse(peers=_peers(peers))

        return await self._serve("LookupP2pArtifact", context, work)


def _peers(peers: Sequence[Peer]) -> list[pb.P2pPeer]:
    return [_peer(p) for p in peers]
