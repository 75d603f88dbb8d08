"""Typed records that cross a boundary: API arguments and results, CLI JSON."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, get_type_hints

import msgspec

from scheduler.domain.catalog import EventType, Status

MIB = 1024 * 1024
#: Upper bounds for numbers that reach Redis: far above any real machine,
#: low enough that Lua's doubles stay exact (< 2**53).
MAX_CPU = 1 << 20
MAX_BYTES = 1 << 50
#: Sandbox counts: the placement index spells counts in 9 digits (lua/includes/index.lua).
MAX_COUNT = 100_000_000


class DiskMetric(msgspec.Struct, kw_only=True):
    mount_point: str = ""
    device: str = ""
    filesystem_type: str = ""
    used_bytes: int = 0
    total_bytes: int = 0


class MachineInfo(msgspec.Struct, kw_only=True):
    cpu_family: str = ""
    cpu_model: str = ""
    cpu_model_name: str = ""
    cpu_architecture: str = ""
    cpu_config_json: str = ""


@dataclass(frozen=True)
class Field:
    """How the scheduler takes one field of a node's snapshot."""

    #: a number's largest value (checked before Redis); 0 for a field that is no number
    maximum: int = 0
    #: a change moves the node in the placement index (lua/heartbeat-5.lua)
    index: bool = False
    #: a decision reads it: a whole number the index may spell (checked again in Lua)
    decides: bool = False


#: 2^53: counters and instants stay exact in Lua's doubles
MAX_COUNTER = 1 << 53
_Cpu = Annotated[int, Field(MAX_CPU, index=True, decides=True)]
_Bytes = Annotated[int, Field(MAX_BYTES, index=True, decides=True)]
_Count = Annotated[int, Field(MAX_COUNT, index=True, decides=True)]
_Counter = Annotated[int, Field(MAX_COUNTER)]


class NodeSnapshot(msgspec.Struct, kw_only=True):
    """A node's own numbers (docs/contract.md, NodeSnapshot), in wire order.
    Active set only in sandbox_count / allocated_*; paused load in the
    paused_* fields.  The one list of snapshot fields: the client, the
    servicer and the scripts (the generated include ``constants``) read it
    from here (:func:`snapshot_numbers`)."""

    status: Annotated[Status, Field(index=True)] = "READY"
    allocated_cpu: _Cpu = 0
    allocated_memory_bytes: _Bytes = 0
    cpu_percent: Annotated[int, Field(100_000, decides=True)] = 0
    cpu_count: _Cpu = 0
    memory_used_bytes: Annotated[int, Field(MAX_BYTES, decides=True)] = 0
    memory_total_bytes: _Bytes = 0
    disks: list[DiskMetric] = msgspec.field(default_factory=list)
    sandbox_count: _Count = 0
    sandbox_starting_count: _Count = 0
    create_successes: _Counter = 0
    create_fails: _Counter = 0
    reported_at_unix_ms: _Counter = 0
    paused_sandbox_count: _Count = 0
    paused_allocated_cpu: _Cpu = 0
    paused_allocated_memory_bytes: _Bytes = 0
    #: False: the node takes no new sandboxes (it is not chosen); None = absent = accepting
    accepting_sandboxes: Annotated[bool | None, Field()] = None
    #: why (scheduler/domain/catalog.py ADMISSION_REASONS), as upstream's enum names it
    admission_reason: Annotated[str, Field()] = "UNSPECIFIED"

    def admission(self) -> str:
        """The node record's ``admission`` field: "" while accepting, else the reason."""
        if self.accepting_sandboxes is False:
            return self.admission_reason or "UNSPECIFIED"
        return ""


@functools.cache
def snapshot_fields() -> Mapping[str, Field]:
    """NodeSnapshot's annotated fields, in wire order.  Worked out once:
    ``get_type_hints`` costs about 0.4 ms, and every heartbeat reads these."""
    hints = get_type_hints(NodeSnapshot, include_extras=True)
    out: dict[str, Field] = {}
    for name in NodeSnapshot.__struct_fields__:
        marks = [m for m in getattr(hints[name], "__metadata__", ()) if isinstance(m, Field)]
        if marks:
            out[name] = marks[0]
    return MappingProxyType(out)


