"""The cell's shared policy: what every replica must agree on.

Stored in ``<base>policy`` as a flat hash of readable fields (see
:meth:`Policy.to_fields`); the Lua side reads the same names
(``load_policy`` in lua/includes/common.lua, the names generated from
:mod:`scheduler.domain.catalog`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from scheduler.domain.catalog import (
    BOUNDS_DEFAULTS,
    CEILING_NAMES,
    CEILINGS,
    DEFAULT_STRATEGY,
    LOCALITY_DEFAULTS,
    STRATEGIES,
)
from scheduler.domain.errors import InvalidArgument
from scheduler.domain.records import MAX_BYTES, MAX_CPU

MAX_ROSTER_IDS = 1_000_000
#: artifact_key_max_bytes may be raised up to this (scheduler/store/p2p.py MAX_KEY)
MAX_ARTIFACT_KEY_BYTES = 4096
YEAR_MS = 365 * 86_400_000


class _Limits(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    def active(self) -> dict[str, int]:
        """The configured ceilings (limit > 0), in the order the stage checks them."""
        return {n: getattr(self, n) for n in CEILING_NAMES if getattr(self, n) > 0}


if TYPE_CHECKING:

    class Limits(_Limits):
        """``node_resource_limit``: one int field per catalog ceiling."""

        def __init__(self, **ceilings: int) -> None: ...
        def __getattr__(self, name: str) -> int: ...
else:
    #: ``node_resource_limit``: one field per :data:`scheduler.domain.catalog.CEILINGS`
    #: row, 0 or absent = no ceiling (as in the reference).
    Limits = msgspec.defstruct(
        "Limits",
        [(c.name, int, 0) for c in CEILINGS],
        bases=(_Limits,),
        module=__name__,
        kw_only=True,
    )


class Overcommit(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    cpu: float = 1.0
    memory: float = 1.0


class DefaultRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    cpu: int = 0
    memory_mb: int = 0


#: locality.affinity_max_nodes may be raised up to this
MAX_AFFINITY_NODES = 1024


class Locality(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Locality-aware placement (docs/design.md, "Locality").  ``weight`` 0 is
    off: every decision exactly as without locality."""

    #: the largest bonus, in pressure units, a node holding everything gets
    weight: float = float(LOCALITY_DEFAULTS["locality_weight"])
    #: a warm node wins only while its pressure is within this of the coolest
    max_pressure_gap: float = float(LOCALITY_DEFAULTS["locality_max_pressure_gap"])
    #: the bonus is divided by 1 + this x the node's pending starts of the group
    pending_decay: float = float(LOCALITY_DEFAULTS["locality_pending_decay"])
    #: > 0: the gap is at most this share of the coolest node's headroom (1 - pressure)
    headroom_share: float = float(LOCALITY_DEFAULTS["locality_headroom_share"])
    #: how long a node that started a template (or first image) stays warm for it
    affinity_ttl_ms: int = int(LOCALITY_DEFAULTS["locality_affinity_ttl_ms"])
    #: the most recent starters kept per template (or first image)
    affinity_max_nodes: int = int(LOCALITY_DEFAULTS["locality_affinity_max_nodes"])

    def fields(self) -> dict[str, str]:
        values: dict[str, float | int] = {
            "locality_weight": float(self.weight),
            "locality_max_pressure_gap": float(self.max_pressure_gap),
            "locality_pending_decay": float(self.pending_decay),
            "locality_headroom_share": float(self.headroom_share),
            "locality_affinity_ttl_ms": self.affinity_ttl_ms,
            "locality_affinity_max_nodes": self.affinity_max_nodes,
        }
        return {
            k: repr(v) if isinstance(v, float) else str(v)
            for k, v in values.items()
            if v != LOCALITY_DEFAULTS[k]
        }

    @classmethod
    def of_fields(cls, f: dict[str, str]) -> Locality:
        d = LOCALITY_DEFAULTS
        return cls(
            weight=float(f.get("locality_weight", d["locality_weight"])),
            max_pressure_gap=float(
                f.get("locality_max_pressure_gap", d["locality_max_pressure_gap"])
            ),
            pending_decay=float(f.get("locality_pending_decay", d["locality_pending_decay"])),
            headroom_share=float(f.get("locality_headroom_share", d["locality_headroom_share"])),
            affinity_ttl_ms=int(f.get("locality_affinity_ttl_ms", d["locality_affinity_ttl_ms"])),
            affinity_max_nodes=int(
                f.get("locality_affinity_max_nodes", d["locality_affinity_max_nodes"])
            ),
        )

    def validate(self) -> None:
        if not 0 <= self.weight <= 10:
            raise InvalidArgument("locality.weight", f"must be in [0, 10], not {self.weight}")
        if not 0 <= self.max_pressure_gap <= 10:
            raise InvalidArgument(
                "locality.max_pressure_gap", f"must be in [0, 10], not {self.max_pressure_gap}"
            )
        if not 0 <= self.pending_decay <= 100:
            raise InvalidArgument(
                "locality.pending_decay", f"must be in [0, 100], not {self.pending_decay}"
            )
        if not 0 <= self.headroom_share <= 1:
            raise InvalidArgument(
                "locality.headroom_share", f"must be in [0, 1], not {self.headroom_share}"
            )
        if not 1 <= self.affinity_ttl_ms <= YEAR_MS:
            raise InvalidArgument(
                "locality.affinity_ttl",
                f"must be between 1 ms and a year, not {self.affinity_ttl_ms}",
            )
        if not 1 <= self.affinity_max_nodes <= MAX_AFFINITY_NODES:
            raise InvalidArgument(
                "locality.affinity_max_nodes",
                f"must be 1..{MAX_AFFINITY_NODES}, not {self.affinity_max_nodes}",
            )


