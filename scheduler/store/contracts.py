"""Each script's contract, declared once: its ARGV and its replies by name.

A script's ARGV is an :class:`Argv` (a msgspec array-like struct): its fields,
in order, are the script's ARGV, each one value, or a list that goes as
several (a variadic or grouped part); :meth:`Argv.wire` spells it as the
strings the call sends.  Its replies are :class:`Reply` structs, one per
form it can answer: fields in reply order, built from the reply with
:func:`head` (a fixed part, then ``TAIL``, the rows or values that follow,
when the form has one).  A mode ARGV takes a named constant below, never a
bare ``"0"``.

The header of each ``lua/<script>-<n>.lua`` names the same fields in the
same order (``ARGV[i]  name ...``, ``Returns {name, ...}``), and
tests/test_contracts.py reads every header against :data:`CONTRACTS`, so a
field renamed or moved on one side only fails there (docs/contract.md,
"Script contracts").  No I/O here, and nothing that changes what goes on the
wire: the struct only names what was positional.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import msgspec
from msgspec.structs import astuple

#: A reply value as Redis gives it: bytes (str from a decoding client) or an integer.
Value = Any

R = TypeVar("R", bound="Reply")

# -- modes (named ARGV values) ----------------------------------------------
#: schedule-5.lua ARGV[1] kind
KIND_CREATE = "create"
KIND_ROUTE = "route"
#: schedule-5.lua ARGV[2] dry_run
DECIDE = "0"
EXPLAIN = "1"
#: heartbeat-5.lua ARGV[6] roster_form: what follows the fields
ROSTER_SAME = "0"
ROSTER_FULL = "1"
ROSTER_DELTA = "2"
#: cancel-5.lua ARGV[2] mode
CANCEL = "0"
ABANDON = "1"
#: sync_policy-5.lua ARGV[1] mode
POLICY_CHECK = "0"
POLICY_OVERWRITE = "1"
POLICY_RESTORE = "r"
#: cpu_config-6.lua ARGV[1] op
CPU_INGEST = "ingest"
CPU_STORE = "store"
#: observed-5.lua ARGV[3] unheard, ARGV[4] form
HEARD_ONLY = "0"
WITH_UNHEARD = "1"
FORM_FULL = "full"
FORM_BRIEF = "brief"
#: stats-5.lua ARGV[1] part
STATS_COUNTERS = ""
STATS_POLICY = "policy"
#: advance_clock-5.lua ARGV[2] mode
CLOCK_ADVANCE = ""
CLOCK_FREEZE = "freeze"
CLOCK_THAW = "thaw"
#: a "1"/"0" flag (probe write, set_lingering lingering, a discovered node's
#: lingering, cpu_config restarted)
YES = "1"
NO = "0"
#: heartbeat_batch-5.lua: the kind of each heartbeat it holds
BATCH_FULL = "full"
BATCH_STEADY = "steady"
BATCH_CPUCFG = "cpucfg"
#: (the CPU config ingest of the heartbeat just before it, in the same trip)
BATCH_INGEST = "ingest"
#: a batch reply's outcome
BATCH_OK = "ok"
BATCH_ERR = "err"
#: (an ingest whose heartbeat did not apply: it did not run)
BATCH_SKIPPED = "skipped"
#: the answer of a delta that meets another record (heartbeat, heartbeat_steady)
RESYNC = "RESYNC"
#: the outcomes of cpu_config-6.lua and sync_begin-5.lua
CPU_DELIVER = "deliver"
CPU_NONE = "none"
CPU_COMPUTE = "compute"
SYNC_BEGUN = "begun"
SYNC_JOINED = "joined"
SYNC_DONE = "done"
DISCOVERY_STALE = "stale"
#: sync_begin-5.lua ARGV[2] kind
SYNC_STATIC = "static"
SYNC_DISCOVERED = "discovered"
#: rewound-5.lua ARGV[1] mode, and the settle's outcome
REWOUND_SETTLE = "settle"
REWOUND_RECONCILE = "reconcile"
REWOUND_SETTLED = "settled"
REWOUND_KNOWN = "known"
#: sync_policy-5.lua's outcomes
POLICY_CONFLICT = "conflict"


def flag(on: bool) -> str:
    return YES if on else NO


# -- the declarations ---------------------------------------------------------
class Argv(msgspec.Struct, array_like=True, frozen=True):
    """A script's ARGV by name: a field per ARGV (str), or per part of several
    (a list, sent in its place); a trailing field that is None is not sent."""

    def wire(self) -> list[str]:
        """The ARGV as sent, in field order."""
        values = astuple(self)
        shape = _SHAPES.get(type(self)) or _shape(type(self))
        if shape is _FLAT:
            return list(values)
        if shape is _OPTIONAL_LAST:  # (a schedule: every placement builds one)
            return list(values) if values[-1] is not None else list(values[:-1])
        out: list[str] = []
        for v in values:
            if isinstance(v, str):
                out.append(v)
            elif v is not None:
                out += v
        return out


#: the shapes of an Argv's fields, as wire() spells them: every field one
#: required value (the wire is the tuple); the same but the last, which may
#: be None (not sent then); any other
_FLAT = "flat"
_OPTIONAL_LAST = "optional last"
_GENERAL = "general"
_SHAPES: dict[type, str] = {}


def _shape(cls: type[Argv]) -> str:
    fields = msgspec.structs.fields(cls)
    one = [f.type is str and f.required for f in fields]
    shape = _FLAT if all(one) else _GENERAL
    if fields and not one[-1] and all(one[:-1]) and fields[-1].type == (str | None):
        shape = _OPTIONAL_LAST
    _SHAPES[cls] = shape
    return shape


class Reply(msgspec.Struct, array_like=True):
    """One form of a script's reply, by name.  ``TAIL`` says what follows the
    fields: "" nothing, a Reply class its rows, ``"pairs"`` rows of field,
    value, ..., any other name values (flat); ``TAG`` is the literal its
    first field holds when the form is told apart by one."""

    TAIL: ClassVar[Any] = ""
    TAG: ClassVar[str] = ""


def head(cls: type[R], reply: list[Value]) -> tuple[R, list[Value]]:
    """The reply's fixed part as ``cls`` and the rest (its ``TAIL``).  A reply
    shorter than the fixed part raises TypeError (an unreadable reply)."""
    n = len(cls.__struct_fields__)
    return cls(*reply[:n]), reply[n:]


def tagged(cls: type[Reply], reply: list[Value]) -> bool:
    """Is ``reply`` the form ``cls`` (its first field holds ``cls.TAG``)?"""
    tag = next(iter(reply), _Tagged)  # (its first value: every form has one)
    if tag is _Tagged:
        raise TypeError("an empty reply")
    return (tag.decode() if isinstance(tag, bytes) else str(tag)) == cls.TAG


def whole_reply(cls: type[R], reply: list[Value]) -> R:
    """The reply as ``cls``: too few values or too many raise TypeError."""
    return cls(*reply)


class _Tagged:
    """What :func:`tagged` reads from an empty reply (none has a tag)."""


class NoArgv(Argv, frozen=True):
    """A script that takes no ARGV."""


@dataclass(frozen=True)
class Scalar:
    """A reply that is one value, not a list (its name as the header gives it)."""

    name: str


@dataclass(frozen=True)
class Contract:
    """A script's KEYS (names, as its header lists them), its ARGV forms and
    its reply forms."""

    keys: tuple[str, ...]
    argv: tuple[type[Argv], ...]
    replies: tuple[type[Reply] | Scalar, ...]


FIXED_KEYS = ("base", "policy", "nodes", "stats", "expiry")


# -- rows shared by several replies ------------------------------------------
class PeerRow(Reply):
    node_id: Value
    backend: Value
    address: Value


class Rows(Reply):
    """A reply that is only rows of field, value (no fixed part)."""

    TAIL = "pairs"


class PolicyFields(Reply):
    """stats-5.lua's policy: field, value, ... (empty when there is none)."""

    TAIL = "fields"