@functools.cache
def snapshot_numbers() -> Mapping[str, Field]:
    """The snapshot's numbers (name -> how they are taken), in wire order."""
    return MappingProxyType({name: f for name, f in snapshot_fields().items() if f.maximum})


class Heartbeat(msgspec.Struct, kw_only=True):
    node_id: str
    service_instance_id: str
    cluster_id: str = ""
    version: str = ""
    commit: str = ""
    machine_info: MachineInfo = msgspec.field(default_factory=MachineInfo)
    snapshot: NodeSnapshot = msgspec.field(default_factory=NodeSnapshot)
    sandbox_ids: list[str] = msgspec.field(default_factory=list)
    p2p_backend: str = ""
    p2p_address: str = ""
    #: Only used to register a node when no static node list is configured.
    endpoint: str = ""


class HeartbeatResult(msgspec.Struct, kw_only=True):
    generation: int
    restarted: bool
    released: int
    roster_mode: bool
    now_ms: int
    #: the cluster's CPU config intersection, when this heartbeat delivers it
    #: (``heartbeat(..., cpu_config=True)``; "" otherwise)
    cpu_config_json: str = ""


#: upstream's bound on ScheduleRequestHint.locality_requirements, and its error text
MAX_LOCALITY_REQUIREMENTS = 32
TOO_MANY_LOCALITY = "too many locality requirements"


class LocalityRequirement(msgspec.Struct, kw_only=True, frozen=True):
    """An artifact a creation needs (ScheduleRequestHint.locality_requirements):
    ``key`` as the P2P artifact index names it, ``size_bytes`` what a node
    without it pulls (0 = unknown)."""

    key: str
    size_bytes: int = 0


class Request(msgspec.Struct, kw_only=True, frozen=True):
    """What a Schedule call asks for.  ``create=False`` routes a non-creating
    call: ranked the same way, nothing reserved, no capacity test.  An absent
    dimension of a creation (None) projects the policy's default_request.

    Locality (docs/design.md, "Locality"; on when the cell's
    ``locality.weight`` > 0): ``locality`` lists the artifacts the sandbox
    needs; without them, ``template_id`` (else the first of ``images``) names
    the group whose recent starters are warm (affinity)."""

    create: bool = True
    cpu: int | None = None
    memory_bytes: int | None = None
    locality: tuple[LocalityRequirement, ...] = ()
    template_id: str = ""
    images: tuple[str, ...] = ()

    @classmethod
    def cold(
        cls,
        cpu: int | None,
        memory_mb: int | None,
        images: tuple[str, ...] = (),
        locality: tuple[LocalityRequirement, ...] = (),
    ) -> Request:
        """POST /sandboxes-cold: 0 means absent, as on the wire."""
        return cls(
            cpu=cpu or None,
            memory_bytes=memory_mb * MIB if memory_mb else None,
            images=images,
            locality=locality,
        )

    @classmethod
    def template(
        cls, template_id: str = "", locality: tuple[LocalityRequirement, ...] = ()
    ) -> Request:
        """POST /sandboxes: a creation whose size the policy's default_request gives."""
        return cls(template_id=template_id, locality=locality)

    def group(self) -> str:
        """What affinity and the same-template decay group by: ``template:<id>``,
        else ``image:<first image>``, else "" (none)."""
        if self.template_id.strip():
            return "template:" + self.template_id.strip()
        if self.images and self.images[0].strip():
            return "image:" + self.images[0].strip()
        return ""

    @classmethod
    def route(cls) -> Request:
        return cls(create=False)


class Placement(msgspec.Struct, kw_only=True):
    node_id: str
    endpoint: str
    reservation_id: str | None
    pressure: float
    cpu: int
    memory_bytes: int
    status: str
    now_ms: int
    #: with locality: "full", "partial" or "cold" (what the chosen node holds); else ""
    warmth: str = ""
    #: with locality: bytes of the requirements the chosen node lacks (sizes given)
    pull_bytes: int = 0


class Verdict(msgspec.Struct, kw_only=True):
    """One node in an explanation: eligible (reason None) or why not."""

    node_id: str
    status: str
    reason: str | None
    pressure: float
    known_capacity: bool
    starting: int
    running: int
    paused: int
    projected_cpu: int
    projected_memory_bytes: int
    cpu_capacity: int
    memory_capacity_bytes: int
    endpoint: str
    rank: int | None = None
    chosen: bool = False
    #: with locality: the share of the request's artifacts the node holds (0..1)
    coverage: float = 0.0
    #: with locality: its bonus, in pressure units (weight x coverage, decayed)
    bonus: float = 0.0
    #: with locality: why this warm node did not win ("" = it won, or it is cold)
    locality: str = ""


