"""Script replies as records: what the scripts answer, typed.

Each parser takes one script's reply (the shapes their headers state under
"Returns") and builds the records of :mod:`scheduler.domain.records`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import msgspec

from scheduler.domain.catalog import (
    ADMISSION_REASONS,
    CEILING_NAMES,
    NODE_STATUSES,
    Status,
    ceiling,
)
from scheduler.domain.errors import CorruptState
from scheduler.domain.records import (
    CeilingUse,
    DiskMetric,
    Explanation,
    ListedNode,
    MachineInfo,
    NodeSnapshot,
    NodeView,
    ObservedNode,
    Reservation,
    Verdict,
    snapshot_numbers,
)
from scheduler.store import contracts as c
from scheduler.store.contracts import head, whole_reply

T = TypeVar("T")


def s(v: Any) -> str:
    """A reply value as text."""
    return v.decode() if isinstance(v, bytes) else str(v)


#: What a parser raises on a reply it cannot read (a field that is not a
#: number, a row of the wrong shape, a missing field)
UNREADABLE = (ValueError, KeyError, TypeError, IndexError, AttributeError)


def parsed(script: str, parse: Callable[[Any], T], reply: Any) -> T:
    """``parse(reply)``; a reply it cannot read is :class:`CorruptState`
    naming the script (the parsers below name the key and field where they
    can), never a traceback."""
    try:
        return parse(reply)
    except UNREADABLE as e:
        raise CorruptState(
            f"the reply of {script} cannot be read ({type(e).__name__}: {e}): the cell holds "
            "state this version cannot read; `schedctl doctor` checks it"
        ) from None


def corrupt(key: str, field: str, value: Any, want: str) -> CorruptState:
    return CorruptState(
        f"corrupt record {key}: field {field} is {s(value)!r}, not {want}; "
        "`schedctl doctor` checks the cell"
    )


def whole(f: dict[str, str], field: str, key: str, minimum: int | None = 0) -> int:
    """Field ``field`` of record ``key`` as an integer (absent or "" = 0),
    at least ``minimum``; else :class:`CorruptState` naming both."""
    v = f.get(field)
    if v is None or v == "":
        return 0
    try:
        x = int(v)
    except ValueError:
        raise corrupt(key, field, v, "an integer") from None
    if minimum is not None and x < minimum:
        raise corrupt(key, field, v, f"an integer >= {minimum}")
    return x


def real(f: dict[str, str], field: str, key: str) -> float:
    v = f.get(field)
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise corrupt(key, field, v, "a number") from None
    if x != x:  # NaN
        raise corrupt(key, field, v, "a number")
    return x


def required(f: dict[str, str], field: str, key: str) -> str:
    v = f.get(field)
    if v is None:
        raise CorruptState(f"corrupt record {key}: field {field} is missing")
    return v


def pairs(flat: list[Any]) -> dict[str, str]:
    """A flat field, value, ... reply as a dict."""
    it = iter(flat)
    return {s(k): s(v) for k, v in zip(it, it, strict=False)}


def opt_int(v: Any) -> int | None:
    return None if v in (None, "", b"") else int(v)


def rank_key(
    known: bool, pressure: float, starting: int, running: int, paused: int
) -> tuple[int, float, int, int, int]:
    """least_loaded order (lua/includes/stages.lua ranks_before): smaller
    ranks first; equal keys rotate."""
    return (0 if known else 1, pressure, starting, running, paused)


def parse_explanation(r: list[Any]) -> Explanation:
    """lua/schedule-5.lua's dry-run reply (contracts.ScheduleExplanation)."""
    e, rows = head(c.ScheduleExplanation, r)
    verdicts = []
    for row in rows:
        row_ = whole_reply(c.Verdict, row)
        verdicts.append(
            Verdict(
                node_id=s(row_.id),
                status=s(row_.status),
                reason=s(row_.reason) or None,
                pressure=float(s(row_.pressure)),
                known_capacity=s(row_.known) == c.YES,
                starting=int(s(row_.starting)),
                running=int(s(row_.running)),
                paused=int(s(row_.paused)),
                projected_cpu=int(s(row_.projected_cpu)),
                projected_memory_bytes=int(s(row_.projected_memory)),
                cpu_capacity=int(s(row_.cpu_capacity)),
                memory_capacity_bytes=int(s(row_.memory_capacity)),
                endpoint=s(row_.endpoint),
                coverage=float(s(row_.coverage)),
                bonus=float(s(row_.bonus)),
                locality=s(row_.locality),
            )
        )
    chosen = s(e.chosen) or None
    eligible = sorted(
        (v for v in verdicts if v.reason is None),
        key=lambda v: (
            rank_key(v.known_capacity, v.pressure, v.starting, v.running, v.paused),
            v.node_id,
        ),
    )
    for i, v in enumerate(eligible, 1):
        v.rank = i
    for v in verdicts:
        v.chosen = v.node_id == chosen
    return Explanation(
        now_ms=int(e.now_ms),
        strategy=s(e.strategy),
        chosen=chosen,
        rotation=int(e.rotation),
        cpu=int(e.cpu),
        memory_bytes=int(e.memory_bytes),
        refusal=s(e.refusal) or None,
        verdicts=verdicts,
    )


#: The record field of each capacity a percent ceiling is a share of.
CAPACITY_FIELDS = {"cpu": "cpu_count", "memory": "memory_total_bytes"}


def _headroom(name: str, limit: int, used: int, f: dict[str, str]) -> float:
    """Room left under a ceiling, in its unit."""
    capacity = ceiling(name).capacity
    if capacity is not None:
        cap = int(f.get(CAPACITY_FIELDS[capacity], 0) or 0)
        return limit - used * 100 / cap if cap else float(limit)
    return float(limit - used)