class BatchItem(Reply):
    """One answer of a batch: ``BATCH_OK`` and that call's reply, or
    ``BATCH_ERR`` and "<CODE> <message>"."""

    TAIL = "reply"
    outcome: Value


class ResyncReply(Reply):
    TAG = RESYNC
    kind: Value


# -- schedule / schedule_batch -------------------------------------------------
class ScheduleArgv(Argv, frozen=True):
    kind: str
    dry_run: str
    strategy: str
    cpu: str
    memory_bytes: str
    reservation_id: str
    random: str
    #: absent without locality (a call main's scripts took before it)
    locality: str | None = None


class ScheduleDecision(Reply):
    node_id: Value
    endpoint: Value
    reservation_id: Value
    pressure: Value
    cpu: Value
    memory_bytes: Value
    status: Value
    now_ms: Value
    warmth: Value = b""
    pull_bytes: Value = 0


class Verdict(Reply):
    id: Value
    status: Value
    reason: Value
    pressure: Value
    known: Value
    starting: Value
    running: Value
    paused: Value
    projected_cpu: Value
    projected_memory: Value
    cpu_capacity: Value
    memory_capacity: Value
    endpoint: Value
    coverage: Value = "0"
    bonus: Value = "0"
    locality: Value = ""


class ScheduleExplanation(Reply):
    TAIL = Verdict
    now_ms: Value
    strategy: Value
    chosen: Value
    rotation: Value
    cpu: Value
    memory_bytes: Value
    refusal: Value


