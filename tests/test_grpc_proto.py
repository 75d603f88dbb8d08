"""The wire contract: the generated stubs carry exactly the contract's
messages (names, field numbers, types) and RPCs (docs/contract.md), and match
scheduler.proto."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from google.protobuf import descriptor, descriptor_pb2

from scheduler.grpc import scheduler_pb2 as pb

F = descriptor.FieldDescriptor
S, U32, U64, I64 = F.TYPE_STRING, F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_INT64
BOOL = F.TYPE_BOOL
R = "repeated"
# message -> [(number, name, type or message/enum name, "repeated" or "")]
CONTRACT: dict[str, list[tuple[int, str, Any, str]]] = {
    "Node": [(1, "node_id", S, ""), (2, "endpoint", S, "")],
    "ScheduleRequestHint": [
        (1, "new_cold_sandbox", "NewColdSandboxHint", ""),
        (2, "new_sandbox", "NewSandboxHint", ""),
        (3, "locality_requirements", "LocalityRequirement", R),  # upstream's PR #51
    ],
    "NewColdSandboxHint": [
        (1, "cpu_count", U32, ""),
        (2, "memory_mb", U64, ""),
        (3, "images", S, R),
        (4, "metadata", "MetadataEntry", R),
    ],
    "NewSandboxHint": [(1, "metadata", "MetadataEntry", R), (2, "template_id", S, "")],
    # upstream's PR #51 (key), and ours (size_bytes, wire-compatible)
    "LocalityRequirement": [(1, "key", S, ""), (2, "size_bytes", U64, "")],
    "ScheduleRequest": [(2, "hint", "ScheduleRequestHint", "")],
    "ScheduleResponse": [(1, "node", "Node", "")],
    "ListNodesRequest": [],
    "ListNodesResponse": [(1, "nodes", "Node", R)],
    "LookupNodeRequest": [(1, "sandbox_id", S, "")],
    "LookupNodeResponse": [(1, "node", "Node", "")],
    "RecordAssignmentRequest": [(1, "sandbox_id", S, ""), (2, "node", "Node", "")],
    "RecordAssignmentResponse": [],
    "MachineInfo": [
        (1, "cpu_family", S, ""),
        (2, "cpu_model", S, ""),
        (3, "cpu_model_name", S, ""),
        (4, "cpu_architecture", S, ""),
        (5, "cpu_config_json", S, ""),
    ],
    "DiskMetric": [
        (1, "mount_point", S, ""),
        (2, "device", S, ""),
        (3, "filesystem_type", S, ""),
        (4, "used_bytes", U64, ""),
        (5, "total_bytes", U64, ""),
    ],
    "NodeSnapshot": [
        (1, "status", "NodeStatus", ""),
        (2, "allocated_cpu", U32, ""),
        (3, "allocated_memory_bytes", U64, ""),
        (4, "cpu_percent", U32, ""),
        (5, "cpu_count", U32, ""),
        (6, "memory_used_bytes", U64, ""),
        (7, "memory_total_bytes", U64, ""),
        (8, "disks", "DiskMetric", R),
        (9, "sandbox_count", U32, ""),
        (10, "sandbox_starting_count", U32, ""),
        (11, "create_successes", U64, ""),
        (12, "create_fails", U64, ""),
        (13, "reported_at_unix_ms", I64, ""),
        (14, "paused_sandbox_count", U32, ""),
        (15, "paused_allocated_cpu", U32, ""),
        (16, "paused_allocated_memory_bytes", U64, ""),
        (17, "accepting_sandboxes", BOOL, ""),  # optional (upstream's admission)
        (18, "admission_reason", "AdmissionReason", ""),
    ],
    "P2pEndpoint": [(1, "backend", S, ""), (2, "address", S, "")],
    "ObservedNode": [
        (1, "node_id", S, ""),
        (2, "endpoint", S, ""),
        (3, "cluster_id", S, ""),
        (4, "service_instance_id", S, ""),
        (5, "version", S, ""),
        (6, "commit", S, ""),
        (7, "machine_info", "MachineInfo", ""),
        (8, "snapshot", "NodeSnapshot", ""),
        (9, "last_seen_unix_ms", I64, ""),
    ],
    "HeartbeatRequest": [
        (1, "node_id", S, ""),
        (2, "cluster_id", S, ""),
        (3, "service_instance_id", S, ""),
        (4, "version", S, ""),
        (5, "commit", S, ""),
        (6, "machine_info", "MachineInfo", ""),
        (7, "snapshot", "NodeSnapshot", ""),
        (8, "sandbox_ids", S, R),
        (9, "p2p_endpoint", "P2pEndpoint", ""),
    ],
    "HeartbeatResponse": [(1, "cpu_config_json", S, "")],
    "SandboxEvent": [
        (1, "sandbox_id", S, ""),
        (2, "event_type", "SandboxEventType", ""),
        (3, "requested_cpu", U32, ""),
        (4, "requested_memory_bytes", U64, ""),
        (5, "requested_disk_bytes", U64, ""),
    ],
    "ReportSandboxEventRequest": [
        (1, "node_id", S, ""),
        (2, "cluster_id", S, ""),
        (3, "service_instance_id", S, ""),
        (4, "events", "SandboxEvent", R),
    ],
    "ReportSandboxEventResponse": [],
    "ListObservedNodesRequest": [(1, "cluster_id", S, "")],
    "ListObservedNodesResponse": [(1, "nodes", "ObservedNode", R)],
    "P2pPeer": [(1, "node_id", S, ""), (2, "endpoint", "P2pEndpoint", "")],
    "ListP2pPeersRequest": [
        (1, "cluster_id", S, ""),
        (2, "backend", S, ""),
        (3, "exclude_node_id", S, ""),
    ],
    "ListP2pPeersResponse": [(1, "peers", "P2pPeer", R)],
    "RecordP2pArtifactRequest": [
        (1, "cluster_id", S, ""),
        (2, "backend", S, ""),
        (3, "key", S, ""),
        (4, "node_id", S, ""),
    ],
    "RecordP2pArtifactResponse": [],
    "ForgetP2pArtifactRequest": [
        (1, "cluster_id", S, ""),
        (2, "backend", S, ""),
        (3, "key", S, ""),
        (4, "node_id", S, ""),
    ],
    "ForgetP2pArtifactResponse": [],
    "LookupP2pArtifactRequest": [
        (1, "cluster_id", S, ""),
        (2, "backend", S, ""),
        (3, "key", S, ""),
        (4, "exclude_node_id", S, ""),
    ],
    "LookupP2pArtifactResponse": [(1, "peers", "P2pPeer", R)],
    "GetNodeRequest": [(1, "node_id", S, ""), (2, "cluster_id", S, "")],
    "GetNodeResponse": [(1, "node", "ObservedNode", "")],
    "UnregisterNodeRequest": [(1, "node_id", S, ""), (2, "service_instance_id", S, "")],
    "UnregisterNodeResponse": [],
}
ENUMS = {
    "NodeStatus": [
        "NODE_STATUS_UNSPECIFIED",
        "NODE_STATUS_READY",
        "NODE_STATUS_CONNECTING",
        "NODE_STATUS_UNHEALTHY",
        "NODE_STATUS_LINGERING",
    ],
    "AdmissionReason": [
        "ADMISSION_REASON_UNSPECIFIED",
        "ADMISSION_REASON_READY",
        "ADMISSION_REASON_DISK_CLEANUP",
        "ADMISSION_REASON_DISK_HARD_LIMIT",
        "ADMISSION_REASON_CLEANUP_DEBT",
    ],
    "SandboxEventType": [
        "SANDBOX_EVENT_TYPE_UNSPECIFIED",
        "SANDBOX_EVENT_TYPE_CREATE",
        "SANDBOX_EVENT_TYPE_DELETE",
        "SANDBOX_EVENT_TYPE_PAUSE",
        "SANDBOX_EVENT_TYPE_RESUME",
        "SANDBOX_EVENT_TYPE_FORK",
    ],
}
RPCS = [
    "Schedule",
    "ListNodes",
    "LookupNode",
    "RecordAssignment",
    "Heartbeat",
    "ReportSandboxEvent",
    "ListObservedNodes",
    "ListP2pPeers",
    "RecordP2pArtifact",
    "ForgetP2pArtifact",
    "LookupP2pArtifact",
    "GetNode",
    "UnregisterNode",
]


def _shape(field: Any) -> tuple[int, str, Any, str]:
    kind = (
        field.message_type.name
        if field.message_type
        else (field.enum_type.name if field.enum_type else field.type)
    )
    repeated = R if field.is_repeated else ""
    return (field.number, field.name, kind, repeated)


def test_package_and_messages_match_the_contract() -> None:
    fd = pb.DESCRIPTOR
    proto = descriptor_pb2.FileDescriptorProto()
    fd.CopyToProto(proto)
    assert (proto.package, proto.syntax) == ("scheduler.v1", "proto3")
    assert sorted(fd.message_types_by_name) == sorted(CONTRACT)
    for name, fields in CONTRACT.items():
        got = sorted(_shape(f) for f in fd.message_types_by_name[name].fields)
        assert got == sorted(fields), name


def test_hint_oneof_reserved_field_and_enums() -> None:
    hint = pb.DESCRIPTOR.message_types_by_name["ScheduleRequestHint"]
    assert [f.name for f in hint.oneofs_by_name["kind"].fields] == [
        "new_cold_sandbox",
        "new_sandbox",
    ]
    proto = descriptor_pb2.DescriptorProto()
    pb.ScheduleRequest.DESCRIPTOR.CopyToProto(proto)
    assert [(r.start, r.end) for r in proto.reserved_range] == [(1, 2)]  # field 1 reserved
    for name, values in ENUMS.items():
        enum = pb.DESCRIPTOR.enum_types_by_name[name]
        assert [(v.number, v.name) for v in enum.values] == list(enumerate(values))
    meta = pb.NewColdSandboxHint.DESCRIPTOR.fields_by_name["metadata"]
    assert meta.message_type.GetOptions().map_entry
    assert [(f.name, f.type) for f in meta.message_type.fields] == [("key", S), ("value", S)]


def test_service_has_the_thirteen_rpcs() -> None:
    service = pb.DESCRIPTOR.services_by_name["Scheduler"]
    assert service.full_name == "scheduler.v1.Scheduler"
    methods = {m.name: (m.input_type.name, m.output_type.name) for m in service.methods}
    assert list(methods) == RPCS
    for rpc, (request, response) in methods.items():
        assert (request, response) == (f"{rpc}Request", f"{rpc}Response")
    from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
    from scheduler.server.service import SchedulerService

    for rpc in RPCS:
        assert hasattr(pb_grpc.SchedulerServicer, rpc)
        assert getattr(SchedulerService, rpc) is not getattr(pb_grpc.SchedulerServicer, rpc)


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None,
    reason="grpcio-tools (the dev extra) regenerates the stubs",
)
def test_committed_stubs_match_the_proto() -> None:
    from scheduler.grpc.generate import mismatches

    assert mismatches() == []
