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
    verdicts = []
    for row in r[7:]:
        f = [s(x) for x in row]
        verdicts.append(
            Verdict(
                node_id=f[0],
                status=f[1],
                reason=f[2] or None,
                pressure=float(f[3]),
                known_capacity=f[4] == "1",
                starting=int(f[5]),
                running=int(f[6]),
                paused=int(f[7]),
                projected_cpu=int(f[8]),
                projected_memory_bytes=int(f[9]),
                cpu_capacity=int(f[10]),
                memory_capacity_bytes=int(f[11]),
                endpoint=f[12],
                coverage=float(f[13]) if len(f) > 13 else 0.0,
                bonus=float(f[14]) if len(f) > 14 else 0.0,
                locality=f[15] if len(f) > 15 else "",
            )
        )
    chosen = s(r[2]) or None
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
        now_ms=int(r[0]),
        strategy=s(r[1]),
        chosen=chosen,
        rotation=int(r[3]),
        cpu=int(r[4]),
        memory_bytes=int(r[5]),
        refusal=s(r[6]) or None,
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


def parse_nodes_view(r: list[Any]) -> tuple[int, list[NodeView]]:
    now = int(r[0])
    views = []
    for row in r[1:]:
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
    return now, views


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


def parse_listed(r: list[Any]) -> list[ListedNode]:
    """lua/observed-5.lua in its brief form."""
    return [
        ListedNode(
            node_id=f.get("node_id", ""),
            endpoint=f.get("endpoint", ""),
            status=f.get("derived_status", ""),
        )
        for f in map(pairs, r[1:])
    ]


def parse_observed(r: list[Any]) -> list[ObservedNode]:
    """lua/observed-5.lua in its full form: each record as the node service
    shows it (a status the wire does not know reads UNSPECIFIED; disks that
    do not decode read none)."""
    return [observed_node(f) for f in map(pairs, r[1:])]


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