def parse_nodes_view(r: list[Any]) -> tuple[int, str, list[NodeView]]:
    """(now_ms, the next page's ``after``: "" for the last, the views)."""
    a, rows = head(c.NodesReply, r)
    now = int(a.now_ms)
    views = []
    for row in rows:
        f = pairs(row)
        key = f"node:{f.get('node_id', '?')}"

        def i(name: str, f: dict[str, str] = f, key: str = key) -> int:
            return whole(f, name, key)

        ceilings: list[CeilingUse] = []
        last_seen = opt_int(f.get("last_seen_ms"))
        views.append(
            NodeView(
                node_id=required(f, "node_id", key),
                endpoint=f.get("endpoint", ""),
                status=required(f, "derived_status", key),
                reason=f.get("reason") or None,
                pressure=real(f, "pressure", key),
                known_capacity=f.get("known") == "1",
                cpu_capacity=i("cpu_count"),
                cpu_allocated=i("allocated_cpu"),
                cpu_paused=i("paused_allocated_cpu"),
                cpu_reserved=i("pending_cpu"),
                cpu_projected=i("allocated_cpu") + i("paused_allocated_cpu") + i("pending_cpu"),
                memory_capacity_bytes=i("memory_total_bytes"),
                memory_allocated_bytes=i("allocated_memory_bytes"),
                memory_paused_bytes=i("paused_allocated_memory_bytes"),
                memory_reserved_bytes=i("pending_memory_bytes"),
                memory_projected_bytes=i("allocated_memory_bytes")
                + i("paused_allocated_memory_bytes")
                + i("pending_memory_bytes"),
                sandbox_count=i("sandbox_count"),
                sandbox_starting_count=i("sandbox_starting_count"),
                paused_sandbox_count=i("paused_sandbox_count"),
                pending_reservations=i("pending_count"),
                cpu_percent=i("cpu_percent"),
                memory_used_bytes=i("memory_used_bytes"),
                lingering=f.get("lingering") == "1",
                static=f.get("static") == "1",
                cluster_id=f.get("cluster_id", ""),
                service_instance_id=f.get("service_instance_id", ""),
                generation=i("generation"),
                restarts=i("restarts"),
                last_seen_ms=last_seen,
                heartbeat_age_ms=None if last_seen is None else now - last_seen,
                ceilings=ceilings,
            )
        )
        for key in list(f):
            if key.startswith("use:"):
                name = key[4:]
                limit = whole(f, f"limit:{name}", f"node:{f['node_id']}", None)
                used = whole(f, key, f"node:{f['node_id']}", None)
                ceilings.append(
                    CeilingUse(
                        name=name, limit=limit, used=used, headroom=_headroom(name, limit, used, f)
                    )
                )
        ceilings.sort(key=lambda c: CEILING_NAMES.index(c.name))
    return now, s(a.next), views


def parse_reservation(f: dict[str, str]) -> Reservation:
    key = f"res:{f.get('reservation_id', '?')}"
    return Reservation(
        reservation_id=required(f, "reservation_id", key),
        node_id=required(f, "node_id", key),
        state=required(f, "state", key),
        cpu=whole(f, "cpu", key),
        memory_bytes=whole(f, "memory_bytes", key),
        created_ms=whole(f, "created_ms", key),
        expires_ms=whole(f, "expires_ms", key),
        sandbox_id=f.get("sandbox_id") or None,
        ended_ms=whole(f, "ended_ms", key) if f.get("ended_ms") else None,
        pressure=real(f, "pressure", key) if f.get("pressure") else None,
    )


_disks = msgspec.json.Decoder(list[DiskMetric])


def parse_listed(r: list[Any]) -> tuple[str, list[ListedNode]]:
    """lua/observed-5.lua in its brief form: the next page's ``after`` and the rows."""
    a, rows = head(c.ObservedReply, r)
    return s(a.next), [
        ListedNode(
            node_id=f.get("node_id", ""),
            endpoint=f.get("endpoint", ""),
            status=f.get("derived_status", ""),
            static=f.get("static") == "1",
        )
        for f in map(pairs, rows)
    ]


def parse_observed(r: list[Any]) -> tuple[str, list[ObservedNode]]:
    """lua/observed-5.lua in its full form: the next page's ``after``, and each
    record as the node service shows it (a status the wire does not know
    reads UNSPECIFIED; disks that do not decode read none)."""
    a, rows = head(c.ObservedReply, r)
    return s(a.next), [observed_node(f) for f in map(pairs, rows)]


def observed_node(f: dict[str, str]) -> ObservedNode:
    key = f"node:{f.get('node_id', '?')}"

    def i(name: str) -> int:
        return whole(f, name, key)

    try:
        disks = _disks.decode(f["disks"]) if f.get("disks") else []
    except msgspec.DecodeError:
        disks = []
    status = f.get("derived_status", "")
    admission = f.get("admission", "")
    snapshot = NodeSnapshot(
        status=cast(Status, status if status in NODE_STATUSES else "UNSPECIFIED"),
        disks=disks,
        **{name: i(name) for name in snapshot_numbers()},
        # (stored as one field: "" while accepting, else the reason)
        accepting_sandboxes=False if admission else None,
        admission_reason=admission if admission in ADMISSION_REASONS else "UNSPECIFIED",
    )
    return ObservedNode(
        node_id=f.get("node_id", ""),
        endpoint=f.get("endpoint", ""),
        cluster_id=f.get("cluster_id", ""),
        service_instance_id=f.get("service_instance_id", ""),
        version=f.get("version", ""),
        commit=f.get("commit", ""),
        machine_info=MachineInfo(**{n: f.get(n, "") for n in MachineInfo.__struct_fields__}),
        snapshot=snapshot,
        last_seen_unix_ms=i("last_seen_ms"),
    )