class ScheduleBatchArgv(Argv, frozen=True):
    count: str
    #: each request's ScheduleArgv, all of one width
    requests: list[str]


class BatchReply(Reply):
    TAIL = BatchItem


# -- heartbeats ------------------------------------------------------------------
class HeartbeatArgv(Argv, frozen=True):
    node_id: str
    service_instance_id: str
    endpoint: str
    base: str
    roster_digest: str
    roster_form: str
    field_count: str
    fields: list[str]
    #: ROSTER_FULL: the roster; ROSTER_DELTA: the base's digest, J, joined, left
    roster: list[str]


class HeartbeatReply(Reply):
    generation: Value
    restarted: Value
    released: Value
    roster_mode: Value
    now_ms: Value
    incarnation: Value


class SteadyArgv(Argv, frozen=True):
    node_id: str
    service_instance_id: str
    base: str
    reported_at: str


class SteadyReply(Reply):
    generation: Value
    roster_mode: Value
    now_ms: Value
    incarnation: Value


class HeartbeatBatchArgv(Argv, frozen=True):
    count: str
    #: each heartbeat's kind, its ARGV's length, its ARGV
    heartbeats: list[str]


# -- CPU configs -------------------------------------------------------------------
class CpuIngestArgv(Argv, frozen=True):
    op: str
    node_id: str
    cluster_id: str
    digest: str
    restarted: str


class CpuStoreArgv(Argv, frozen=True):
    op: str
    node_id: str
    cluster_id: str
    epoch: str
    result: str


class CpuDeliver(Reply):
    TAG = CPU_DELIVER
    kind: Value
    config: Value


class CpuNone(Reply):
    TAG = CPU_NONE
    kind: Value


class CpuCompute(Reply):
    TAG = CPU_COMPUTE
    TAIL = "configs"
    kind: Value
    epoch: Value


# -- lifecycle -------------------------------------------------------------------
class AssignArgv(Argv, frozen=True):
    sandbox_id: str
    node_id: str
    endpoint: str
    reservation_id: str


class AssignReply(Reply):
    reservation_id: Value
    released: Value
    now_ms: Value


class CancelArgv(Argv, frozen=True):
    reservation_id: str
    mode: str


class CancelReply(Reply):
    node_id: Value
    now_ms: Value


class ProbeArgv(Argv, frozen=True):
    write: str


class ProbeReply(Reply):
    now_ms: Value
    has_policy: Value
    raw_ms: Value
    sequence: Value
    generation: Value


class RewoundSettleArgv(Argv, frozen=True):
    mode: str
    #: the rewind generation the caller saw
    generation: str
    #: the cell time (ms) the caller expected, "" = no clock check
    expected_ms: str
    #: the clock bound (ms); (declared optional only because the reconcile
    #: form has no fourth value: the settle always sends it)
    bound_ms: str | None = None
    #: for a probe that read a lower generation than the caller saw: the
    #: generation it read (absent otherwise)
    probed: str | None = None


class RewoundReconcileArgv(Argv, frozen=True):
    mode: str
    #: cut-off (cell time, ms)
    before_ms: str
    #: most reservations to end
    most: str
    #: (no fourth value: the settle form's bound)
    spare: str | None = None
    #: (no fifth value: the settle form's probed generation)
    spare2: str | None = None


class RewoundSettled(Reply):
    outcome: Value
    generation: Value
    now_ms: Value
    moved_ms: Value
    age_ms: Value


class RewoundReconciled(Reply):
    ended: Value
    more: Value


class ReplayArgv(Argv, frozen=True):
    #: a placement made this long (ms) before the settle or less may be in flight
    grace_ms: str
    count: str
    #: each placement's (reservation id, node id, cpu, memory bytes,
    #: created_ms, pressure, sandbox id or "")
    placements: list[str]


class ReplayReply(Reply):
    live: Value
    ended: Value
    kept: Value
    unknown: Value