class Explanation(msgspec.Struct, kw_only=True):
    now_ms: int
    strategy: str
    chosen: str | None
    rotation: int
    cpu: int
    memory_bytes: int
    refusal: str | None
    verdicts: list[Verdict]


class CeilingUse(msgspec.Struct, kw_only=True):
    name: str
    limit: int
    used: int
    headroom: float


class NodeView(msgspec.Struct, kw_only=True):
    node_id: str
    endpoint: str
    status: str
    reason: str | None
    pressure: float
    known_capacity: bool
    cpu_capacity: int
    cpu_allocated: int
    cpu_paused: int
    cpu_reserved: int
    cpu_projected: int
    memory_capacity_bytes: int
    memory_allocated_bytes: int
    memory_paused_bytes: int
    memory_reserved_bytes: int
    memory_projected_bytes: int
    sandbox_count: int
    sandbox_starting_count: int
    paused_sandbox_count: int
    pending_reservations: int
    cpu_percent: int
    memory_used_bytes: int
    lingering: bool
    static: bool
    cluster_id: str
    service_instance_id: str
    generation: int
    restarts: int
    last_seen_ms: int | None
    heartbeat_age_ms: int | None
    ceilings: list[CeilingUse]


class ListedNode(msgspec.Struct, kw_only=True):
    """A known node as ListNodes lists it."""

    node_id: str
    endpoint: str
    #: derived at read time (Redis time), as every view derives it
    status: str
    #: in the cell's static (or discovered) node list
    static: bool = False


class ObservedNode(msgspec.Struct, kw_only=True):
    """A node as the node service shows it (ListObservedNodes, GetNode); the
    snapshot's status is the derived one."""

    node_id: str
    endpoint: str = ""
    cluster_id: str = ""
    service_instance_id: str = ""
    version: str = ""
    commit: str = ""
    machine_info: MachineInfo = msgspec.field(default_factory=MachineInfo)
    snapshot: NodeSnapshot = msgspec.field(default_factory=NodeSnapshot)
    last_seen_unix_ms: int = 0


class Reservation(msgspec.Struct, kw_only=True):
    reservation_id: str
    node_id: str
    state: str
    cpu: int
    memory_bytes: int
    created_ms: int
    expires_ms: int
    sandbox_id: str | None = None
    ended_ms: int | None = None
    pressure: float | None = None


class AssignResult(msgspec.Struct, kw_only=True):
    reservation_id: str | None
    released: bool


class Binding(msgspec.Struct, kw_only=True):
    sandbox_id: str
    node_id: str
    endpoint: str
    expires_ms: int
    reservation_id: str | None
    listed: bool


class SandboxEvent(msgspec.Struct, kw_only=True):
    sandbox_id: str
    event_type: EventType
    requested_cpu: int = 0
    requested_memory_bytes: int = 0
    requested_disk_bytes: int = 0


class EventsResult(msgspec.Struct, kw_only=True):
    acked: int
    released: int


class Census(msgspec.Struct, kw_only=True):
    """The cell's node census (lua/census-5.lua): nodes by derived status, as
    the last finished pass over the fleet counted them."""

    #: Redis time the pass finished (ms); None before the first one
    done_ms: int | None
    #: passes finished so far
    passes: int = 0
    #: derived status -> nodes
    nodes: dict[str, int]


class RebuildStep(msgspec.Struct, kw_only=True):
    """One bounded step of the placement index's rebuild
    (lua/index_rebuild-5.lua)."""

    #: the index is whole: no rebuild under way after this step
    done: bool
    #: nodes this step reindexed (at most the step's budget)
    reindexed: int
    #: the rebuild's epoch ("" when none ever ran) and the last node id it
    #: reindexed ("" at the start or the end of a pass)
    epoch: str = ""
    cursor: str = ""


class Stats(msgspec.Struct, kw_only=True):
    pending: int
    reserved_total: int
    assigned_total: int
    released_total: int
    cancelled_total: int
    expired_total: int
    refused_total: int
    #: nodes removed by the forget sweep (silent for node_forget_after)
    forgotten_total: int = 0
