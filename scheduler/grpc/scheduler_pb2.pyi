from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATUS_UNSPECIFIED: _ClassVar[NodeStatus]
    NODE_STATUS_READY: _ClassVar[NodeStatus]
    NODE_STATUS_CONNECTING: _ClassVar[NodeStatus]
    NODE_STATUS_UNHEALTHY: _ClassVar[NodeStatus]
    NODE_STATUS_LINGERING: _ClassVar[NodeStatus]

class AdmissionReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADMISSION_REASON_UNSPECIFIED: _ClassVar[AdmissionReason]
    ADMISSION_REASON_READY: _ClassVar[AdmissionReason]
    ADMISSION_REASON_DISK_CLEANUP: _ClassVar[AdmissionReason]
    ADMISSION_REASON_DISK_HARD_LIMIT: _ClassVar[AdmissionReason]
    ADMISSION_REASON_CLEANUP_DEBT: _ClassVar[AdmissionReason]

class SandboxEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SANDBOX_EVENT_TYPE_UNSPECIFIED: _ClassVar[SandboxEventType]
    SANDBOX_EVENT_TYPE_CREATE: _ClassVar[SandboxEventType]
    SANDBOX_EVENT_TYPE_DELETE: _ClassVar[SandboxEventType]
    SANDBOX_EVENT_TYPE_PAUSE: _ClassVar[SandboxEventType]
    SANDBOX_EVENT_TYPE_RESUME: _ClassVar[SandboxEventType]
    SANDBOX_EVENT_TYPE_FORK: _ClassVar[SandboxEventType]
NODE_STATUS_UNSPECIFIED: NodeStatus
NODE_STATUS_READY: NodeStatus
NODE_STATUS_CONNECTING: NodeStatus
NODE_STATUS_UNHEALTHY: NodeStatus
NODE_STATUS_LINGERING: NodeStatus
ADMISSION_REASON_UNSPECIFIED: AdmissionReason
ADMISSION_REASON_READY: AdmissionReason
ADMISSION_REASON_DISK_CLEANUP: AdmissionReason
ADMISSION_REASON_DISK_HARD_LIMIT: AdmissionReason
ADMISSION_REASON_CLEANUP_DEBT: AdmissionReason
SANDBOX_EVENT_TYPE_UNSPECIFIED: SandboxEventType
SANDBOX_EVENT_TYPE_CREATE: SandboxEventType
SANDBOX_EVENT_TYPE_DELETE: SandboxEventType
SANDBOX_EVENT_TYPE_PAUSE: SandboxEventType
SANDBOX_EVENT_TYPE_RESUME: SandboxEventType
SANDBOX_EVENT_TYPE_FORK: SandboxEventType

class Node(_message.Message):
    __slots__ = ("node_id", "endpoint")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    endpoint: str
    def __init__(self, node_id: _Optional[str] = ..., endpoint: _Optional[str] = ...) -> None: ...

class ScheduleRequestHint(_message.Message):
    __slots__ = ("new_cold_sandbox", "new_sandbox", "locality_requirements")
    NEW_COLD_SANDBOX_FIELD_NUMBER: _ClassVar[int]
    NEW_SANDBOX_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_REQUIREMENTS_FIELD_NUMBER: _ClassVar[int]
    new_cold_sandbox: NewColdSandboxHint
    new_sandbox: NewSandboxHint
    locality_requirements: _containers.RepeatedCompositeFieldContainer[LocalityRequirement]
    def __init__(self, new_cold_sandbox: _Optional[_Union[NewColdSandboxHint, _Mapping]] = ..., new_sandbox: _Optional[_Union[NewSandboxHint, _Mapping]] = ..., locality_requirements: _Optional[_Iterable[_Union[LocalityRequirement, _Mapping]]] = ...) -> None: ...

