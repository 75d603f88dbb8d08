"""Every domain list, once: ceilings, strategies, node statuses, sandbox event
types, reservation states, the policy hash's fields and its bounds.

The Lua scripts read these from the include ``constants``, which the script
loader writes from this module (:mod:`scheduler.store.lua_constants`); the client,
the CLI, the gRPC servicer and the oracle read them from here.  The snapshot
fields are defined by the record itself (:class:`scheduler.domain.records.NodeSnapshot`).

Adding a count or allocation ceiling is one :data:`CEILINGS` row, its formula
in the Lua stage (``ceiling_use`` in lua/includes/stages.lua) and its formula
in the oracle (``ceiling_use`` in scheduler/testing/model.py).  The row order
is the order the ceilings stage checks them, so it decides which ceiling a
refusal names when several are reached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Strategy = Literal["least_loaded", "round_robin", "random"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
DEFAULT_STRATEGY: Strategy = "least_loaded"

#: A node's status as the wire spells it (NodeStatus without its prefix).
Status = Literal["UNSPECIFIED", "READY", "CONNECTING", "UNHEALTHY", "LINGERING"]
NODE_STATUSES: tuple[str, ...] = get_args(Status)

#: A sandbox event (SandboxEventType without its prefix).
EventType = Literal["CREATE", "DELETE", "PAUSE", "RESUME", "FORK"]
EVENT_TYPES: tuple[str, ...] = get_args(EventType)

#: A reservation is live until it ends exactly once, by one of the outcomes.
LIVE_STATES = ("pending", "assigned", "acked")
OUTCOMES = ("released", "cancelled", "expired")

#: Expired reservations a script call ends, at most (the sweep's bound).
SWEEP_BATCH = 64
#: The nodes, first by id, whose reasons a refusal counts, at most: a
#: refusal the placement index decides then reads that many records, not
#: the fleet.
REFUSAL_COUNTED = 64
#: The most nodes a Schedule's full scan reads (explain's dry run aside).
#: The full scan decides when the placement index cannot (an index being
#: built anew or rebuilt, stale nodes the sweeps have not taken out, an
#: index that disagreed with a record); on a larger fleet the Schedule is
#: refused as ``BEHIND`` instead (retry: the replicas' steps catch the
#: index up), because reading the fleet would hold Redis for longer than
#: any other call: 18-22 us a node, measured with explain at 200 to 20,000
#: nodes, so about 4 ms at this bound.
FULL_SCAN_MAX = 200
#: The one-heartbeat release (docs/design.md, the roster-mode heartbeat row):
#: a node's stamped heartbeat counts alone for an assigned reservation its
#: roster does not list when, placed on the cell's clock by the node's stamp
#: lead (the largest stamp minus arrival its instance showed, in windows of
#: STAMP_WINDOW_MS), it was taken at least STAMP_MARGIN_MS after the
#: assignment.  The margin bounds the smallest transit among the lead's
#: heartbeats, not the transit of the heartbeat judged.
STAMP_MARGIN_MS = 1_000
STAMP_WINDOW_MS = 600_000


@dataclass(frozen=True)
class Ceiling:
    """One ``node_resource_limit``: ``current + pending + this request <= limit``
    (after the placement), or for an observed one, the latest snapshot."""

    name: str
    #: what it counts: sandboxes, CPUs or memory
    counts: Literal["sandboxes", "cpu", "memory"]
    #: the unit of its limit
    unit: Literal["sandboxes", "cpus", "bytes", "percent"]
    #: its column title in ``schedctl nodes`` ("room <alias>")
    alias: str
    #: a percent of this capacity (cpu_count or memory_total_bytes); the ceiling
    #: cannot apply while the node has not reported it
    capacity: Literal["cpu", "memory"] | None = None
    #: observed utilisation: the snapshot field it reads; it cannot be
    #: projected, so it filters on the latest snapshot alone
    observed: str | None = None


CEILINGS: tuple[Ceiling, ...] = (
    Ceiling("max_sandbox_count", "sandboxes", "sandboxes", "sbx"),
    Ceiling("max_sandbox_starting_count", "sandboxes", "sandboxes", "starting"),
    Ceiling("max_sandbox_count_including_paused", "sandboxes", "sandboxes", "sbx+paused"),
    Ceiling("max_cpu_allocated_percent", "cpu", "percent", "cpu alloc", capacity="cpu"),
    Ceiling("max_memory_allocated_percent", "memory", "percent", "mem alloc", capacity="memory"),
    Ceiling("max_allocated_cpu_including_paused", "cpu", "cpus", "cpu+paused"),
    Ceiling("max_allocated_memory_bytes_including_paused", "memory", "bytes", "mem+paused"),
    Ceiling("max_cpu_used_percent", "cpu", "percent", "cpu used", observed="cpu_percent"),
    Ceiling(
        "max_memory_used_percent",
        "memory",
        "percent",
        "mem used",
        capacity="memory",
        observed="memory_used_bytes",
    ),
)


CEILING_NAMES: tuple[str, ...] = tuple(c.name for c in CEILINGS)


def ceiling(name: str) -> Ceiling:
    """The row of ``name`` (KeyError names the unknown ceiling)."""
    for c in CEILINGS:
        if c.name == name:
            return c
    raise KeyError(name)


def ceiling_reason(name: str, limit: int) -> str:
    """Why the ceilings stage excludes a node (lua/includes/stages.lua says the same)."""
    return f"at {name} ({limit})"


def ceiling_in(reason: str) -> Ceiling | None:
    """The ceiling a refusal reason names (:func:`ceiling_reason`), if it names one."""
    if not reason.startswith("at ") or not reason.endswith(")"):
        return None
    name = reason[3:].partition(" (")[0]
    return next((c for c in CEILINGS if c.name == name), None)


#: Bounds on input and on state that outlives its owner, with their defaults.
#: A bound equal to its default is absent from the stored policy hash, so a
#: cell stored before these existed reads the same; the scripts default alike.
BOUNDS_DEFAULTS: dict[str, int] = {
    "max_roster_ids": 4096,
    "node_forget_after_ms": 3_600_000,
    "reservation_tombstone_ttl_ms": 600_000,
    "artifact_key_max_bytes": 512,
}

#: Locality-aware placement (docs/design.md, "Locality"): the policy hash's
#: field -> its default.  A field equal to its default is absent from the
#: stored hash (a cell stored before these existed reads the same), and a
#: weight of 0 is locality off: every decision exactly as without it.
LOCALITY_DEFAULTS: dict[str, float | int] = {
    "locality_weight": 0.0,
    "locality_max_pressure_gap": 0.2,
    "locality_pending_decay": 1.0,
    "locality_headroom_share": 0.5,
    "locality_affinity_ttl_ms": 600_000,
    "locality_affinity_max_nodes": 16,
}

#: NodeSnapshot.admission_reason (upstream's enum, its numbers in the wire's
#: AdmissionReason) -> the refusal of a node that is not accepting sandboxes
#: names it by ("not accepting: disk cleanup").
ADMISSION_TEXT: dict[str, str] = {
    "UNSPECIFIED": "unspecified",
    "READY": "ready",
    "DISK_CLEANUP": "disk cleanup",
    "DISK_HARD_LIMIT": "disk hard limit",
    "CLEANUP_DEBT": "cleanup debt",
}
ADMISSION_REASONS = tuple(ADMISSION_TEXT)

#: The settings every stored policy has (Policy.to_fields writes them).
POLICY_SETTINGS = (
    "strategy",
    "report_ttl_ms",
    "binding_ttl_ms",
    "reservation_ttl_ms",
    "unassigned_reservation_ttl_ms",
    "overcommit_cpu",
    "overcommit_memory",
    "default_cpu",
    "default_memory_bytes",
    "static_nodes",
)
#: The drill clock (tests and drills only): Redis TIME + offset, or frozen.
CLOCK_FIELDS = ("time_offset_ms", "frozen_now_ms")
#: The placement index's layout, and the instant the cell last settled.
INDEX_FORMAT_FIELD = "index_format"
SETTLE_FIELD = "settle_ms"
#: While the placement index is rebuilt in bounded steps: the rebuild's epoch
#: (lua/includes/index_moves.lua start_rebuild; absent = the index is whole).
INDEX_REBUILD_FIELD = "index_rebuild"
#: Kept in the policy hash beside the policy, not part of it: a stored policy
#: is compared without them, and an overwrite keeps them.
BESIDE_POLICY = (
    *CLOCK_FIELDS,
    "packed",
    INDEX_FORMAT_FIELD,
    SETTLE_FIELD,
    INDEX_REBUILD_FIELD,
)
#: The policy hash's fields in the order the scripts keep them packed into one
#: string (lua/includes/common.lua raw_policy).  A packed string of another
#: order or length is never misread: the scripts then read the named fields.
PACKED = (
    *POLICY_SETTINGS,
    *CLOCK_FIELDS,
    *CEILING_NAMES,
    INDEX_FORMAT_FIELD,
    SETTLE_FIELD,
    INDEX_REBUILD_FIELD,
    *BOUNDS_DEFAULTS,
    *LOCALITY_DEFAULTS,
)
