"""``python -m bench SCENARIO [options]``: run one scenario, print its table,
optionally keep it as JSON (``--json FILE``) and draw it (``--plot FILE.png``).

Runs against a ``redis-server`` it starts itself (from the repository root),
or against ``--redis URL``, where it works in a cell of its own that it
deletes afterwards and never flushes or resets anything.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bench import (
    balance,
    ceiling,
    churn,
    cluster,
    durability,
    faults,
    heartbeats,
    instructions,
    latency,
    locality,
    memory,
    phases,
    roster,
    scale,
    stall,
    throughput,
    versus,
)
from bench.runner import Result, Target, markdown, redis_target, show, write_json

PLOTTABLE = ("ceiling", "latency", "locality")


def _whole(text: str, least: int) -> tuple[int, ...]:
    """Comma-separated whole numbers of at least ``least``."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated whole numbers, not {text!r}"
        ) from None
    if not values or any(v < least for v in values):
        raise argparse.ArgumentTypeError(f"expected whole numbers of {least} or more, not {text!r}")
    return values


def _ints(text: str) -> tuple[int, ...]:
    return _whole(text, 1)


def _counts(text: str) -> tuple[int, ...]:
    """(0 allowed)"""
    return _whole(text, 0)


def _shares(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated shares, not {text!r}") from None
    if not values or any(not 0 <= v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected shares from 0 to 1, not {text!r}")
    return values


def _subset(text: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A comma-separated choice among ``known`` (an option's value)."""
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [v for v in values if v not in known]
    if not values or bad:
        raise argparse.ArgumentTypeError(
            f"{what} are {', '.join(known)}, comma-separated; not {text!r}"
        )
    return values


def _paths(text: str) -> tuple[str, ...]:
    return _subset(text, throughput.PATHS, "paths")


def _names(allowed: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [v for v in values if v not in allowed]
        if not values or bad:
            raise argparse.ArgumentTypeError(
                f"expected some of {', '.join(allowed)}, comma-separated; not {text!r}"
            )
        return values

    return parse


def _burst_options(
    p: argparse.ArgumentParser, defaults: Any, rounds: str, burst: str, base: bool = False
) -> None:
    """The options of the scenarios that send rounds of bursts over one fleet
    (defaults from the scenario's Params)."""
    if base:
        p.add_argument(
            "--base",
            default="HEAD",
            metavar="REV",
            help="git revision to compare with (default HEAD: the last commit)",
        )
    p.add_argument("--nodes", type=int, help=f"fleet size (default {defaults.nodes})")
    p.add_argument("--rounds", type=int, help=f"{rounds} (default {defaults.rounds})")
    p.add_argument("--burst", type=int, help=f"{burst} (default {defaults.burst})")
    p.add_argument("--seed", type=int, default=1, help="seed of the simulated fleet")


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--redis", metavar="URL", help="use this Redis instead of starting a redis-server"
    )
    common.add_argument("--json", metavar="FILE", help='also write {"scenario", "rows", ...}')
    common.add_argument(
        "--markdown",
        action="store_true",
        help="also print the table as markdown (for docs/performance.md)",
    )
    common.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes: checks the scenario works, measures nothing useful",
    )

    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")

    c = sub.add_parser(
        "ceiling",
        parents=[common],
        help="per-node ceiling with many replicas, ours vs the reference design",
    )
    c.add_argument("--replicas", type=_ints, help="replica counts (default 1,3,8)")
    c.add_argument("--creates", type=int, help="creations per run (default 200)")
    c.add_argument("--lag", type=int, help="heartbeat lag in batches, paced mode (default 3)")
    c.add_argument("--plot", metavar="FILE.png", help="draw the chart (needs the bench extra)")

    b = sub.add_parser(
        "balance", parents=[common], help="peak pressure by strategy vs the exact optimum"
    )
    b.add_argument("--replicas", type=_ints, help="replica counts (default 1,8)")
    b.add_argument("--requests", type=int, help="requests per run (default 300)")

    lat = sub.add_parser(
        "latency", parents=[common], help="Schedule latency and Redis CPU per call by fleet size"
    )
    lat.add_argument("--nodes", type=_ints, help="fleet sizes (default 100,1000,10000)")
    lat.add_argument("--seconds", type=float, help="measuring time per fleet size (default 10)")
    lat.add_argument("--seed", type=int, default=1, help="seed of the simulated fleet and stream")
    lat.add_argument("--plot", metavar="FILE.png", help="draw the chart (needs the bench extra)")

    t = sub.add_parser(
        "throughput",
        parents=[common],
        help="schedules per second by replica processes, library and gRPC",
    )
    t.add_argument("--replicas", type=_ints, help="replica process counts (default 1,2,4,8)")
    t.add_argument("--nodes", type=int, help="fleet size (default 1000)")
    t.add_argument("--seconds", type=float, help="measuring time per row (default 4)")
    t.add_argument("--paths", type=_paths, help="library,grpc,cpu (default all)")
    t.add_argument("--concurrency", type=int, help="cpu path: calls in flight (default 32)")
    t.add_argument("--channels", type=int, help="cpu path: connections they use (default 8)")
    t.add_argument("--rounds", type=int, help="cpu path: rounds over the servers (default 3)")
    t.add_argument(
        "--rate",
        type=float,
        help="cpu path: calls a second, the same for every "
        "server (default 0: as fast as each answers)",
    )
    t.add_argument(
        "--rpc",
        choices=("schedule", "heartbeat"),
        help="cpu path: the RPC (default schedule; heartbeat: steady "
        "heartbeats of the fleet, every node in turn)",
    )
    t.add_argument(
        "--shipped",
        action="store_true",
        help="cpu path: only the bare asyncio server and the replica as shipped",
    )
    t.add_argument("--seed", type=int, default=1, help="seed of the simulated fleet")

    h = sub.add_parser(
        "heartbeats",
        parents=[common],
        help="client and Redis CPU per "
        "Heartbeat RPC (with its CPU config step), coalescing off and on",
    )
    h.add_argument("--nodes", type=int, help="fleet size (default 300)")
    h.add_argument("--rounds", type=int, help="rounds, each measuring off and on (default 3)")
    h.add_argument("--passes", type=int, help="heartbeats per node per round (default 5)")
    h.add_argument("--concurrency", type=int, help="heartbeats in flight (default 32)")

    r = sub.add_parser(
        "roster",
        parents=[common],
        help="Redis time of one heartbeat with a long roster (max_roster_ids 100,000)",
    )
    r.add_argument("--sizes", type=_ints, help="roster lengths (default 4096,100000)")

    sc = sub.add_parser(
        "scale",
        parents=[common],
        help="Redis core share, cost per call against the floor and the longest call "
        "of a cell of 1,000, 10,000 and 100,000 nodes",
    )
    sc.add_argument("--nodes", type=_ints, help="fleet sizes (default 1000,10000,100000)")
    sc.add_argument("--rounds", type=int, help="measured rounds per size (default 3)")
    sc.add_argument("--burst", type=int, help="calls per measured burst (default 256)")
    sc.add_argument("--seed", type=int, default=1, help="seed of the simulated fleet")

    st = sub.add_parser(
        "stall",
        parents=[common],
        help="the longest time a trivial call takes inside Redis beside busy processes "
        "(the control for the longest call of `scale`)",
    )
    st.add_argument(
        "--hogs", type=_counts, help="busy processes beside it, a row each (default 0,2,4)"
    )
    st.add_argument("--seconds", type=float, help="calls per row, in seconds (default 60)")

    m = sub.add_parser(
        "memory",
        parents=[common],
        help="Redis memory per node, roster entry, reservation, tombstone and artifact",
    )
    m.add_argument("--nodes", type=int, help="nodes (default 2000)")
    m.add_argument("--reservations", type=int, help="reservations (default 20000)")
    f = sub.add_parser(
        "faults",
        parents=[common],
        help="Redis faults under load (kill -9, "
        "SIGSTOP, replica kill, Sentinel failover): ceilings, lost and phantom "
        "placements, health",
    )
    f.add_argument(
        "--scenarios",
        type=_names(faults.SCENARIOS),
        help=f"comma-separated, of {','.join(faults.SCENARIOS)} (default all)",
    )
    f.add_argument("--seed", type=int, default=1, help="seed of the load")

    ch = sub.add_parser(
        "churn",
        parents=[common],
        help="short-lived sandboxes, lost events, failed and missing creates "
        "through 3 replicas: ceilings, capacity held by gone creations, refusals with room",
    )
    ch.add_argument("--seconds", type=float, help="load per setting (default 45)")
    ch.add_argument("--modes", type=_names(churn.MODES), help="roster,counter (default roster)")
    ch.add_argument("--losses", type=_shares, help="shares of events lost (default 0,0.1,1)")
    ch.add_argument(
        "--unassigned-ttl",
        type=float,
        help="the replicas' unassigned_reservation_ttl in seconds (default: theirs, 90)",
    )
    ch.add_argument("--seed", type=int, default=1, help="seed of the load")

    cl = sub.add_parser(
        "cluster",
        parents=[common],
        help="N cells on a 3-primary Redis Cluster against the same cells on one Redis",
    )
    cl.add_argument("--cells", type=_ints, help="cell counts (default 3,6)")
    cl.add_argument("--nodes", type=int, help="nodes per cell (default 200)")
    cl.add_argument("--seconds", type=float, help="measuring time per row (default 4)")

    d = sub.add_parser(
        "durability",
        parents=[common],
        help="Schedule p50/p99 at min_replicas_acked 0 and 1 (a primary and a replica)",
    )
    d.add_argument("--calls", type=int, help="Schedules per setting and concurrency (default 3000)")
    d.add_argument("--nodes", type=int, help="fleet size (default 100)")

    v = sub.add_parser(
        "versus",
        parents=[common],
        help="Redis CPU per call of another "
        "revision's scripts against this tree's, as ratios in one run",
    )
    _burst_options(v, versus.Params(), "rounds of bursts per library", "calls per burst", base=True)

    lo = sub.add_parser(
        "locality",
        parents=[common],
        help="warm starts, GiB pulled, pressure and Redis CPU by placement strategy, "
        "a replay in simulated time (issue #32)",
    )
    lo.add_argument("--nodes-per-shape", type=int, help="nodes of each CPU size (default 4)")
    lo.add_argument("--seconds", type=int, help="simulated seconds of arrivals (default 3000)")
    lo.add_argument("--replicas", type=int, help="library replicas (default 3)")
    lo.add_argument(
        "--strategies",
        type=_names(locality.STRATEGIES),
        help=f"comma-separated, of {','.join(locality.STRATEGIES)} (default all)",
    )
    lo.add_argument(
        "--locality",
        action="append",
        metavar="KEY=VALUE",
        help="a locality policy setting for `ours` (JSON value), e.g. max_pressure_gap=0.1; "
        "repeatable",
    )
    lo.add_argument(
        "--sweep",
        action="append",
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="one more `ours` row with these locality settings (the sensitivity of the "
        "targets); repeatable",
    )
    lo.add_argument(
        "--scale-nodes",
        type=_ints,
        help="fleet sizes of the Redis-CPU-per-decision rows (default 1000,10000)",
    )
    lo.add_argument("--no-scale", action="store_true", help="skip those rows")
    lo.add_argument("--seed", type=int, default=1, help="seed of the fleet and the arrivals")
    lo.add_argument("--plot", metavar="FILE.png", help="draw the chart (needs the bench extra)")
    lo.add_argument(
        "--diagnose",
        action="store_true",
        help="sort ours' placements short of a full holder by cause, beside kube's of the "
        "same arrivals (adds an explain to each of ours' decisions: no Redis figures)",
    )
    lo.add_argument(
        "--ordered",
        action="store_true",
        help="the replicas decide each tick's arrivals in turn, not at once from threads: "
        "a seed's run is the same every time",
    )

    g = sub.add_parser(
        "phases",
        aliases=["stages"],  # (its former name)
        parents=[common],
        help="where a coalesced placement's and a "
        "changed heartbeat's Redis time goes, phase by phase",
    )
    _burst_options(g, phases.Params(), "rounds of bursts", "placements per burst")

    n = sub.add_parser(
        "instructions",
        parents=[common],
        help="instructions Redis executes "
        "per call (valgrind callgrind), another revision's scripts against "
        "this tree's",
    )
    _burst_options(n, instructions.Params(), "rounds of bursts", "calls per burst", base=True)
    n.add_argument(
        "--ops",
        type=_operations,
        help="comma-separated operations to measure (default all: "
        + ", ".join(instructions.OPERATIONS)
        + ")",
    )
    return p


def _operations(text: str) -> tuple[str, ...]:
    return _subset(text, instructions.OPERATIONS, "operations")


def _setting(item: str) -> tuple[str, str]:
    """A locality setting ``KEY=VALUE`` (the value JSON: 0.1, 600000)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip() or not value.strip():
        parser().error(f"--locality and --sweep take KEY=VALUE, not {item!r}")
    return key.strip(), value.strip()


def _params(args: argparse.Namespace, base: Any, mapping: dict[str, str]) -> Any:
    changes = {
        field: getattr(args, opt)
        for opt, field in mapping.items()
        if getattr(args, opt, None) is not None
    }
    return replace(base, **changes)


def runner(args: argparse.Namespace) -> Callable[[Target], Result]:
    name = args.scenario
    if name == "ceiling":
        cp = _params(
            args,
            ceiling.Params.quick() if args.quick else ceiling.Params(),
            {"replicas": "replicas", "creates": "creates", "lag": "lag"},
        )
        return lambda t: ceiling.run(t, cp)
    if name == "balance":
        bp = _params(
            args,
            balance.Params.quick() if args.quick else balance.Params(),
            {"replicas": "replicas", "requests": "requests"},
        )
        return lambda t: balance.run(t, bp)
    if name == "latency":
        lp = _params(
            args,
            latency.Params.quick() if args.quick else latency.Params(),
            {"nodes": "nodes", "seconds": "seconds"},
        )
        lp = replace(lp, seed=args.seed)
        return lambda t: latency.run(t, lp)
    if name == "heartbeats":
        hp = _params(
            args,
            heartbeats.Params.quick() if args.quick else heartbeats.Params(),
            {
                "nodes": "nodes",
                "rounds": "rounds",
                "passes": "passes",
                "concurrency": "concurrency",
            },
        )
        return lambda t: heartbeats.run(t, hp)
    if name == "roster":
        rp = _params(
            args, roster.Params.quick() if args.quick else roster.Params(), {"sizes": "sizes"}
        )
        if max(rp.sizes) > rp.max_roster_ids:
            rp = replace(rp, max_roster_ids=max(rp.sizes))
        return lambda t: roster.run(t, rp)
    if name == "memory":
        mp = _params(
            args,
            memory.Params.quick() if args.quick else memory.Params(),
            {"nodes": "nodes", "reservations": "reservations"},
        )
        return lambda t: memory.run(t, mp)
    if name == "locality":
        lop = _params(
            args,
            locality.Params.quick() if args.quick else locality.Params(),
            {
                "nodes_per_shape": "nodes_per_shape",
                "seconds": "seconds",
                "replicas": "replicas",
                "strategies": "strategies",
            },
        )
        pairs = [_setting(item) for item in args.locality or ()]
        sweep = tuple(
            tuple(_setting(item) for item in text.split(",") if item.strip())
            for text in args.sweep or ()
        )
        lop = replace(
            lop,
            seed=args.seed,
            locality=tuple(pairs),
            sweep=sweep,
            diagnose=args.diagnose,
            ordered=args.ordered,
        )
        if args.scale_nodes:
            lop = replace(lop, scale_nodes=args.scale_nodes)
        if args.no_scale:
            lop = replace(lop, scale_nodes=())
        return lambda t: locality.run(t, lop)
    if name in ("phases", "stages"):
        gp = _params(
            args,
            phases.Params.quick() if args.quick else phases.Params(),
            {"nodes": "nodes", "rounds": "rounds", "burst": "burst"},
        )
        gp = replace(gp, seed=args.seed)
        return lambda t: phases.run(t, gp)
    if name == "instructions":
        np_ = _params(
            args,
            instructions.Params.quick() if args.quick else instructions.Params(),
            {"nodes": "nodes", "rounds": "rounds", "burst": "burst"},
        )
        np_ = replace(np_, base=args.base, seed=args.seed)
        if args.ops:
            np_ = replace(np_, ops=args.ops)
        return lambda t: instructions.run(t, np_)
    if name == "scale":
        sp = _params(
            args,
            scale.Params.quick() if args.quick else scale.Params(),
            {"nodes": "nodes", "rounds": "rounds", "burst": "burst"},
        )
        sp = replace(sp, seed=args.seed)
        return lambda t: scale.run(t, sp)
    if name == "versus":
        vp = _params(
            args,
            versus.Params.quick() if args.quick else versus.Params(),
            {"nodes": "nodes", "rounds": "rounds", "burst": "burst"},
        )
        vp = replace(vp, base=args.base, seed=args.seed)
        return lambda t: versus.run(t, vp)
    tp = _params(
        args,
        throughput.Params.quick() if args.quick else throughput.Params(),
        {
            "replicas": "replicas",
            "nodes": "nodes",
            "seconds": "seconds",
            "paths": "paths",
            "concurrency": "concurrency",
            "channels": "channels",
            "rounds": "rounds",
            "rate": "rate",
            "rpc": "rpc",
        },
    )
    tp = replace(tp, seed=args.seed, shipped=tp.shipped or args.shipped)
    return lambda t: throughput.run(t, tp)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    plot = getattr(args, "plot", None)
    if plot:
        from bench import plot as plotting

        plotting.require()  # fail before the run, not after it
    if args.scenario in ("faults", "durability", "cluster", "churn", "stall") and args.redis:
        parser().error(f"{args.scenario} starts Redis servers of its own: no --redis")
    if args.scenario == "cluster":
        cp = _params(
            args,
            cluster.Params.quick() if args.quick else cluster.Params(),
            {"cells": "cells", "nodes": "nodes", "seconds": "seconds"},
        )
        result = cluster.run(cp)
    elif args.scenario == "durability":
        dp = _params(
            args,
            durability.Params.quick() if args.quick else durability.Params(),
            {"calls": "calls", "nodes": "nodes"},
        )
        result = durability.run(dp)
    elif args.scenario == "churn":
        chp = _params(
            args,
            churn.Params.quick() if args.quick else churn.Params(),
            {
                "seconds": "seconds",
                "modes": "modes",
                "losses": "losses",
                "unassigned_ttl": "unassigned_ttl_s",
            },
        )
        result = churn.run(replace(chp, seed=args.seed))
    elif args.scenario == "stall":
        stp = _params(
            args,
            stall.Params.quick() if args.quick else stall.Params(),
            {"hogs": "hogs", "seconds": "seconds"},
        )
        result = stall.run(stp)
    elif args.scenario == "faults":
        fp = faults.Params.quick() if args.quick else faults.Params()
        fp = replace(
            fp, seed=args.seed, **({"scenarios": args.scenarios} if args.scenarios else {})
        )
        result = faults.run(fp)
    else:
        run = runner(args)
        with redis_target(args.redis) as target:
            result = run(target)
    result.params["command"] = "python -m bench " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    show(result)
    if args.markdown:
        print(markdown(result))
    if args.json:
        write_json(result, args.json)
    if plot:
        from bench import plot as plotting

        plotting.draw(result, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