class Policy(msgspec.Struct, kw_only=True):
    strategy: str = DEFAULT_STRATEGY
    report_ttl_ms: int = 30_000
    binding_ttl_ms: int = 30_000
    reservation_ttl_ms: int = 600_000
    #: A reservation no RecordAssignment claimed ends (expired) this long after
    #: its Schedule: its create was never sent, failed unseen, or its answer
    #: never reached the gateway (docs/design.md, "unassigned_reservation_ttl").
    unassigned_reservation_ttl_ms: int = 90_000
    limits: Limits = msgspec.field(default_factory=Limits)
    overcommit: Overcommit = msgspec.field(default_factory=Overcommit)
    default_request: DefaultRequest = msgspec.field(default_factory=DefaultRequest)
    #: True when a static node list is configured: heartbeats from other nodes are refused.
    static_nodes: bool = False
    #: A heartbeat roster longer than this is refused (INVALID_ARGUMENT sandbox_ids).
    max_roster_ids: int = BOUNDS_DEFAULTS["max_roster_ids"]
    #: A node silent this long (and at least report_ttl_ms: only stale nodes go)
    #: is forgotten; a static node keeps a bare record.  0 = never.
    node_forget_after_ms: int = BOUNDS_DEFAULTS["node_forget_after_ms"]
    #: How long an ended reservation stays readable.
    reservation_tombstone_ttl_ms: int = BOUNDS_DEFAULTS["reservation_tombstone_ttl_ms"]
    #: Longest artifact key (UTF-8 bytes) RecordP2pArtifact and friends accept.
    artifact_key_max_bytes: int = BOUNDS_DEFAULTS["artifact_key_max_bytes"]
    #: locality-aware placement; weight 0 (the default) is off
    locality: Locality = msgspec.field(default_factory=Locality)

    def validate(self) -> Policy:
        if self.strategy not in STRATEGIES:
            raise InvalidArgument(
                "strategy", f"must be one of {', '.join(STRATEGIES)}, not {self.strategy!r}"
            )
        for name in (
            "report_ttl_ms",
            "binding_ttl_ms",
            "reservation_ttl_ms",
            "unassigned_reservation_ttl_ms",
            "reservation_tombstone_ttl_ms",
        ):
            v = getattr(self, name)
            if not 1 <= v <= YEAR_MS:
                raise InvalidArgument(name, f"must be between 1 ms and a year, not {v}")
        if not 0 <= self.node_forget_after_ms <= YEAR_MS:
            raise InvalidArgument(
                "node_forget_after_ms",
                f"must be 0 (never) or at most a year, not {self.node_forget_after_ms}",
            )
        if not 1 <= self.max_roster_ids <= MAX_ROSTER_IDS:
            raise InvalidArgument(
                "max_roster_ids", f"must be 1..{MAX_ROSTER_IDS}, not {self.max_roster_ids}"
            )
        if not 1 <= self.artifact_key_max_bytes <= MAX_ARTIFACT_KEY_BYTES:
            raise InvalidArgument(
                "artifact_key_max_bytes",
                f"must be 1..{MAX_ARTIFACT_KEY_BYTES}, not {self.artifact_key_max_bytes}",
            )
        for name in CEILING_NAMES:
            v = getattr(self.limits, name)
            if not 0 <= v <= MAX_BYTES:
                raise InvalidArgument(f"node_resource_limit.{name}", f"must be 0..{MAX_BYTES}")
        for dim in ("cpu", "memory"):
            v = getattr(self.overcommit, dim)
            if not 0 < v <= 1000:
                raise InvalidArgument(f"overcommit.{dim}", f"must be in (0, 1000], not {v}")
        if not 0 <= self.default_request.cpu <= MAX_CPU:
            raise InvalidArgument("default_request.cpu", f"must be 0..{MAX_CPU}")
        if not 0 <= self.default_request.memory_mb * 1024 * 1024 <= MAX_BYTES:
            raise InvalidArgument("default_request.memory_mb", "is out of range")
        self.locality.validate()
        return self

    def to_fields(self) -> dict[str, str]:
        """The flat hash stored in Redis.  Unset ceilings are absent."""
        f = {
            "strategy": self.strategy,
            "report_ttl_ms": str(self.report_ttl_ms),
            "binding_ttl_ms": str(self.binding_ttl_ms),
            "reservation_ttl_ms": str(self.reservation_ttl_ms),
            "unassigned_reservation_ttl_ms": str(self.unassigned_reservation_ttl_ms),
            "overcommit_cpu": repr(float(self.overcommit.cpu)),
            "overcommit_memory": repr(float(self.overcommit.memory)),
            "default_cpu": str(self.default_request.cpu),
            "default_memory_bytes": str(self.default_request.memory_mb * 1024 * 1024),
            "static_nodes": "1" if self.static_nodes else "0",
        }
        f.update({k: str(v) for k, v in self.limits.active().items()})
        f.update(
            {
                k: str(getattr(self, k))
                for k, default in BOUNDS_DEFAULTS.items()
                if getattr(self, k) != default
            }
        )
        f.update(self.locality.fields())
        return f

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> Policy:
        limits = Limits(**{n: int(f[n]) for n in CEILING_NAMES if n in f})
        return cls(
            strategy=f.get("strategy", DEFAULT_STRATEGY),
            report_ttl_ms=int(f.get("report_ttl_ms", 30_000)),
            binding_ttl_ms=int(f.get("binding_ttl_ms", 30_000)),
            reservation_ttl_ms=int(f.get("reservation_ttl_ms", 600_000)),
            unassigned_reservation_ttl_ms=int(f.get("unassigned_reservation_ttl_ms", 90_000)),
            limits=limits,
            overcommit=Overcommit(
                cpu=float(f.get("overcommit_cpu", 1.0)),
                memory=float(f.get("overcommit_memory", 1.0)),
            ),
            default_request=DefaultRequest(
                cpu=int(f.get("default_cpu", 0)),
                memory_mb=int(f.get("default_memory_bytes", 0)) // (1024 * 1024),
            ),
            static_nodes=f.get("static_nodes") == "1",
            **{k: int(f.get(k, default)) for k, default in BOUNDS_DEFAULTS.items()},
            locality=Locality.of_fields(f),
        )