class RebuildArgv(Argv, frozen=True):
    mode: str
    step: str


class RebuildReply(Reply):
    done: Value
    reindexed: Value
    epoch: Value
    cursor: Value


class EventsArgv(Argv, frozen=True):
    node_id: str
    #: the node agent instance that sent them ("" = not said)
    service_instance_id: str
    #: sandbox_id, type of each event
    events: list[str]


class EventsReply(Reply):
    acked: Value
    released: Value
    now_ms: Value


class LookupArgv(Argv, frozen=True):
    sandbox_id: str


class LookupReply(Reply):
    node_id: Value
    endpoint: Value
    expires_ms: Value
    reservation_id: Value
    listed: Value
    now_ms: Value


class UnregisterArgv(Argv, frozen=True):
    node_id: str
    service_instance_id: str


class UnregisterReply(Reply):
    removed: Value
    now_ms: Value


# -- fleet and policy ----------------------------------------------------------------
class SyncBeginArgv(Argv, frozen=True):
    #: the new pass's token
    token: str
    #: SYNC_STATIC or SYNC_DISCOVERED
    kind: str
    #: the list's digest (a live pass of the same is joined)
    digest: str
    #: YES a non-empty list, NO an empty one
    listed: str
    #: the 3 watch positions (discovered), none (static)
    positions: list[str]


class SyncBeginReply(Reply):
    TAIL = "positions"
    outcome: Value
    token: Value


class SyncStageArgv(Argv, frozen=True):
    token: str
    #: node_id, endpoint, lingering ("" for a static list) of each node
    nodes: list[str]


class SyncStageReply(Reply):
    changed: Value


class SyncWalkArgv(Argv, frozen=True):
    token: str
    #: nodes read at most
    step: str


class SyncWalkReply(Reply):
    done: Value
    changed: Value
    removed: Value


class SetLingeringArgv(Argv, frozen=True):
    node_id: str
    lingering: str


class SetLingeringReply(Reply):
    previous: Value


class SyncPolicyArgv(Argv, frozen=True):
    mode: str
    #: field, value of the wanted policy
    fields: list[str]


class SyncPolicyReply(Reply):
    TAIL = "stored"
    outcome: Value


class ReservationsArgv(Argv, frozen=True):
    node_id: str
    reservation_id: str
    after: str
    page: str


class ReservationsReply(Reply):
    """The next page's ``after``, then a field, value row per reservation."""

    TAIL = "pairs"
    next: Value


class StatsArgv(Argv, frozen=True):
    part: str


class StatsCounters(Reply):
    TAIL = "counters"
    pending: Value


class CensusArgv(Argv, frozen=True):
    step: str


class CensusReply(Reply):
    TAIL = "counts"
    done_ms: Value
    passes: Value


class ObservedArgv(Argv, frozen=True):
    node_id: str
    cluster_id: str
    unheard: str
    form: str
    after: str
    page: str


class NodesViewArgv(Argv, frozen=True):
    node_id: str
    after: str
    page: str


class NodesReply(Reply):
    """now_ms, the next page's ``after``, then a field, value row per node
    (nodes_view)."""

    TAIL = "pairs"
    now_ms: Value
    next: Value


class ObservedReply(Reply):
    TAIL = "pairs"
    now_ms: Value
    next: Value


class SweepReply(Reply):
    forgotten: Value
    expired: Value
    now_ms: Value


class ReplicaSeenArgv(Argv, frozen=True):
    replica_id: str
    ttl_ms: str
    #: field, value of the entry
    fields: list[str]


class NowReply(Reply):
    now_ms: Value


class AdvanceClockArgv(Argv, frozen=True):
    ms: str
    mode: str


# -- P2P artifacts ------------------------------------------------------------------
class PeerListArgv(Argv, frozen=True):
    cluster_id: str
    backend: str
    exclude: str
    after: str
    page: str
    ids: list[str]


class PeerMembersArgv(Argv, frozen=True):
    cluster_id: str


class PeerMembersReply(Reply):
    TAIL = "ids"


class PeersReply(Reply):
    TAIL = PeerRow
    now_ms: Value
    next: Value


class HoldersReply(Reply):
    """An artifact's holders (artifact_lookup): their ids, whose rows the
    client then reads as peer_list's, filtered as the peers are."""

    TAIL = "ids"
    now_ms: Value


class ArtifactRecordArgv(Argv, frozen=True):
    digest: str
    name: str
    node_id: str
    capacity: str
    key_sha1: str


class ArtifactRecordReply(Reply):
    evicted: Value
    now_ms: Value


