"""scheduler.v1.Scheduler over gRPC, in-process, on real Redis and fakeredis:
every RPC, the contract's error codes and exact strings, and bad input that
writes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scheduler import DefaultRequest, Limits, Policy, Scheduler
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.testing.replicas import ThreadedReplica
from tests.helpers import cold, endpoint_md, hb, hb_request, snapshot_keys

MIB = 1024 * 1024
Make = Callable[..., ThreadedReplica]


@pytest.fixture
def sched(redis_client: Any) -> Scheduler:
    """A plain client of the same cell, to look at (or poke) the shared state."""
    return Scheduler(redis_client, cell="test")


def code_of(fn: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


def register(r: ThreadedReplica, *ids: str, **kw: Any) -> None:
    for node_id in ids:
        r.stub.Heartbeat(hb_request(node_id, **kw), metadata=endpoint_md(f"{node_id}:5000"))


# ---------------------------------------------------------------------------
# Schedule / RecordAssignment / LookupNode
# ---------------------------------------------------------------------------
def test_cold_create_reserves_and_returns_reservation_id(
    make_replica: Make, sched: Scheduler
) -> None:
    r = make_replica()
    register(r, "n1", "n2")
    resp, call = r.stub.Schedule.with_call(cold(2, 4096))
    rid = dict(call.trailing_metadata())["x-reservation-id"]
    assert resp.node.node_id in ("n1", "n2")
    assert resp.node.endpoint == f"{resp.node.node_id}:5000"
    res = sched.reservation(rid)
    assert (res.node_id, res.state, res.cpu, res.memory_bytes) == (
        resp.node.node_id,
        "pending",
        2,
        4096 * MIB,
    )

    r.stub.RecordAssignment(
        pb.RecordAssignmentRequest(sandbox_id="sb-1", node=resp.node),
        metadata=(("x-reservation-id", rid),),
    )
    res = sched.reservation(rid)
    assert (res.state, res.sandbox_id) == ("assigned", "sb-1")
    looked = r.stub.LookupNode(pb.LookupNodeRequest(sandbox_id="sb-1"))
    assert looked.node == resp.node


def test_template_hint_uses_default_request_and_no_hint_reserves_nothing(
    make_replica: Make, sched: Scheduler
) -> None:
    r = make_replica(Policy(default_request=DefaultRequest(cpu=1, memory_mb=512)))
    register(r, "n1")
    _, call = r.stub.Schedule.with_call(
        pb.ScheduleRequest(hint=pb.ScheduleRequestHint(new_sandbox=pb.NewSandboxHint()))
    )
    rid = dict(call.trailing_metadata())["x-reservation-id"]
    res = sched.reservation(rid)
    assert (res.cpu, res.memory_bytes) == (1, 512 * MIB)

    resp, call = r.stub.Schedule.with_call(pb.ScheduleRequest())
    assert resp.node.node_id == "n1"
    assert "x-reservation-id" not in dict(call.trailing_metadata())
    assert sched.stats().pending == 1


def test_no_nodes_available_is_unavailable_with_counted_reasons(make_replica: Make) -> None:
    r = make_replica(Policy(limits=Limits(max_sandbox_count=1)))
    register(r, "n1", "n2")
    placed = {r.stub.Schedule(cold()).node.node_id for _ in range(2)}
    assert placed == {"n1", "n2"}
    code, details = code_of(lambda: r.stub.Schedule(cold()))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert details == "no nodes available: 0/2 nodes available: 2 at max_sandbox_count (1)"


def test_record_assignment_and_lookup_errors(make_replica: Make) -> None:
    r = make_replica()
    register(r, "n1")
    node = pb.Node(node_id="n1", endpoint="n1:5000")
    cases = [
        (pb.RecordAssignmentRequest(node=node), "sandbox_id is required"),
        (
            pb.RecordAssignmentRequest(sandbox_id="s", node=pb.Node(node_id="n1")),
            "node_id and endpoint are required",
        ),
        (
            pb.RecordAssignmentRequest(sandbox_id="s", node=pb.Node(endpoint="x")),
            "node_id and endpoint are required",
        ),
        (
            pb.RecordAssignmentRequest(sandbox_id="s", node=pb.Node(node_id="n9", endpoint="x")),
            "node is not in scheduler node list",
        ),
        (
            pb.RecordAssignmentRequest(sandbox_id="s", node=pb.Node(node_id="n1", endpoint="y")),
            "node is not in scheduler node list",
        ),
    ]
    for req, message in cases:
        assert code_of(lambda req=req: r.stub.RecordAssignment(req)) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            message,
        )
    assert code_of(lambda: r.stub.LookupNode(pb.LookupNodeRequest())) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "sandbox_id is required",
    )
    assert code_of(lambda: r.stub.LookupNode(pb.LookupNodeRequest(sandbox_id="nope"))) == (
        grpc.StatusCode.NOT_FOUND,
        "sandbox assignment not found",
    )


def test_roster_makes_sandboxes_routable(make_replica: Make) -> None:
    r = make_replica()
    register(r, "n1", roster=["direct-1", " ", "direct-1"])
    assert r.stub.LookupNode(pb.LookupNodeRequest(sandbox_id="direct-1")).node.node_id == "n1"
    register(r, "n2", roster=["direct-1"])  # listed by another node: the binding moves
    assert r.stub.LookupNode(pb.LookupNodeRequest(sandbox_id="direct-1")).node.node_id == "n2"
    register(r, "n2", roster=[])  # an empty roster drops them all
    assert (
        code_of(lambda: r.stub.LookupNode(pb.LookupNodeRequest(sandbox_id="direct-1")))[0]
        == grpc.StatusCode.NOT_FOUND
    )


# ---------------------------------------------------------------------------
# Heartbeat, nodes, status
# ---------------------------------------------------------------------------
def test_heartbeat_required_fields_and_static_list(make_replica: Make) -> None:
    r = make_replica(nodes=[("n1", "10.0.0.1:5000"), ("n2", "10.0.0.2:5000")])
    assert code_of(lambda: r.stub.Heartbeat(hb_request(""))) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "node_id is required",
    )
    assert code_of(lambda: r.stub.Heartbeat(hb_request("n1", sid=" "))) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "service_instance_id is required",
    )
    assert code_of(lambda: r.stub.Heartbeat(hb_request("n3"))) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "node is not in scheduler node list",
    )
    # the endpoint comes from the static list, not from the metadata
    r.stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("elsewhere:1"))
    r.stub.Heartbeat(hb_request("n1", sid="i2"))  # a restarted node is accepted
    nodes = r.stub.ListNodes(pb.ListNodesRequest()).nodes
    assert [(n.node_id, n.endpoint) for n in nodes] == [
        ("n1", "10.0.0.1:5000"),
        ("n2", "10.0.0.2:5000"),
    ]
    assert r.stub.Schedule(cold()).node.node_id == "n1"  # known capacity ranks first


def test_node_without_endpoint_is_excluded_with_reason(make_replica: Make) -> None:
    r = make_replica()
    r.stub.Heartbeat(hb_request("n1"))  # no x-node-endpoint metadata
    code, details = code_of(lambda: r.stub.Schedule(cold()))
    assert (code, details) == (
        grpc.StatusCode.UNAVAILABLE,
        "no nodes available: 0/1 nodes available: 1 no endpoint",
    )


def test_list_nodes_sorted_lingering_included_and_never_chosen(
    make_replica: Make, sched: Scheduler
) -> None:
    r = make_replica()
    register(r, "nb", "na", "nc")
    sched.set_lingering("na", True)
    assert [n.node_id for n in r.stub.ListNodes(pb.ListNodesRequest()).nodes] == ["na", "nb", "nc"]
    got = r.stub.GetNode(pb.GetNodeRequest(node_id="na")).node
    assert got.snapshot.status == pb.NODE_STATUS_LINGERING
    chosen = {r.stub.Schedule(pb.ScheduleRequest()).node.node_id for _ in range(6)}
    assert chosen == {"nb", "nc"}


def test_observed_nodes_get_node_and_derived_status(make_replica: Make, sched: Scheduler) -> None:
    r = make_replica(Policy(report_ttl_ms=30_000))
    req = hb_request(
        "n1",
        cluster="c1",
        allocated_cpu=3,
        create_successes=7,
        disks=[
            pb.DiskMetric(
                mount_point="/", device="sda", filesystem_type="ext4", used_bytes=5, total_bytes=10
            )
        ],
    )
    req.version, req.commit = "1.2.3", "abc"
    req.machine_info.cpu_model_name = "EPYC"
    req.machine_info.cpu_config_json = '{"kvm_capabilities": []}'
    req.p2p_endpoint.backend, req.p2p_endpoint.address = "bt", "10.0.0.1:6881"
    r.stub.Heartbeat(req, metadata=endpoint_md("n1:5000"))
    register(r, "n2", cluster="c2")
    r.stub.Heartbeat(hb_request("n3", cluster="c1"), metadata=endpoint_md("n3:5000"))
    sched.set_lingering("n3", True)

    node = r.stub.GetNode(pb.GetNodeRequest(node_id="n1", cluster_id="c1")).node
    assert (
        node.endpoint,
        node.cluster_id,
        node.service_instance_id,
        node.version,
        node.commit,
    ) == ("n1:5000", "c1", "i1", "1.2.3", "abc")
    assert node.machine_info.cpu_model_name == "EPYC"
    assert node.machine_info.cpu_config_json == '{"kvm_capabilities": []}'
    assert (
        node.snapshot.status,
        node.snapshot.allocated_cpu,
        node.snapshot.cpu_count,
        node.snapshot.create_successes,
    ) == (pb.NODE_STATUS_READY, 3, 32, 7)
    assert [d.mount_point for d in node.snapshot.disks] == ["/"]
    assert node.snapshot.disks[0].total_bytes == 10
    assert node.last_seen_unix_ms > 0
    assert node.snapshot.reported_at_unix_ms == node.last_seen_unix_ms  # 0 is stamped

    c1 = r.stub.ListObservedNodes(pb.ListObservedNodesRequest(cluster_id="c1")).nodes
    assert [(n.node_id, n.snapshot.status) for n in c1] == [
        ("n1", pb.NODE_STATUS_READY),
        ("n3", pb.NODE_STATUS_LINGERING),
    ]
    every = r.stub.ListObservedNodes(pb.ListObservedNodesRequest()).nodes
    assert [n.node_id for n in every] == ["n1", "n2", "n3"]
    assert list(r.stub.ListObservedNodes(pb.ListObservedNodesRequest(cluster_id="c9")).nodes) == []

    assert code_of(lambda: r.stub.GetNode(pb.GetNodeRequest())) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "node_id is required",
    )
    for req2 in (pb.GetNodeRequest(node_id="n1", cluster_id="c2"), pb.GetNodeRequest(node_id="n9")):
        assert code_of(lambda req2=req2: r.stub.GetNode(req2)) == (
            grpc.StatusCode.NOT_FOUND,
            "observed node not found",
        )

    sched.advance_clock(30_001)  # Redis time moves past report_ttl: stale, even if lingering
    c1 = r.stub.ListObservedNodes(pb.ListObservedNodesRequest(cluster_id="c1")).nodes
    assert [n.snapshot.status for n in c1] == [pb.NODE_STATUS_UNHEALTHY] * 2


def test_unregister(make_replica: Make) -> None:
    r = make_replica()
    register(r, "n1", roster=["sb-1"])
    assert code_of(lambda: r.stub.UnregisterNode(pb.UnregisterNodeRequest(node_id="n1"))) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "node_id and service_instance_id are required",
    )
    assert code_of(
        lambda: r.stub.UnregisterNode(
            pb.UnregisterNodeRequest(node_id="n1", service_instance_id="other")
        )
    ) == (grpc.StatusCode.FAILED_PRECONDITION, "service instance mismatch")
    r.stub.UnregisterNode(pb.UnregisterNodeRequest(node_id="n9", service_instance_id="x"))
    r.stub.UnregisterNode(pb.UnregisterNodeRequest(node_id="n1", service_instance_id="i1"))
    assert code_of(lambda: r.stub.LookupNode(pb.LookupNodeRequest(sandbox_id="sb-1"))) == (
        grpc.StatusCode.NOT_FOUND,
        "sandbox assignment not found",
    )
    assert list(r.stub.ListNodes(pb.ListNodesRequest()).nodes) == []


def test_report_sandbox_event(make_replica: Make, sched: Scheduler) -> None:
    r = make_replica()
    register(r, "n1")
    placed, call = r.stub.Schedule.with_call(cold())
    rid = dict(call.trailing_metadata())["x-reservation-id"]
    # (the gateway records the assignment; an outside CREATE takes no reservation)
    r.stub.RecordAssignment(pb.RecordAssignmentRequest(sandbox_id="sb-1", node=placed.node))
    assert sched.reservation(rid).state == "assigned"
    create = pb.SandboxEvent(
        sandbox_id="sb-1",
        event_type=pb.SANDBOX_EVENT_TYPE_CREATE,
        requested_cpu=2,
        requested_memory_bytes=4096 * MIB,
    )
    r.stub.ReportSandboxEvent(
        pb.ReportSandboxEventRequest(
            node_id="n1", cluster_id="c1", service_instance_id="i1", events=[create]
        )
    )
    assert sched.reservation(rid).state == "acked"
    assert r.stub.LookupNode(pb.LookupNodeRequest(sandbox_id="sb-1")).node.node_id == "n1"
    delete = pb.SandboxEvent(sandbox_id="sb-1", event_type=pb.SANDBOX_EVENT_TYPE_DELETE)
    r.stub.ReportSandboxEvent(pb.ReportSandboxEventRequest(node_id="n1", events=[delete]))
    assert (
        code_of(lambda: r.stub.LookupNode(pb.LookupNodeRequest(sandbox_id="sb-1")))[0]
        == grpc.StatusCode.NOT_FOUND
    )
    assert code_of(
        lambda: r.stub.ReportSandboxEvent(
            pb.ReportSandboxEventRequest(node_id="n9", events=[create])
        )
    ) == (grpc.StatusCode.INVALID_ARGUMENT, "node is not in scheduler node list")


# ---------------------------------------------------------------------------
# Bad input: INVALID_ARGUMENT naming the field, nothing written
# ---------------------------------------------------------------------------
def _hb(**kw: Any) -> pb.HeartbeatRequest:
    req = hb_request("n1")
    for name, value in kw.items():
        if name.startswith("snap_"):
            setattr(req.snapshot, name[5:], value)
        elif isinstance(value, list):
            getattr(req, name)[:] = value
        else:
            setattr(req, name, value)
    return req


U32, U64 = 2**32 - 1, 2**64 - 1
NODE = pb.Node(node_id="n1", endpoint="n1:5000")
BAD: list[tuple[str, str, Any, tuple[tuple[str, str], ...], str]] = [
    ("schedule-cpu", "Schedule", cold(cpu=U32), (), "hint.new_cold_sandbox.cpu_count"),
    ("schedule-mem", "Schedule", cold(memory_mb=U64), (), "hint.new_cold_sandbox.memory_mb"),
    ("hb-empty-id", "Heartbeat", _hb(node_id=""), (), "node_id is required"),
    ("hb-long-id", "Heartbeat", _hb(node_id="n" * 300), (), "node_id is longer"),
    ("hb-brace-id", "Heartbeat", _hb(node_id="n{1}"), (), "node_id contains '{'"),
    ("hb-colon-id", "Heartbeat", _hb(node_id="n:1"), (), "node_id contains ':'"),
    ("hb-newline-id", "Heartbeat", _hb(node_id="n\n1"), (), "node_id contains '\\n'"),
    ("hb-sid", "Heartbeat", _hb(service_instance_id="i}"), (), "service_instance_id"),
    ("hb-cluster", "Heartbeat", _hb(cluster_id="c:1"), (), "cluster_id"),
    ("hb-cpu", "Heartbeat", _hb(snap_cpu_count=U32), (), "snapshot.cpu_count"),
    ("hb-mem", "Heartbeat", _hb(snap_memory_total_bytes=U64), (), "snapshot.memory_total_bytes"),
    (
        "hb-reported",
        "Heartbeat",
        _hb(snap_reported_at_unix_ms=-5),
        (),
        "snapshot.reported_at_unix_ms",
    ),
    ("hb-successes", "Heartbeat", _hb(snap_create_successes=U64), (), "snapshot.create_successes"),
    ("hb-status", "Heartbeat", _hb(snap_status=99), (), "snapshot.status"),
    ("hb-version", "Heartbeat", _hb(version="v" * 5000), (), "version"),
    ("hb-roster", "Heartbeat", _hb(sandbox_ids=["ok", "bad:id"]), (), "sandbox_ids[1]"),
    (
        "assign-sandbox",
        "RecordAssignment",
        pb.RecordAssignmentRequest(sandbox_id="s}{", node=NODE),
        (),
        "sandbox_id",
    ),
    (
        "assign-node",
        "RecordAssignment",
        pb.RecordAssignmentRequest(sandbox_id="s", node=pb.Node(node_id="n:1", endpoint="x")),
        (),
        "node_id",
    ),
    (
        "assign-rid",
        "RecordAssignment",
        pb.RecordAssignmentRequest(sandbox_id="s", node=NODE),
        (("x-reservation-id", "r{1}"),),
        "reservation_id",
    ),
    ("lookup-newline", "LookupNode", pb.LookupNodeRequest(sandbox_id="a\nb"), (), "sandbox_id"),
    ("lookup-long", "LookupNode", pb.LookupNodeRequest(sandbox_id="s" * 257), (), "sandbox_id"),
    ("getnode", "GetNode", pb.GetNodeRequest(node_id="{x}"), (), "node_id"),
    (
        "observed-cluster",
        "ListObservedNodes",
        pb.ListObservedNodesRequest(cluster_id="a}"),
        (),
        "cluster_id",
    ),
    (
        "event-sandbox",
        "ReportSandboxEvent",
        pb.ReportSandboxEventRequest(
            node_id="n1", events=[pb.SandboxEvent(sandbox_id="a:b", event_type=1)]
        ),
        (),
        "events[0].sandbox_id",
    ),
    (
        "event-type",
        "ReportSandboxEvent",
        pb.ReportSandboxEventRequest(
            node_id="n1", events=[pb.SandboxEvent(sandbox_id="x", event_type=0)]
        ),
        (),
        "events[0].event_type",
    ),
    (
        "unregister",
        "UnregisterNode",
        pb.UnregisterNodeRequest(node_id="n1{", service_instance_id="i1"),
        (),
        "node_id",
    ),
    (
        "p2p-record-missing",
        "RecordP2pArtifact",
        pb.RecordP2pArtifactRequest(cluster_id="c1", backend="bt", node_id="n1"),
        (),
        "cluster_id, backend, key, and node_id are required",
    ),
    (
        "p2p-record-key",
        "RecordP2pArtifact",
        pb.RecordP2pArtifactRequest(cluster_id="c1", backend="bt", key="a\nb", node_id="n1"),
        (),
        "key",
    ),
    (
        "p2p-record-cluster",
        "RecordP2pArtifact",
        pb.RecordP2pArtifactRequest(cluster_id="c:1", backend="bt", key="k", node_id="n1"),
        (),
        "cluster_id",
    ),
    (
        "p2p-forget-missing",
        "ForgetP2pArtifact",
        pb.ForgetP2pArtifactRequest(cluster_id="c1", key="k", node_id="n1"),
        (),
        "cluster_id, backend, key, and node_id are required",
    ),
    (
        "p2p-lookup-missing",
        "LookupP2pArtifact",
        pb.LookupP2pArtifactRequest(cluster_id="c1", backend="bt"),
        (),
        "cluster_id, backend, and key are required",
    ),
    (
        "p2p-peers-exclude",
        "ListP2pPeers",
        pb.ListP2pPeersRequest(exclude_node_id="x{"),
        (),
        "exclude_node_id",
    ),
]


@pytest.mark.parametrize(
    ("rpc", "request_", "metadata", "named"), [pytest.param(*case[1:], id=case[0]) for case in BAD]
)
def test_bad_input_is_invalid_argument_and_writes_nothing(
    make_replica: Make,
    redis_client: Any,
    rpc: str,
    request_: Any,
    metadata: tuple[tuple[str, str], ...],
    named: str,
) -> None:
    r = make_replica()
    register(r, "n1", roster=["sb-1"])
    r.stub.Schedule(cold())
    # (the replica's monitor writes its presence, probe and census meanwhile)
    before = snapshot_keys(redis_client, monitor=True)
    code, details = code_of(lambda: getattr(r.stub, rpc)(request_, metadata=metadata))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert named in details
    assert snapshot_keys(redis_client, monitor=True) == before


# ---------------------------------------------------------------------------
# Health and metrics of one replica
# ---------------------------------------------------------------------------
def test_health_serving_and_metrics(make_replica: Make, sched: Scheduler) -> None:
    r = make_replica()
    assert r.channel is not None and r.replica is not None
    health = health_pb2_grpc.HealthStub(r.channel)
    for service in ("", "scheduler.v1.Scheduler"):
        assert (
            health.Check(health_pb2.HealthCheckRequest(service=service)).status
            == health_pb2.HealthCheckResponse.SERVING
        )
    register(r, "n1")
    r.stub.Schedule(cold())
    code_of(lambda: r.stub.LookupNode(pb.LookupNodeRequest(sandbox_id="nope")))
    reg = r.replica.metrics.registry

    def value(name: str, **labels: str) -> float | None:
        v: float | None = reg.get_sample_value(name, labels)
        return v

    assert value("agentenv_scheduler_rpc_duration_seconds_count", rpc="Schedule", status="ok") == 1
    assert (
        value("agentenv_scheduler_rpc_duration_seconds_count", rpc="LookupNode", status="not_found")
        == 1
    )
    assert (
        value(
            "agentenv_scheduler_schedule_duration_seconds_count",
            strategy="least_loaded",
            status="ok",
        )
        == 1
    )
    assert value("agentenv_scheduler_schedule_assignments_total", strategy="least_loaded") == 1
    assert value("sched_script_duration_seconds_count", script="schedule") == 1
    # (the Heartbeat RPC's heartbeat and its CPU config ingest: one batch call)
    assert value("sched_script_duration_seconds_count", script="heartbeat_batch") == 1
    assert value("sched_script_duration_seconds_count", script="heartbeat") is None
    assert value("sched_script_duration_seconds_count", script="cpu_config") is None
    assert value("sched_redis_up") == 1
    r.call(r.replica.refresh_cell_metrics())
    assert value("sched_reservations_pending") == sched.stats().pending == 1
    assert value("agentenv_scheduler_observed_nodes", status="ready") == 1
    rid = sched.reservations()[0].reservation_id
    sched.cancel(rid)
    r.call(r.replica.refresh_cell_metrics())
    assert value("sched_reservations_ended_total", outcome="cancelled") == 1
    assert value("sched_reservations_pending") == 0
    # (one at a time so far: no batch; the coalescers' counters, read when scraped)
    assert value("sched_batches_total", kind="schedule") == 0

    async def together() -> None:  # ten heartbeats that arrive at once: one batch
        await asyncio.gather(*(r.replica.sched.heartbeat(hb(f"b{i}")) for i in range(10)))

    r.call(together())
    assert value("sched_batches_total", kind="heartbeat") == 1
    assert value("sched_batched_calls_total", kind="heartbeat") == 10


@pytest.mark.real_only
def test_redis_refusing_writes_is_unavailable_naming_redis(
    make_replica: Make, redis_client: Any
) -> None:
    r = make_replica()
    register(r, "n1")
    redis_client.config_set("maxmemory", "1")
    try:
        code, details = code_of(lambda: r.stub.Schedule(cold()))
    finally:
        redis_client.config_set("maxmemory", "0")
    assert code == grpc.StatusCode.UNAVAILABLE
    assert details.startswith("Redis at ")
    assert "cannot serve: command not allowed when used memory" in details
    assert r.stub.Schedule(cold()).node.node_id == "n1"


def test_a_cell_lost_by_redis_is_restored_by_the_next_call(
    make_replica: Make, redis_client: Any, sched: Scheduler
) -> None:
    policy = Policy(limits=Limits(max_sandbox_count=7))
    r = make_replica(policy)
    register(r, "n1")
    redis_client.flushall()  # e.g. a Redis without persistence restarted
    register(r, "n1")  # no FAILED_PRECONDITION: the replica puts its policy back
    assert sched.policy() == policy
    assert r.stub.Schedule(cold()).node.node_id == "n1"


def test_schedule_answers_are_built_once_per_node_and_kept_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from scheduler.client.aio import AsyncScheduler
    from scheduler.server import service
    from scheduler.server.metrics import Metrics
    from scheduler.store import embedded

    svc = service.SchedulerService(
        AsyncScheduler(embedded.async_client()),
        Metrics(),
        strategy="least_loaded",
        artifact_store_capacity=10,
        artifact_lookup_node_limit=0,
    )
    first = svc._answer("n1", "10.0.0.1:5000")
    assert first is svc._answer("n1", "10.0.0.1:5000")
    assert (first.node.node_id, first.node.endpoint) == ("n1", "10.0.0.1:5000")
    moved = svc._answer("n1", "10.0.0.2:5000")  # a node's endpoint is part of its answer
    assert moved.node.endpoint == "10.0.0.2:5000" and first.node.endpoint == "10.0.0.1:5000"
    monkeypatch.setattr(service, "ANSWERS_KEPT", 3)
    for i in range(10):
        assert svc._answer(f"n{i}", "e:1").node.node_id == f"n{i}"
        assert len(svc._answers) <= 3
