"""Scenario ``balance``: how evenly does each strategy load unequal nodes?

The least-loaded proposal's replay: three nodes of 16, 64 and 192 CPU (4 GiB
of memory per CPU), empty, and 300 creations of 2 CPU / 4 GiB, with the
capacity test out of the way (overcommit 1000) so that only the strategy
decides.  Each strategy runs with 1 replica process and with 8 concurrent
ones.  No heartbeat arrives during the run: every earlier placement is known
to the next decision only through its reservation in Redis.

``peak_pressure`` is the highest final pressure over the nodes,
``max(cpu / cpu_capacity, memory / memory_capacity)``.  The optimum is
computed exactly (rational arithmetic): the smallest ``v`` among the
candidate values ``k * w_i`` such that the nodes can hold every request
with none above ``v``, where ``w_i`` is one request's pressure on node ``i``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction

from bench.fleet import GIB, send_heartbeats
from bench.runner import Result, Target, machine
from scheduler import Overcommit, Policy, Scheduler
from scheduler.domain.records import MIB
from scheduler.ops.simnode import SimNode
from scheduler.testing.replicas import Creates, LibraryReplicas, Outcome

COLUMNS = ["strategy", "replicas", "peak_pressure", "optimal_peak_pressure", "placed"]
STRATEGIES = ("round_robin", "random", "least_loaded")


@dataclass(frozen=True)
class Params:
    node_cpus: tuple[int, ...] = (16, 64, 192)
    memory_gib_per_cpu: int = 4
    requests: int = 300
    cpu: int = 2
    memory_mb: int = 4096
    replicas: tuple[int, ...] = (1, 8)

    @classmethod
    def quick(cls) -> Params:
        return cls(requests=40, replicas=(1, 3))


def unit_pressure(cpu_capacity: int, memory_capacity: int, cpu: int, memory: int) -> Fraction:
    """The pressure one request adds to an empty node of this shape."""
    return max(Fraction(cpu, cpu_capacity), Fraction(memory, memory_capacity))


def peak_pressure(nodes: Sequence[SimNode]) -> Fraction:
    return max(
        max(Fraction(n.allocated_cpu, n.cpu), Fraction(n.allocated_memory_bytes, n.memory_bytes))
        for n in nodes
    )


def optimal_peak(units: Sequence[Fraction], requests: int) -> Fraction:
    """Least possible peak when ``requests`` identical requests go to nodes
    where each adds ``units[i]`` of pressure (nodes start empty)."""
    if requests <= 0:
        return Fraction(0)
    candidates = sorted({k * w for w in units for k in range(1, requests + 1)})

    def holds(v: Fraction) -> bool:
        return sum(v // w for w in units) >= requests

    lo, hi = 0, len(candidates) - 1  # candidates[hi] holds: one node can take them all
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    return candidates[lo]


def _nodes(p: Params) -> list[SimNode]:
    return [SimNode(f"cpu{c}", c, c * p.memory_gib_per_cpu * GIB) for c in p.node_cpus]


def run_one(
    p: Params, target: Target, pool: LibraryReplicas, strategy: str, replicas: int
) -> dict[str, object]:
    nodes = _nodes(p)
    by_id = {n.node_id: n for n in nodes}
    cell = target.new_cell("balance")
    policy = Policy(
        strategy=strategy, overcommit=Overcommit(cpu=1000.0, memory=1000.0), report_ttl_ms=3_600_000
    )
    s = Scheduler.connect(target.url, cell=cell, policy=policy)
    try:
        send_heartbeats(s, [n.heartbeat() for n in nodes])
        items = [(f"sb{j}", p.cpu, p.memory_mb) for j in range(p.requests)]
        jobs = [Creates(cell, items[r::replicas]) for r in range(replicas)]
        results, _ = pool.run(jobs)
    finally:
        s.close()
        target.drop_cell(cell)
    placed = 0
    for outcomes in results:
        for o in outcomes:
            assert isinstance(o, Outcome)
            if o.node_id is not None:
                by_id[o.node_id].create(o.sandbox_id, p.cpu, p.memory_mb * MIB)
                placed += 1
    units = [unit_pressure(n.cpu, n.memory_bytes, p.cpu, p.memory_mb * MIB) for n in nodes]
    peak = peak_pressure(nodes)
    optimum = optimal_peak(units, placed)
    return {
        "strategy": strategy,
        "replicas": replicas,
        "peak_pressure": float(peak),
        "optimal_peak_pressure": float(optimum),
        "placed": placed,
        # exact values, so the optimum can be checked without rounding
        "_peak": peak,
        "_optimum": optimum,
    }


def run(target: Target, p: Params | None = None) -> Result:
    p = p or Params()
    facts = machine(target)  # before the run: its load average is the one that matters
    rows = []
    with LibraryReplicas(target.url, max(p.replicas)) as pool:
        for replicas in p.replicas:
            for strategy in STRATEGIES:
                rows.append(run_one(p, target, pool, strategy, replicas))
    exact = [{"peak": str(r.pop("_peak")), "optimum": str(r.pop("_optimum"))} for r in rows]
    notes = [
        f"nodes of {', '.join(map(str, p.node_cpus))} CPU ({p.memory_gib_per_cpu} GiB per CPU), "
        f"empty; {p.requests} creations of {p.cpu} CPU / {p.memory_mb} MB; overcommit 1000",
        "peak_pressure: highest final max(cpu, memory) pressure over the nodes; "
        "optimal_peak_pressure: exact minimum over every possible placement",
    ]
    params = asdict(p)
    params["exact"] = exact
    return Result("balance", COLUMNS, rows, params=params, machine=facts, notes=notes)
