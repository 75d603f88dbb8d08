"""Script replies as records: what the scripts answer, typed.

Each parser takes one script's reply (the shapes their headers state under
"Returns") and builds the records of :mod:`scheduler.records`.
"""

from __future__ import annotations

from typing import Any, cast

import msgspec

from scheduler.catalog import CEILING_NAMES, NODE_STATUSES, Status, ceiling
from scheduler.records import (
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


def s(v: Any) -> str:
    """A reply value as text."""
    return v.decode() if isinstance(v, bytes) else str(v)


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

        def i(name: str, f: dict[str, str] = f) -> int:
            return int(f.get(name) or 0)

        ceilings: list[CeilingUse] = []
        last_seen = opt_int(f.get("last_seen_ms"))
        views.append(
            NodeView(
                node_id=f["node_id"],
                endpoint=f.get("endpoint", ""),
                status=f["derived_status"],
                reason=f.get("reason") or None,
                pressure=float(f["pressure"]),
                known_capacity=f["known"] == "1",
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
        for key, value in f.items():
            if key.startswith("use:"):
                name = key[4:]
                limit = int(f[f"limit:{name}"])
                used = int(value)
                ceilings.append(
                    CeilingUse(
                        name=name, limit=limit, used=used, headroom=_headroom(name, limit, used, f)
                    )
                )
        ceilings.sort(key=lambda c: CEILING_NAMES.index(c.name))
    return now, views


def parse_reservation(f: dict[str, str]) -> Reservation:
    return Reservation(
        reservation_id=f["reservation_id"],
        node_id=f["node_id"],
        state=f["state"],
        cpu=int(f["cpu"]),
        memory_bytes=int(f["memory_bytes"]),
        created_ms=int(f["created_ms"]),
        expires_ms=int(f["expires_ms"]),
        sandbox_id=f.get("sandbox_id") or None,
        ended_ms=opt_int(f.get("ended_ms")),
        pressure=float(f["pressure"]) if f.get("pressure") else None,
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
    def i(name: str) -> int:
        return int(f.get(name) or 0)

    try:
        disks = _disks.decode(f["disks"]) if f.get("disks") else []
    except msgspec.DecodeError:
        disks = []
    status = f.get("derived_status", "")
    snapshot = NodeSnapshot(
        status=cast(Status, status if status in NODE_STATUSES else "UNSPECIFIED"),
        disks=disks,
        **{name: i(name) for name in snapshot_numbers()},
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
