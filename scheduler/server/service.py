"""The gRPC servicer of ``scheduler.v1.Scheduler``: an adapter over the library.

Every RPC converts its request to records (bad input -> ``InvalidArgument``
naming the field, before anything reaches Redis), calls one operation of
:class:`~scheduler.client.aio.AsyncScheduler`, and converts the answer back;
the library holds the behaviour (RESYNC retry, CPU-config exchange, a lost
cell restored, a placement cancelled when its caller is gone).  The servicer
adds what only the transport knows: the caller's deadline bounds every Redis
call of the RPC, metrics, metadata extensions, and error -> status code
(:data:`STATUS`, docs/contract.md's table).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar, cast
from urllib.parse import unquote

import grpc

from scheduler.client.aio import AsyncScheduler
from scheduler.domain.catalog import EVENT_TYPES, NODE_STATUSES, Status
from scheduler.domain.errors import (
    FailedPrecondition,
    IndexBehind,
    InvalidArgument,
    NoNodesAvailable,
    NotFound,
    SchedulerError,
    StoreUnavailable,
    UnknownNode,
)
from scheduler.domain.limits import (
    MAX_DISKS,
    MAX_EVENTS,
    MAX_IMAGES,
    MAX_METADATA,
    MAX_METADATA_BYTES,
    at_most,
    text,
)
from scheduler.domain.limits import endpoint as valid_endpoint
from scheduler.domain.records import (
    MAX_BYTES,
    MAX_CPU,
    MAX_LOCALITY_REQUIREMENTS,
    MIB,
    TOO_MANY_LOCALITY,
    DiskMetric,
    Heartbeat,
    LocalityRequirement,
    MachineInfo,
    NodeSnapshot,
    ObservedNode,
    Placement,
    Request,
    SandboxEvent,
    snapshot_numbers,
)
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.server import logs
from scheduler.server.frames import OMITTED_METADATA, STRIPPED_METADATA, fit_observed
from scheduler.server.metrics import Metrics, refusal_reasons, status_label
from scheduler.server.peers import PeerLists, protos

log = logging.getLogger("scheduler.server.service")
decisions = logging.getLogger(logs.DECISIONS)
T = TypeVar("T")

#: Schedule answers kept, one per node (then the cache starts over)
ANSWERS_KEPT = 100_000

RESERVATION_METADATA = "x-reservation-id"
ENDPOINT_METADATA = "x-node-endpoint"

STATUS: dict[type[SchedulerError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownNode: grpc.StatusCode.INVALID_ARGUMENT,
    NoNodesAvailable: grpc.StatusCode.UNAVAILABLE,
    IndexBehind: grpc.StatusCode.UNAVAILABLE,
    StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    NotFound: grpc.StatusCode.NOT_FOUND,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
}

#: wire enum value <-> name, for every name of the catalog (NODE_STATUS_<name>)
NODE_STATUS_NAMES: dict[pb.NodeStatus, str] = {
    cast(pb.NodeStatus, pb.NodeStatus.Value(f"NODE_STATUS_{name}")): name for name in NODE_STATUSES
}
NODE_STATUS_VALUES = {name: value for value, name in NODE_STATUS_NAMES.items()}
EVENT_NAMES: dict[int, str] = {
    pb.SandboxEventType.Value(f"SANDBOX_EVENT_TYPE_{name}"): name for name in EVENT_TYPES
}


def status_of(e: SchedulerError) -> grpc.StatusCode:
    for cls in type(e).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return grpc.StatusCode.INTERNAL


def peer_endpoint(peer: str, scheme: str, port: int) -> str:
    """``scheme://<host>:port`` for a gRPC peer ("ipv4:10.0.0.7:53122",
    "ipv6:[fd00::7]:53122", brackets maybe %-encoded); "" for any other peer."""
    kind, _, rest = unquote(peer).partition(":")
    host = rest.rpartition(":")[0].strip("[]")
    if kind not in ("ipv4", "ipv6") or not host:
        return ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return ""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    shown = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"{scheme}://{shown}:{port}"


def _metadata(context: grpc.aio.ServicerContext[Any, Any], name: str) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return value if isinstance(value, str) else value.decode()
    return ""


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
    disks = [
        DiskMetric(
            mount_point=text(f"snapshot.disks[{i}].mount_point", d.mount_point),
            device=text(f"snapshot.disks[{i}].device", d.device),
            filesystem_type=text(f"snapshot.disks[{i}].filesystem_type", d.filesystem_type),
            used_bytes=d.used_bytes,
            total_bytes=d.total_bytes,
        )
        for i, d in enumerate(snap.disks)
    ]
    mi = req.machine_info
    return Heartbeat(
        node_id=req.node_id,
        service_instance_id=req.service_instance_id,
        cluster_id=req.cluster_id,
        version=req.version,
        commit=req.commit,
        machine_info=MachineInfo(
            cpu_family=mi.cpu_family,
            cpu_model=mi.cpu_model,
            cpu_model_name=mi.cpu_model_name,
            cpu_architecture=mi.cpu_architecture,
            cpu_config_json=mi.cpu_config_json,
        ),
        snapshot=NodeSnapshot(
            status=cast(Status, status),
            disks=disks,
            **{name: getattr(snap, name) for name in snapshot_numbers()},
            accepting_sandboxes=(
                snap.accepting_sandboxes if snap.HasField("accepting_sandboxes") else None
            ),
            admission_reason=admission_name(snap.admission_reason),
        ),
        sandbox_ids=list(req.sandbox_ids),
        p2p_backend=req.p2p_endpoint.backend,
        p2p_address=req.p2p_endpoint.address,
        endpoint=endpoint,
    )


def request_of(req: pb.ScheduleRequest) -> Request:
    """Hints map to creation requests: cold = cpu/memory, template = policy
    default size, none = routing (nothing reserved)."""
    kind = req.hint.WhichOneof("kind") if req.HasField("hint") else None
    if kind == "new_cold_sandbox":
        cold = req.hint.new_cold_sandbox
        if cold.images:
            at_most("hint.new_cold_sandbox.images", cold.images, MAX_IMAGES)
        if cold.metadata:
            _metadata_map("hint.new_cold_sandbox.metadata", cold.metadata)
        if cold.cpu_count > MAX_CPU:
            raise InvalidArgument("hint.new_cold_sandbox.cpu_count", f"must be at most {MAX_CPU}")
        if cold.memory_mb * MIB > MAX_BYTES:
            raise InvalidArgument(
                "hint.new_cold_sandbox.memory_mb", f"must be at most {MAX_BYTES // MIB}"
            )
        return Request.cold(
            cold.cpu_count, cold.memory_mb, tuple(cold.images), _locality_of(req.hint)
        )
    if kind == "new_sandbox":
        _metadata_map("hint.new_sandbox.metadata", req.hint.new_sandbox.metadata)
        return Request.template(
            text("hint.new_sandbox.template_id", req.hint.new_sandbox.template_id),
            _locality_of(req.hint),
        )
    return Request.route()


def _locality_of(hint: pb.ScheduleRequestHint) -> tuple[LocalityRequirement, ...]:
    """hint.locality_requirements, bounded as upstream bounds them."""
    if len(hint.locality_requirements) > MAX_LOCALITY_REQUIREMENTS:
        raise InvalidArgument("", TOO_MANY_LOCALITY)
    return tuple(
        LocalityRequirement(key=r.key, size_bytes=r.size_bytes) for r in hint.locality_requirements
    )


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
            raise InvalidArgument(
                f"events[{i}].event_type", f"is not an event type: {ev.event_type}"
            )
        out.append(
            SandboxEvent(
                sandbox_id=ev.sandbox_id,
                event_type=name,  # type: ignore[arg-type]
                requested_cpu=ev.requested_cpu,
                requested_memory_bytes=ev.requested_memory_bytes,
                requested_disk_bytes=ev.requested_disk_bytes,
            )
        )
    return out


# ---------------------------------------------------------------------------
# records -> proto
# ---------------------------------------------------------------------------
def admission_name(value: int) -> str:
    """AdmissionReason's name without its prefix; a number the wire does not
    know is an error naming the field."""
    try:
        name = pb.AdmissionReason.Name(value)
    except ValueError:
        raise InvalidArgument(
            "snapshot.admission_reason", f"is not an admission reason: {value}"
        ) from None
    return str(name).removeprefix("ADMISSION_REASON_")


def snapshot_proto(snap: NodeSnapshot) -> pb.NodeSnapshot:
    msg = pb.NodeSnapshot(
        admission_reason=pb.AdmissionReason.Value("ADMISSION_REASON_" + snap.admission_reason),
        status=NODE_STATUS_VALUES.get(snap.status, pb.NODE_STATUS_UNSPECIFIED),
        disks=[
            pb.DiskMetric(
                mount_point=d.mount_point,
                device=d.device,
                filesystem_type=d.filesystem_type,
                used_bytes=d.used_bytes,
                total_bytes=d.total_bytes,
            )
            for d in snap.disks
        ],
        **{name: getattr(snap, name) for name in snapshot_numbers()},
    )
    if snap.accepting_sandboxes is not None:  # (optional on the wire: absent = accepting)
        msg.accepting_sandboxes = snap.accepting_sandboxes
    return msg


def machine_proto(mi: MachineInfo) -> pb.MachineInfo:
    return pb.MachineInfo(**{name: getattr(mi, name) for name in MachineInfo.__struct_fields__})


def observed_proto(n: ObservedNode) -> pb.ObservedNode:
    return pb.ObservedNode(
        node_id=n.node_id,
        endpoint=n.endpoint,
        cluster_id=n.cluster_id,
        service_instance_id=n.service_instance_id,
        version=n.version,
        commit=n.commit,
        machine_info=machine_proto(n.machine_info),
        snapshot=snapshot_proto(n.snapshot),
        last_seen_unix_ms=n.last_seen_unix_ms,
    )


def heartbeat_request(hb: Heartbeat) -> pb.HeartbeatRequest:
    """The request a runtime node sends for ``hb`` (its endpoint goes as
    ``x-node-endpoint`` metadata): what simulated nodes send over gRPC."""
    return pb.HeartbeatRequest(
        node_id=hb.node_id,
        cluster_id=hb.cluster_id,
        service_instance_id=hb.service_instance_id,
        version=hb.version,
        commit=hb.commit,
        machine_info=machine_proto(hb.machine_info),
        snapshot=snapshot_proto(hb.snapshot),
        sandbox_ids=hb.sandbox_ids,
        p2p_endpoint=pb.P2pEndpoint(backend=hb.p2p_backend, address=hb.p2p_address),
    )


class CallerGone(StoreUnavailable):
    """The caller gave up before its placement was answered (not a Redis failure)."""


def _request_fields(req: Request) -> dict[str, Any]:
    """A Schedule request as the decision log records it (None: the policy's default)."""
    return {"create": req.create, "cpu": req.cpu, "memory_bytes": req.memory_bytes}


def _described(req: Request) -> str:
    if not req.create:
        return "a non-creating call"
    cpu = "default" if req.cpu is None else str(req.cpu)
    mem = "default" if req.memory_bytes is None else f"{req.memory_bytes // (1 << 20)}MiB"
    return f"a creation (cpu {cpu}, memory {mem})"


# ---------------------------------------------------------------------------
# The servicer
# ---------------------------------------------------------------------------
class SchedulerService(pb_grpc.SchedulerServicer):  # type: ignore[misc]
    def __init__(
        self,
        sched: AsyncScheduler,
        metrics: Metrics,
        *,
        strategy: str,
        artifact_store_capacity: int,
        artifact_lookup_node_limit: int,
        on_unavailable: Callable[[], None] = lambda: None,
        heartbeat_endpoint: tuple[str, int] | None = None,
        decision_log: bool = False,
    ) -> None:
        self.sched = sched
        #: ListP2pPeers' lists, read at most once a second per cluster and backend
        self.peer_lists = PeerLists(sched, observe=self._metered)
        #: (scheme, port): a heartbeat without x-node-endpoint gets scheme://peer:port
        self.heartbeat_endpoint = heartbeat_endpoint
        self.metrics = metrics
        self.strategy = strategy
        self.capacity = artifact_store_capacity
        self.lookup_limit = artifact_lookup_node_limit
        #: told of every call that found Redis unable to serve (health re-checks at once)
        self.on_unavailable = on_unavailable
        self._answers: dict[tuple[str, str], pb.ScheduleResponse] = {}
        self._rpc_series: dict[tuple[str, str], Any] = {}
        self._script_series: dict[str, Any] = {}
        self._schedule_ok = metrics.schedule_duration.labels(strategy, "ok")
        self._assigned = metrics.assignments.labels(strategy)
        self._schedule_rpc_ok = self._rpc_seconds("Schedule", "ok")
        self._placed = metrics.placements
        self._redis_refusals = metrics.refusals.labels("redis")
        self._behind_refusals = metrics.refusals.labels("index behind")
        #: one line per Schedule on the logger scheduler.decisions
        self.decision_log = decision_log

    # -- plumbing ----------------------------------------------------------
    def _metered(self, script: str, seconds: float, error: BaseException | None) -> None:
        """Each Redis call an RPC makes (the library reports them)."""
        self._script_seconds(script).observe(seconds)
        if isinstance(error, StoreUnavailable):
            self.metrics.redis_errors.inc()
            self.on_unavailable()

    async def _serve(
        self,
        rpc: str,
        context: grpc.aio.ServicerContext[Any, Any],
        work: Callable[[], Awaitable[T]],
    ) -> T:
        start = time.perf_counter()
        logs.call(rpc)
        try:
            with self.sched.scoped(timeout=context.time_remaining(), observe=self._metered):
                result = await work()
        except Exception as e:
            await self._fail(rpc, context, start, e)
        self._rpc_seconds(rpc, "ok").observe(time.perf_counter() - start)
        return result

    async def _fail(
        self, rpc: str, context: grpc.aio.ServicerContext[Any, Any], start: float, e: Exception
    ) -> NoReturn:
        """Answer the call with ``e``'s status code (INTERNAL, logged, for what
        is not a SchedulerError)."""
        if isinstance(e, SchedulerError):
            code, message = status_of(e), e.message
            if code is grpc.StatusCode.INTERNAL:
                log.error("%s failed: %s", rpc, message)
        else:
            code, message = grpc.StatusCode.INTERNAL, f"{rpc} failed; see the replica's log"
            log.error("%s failed", rpc, exc_info=e)
        # recorded before abort() sends the status, so a caller never sees it first
        self._rpc_seconds(rpc, status_label(code)).observe(time.perf_counter() - start)
        await context.abort(code, message)
        raise AssertionError("unreachable")  # abort() always raises

    # The metric series every call observes, each looked up once (a label
    # lookup costs about as much as the observation itself).
    def _rpc_seconds(self, rpc: str, code: str) -> Any:
        series = self._rpc_series.get((rpc, code))
        if series is None:
            series = self._rpc_series[rpc, code] = self.metrics.rpc_duration.labels(rpc, code)
        return series

    def _script_seconds(self, script: str) -> Any:
        series = self._script_series.get(script)
        if series is None:
            series = self._script_series[script] = self.metrics.script_duration.labels(script)
        return series

    # -- placement ---------------------------------------------------------
    async def Schedule(
        self, request: pb.ScheduleRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ScheduleResponse:
        # _serve written out: this is the call a replica answers most
        start = time.perf_counter()
        logs.call("Schedule")
        try:
            with self.sched.scoped(timeout=context.time_remaining(), observe=self._metered):
                req = request_of(request)
                placing = time.perf_counter()
                try:
                    placed = await self._place(req, context)
                except SchedulerError as e:
                    self.metrics.schedule_duration.labels(
                        self.strategy, status_label(status_of(e))
                    ).observe(time.perf_counter() - placing)
                    self._refused(req, e)
                    raise
        except Exception as e:
            await self._fail("Schedule", context, start, e)
        done = time.perf_counter()
        self._schedule_ok.observe(done - placing)
        self._assigned.inc()
        self._placed.inc()
        if placed.warmth:
            self.metrics.warmth.labels(placed.warmth).inc()
            self.metrics.pull_bytes.inc(placed.pull_bytes)
        logs.bind(node=placed.node_id, reservation=placed.reservation_id)
        if placed.reservation_id:
            context.set_trailing_metadata(((RESERVATION_METADATA, placed.reservation_id),))
        if self.decision_log:
            self._log_placed(req, placed)
        self._schedule_rpc_ok.observe(done - start)
        return self._answer(placed.node_id, placed.endpoint)

    def _refused(self, req: Request, e: SchedulerError) -> None:
        """Count a refused Schedule by reason (and log it, with the decision log)."""
        if isinstance(e, NoNodesAvailable):
            self.metrics.refused(e.message)
            if self.decision_log:
                reasons = refusal_reasons(e.message)
                decisions.info(
                    "refused %s: %s",
                    _described(req),
                    e.message,
                    extra={
                        "decision": "refused",
                        "strategy": self.strategy,
                        "request": _request_fields(req),
                        "reasons": reasons,
                    },
                )
        elif isinstance(e, IndexBehind | StoreUnavailable) and not isinstance(e, CallerGone):
            if isinstance(e, IndexBehind):
                self._behind_refusals.inc()
            else:
                self._redis_refusals.inc()
            if self.decision_log:
                decisions.info(
                    "failed %s: %s",
                    _described(req),
                    e.message,
                    extra={
                        "decision": "failed",
                        "strategy": self.strategy,
                        "request": _request_fields(req),
                    },
                )

    def _log_placed(self, req: Request, placed: Placement) -> None:
        """The decision log's line of a placement: what was asked, where it
        went and how loaded that node was.  (The Schedule script answers the
        chosen node only, not the runner-up: ``schedctl explain`` ranks them.)"""
        decisions.info(
            "placed %s on %s (pressure %.3f, %s)",
            _described(req),
            placed.node_id,
            placed.pressure,
            placed.status,
            extra={
                "decision": "placed",
                "strategy": self.strategy,
                "request": _request_fields(req),
                "endpoint": placed.endpoint,
                "pressure": placed.pressure,
                "node_status": placed.status,
                "reserved_cpu": placed.cpu,
                "reserved_memory_bytes": placed.memory_bytes,
            },
        )

    def _answer(self, node_id: str, endpoint: str) -> pb.ScheduleResponse:
        """The ScheduleResponse naming this node, built once per node: a
        message gRPC only serializes, never changes, so calls may share it."""
        key = (node_id, endpoint)
        answer = self._answers.get(key)
        if answer is None:
            if len(self._answers) >= ANSWERS_KEPT:
                self._answers.clear()  # nodes came and went: start over
            answer = self._answers[key] = pb.ScheduleResponse(
                node=pb.Node(node_id=node_id, endpoint=endpoint)
            )
        return answer

    async def _place(
        self,
        req: Request,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> Placement:
        """Schedule within the caller's deadline.  A caller that is gone by the
        time its reservation exists gets it cancelled (by the library when the
        call is cut short, here when the answer can no longer be delivered)."""
        placed = await self.sched.schedule(req)
        rid = placed.reservation_id
        if rid:
            # (a deadline already passed: the answer cannot reach the caller in
            # time, and the gateway never learns the id; None: no deadline)
            left = context.time_remaining()
            if context.cancelled() or context.done() or (left is not None and left <= 0):
                self.sched.abandon(rid)
                raise CallerGone(
                    "the caller gave up (or its deadline passed) before its placement "
                    "was answered; its reservation is cancelled"
                )

            # the answer may still not reach a caller that gives up now
            def undelivered(ctx: grpc.aio.ServicerContext[Any, Any]) -> None:
                if ctx.cancelled():
                    self.sched.abandon(rid)

            context.add_done_callback(undelivered)
        return placed

    async def RecordAssignment(
        self,
        request: pb.RecordAssignmentRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.RecordAssignmentResponse:
        async def work() -> pb.RecordAssignmentResponse:
            rid = _metadata(context, RESERVATION_METADATA).strip() or None
            logs.bind(node=request.node.node_id, reservation=rid)
            try:
                await self.sched.assign(
                    request.sandbox_id, request.node.node_id, request.node.endpoint, rid
                )
            except StoreUnavailable:
                # (the gateway sends it once, after the create: written once
                # Redis answers, still answered UNAVAILABLE now)
                self.sched.owe_assignment(
                    request.sandbox_id, request.node.node_id, request.node.endpoint, rid
                )
                raise
            return pb.RecordAssignmentResponse()

        return await self._serve("RecordAssignment", context, work)

    async def LookupNode(
        self, request: pb.LookupNodeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.LookupNodeResponse:
        async def work() -> pb.LookupNodeResponse:
            b = await self.sched.lookup(request.sandbox_id)
            return pb.LookupNodeResponse(node=pb.Node(node_id=b.node_id, endpoint=b.endpoint))

        return await self._serve("LookupNode", context, work)

    # -- nodes -------------------------------------------------------------
    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.HeartbeatResponse:
        async def work() -> pb.HeartbeatResponse:
            logs.bind(node=request.node_id)
            endpoint = _metadata(context, ENDPOINT_METADATA)
            if not endpoint and self.heartbeat_endpoint is not None:
                endpoint = peer_endpoint(context.peer(), *self.heartbeat_endpoint)
            hb = heartbeat_of(request, endpoint)
            result = await self.sched.heartbeat(hb, cpu_config=True)
            return pb.HeartbeatResponse(cpu_config_json=result.cpu_config_json)

        return await self._serve("Heartbeat", context, work)

    async def ReportSandboxEvent(
        self,
        request: pb.ReportSandboxEventRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.ReportSandboxEventResponse:
        async def work() -> pb.ReportSandboxEventResponse:
            logs.bind(node=request.node_id)
            await self.sched.events(
                request.node_id, events_of(request), request.service_instance_id
            )
            return pb.ReportSandboxEventResponse()

        return await self._serve("ReportSandboxEvent", context, work)

    async def ListNodes(
        self, request: pb.ListNodesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListNodesResponse:
        async def work() -> pb.ListNodesResponse:
            listed = await self.sched.list_nodes()
            return pb.ListNodesResponse(
                nodes=[pb.Node(node_id=n.node_id, endpoint=n.endpoint) for n in listed]
            )

        return await self._serve("ListNodes", context, work)

    async def ListObservedNodes(
        self,
        request: pb.ListObservedNodesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.ListObservedNodesResponse:
        async def work() -> pb.ListObservedNodesResponse:
            found = [observed_proto(n) for n in await self.sched.observed_nodes(request.cluster_id)]
            # (within a default client's 4 MiB: large fields first, scheduler/server/frames.py)
            stripped, omitted = fit_observed(found)
            if stripped or omitted:
                context.set_trailing_metadata(
                    ((STRIPPED_METADATA, str(stripped)), (OMITTED_METADATA, str(omitted)))
                )
            return pb.ListObservedNodesResponse(nodes=found)

        return await self._serve("ListObservedNodes", context, work)

    async def GetNode(
        self, request: pb.GetNodeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetNodeResponse:
        async def work() -> pb.GetNodeResponse:
            logs.bind(node=request.node_id)
            node = await self.sched.observed_node(request.node_id, request.cluster_id)
            return pb.GetNodeResponse(node=observed_proto(node))

        return await self._serve("GetNode", context, work)

    async def UnregisterNode(
        self,
        request: pb.UnregisterNodeRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.UnregisterNodeResponse:
        async def work() -> pb.UnregisterNodeResponse:
            logs.bind(node=request.node_id)
            await self.sched.unregister(request.node_id, request.service_instance_id)
            return pb.UnregisterNodeResponse()

        return await self._serve("UnregisterNode", context, work)

    # -- P2P ---------------------------------------------------------------
    async def ListP2pPeers(
        self,
        request: pb.ListP2pPeersRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> bytes:
        async def work() -> bytes:
            # (serialized once a list, each answer joined from its peers' parts)
            return await self.peer_lists.answer(
                request.cluster_id, request.backend, request.exclude_node_id
            )

        return await self._serve("ListP2pPeers", context, work)

    async def RecordP2pArtifact(
        self,
        request: pb.RecordP2pArtifactRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.RecordP2pArtifactResponse:
        async def work() -> pb.RecordP2pArtifactResponse:
            await self.sched.record_artifact(
                request.cluster_id, request.backend, request.key, request.node_id, self.capacity
            )
            return pb.RecordP2pArtifactResponse()

        return await self._serve("RecordP2pArtifact", context, work)

    async def ForgetP2pArtifact(
        self,
        request: pb.ForgetP2pArtifactRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.ForgetP2pArtifactResponse:
        async def work() -> pb.ForgetP2pArtifactResponse:
            await self.sched.forget_artifact(
                request.cluster_id, request.backend, request.key, request.node_id
            )
            return pb.ForgetP2pArtifactResponse()

        return await self._serve("ForgetP2pArtifact", context, work)

    async def LookupP2pArtifact(
        self,
        request: pb.LookupP2pArtifactRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.LookupP2pArtifactResponse:
        async def work() -> pb.LookupP2pArtifactResponse:
            peers = await self.sched.lookup_artifact(
                request.cluster_id,
                request.backend,
                request.key,
                request.exclude_node_id,
                self.lookup_limit,
            )
            return pb.LookupP2pArtifactResponse(peers=protos(peers))

        return await self._serve("LookupP2pArtifact", context, work)
