"""Scenario ``memory``: bytes of Redis memory per node, per roster entry, per
live reservation, per tombstone and per artifact, for the sizing table of
docs/operations.md ("Security").

Each row adds ``count`` items to a fresh cell and reads ``used_memory``
(``INFO memory``) before and after: ``bytes_per_item`` is the difference
over the count (allocator and hash-table growth included, as an operator's
Redis would pay them).  ``memory_usage_one`` is ``MEMORY USAGE`` of one
item's main key (sampled exactly, ``SAMPLES 0``), which leaves out its
entries in shared keys (indexes, sets).

- ``node``: a node registered by heartbeat: snapshot with one disk, P2P
  endpoint, cluster, CPU config digest fields, index entry; no sandboxes.
- ``roster entry``: one more sandbox listed by its node's roster: its
  binding and its place in the node's roster set (a listed sandbox is in
  no other).
- ``live reservation``: a placement not yet accounted for (record, expiry
  and per-node entries, the node's pending sums).
- ``tombstone``: an ended reservation, kept ``reservation_tombstone_ttl``
  (the row cancels every live one: the figure is the ended record alone).
- ``artifact (512-byte key)``: a P2P artifact at the largest default key,
  held by one node (holder sets, LRU, name); and one of a 64-byte key.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from bench.fleet import mixed_fleet, run_pipelined, send_heartbeats
from bench.runner import Result, Target, machine
from scheduler import Heartbeat, NodeSnapshot, Policy, Request, Scheduler
from scheduler.domain.records import DiskMetric, MachineInfo
from scheduler.store.calls import Call
from scheduler.store.contracts import ArtifactRecordArgv
from scheduler.store.p2p import PeerOps

COLUMNS = ["item", "count", "bytes_per_item", "memory_usage_one", "example_key"]


@dataclass(frozen=True)
class Params:
    nodes: int = 2000
    roster: int = 50
    reservations: int = 20_000
    artifacts: int = 20_000
    seed: int = 1

    @classmethod
    def quick(cls) -> Params:
        return cls(nodes=20, roster=5, reservations=200, artifacts=200)


def _used(target: Target) -> int:
    """Redis's allocated bytes less its clients' buffers, once settled: a
    pipelined burst's query buffers and a growing dict's second table are
    freed by Redis's cron (every 100 ms), which moved a 200-item row by more
    than the items themselves; read until two reads 0.25 s apart agree."""

    def read() -> int:
        info = target.client.info("memory")
        clients = int(info.get("mem_clients_normal", 0)) + int(info.get("mem_clients_slaves", 0))
        return int(info["used_memory"]) - clients

    last = read()
    for _ in range(12):
        time.sleep(0.25)
        now = read()
        if now == last:
            break
        last = now
    return last


def _usage(target: Target, key: str) -> int:
    client: Any = target.client
    return int(client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0") or 0)


def _node_heartbeat(node_id: str, cpu: int, mem: int, roster: list[str]) -> Heartbeat:
    return Heartbeat(
        node_id=node_id,
        service_instance_id="boot-1",
        cluster_id="eu-1",
        version="1.4.2",
        commit="0123456789abcdef",
        endpoint=f"http://{node_id}.bench:8000",
        machine_info=MachineInfo(
            cpu_family="25",
            cpu_model="17",
            cpu_model_name="AMD EPYC 9454P",
            cpu_architecture="x86_64",
        ),
        snapshot=NodeSnapshot(
            status="READY",
            cpu_count=cpu,
            memory_total_bytes=mem,
            allocated_cpu=len(roster),
            allocated_memory_bytes=len(roster) << 31,
            sandbox_count=len(roster),
            cpu_percent=37,
            memory_used_bytes=mem // 3,
            reported_at_unix_ms=0,
            disks=[
                DiskMetric(
                    mount_point="/",
                    device="/dev/nvme0n1p1",
                    filesystem_type="ext4",
                    used_bytes=1 << 38,
                    total_bytes=1 << 40,
                )
            ],
        ),
        sandbox_ids=roster,
        p2p_backend="bittorrent",
        p2p_address=f"{node_id}.bench:6881",
    )


def _measure(target: Target, step: Callable[[], Any]) -> int:
    before = _used(target)
    step()
    return _used(target) - before


def run(target: Target, p: Params) -> Result:
    rng = random.Random(p.seed)
    cell = target.new_cell("memory")
    s = Scheduler.connect(target.url, cell=cell, policy=Policy())
    rows: list[dict[str, Any]] = []
    try:
        fleet = mixed_fleet(p.nodes, rng, load=(0.0, 0.0), prefix="node")
        k = s.keys

        def row(item: str, count: int, delta: int, key: str) -> None:
            rows.append(
                {
                    "item": item,
                    "count": count,
                    "bytes_per_item": round(delta / count),
                    "memory_usage_one": _usage(target, key),
                    "example_key": key.removeprefix(k.base),
                }
            )

        bare = [_node_heartbeat(n.node_id, n.cpu, n.memory_bytes, []) for n in fleet]
        row(
            "node",
            p.nodes,
            _measure(target, lambda: send_heartbeats(s, bare)),
            k.node(fleet[0].node_id),
        )
        listed = [
            _node_heartbeat(
                n.node_id,
                n.cpu,
                n.memory_bytes,
                [f"{n.node_id}-sandbox-{i:04d}-0123456789abcdef" for i in range(p.roster)],
            )
            for n in fleet
        ]
        row(
            "roster entry",
            p.nodes * p.roster,
            _measure(target, lambda: send_heartbeats(s, listed)),
            k.bind(f"{fleet[0].node_id}-sandbox-0000-0123456789abcdef"),
        )

        calls = [s.ops.schedule(Request.cold(1, 1024)) for _ in range(p.reservations)]
        placed: list[Any] = []
        row(
            "live reservation",
            p.reservations,
            _measure(target, lambda: placed.extend(run_pipelined(s, calls))),
            k.res(placed[0].reservation_id),
        )
        cancels = [s.ops.cancel(pl.reservation_id) for pl in placed]
        ended = _measure(target, lambda: run_pipelined(s, cancels))
        # what the cell holds now over what it held before the placements
        live_delta = rows[-1]["bytes_per_item"] * p.reservations
        row("tombstone", p.reservations, live_delta + ended, k.res(placed[0].reservation_id))

        peers = PeerOps(k, lambda: s.ops.bounds)
        holder = fleet[0].node_id
        for size in (512, 64):
            records = [
                peers.record("eu-1", "bittorrent", f"{size}-{i:08d}".ljust(size, "k"), holder)
                for i in range(p.artifacts)
            ]
            row(
                f"artifact ({size}-byte key)",
                p.artifacts,
                _measure(target, partial(run_pipelined, s, records)),
                k.art(_digest(records[0])),
            )
    finally:
        s.close()
        target.drop_cell(cell)
    return Result(
        "memory",
        COLUMNS,
        rows,
        params=asdict(p),
        machine=machine(target),
        notes=[
            "bytes_per_item: INFO memory used_memory less client buffers, settled,"
            " difference over the count; "
            "memory_usage_one: MEMORY USAGE of the example key alone"
        ],
    )


def _digest(call: Call[Any]) -> str:
    """An artifact_record call's digest (its ARGV by name)."""
    assert isinstance(call.argv, ArtifactRecordArgv), call.script
    return call.argv.digest
