"""What the decision log and gRPC reflection cost a replica, per Schedule.

``python -m bench.observability [--rounds N] [--seconds S] [--json FILE]``

One ``schedctl serve`` per variant (uvloop, coalescing on, ``log_format``
json unless the variant says text; its log goes to a file as a container's
stderr would), a 1,000-node mixed fleet fresh for every run, and the ``cpu``
path's load of bench/throughput.py: ``concurrency`` Schedule calls in flight
(1 CPU / 1 GiB creations) for ``seconds``.  ``cpu_us_per_call`` is the
replica process' CPU time (user + system) per answered call; the variants
run in turn within each round, and each row is the median over the rounds
with its range.  ``log_bytes_per_call`` is what the replica's log grew by.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

from bench import grpc_path
from bench.runner import Target, machine, redis_target
from bench.throughput import POLICY, Params, _fleet
from scheduler.testing.replicas import ServeProcess


@dataclass(frozen=True)
class Variant:
    label: str
    scheduler: dict[str, Any] = field(default_factory=dict)
    log_format: str = "json"
    #: added to the replica's environment (``--before DIR``: another tree's package)
    env: dict[str, str] = field(default_factory=dict)
    #: more ``schedctl serve`` flags
    extra: tuple[str, ...] = ()


VARIANTS = (
    Variant("decision log off (default), reflection on"),
    Variant("decision log on, json", {"decision_log": True}),
    Variant("decision log on, text", {"decision_log": True}, "text"),
    Variant("decision log off, reflection off", {"grpc_reflection": False}),
)
#: ``--reflection``: reflection on and off alone, for a closer look
REFLECTION = (
    Variant("reflection on (default)"),
    Variant("reflection off", {"grpc_reflection": False}),
)
#: ``--coalescing``: the decision log with coalescing off and on (what a line
#: costs by itself, and what it costs the batches it makes smaller)
COALESCING = (
    Variant("decision log off"),
    Variant("decision log on, json", {"decision_log": True}),
    Variant("decision log off, coalescing off", extra=("--no-coalesce",)),
    Variant(
        "decision log on, json, coalescing off", {"decision_log": True}, extra=("--no-coalesce",)
    ),
)


def measure(target: Target, p: Params, v: Variant, seed: int) -> dict[str, float]:
    cell, s = _fleet(target, p, seed)
    try:
        config = grpc_path.config(POLICY)
        config["scheduler"].update(v.scheduler)
        config["log_format"] = v.log_format
        proc = ServeProcess(
            config,
            target.url,
            cell,
            metrics=False,
            extra_args=grpc_path.serve_args("uvloop", 1, v.extra),
            env=v.env,
        )
        try:
            proc.wait_listening(120)
            before = proc.log_path.stat().st_size
            m = grpc_path.measure(
                proc.port,
                proc.proc.pid,
                seconds=p.seconds,
                concurrency=p.concurrency,
                channels=p.channels,
                cpu=p.cpu,
                memory_mb=p.memory_mb,
                redis_cpu=target.cpu_seconds,
            )
            grown = proc.log_path.stat().st_size - before
        finally:
            proc.close()
    finally:
        s.close()
        target.drop_cell(cell)
    return {
        "calls": m.calls,
        "refused": m.refused,
        "schedules_per_s": m.calls / m.wall,
        "cpu_us_per_call": m.server_cpu / m.calls * 1e6,
        "log_bytes_per_call": grown / m.calls,
    }


def before(tree: str) -> Variant:
    """The replica of another tree (its ``scheduler`` package, with ``cli`` and
    ``lua`` linked into it), for the cost of a change with everything off."""
    env = {"PYTHONSAFEPATH": "1", "PYTHONPATH": tree}
    return Variant(f"before: {tree}", {}, "json", env)


def run(target: Target, p: Params, variants: tuple[Variant, ...]) -> list[dict[str, Any]]:
    runs: dict[str, list[dict[str, float]]] = {v.label: [] for v in variants}
    for r in range(p.rounds):
        # each round in another order: no variant always runs first or last
        turn = variants[r % len(variants) :] + variants[: r % len(variants)]
        for v in turn:
            runs[v.label].append(measure(target, p, v, p.seed + 100 * r))
            print(f"round {r + 1} {v.label}: {runs[v.label][-1]}", file=sys.stderr)
    rows = []
    for label, got in runs.items():
        cpu = [g["cpu_us_per_call"] for g in got]
        rows.append(
            {
                "variant": label,
                "rounds": len(got),
                "cpu_us_per_call": round(statistics.median(cpu), 1),
                "cpu_low": round(min(cpu), 1),
                "cpu_high": round(max(cpu), 1),
                "schedules_per_s": round(statistics.median(g["schedules_per_s"] for g in got)),
                "log_bytes_per_call": round(
                    statistics.median(g["log_bytes_per_call"] for g in got)
                ),
                "refused": sum(int(g["refused"]) for g in got),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--redis", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--before",
        default=None,
        metavar="DIR",
        help="also run the tree in DIR (git archive of a commit, scheduler/cli and "
        "scheduler/lua linked to its cli/ and lua/), with its defaults",
    )
    ap.add_argument("--coalescing", action="store_true", help="the COALESCING variants instead")
    ap.add_argument("--reflection", action="store_true", help="the REFLECTION variants instead")
    a = ap.parse_args()
    variants = COALESCING if a.coalescing else REFLECTION if a.reflection else VARIANTS
    if a.before is not None:
        variants = (before(a.before), *variants)
    p = Params(rounds=a.rounds, seconds=a.seconds, concurrency=a.concurrency)
    with redis_target(a.redis) as target:
        rows = run(target, p, variants)
        info = machine(target)
    cols = list(rows[0])
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(str(row[c]) for c in cols))
    if a.json:
        import json

        with open(a.json, "w") as f:
            json.dump({"machine": info, "params": vars(a), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