class ArtifactForgetArgv(Argv, frozen=True):
    digest: str
    node_id: str


class ArtifactForgetReply(Reply):
    held: Value


class ArtifactLookupArgv(Argv, frozen=True):
    digest: str


_ART_KEYS = (*FIXED_KEYS, "art-lru", "art-names")

#: Every script's contract, by script name (lua/<name>-<n>.lua).
CONTRACTS: dict[str, Contract] = {
    "advance_clock": Contract(FIXED_KEYS, (AdvanceClockArgv,), (Scalar("now_ms"),)),
    "artifact_forget": Contract(_ART_KEYS, (ArtifactForgetArgv,), (ArtifactForgetReply,)),
    "artifact_lookup": Contract(_ART_KEYS, (ArtifactLookupArgv,), (HoldersReply,)),
    "artifact_record": Contract(_ART_KEYS, (ArtifactRecordArgv,), (ArtifactRecordReply,)),
    "assign": Contract(FIXED_KEYS, (AssignArgv,), (AssignReply,)),
    "cancel": Contract(FIXED_KEYS, (CancelArgv,), (CancelReply,)),
    "census": Contract(FIXED_KEYS, (CensusArgv,), (CensusReply,)),
    "cpu_config": Contract(
        (*FIXED_KEYS, "cpucfg"), (CpuIngestArgv, CpuStoreArgv), (CpuDeliver, CpuNone, CpuCompute)
    ),
    "events": Contract(FIXED_KEYS, (EventsArgv,), (EventsReply,)),
    "heartbeat": Contract(FIXED_KEYS, (HeartbeatArgv,), (HeartbeatReply, ResyncReply)),
    "heartbeat_batch": Contract(FIXED_KEYS, (HeartbeatBatchArgv,), (BatchReply,)),
    "heartbeat_steady": Contract(FIXED_KEYS, (SteadyArgv,), (SteadyReply, ResyncReply)),
    "lookup": Contract(FIXED_KEYS, (LookupArgv,), (LookupReply,)),
    "nodes_view": Contract(FIXED_KEYS, (NodesViewArgv,), (NodesReply,)),
    "observed": Contract(FIXED_KEYS, (ObservedArgv,), (ObservedReply,)),
    "peer_list": Contract(FIXED_KEYS, (PeerListArgv,), (PeersReply,)),
    "peer_members": Contract(FIXED_KEYS, (PeerMembersArgv,), (PeerMembersReply,)),
    "index_rebuild": Contract(FIXED_KEYS, (RebuildArgv,), (RebuildReply,)),
    "probe": Contract(FIXED_KEYS, (ProbeArgv,), (ProbeReply,)),
    "replica_seen": Contract(FIXED_KEYS, (ReplicaSeenArgv,), (NowReply,)),
    "rewound": Contract(
        FIXED_KEYS,
        (RewoundSettleArgv, RewoundReconcileArgv),
        (RewoundSettled, RewoundReconciled),
    ),
    "replay": Contract(FIXED_KEYS, (ReplayArgv,), (ReplayReply,)),
    "reservations": Contract(FIXED_KEYS, (ReservationsArgv,), (ReservationsReply,)),
    "schedule": Contract(
        (*FIXED_KEYS, "rr"), (ScheduleArgv,), (ScheduleDecision, ScheduleExplanation)
    ),
    "schedule_batch": Contract((*FIXED_KEYS, "rr"), (ScheduleBatchArgv,), (BatchReply,)),
    "set_lingering": Contract(FIXED_KEYS, (SetLingeringArgv,), (SetLingeringReply,)),
    "settle": Contract(FIXED_KEYS, (NoArgv,), (Scalar("now_ms"),)),
    "stats": Contract(FIXED_KEYS, (StatsArgv,), (StatsCounters, PolicyFields)),
    "sweep": Contract(FIXED_KEYS, (NoArgv,), (SweepReply,)),
    "sync_begin": Contract(FIXED_KEYS, (SyncBeginArgv,), (SyncBeginReply,)),
    "sync_stage": Contract(FIXED_KEYS, (SyncStageArgv,), (SyncStageReply,)),
    "sync_walk": Contract(FIXED_KEYS, (SyncWalkArgv,), (SyncWalkReply,)),
    "sync_policy": Contract(FIXED_KEYS, (SyncPolicyArgv,), (SyncPolicyReply,)),
    "unregister": Contract(FIXED_KEYS, (UnregisterArgv,), (UnregisterReply,)),
}
