"""Machine instructions per Schedule, locality on against least_loaded:
``python -m bench.locality_instructions [--nodes N] [--decisions D]``.

The fleet and request stream of ``bench locality``'s fleet-size rows
(``bench/locality.py``, ``_scale_fleet``: nodes of the replay's three
shapes, 30-70 % allocated, caches filled by popularity and recorded in the
artifact index), each strategy on a fresh ``redis-server`` under callgrind
(``bench/instructions.py``'s counted server), counting only around the
decisions (one ``Schedule`` call each, nothing cancelled). CPU time on this
shared machine moves by tens of percent from run to run; an instruction
count does not, so it is how a change to the locality stage is judged
(docs/performance.md, "Locality off costs what main costs"). Needs valgrind.
"""

from __future__ import annotations

import argparse
import contextlib
import random

from bench import instructions
from bench import locality as loc
from bench.fleet import run_pipelined, send_heartbeats
from scheduler import Limits, Overcommit, Policy, Scheduler, SchedulerError


def per_decision(strategy: str, nodes: int, decisions: int, seed: int = 1) -> float:
    """Instructions per Schedule of ``strategy`` (``least_loaded`` or ``ours``)."""
    p = loc.Params(seed=seed)
    tpls = loc.templates(p, random.Random(f"{p.seed}-templates"))
    fleet, held = loc._scale_fleet(p, nodes, tpls, random.Random(f"{p.seed}-scale-{nodes}"))
    rng = random.Random(f"{p.seed}-scale-stream-{nodes}")
    weights = loc.zipf_weights(len(tpls), p.zipf_s)
    stream = [
        (rng.choices(range(len(tpls)), weights)[0], *rng.choice(loc.SIZES))
        for _ in range(decisions)
    ]
    with instructions._counted_server() as server:
        policy = Policy(
            strategy="least_loaded",
            overcommit=Overcommit(cpu=1.0, memory=1.0),
            limits=Limits(max_sandbox_count=p.ceiling),
            report_ttl_ms=3_600_000,
        )
        policy = loc.locality_policy(policy, p.locality, strategy == "ours")
        s = Scheduler.connect(server.url, cell="c", policy=policy, timeout_s=60.0)
        try:
            send_heartbeats(s, [loc._heartbeat(n) for n in fleet])
            run_pipelined(
                s,
                [
                    s.peer_ops.record(loc.CLUSTER, loc.BACKEND, key, n.node_id)
                    for n, keys in zip(fleet, held, strict=True)
                    for key in keys
                ],
                batch=500,
            )
            decider = loc.Decider(p, strategy, tpls)
            calls = [
                s.ops.schedule(
                    decider.request(loc.Arrival(0, "", t, cpu, mib, 0.0)), loc.LIBRARY[strategy]
                )
                for t, cpu, mib in stream
            ]
            with server.counting():
                for c in calls:
                    with contextlib.suppress(SchedulerError):  # (a refusal counts too)
                        s.run(c)
        finally:
            s.close()
    return server.total() / len(stream)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--decisions", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    base = per_decision("least_loaded", a.nodes, a.decisions, a.seed)
    ours = per_decision("ours", a.nodes, a.decisions, a.seed)
    print(f"nodes {a.nodes}, {a.decisions} decisions")
    print(f"least_loaded {base:,.0f} instructions a decision")
    print(f"ours         {ours:,.0f} instructions a decision ({ours / base:.2f}x)")


if __name__ == "__main__":
    main()
