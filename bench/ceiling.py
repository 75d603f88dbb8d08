"""Scenario ``ceiling``: does ``max_sandbox_count`` hold with many replicas?

The reference design's published failure, replayed on both systems with one
workload: 8 nodes of 16 CPU / 64 GiB, ``max_sandbox_count`` 10, 200
creations of 2 CPU / 4096 MB, spread round-robin over the replicas (as a
gateway load balancer would).  CPU overcommit is 2.0 for both systems, so the
count ceiling, not CPU, is what binds (16 CPU x 2.0 / 2 CPU = 16 > 10).

- **full speed**: one heartbeat from every node, then all creations at once;
  no heartbeat arrives during the burst.
- **paced**: batches of 8 creations, one per (virtual) second; after each
  batch every node heartbeats, but what it reports is its state ``lag``
  batches ago (several seconds stale), as a busy node's would be.

**ours**: real replica processes (each its own connection) against one real
``redis-server``; a placed creation is "created" on the simulated node and
assigned (``RecordAssignment`` with the reservation id); heartbeats carry the
node's full roster, so they release the reservations of the sandboxes they
list.  **reference-model**: :mod:`bench.reference_model`, driven in-process
with the same creation order and the same heartbeats.

A row counts placements and refusals, and, from the nodes' own truth, the
most sandboxes any node ended with and how many nodes went over the limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from bench.fleet import GIB, send_heartbeats
from bench.reference_model import ReferenceCluster, RefSnapshot
from bench.runner import Result, Target, machine
from scheduler import Limits, Overcommit, Policy, Scheduler
from scheduler.domain.records import MIB
from scheduler.ops.simnode import Observed, SimNode
from scheduler.testing.replicas import Creates, LibraryReplicas, Outcome

COLUMNS = [
    "system",
    "replicas",
    "paced",
    "placed",
    "refused",
    "max_node_sandboxes",
    "limit",
    "nodes_over_limit",
]


@dataclass(frozen=True)
class Params:
    nodes: int = 8
    node_cpu: int = 16
    node_memory_gib: int = 64
    limit: int = 10
    creates: int = 200
    cpu: int = 2
    memory_mb: int = 4096
    replicas: tuple[int, ...] = (1, 3, 8)
    batch: int = 8
    lag: int = 3
    overcommit_cpu: float = 2.0

    @classmethod
    def quick(cls) -> Params:
        return cls(nodes=4, creates=60, replicas=(1, 3))


def _fleet(p: Params) -> list[SimNode]:
    return [SimNode(f"n{i}", p.node_cpu, p.node_memory_gib * GIB) for i in range(p.nodes)]


def _batches(p: Params, paced: bool) -> list[list[int]]:
    idx = list(range(p.creates))
    if not paced:
        return [idx]
    return [idx[i : i + p.batch] for i in range(0, p.creates, p.batch)]


def _row(
    system: str,
    replicas: int,
    paced: bool,
    placed: int,
    refused: int,
    nodes: Sequence[SimNode],
    limit: int,
) -> dict[str, object]:
    counts = [len(n.sandboxes) for n in nodes]
    return {
        "system": system,
        "replicas": replicas,
        "paced": paced,
        "placed": placed,
        "refused": refused,
        "max_node_sandboxes": max(counts),
        "limit": limit,
        "nodes_over_limit": sum(1 for c in counts if c > limit),
    }


def run_reference(p: Params, replicas: int, paced: bool) -> dict[str, object]:
    nodes = _fleet(p)
    by_id = {n.node_id: n for n in nodes}
    cluster = ReferenceCluster(
        [n.node_id for n in nodes], replicas, p.limit, overcommit_cpu=p.overcommit_cpu
    )

    def heartbeat_all(seen: list[Observed]) -> None:
        for n, o in zip(nodes, seen, strict=True):
            cluster.heartbeat(
                n.node_id,
                RefSnapshot(
                    cpu_count=n.cpu,
                    memory_total_bytes=n.memory_bytes,
                    allocated_cpu=o.allocated_cpu,
                    allocated_memory_bytes=o.allocated_memory_bytes,
                    sandbox_count=len(o.sandboxes),
                    sandbox_starting_count=0,
                    create_successes=o.create_successes,
                ),
            )

    history = [[n.observe() for n in nodes]]
    heartbeat_all(history[0])
    placed = refused = 0
    for batch in _batches(p, paced):
        for j in batch:
            node_id = cluster.schedule(j % replicas, p.cpu, p.memory_mb * MIB)
            if node_id is None:
                refused += 1
            else:
                by_id[node_id].create(f"sb{j}", p.cpu, p.memory_mb * MIB)
                placed += 1
        if paced:
            history.append([n.observe() for n in nodes])
            heartbeat_all(history[max(0, len(history) - 1 - p.lag)])
    return _row("reference-model", replicas, paced, placed, refused, nodes, p.limit)


def run_ours(
    p: Params, target: Target, pool: LibraryReplicas, replicas: int, paced: bool
) -> dict[str, object]:
    nodes = _fleet(p)
    by_id = {n.node_id: n for n in nodes}
    cell = target.new_cell("ceiling")
    policy = Policy(
        strategy="least_loaded",
        limits=Limits(max_sandbox_count=p.limit),
        overcommit=Overcommit(cpu=p.overcommit_cpu),
        report_ttl_ms=3_600_000,
    )
    s = Scheduler.connect(target.url, cell=cell, policy=policy)
    try:
        history = [[n.observe() for n in nodes]]
        send_heartbeats(s, [n.heartbeat() for n in nodes])
        placed = refused = 0
        refusals: set[str] = set()
        for batch in _batches(p, paced):
            jobs = [
                Creates(cell, [(f"sb{j}", p.cpu, p.memory_mb) for j in batch if j % replicas == r])
                for r in range(replicas)
            ]
            results, _ = pool.run(jobs)
            for outcomes in results:
                for o in outcomes:
                    assert isinstance(o, Outcome)
                    if o.node_id is None:
                        refused += 1
                        refusals.add(o.refusal or "")
                    else:
                        by_id[o.node_id].create(o.sandbox_id, p.cpu, p.memory_mb * MIB)
                        placed += 1
            if paced:
                history.append([n.observe() for n in nodes])
                past = history[max(0, len(history) - 1 - p.lag)]
                send_heartbeats(s, [n.heartbeat(seen) for n, seen in zip(nodes, past, strict=True)])
        row = _row("ours", replicas, paced, placed, refused, nodes, p.limit)
        st = s.stats()
        # how the reservations were accounted for: the lagging rosters released some
        row["_detail"] = {
            "replicas": replicas,
            "paced": paced,
            "reserved": st.reserved_total,
            "released_by_heartbeats": st.released_total,
            "pending_at_end": st.pending,
            "refused": st.refused_total,
            "refusal_messages": sorted(refusals),
        }
        return row
    finally:
        s.close()
        target.drop_cell(cell)


def run(target: Target, p: Params | None = None) -> Result:
    p = p or Params()
    facts = machine(target)  # before the run: its load average is the one that matters
    rows: list[dict[str, object]] = []
    with LibraryReplicas(target.url, max(p.replicas)) as pool:
        for paced in (False, True):
            for replicas in p.replicas:
                rows.append(run_ours(p, target, pool, replicas, paced))
                rows.append(run_reference(p, replicas, paced))
    detail = [r.pop("_detail") for r in rows if "_detail" in r]
    notes = [
        f"{p.nodes} nodes x {p.node_cpu} CPU / {p.node_memory_gib} GiB, max_sandbox_count "
        f"{p.limit}, {p.creates} creations of {p.cpu} CPU / {p.memory_mb} MB, least_loaded, "
        f"CPU overcommit {p.overcommit_cpu} for both systems",
        f"paced: batches of {p.batch}, heartbeats report the state {p.lag} batches "
        "(virtual seconds) old; full speed: no heartbeat during the burst",
        "ours: real replica processes on one redis-server; reference-model: "
        "bench/reference_model.py (per-replica memory, nodes pinned to one replica each)",
    ]
    params = asdict(p)
    params["ours"] = detail
    return Result("ceiling", COLUMNS, rows, params=params, machine=facts, notes=notes)