class LocalityRequirement(_message.Message):
    __slots__ = ("key", "size_bytes")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    key: str
    size_bytes: int
    def __init__(self, key: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class NewColdSandboxHint(_message.Message):
    __slots__ = ("cpu_count", "memory_mb", "images", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    cpu_count: int
    memory_mb: int
    images: _containers.RepeatedScalarFieldContainer[str]
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, cpu_count: _Optional[int] = ..., memory_mb: _Optional[int] = ..., images: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class NewSandboxHint(_message.Message):
    __slots__ = ("metadata", "template_id")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_ID_FIELD_NUMBER: _ClassVar[int]
    metadata: _containers.ScalarMap[str, str]
    template_id: str
    def __init__(self, metadata: _Optional[_Mapping[str, str]] = ..., template_id: _Optional[str] = ...) -> None: ...

class ScheduleRequest(_message.Message):
    __slots__ = ("hint",)
    HINT_FIELD_NUMBER: _ClassVar[int]
    hint: ScheduleRequestHint
    def __init__(self, hint: _Optional[_Union[ScheduleRequestHint, _Mapping]] = ...) -> None: ...

class ScheduleResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: Node
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class LookupNodeRequest(_message.Message):
    __slots__ = ("sandbox_id",)
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    def __init__(self, sandbox_id: _Optional[str] = ...) -> None: ...

class LookupNodeResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: Node
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...

class RecordAssignmentRequest(_message.Message):
    __slots__ = ("sandbox_id", "node")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    node: Node
    def __init__(self, sandbox_id: _Optional[str] = ..., node: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...

class RecordAssignmentResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MachineInfo(_message.Message):
    __slots__ = ("cpu_family", "cpu_model", "cpu_model_name", "cpu_architecture", "cpu_config_json")
    CPU_FAMILY_FIELD_NUMBER: _ClassVar[int]
    CPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    CPU_MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    CPU_ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    CPU_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    cpu_family: str
    cpu_model: str
    cpu_model_name: str
    cpu_architecture: str
    cpu_config_json: str
    def __init__(self, cpu_family: _Optional[str] = ..., cpu_model: _Optional[str] = ..., cpu_model_name: _Optional[str] = ..., cpu_architecture: _Optional[str] = ..., cpu_config_json: _Optional[str] = ...) -> None: ...

class DiskMetric(_message.Message):
    __slots__ = ("mount_point", "device", "filesystem_type", "used_bytes", "total_bytes")
    MOUNT_POINT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    FILESYSTEM_TYPE_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    mount_point: str
    device: str
    filesystem_type: str
    used_bytes: int
    total_bytes: int
    def __init__(self, mount_point: _Optional[str] = ..., device: _Optional[str] = ..., filesystem_type: _Optional[str] = ..., used_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class NodeSnapshot(_message.Message):
    __slots__ = ("status", "allocated_cpu", "allocated_memory_bytes", "cpu_percent", "cpu_count", "memory_used_bytes", "memory_total_bytes", "disks", "sandbox_count", "sandbox_starting_count", "create_successes", "create_fails", "reported_at_unix_ms", "paused_sandbox_count", "paused_allocated_cpu", "paused_allocated_memory_bytes", "accepting_sandboxes", "admission_reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_CPU_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISKS_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_COUNT_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_STARTING_COUNT_FIELD_NUMBER: _ClassVar[int]
    CREATE_SUCCESSES_FIELD_NUMBER: _ClassVar[int]
    CREATE_FAILS_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_SANDBOX_COUNT_FIELD_NUMBER: _ClassVar[int]
    PAUSED_ALLOCATED_CPU_FIELD_NUMBER: _ClassVar[int]
    PAUSED_ALLOCATED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACCEPTING_SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_REASON_FIELD_NUMBER: _ClassVar[int]
    status: NodeStatus
    allocated_cpu: int
    allocated_memory_bytes: int
    cpu_percent: int
    cpu_count: int
    memory_used_bytes: int
    memory_total_bytes: int
    disks: _containers.RepeatedCompositeFieldContainer[DiskMetric]
    sandbox_count: int
    sandbox_starting_count: int
    create_successes: int
    create_fails: int
    reported_at_unix_ms: int
    paused_sandbox_count: int
    paused_allocated_cpu: int
    paused_allocated_memory_bytes: int
    accepting_sandboxes: bool
    admission_reason: AdmissionReason
    def __init__(self, status: _Optional[_Union[NodeStatus, str]] = ..., allocated_cpu: _Optional[int] = ..., allocated_memory_bytes: _Optional[int] = ..., cpu_percent: _Optional[int] = ..., cpu_count: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., disks: _Optional[_Iterable[_Union[DiskMetric, _Mapping]]] = ..., sandbox_count: _Optional[int] = ..., sandbox_starting_count: _Optional[int] = ..., create_successes: _Optional[int] = ..., create_fails: _Optional[int] = ..., reported_at_unix_ms: _Optional[int] = ..., paused_sandbox_count: _Optional[int] = ..., paused_allocated_cpu: _Optional[int] = ..., paused_allocated_memory_bytes: _Optional[int] = ..., accepting_sandboxes: _Optional[bool] = ..., admission_reason: _Optional[_Union[AdmissionReason, str]] = ...) -> None: ...

class P2pEndpoint(_message.Message):
    __slots__ = ("backend", "address")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    backend: str
    address: str
    def __init__(self, backend: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class ObservedNode(_message.Message):
    __slots__ = ("node_id", "endpoint", "cluster_id", "service_instance_id", "version", "commit", "machine_info", "snapshot", "last_seen_unix_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    MACHINE_INFO_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    endpoint: str
    cluster_id: str
    service_instance_id: str
    version: str
    commit: str
    machine_info: MachineInfo
    snapshot: NodeSnapshot
    last_seen_unix_ms: int
    def __init__(self, node_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., cluster_id: _Optional[str] = ..., service_instance_id: _Optional[str] = ..., version: _Optional[str] = ..., commit: _Optional[str] = ..., machine_info: _Optional[_Union[MachineInfo, _Mapping]] = ..., snapshot: _Optional[_Union[NodeSnapshot, _Mapping]] = ..., last_seen_unix_ms: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "cluster_id", "service_instance_id", "version", "commit", "machine_info", "snapshot", "sandbox_ids", "p2p_endpoint")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    MACHINE_INFO_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_IDS_FIELD_NUMBER: _ClassVar[int]
    P2P_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    cluster_id: str
    service_instance_id: str
    version: str
    commit: str
    machine_info: MachineInfo
    snapshot: NodeSnapshot
    sandbox_ids: _containers.RepeatedScalarFieldContainer[str]
    p2p_endpoint: P2pEndpoint
    def __init__(self, node_id: _Optional[str] = ..., cluster_id: _Optional[str] = ..., service_instance_id: _Optional[str] = ..., version: _Optional[str] = ..., commit: _Optional[str] = ..., machine_info: _Optional[_Union[MachineInfo, _Mapping]] = ..., snapshot: _Optional[_Union[NodeSnapshot, _Mapping]] = ..., sandbox_ids: _Optional[_Iterable[str]] = ..., p2p_endpoint: _Optional[_Union[P2pEndpoint, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("cpu_config_json",)
    CPU_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    cpu_config_json: str
    def __init__(self, cpu_config_json: _Optional[str] = ...) -> None: ...

class SandboxEvent(_message.Message):
    __slots__ = ("sandbox_id", "event_type", "requested_cpu", "requested_memory_bytes", "requested_disk_bytes")
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_CPU_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    sandbox_id: str
    event_type: SandboxEventType
    requested_cpu: int
    requested_memory_bytes: int
    requested_disk_bytes: int
    def __init__(self, sandbox_id: _Optional[str] = ..., event_type: _Optional[_Union[SandboxEventType, str]] = ..., requested_cpu: _Optional[int] = ..., requested_memory_bytes: _Optional[int] = ..., requested_disk_bytes: _Optional[int] = ...) -> None: ...

class ReportSandboxEventRequest(_message.Message):
    __slots__ = ("node_id", "cluster_id", "service_instance_id", "events")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    cluster_id: str
    service_instance_id: str
    events: _containers.RepeatedCompositeFieldContainer[SandboxEvent]
    def __init__(self, node_id: _Optional[str] = ..., cluster_id: _Optional[str] = ..., service_instance_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[SandboxEvent, _Mapping]]] = ...) -> None: ...

class ReportSandboxEventResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListObservedNodesRequest(_message.Message):
    __slots__ = ("cluster_id",)
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    def __init__(self, cluster_id: _Optional[str] = ...) -> None: ...

class ListObservedNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[ObservedNode]
    def __init__(self, nodes: _Optional[_Iterable[_Union[ObservedNode, _Mapping]]] = ...) -> None: ...

class P2pPeer(_message.Message):
    __slots__ = ("node_id", "endpoint")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    endpoint: P2pEndpoint
    def __init__(self, node_id: _Optional[str] = ..., endpoint: _Optional[_Union[P2pEndpoint, _Mapping]] = ...) -> None: ...

class ListP2pPeersRequest(_message.Message):
    __slots__ = ("cluster_id", "backend", "exclude_node_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    backend: str
    exclude_node_id: str
    def __init__(self, cluster_id: _Optional[str] = ..., backend: _Optional[str] = ..., exclude_node_id: _Optional[str] = ...) -> None: ...

class ListP2pPeersResponse(_message.Message):
    __slots__ = ("peers",)
    PEERS_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedCompositeFieldContainer[P2pPeer]
    def __init__(self, peers: _Optional[_Iterable[_Union[P2pPeer, _Mapping]]] = ...) -> None: ...

class RecordP2pArtifactRequest(_message.Message):
    __slots__ = ("cluster_id", "backend", "key", "node_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    backend: str
    key: str
    node_id: str
    def __init__(self, cluster_id: _Optional[str] = ..., backend: _Optional[str] = ..., key: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class RecordP2pArtifactResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ForgetP2pArtifactRequest(_message.Message):
    __slots__ = ("cluster_id", "backend", "key", "node_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    backend: str
    key: str
    node_id: str
    def __init__(self, cluster_id: _Optional[str] = ..., backend: _Optional[str] = ..., key: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class ForgetP2pArtifactResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LookupP2pArtifactRequest(_message.Message):
    __slots__ = ("cluster_id", "backend", "key", "exclude_node_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    backend: str
    key: str
    exclude_node_id: str
    def __init__(self, cluster_id: _Optional[str] = ..., backend: _Optional[str] = ..., key: _Optional[str] = ..., exclude_node_id: _Optional[str] = ...) -> None: ...

class LookupP2pArtifactResponse(_message.Message):
    __slots__ = ("peers",)
    PEERS_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedCompositeFieldContainer[P2pPeer]
    def __init__(self, peers: _Optional[_Iterable[_Union[P2pPeer, _Mapping]]] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ("node_id", "cluster_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    cluster_id: str
    def __init__(self, node_id: _Optional[str] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class GetNodeResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: ObservedNode
    def __init__(self, node: _Optional[_Union[ObservedNode, _Mapping]] = ...) -> None: ...

class UnregisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "service_instance_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    service_instance_id: str
    def __init__(self, node_id: _Optional[str] = ..., service_instance_id: _Optional[str] = ...) -> None: ...

class UnregisterNodeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
