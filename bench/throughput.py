"""Scenario ``throughput``: schedules per second as replica processes are added.

A 1,000-node mixed fleet (30-60 % allocated, set up with pipelined
heartbeats, fresh for every row), then every replica process schedules
1 CPU / 1 GiB creations back to back for a fixed time, all starting
together.  Each Schedule reserves; nothing is released during a row (the
fleet has room for far more than a row places).

- **library**: each replica process calls ``Scheduler.schedule`` itself.
- **grpc**: each replica is a ``schedctl serve`` process; one load process
  per replica calls its ``Schedule`` RPC (``new_cold_sandbox`` hint).
- **cpu**: what one Schedule RPC costs the server process, with
  ``concurrency`` calls in flight from one load process (over ``channels``
  connections): a bare ``grpc.aio`` server that answers a constant (the
  floor: gRPC in Python and nothing else), then ``schedctl serve`` on the
  asyncio loop and on uvloop, each with coalescing off and on, and with
  ``--workers 2``.  ``rounds`` times, the
  servers in turn within each round; ``ratio_to_bare`` is the median of the
  per-round ratios to the bare asyncio server of the same round, with their
  range.  ``rate`` paces the calls (the same rate for every server) instead
  of sending the next as soon as one is answered.

``cpu_us_per_call`` is the CPU time (user + system, all threads, workers
included) of the process(es) that served the row, per call: the replica
processes of ``grpc``, the library processes of ``library``, the server of
``cpu``.  ``redis_cpu_share`` is the CPU time redis-server used during the
row divided by the row's wall time (1.0 = one core busy all along).  Redis
runs commands on one thread, so a share near 1.0 means Redis is the
bottleneck; on a machine with few cores, the replica processes also compete
with it.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from bench import grpc_path
from bench.fleet import mixed_fleet, send_heartbeats
from bench.runner import Result, Target, machine
from scheduler import Policy, Scheduler
from scheduler.server.loops import LoopUnavailable, choose
from scheduler.testing.replicas import LibraryReplicas, ServeProcess, Stream, StreamResult

COLUMNS = [
    "path",
    "server",
    "replicas",
    "concurrency",
    "schedules_per_s",
    "cpu_us_per_call",
    "ratio_to_bare",
    "ratio_low",
    "ratio_high",
    "redis_cpu_share",
    "redis_us_per_schedule",
    "note",
]
PATHS = ("library", "grpc", "cpu")


@dataclass(frozen=True)
class Server:
    """One server of the ``cpu`` path: ``bare`` or ``replica``, its event
    loop, its worker processes, and extra ``schedctl serve`` flags."""

    kind: str
    loop: str
    workers: int = 1
    extra: tuple[str, ...] = ()
    label_extra: str = ""
    #: what a bare server does per call (grpc_path.LAYERS)
    layer: str = "constant"

    @property
    def label(self) -> str:
        name = "bare grpc.aio" if self.kind == "bare" else "replica"
        name += {"constant": "", "redis": " + Redis PING", "library": " + library Schedule"}[
            self.layer
        ]
        workers = f", {self.workers} workers" if self.workers > 1 else ""
        return f"{name}, {self.loop}{workers}{self.label_extra}"


#: the floor every ``cpu`` row is compared with
BARE = Server("bare", "asyncio")
NO_COALESCE = ("--no-coalesce",)
SERVERS: tuple[Server, ...] = (
    BARE,
    Server("bare", "uvloop"),
    Server("replica", "asyncio", extra=NO_COALESCE, label_extra=", coalescing off"),
    Server("replica", "asyncio", label_extra=", coalescing on"),
    Server("replica", "uvloop", extra=NO_COALESCE, label_extra=", coalescing off"),
    Server("replica", "uvloop", label_extra=", coalescing on"),
    Server("replica", "uvloop", workers=2, label_extra=", coalescing on"),
    # where a replica's CPU goes: the bare server plus one layer at a time
    Server("bare", "uvloop", layer="redis"),
    Server("bare", "uvloop", layer="library", label_extra=", coalescing on"),
)


@dataclass(frozen=True)
class Params:
    replicas: tuple[int, ...] = (1, 2, 4, 8)
    nodes: int = 1000
    seconds: float = 4.0
    cpu: int = 1
    memory_mb: int = 1024
    paths: tuple[str, ...] = PATHS
    seed: int = 1
    #: the ``cpu`` path: calls in flight, over this many connections, rounds
    concurrency: int = 32
    channels: int = 8
    rounds: int = 3
    #: the ``cpu`` path's calls a second (0: as fast as the server answers)
    rate: float = 0.0

    @classmethod
    def quick(cls) -> Params:
        return cls(replicas=(1, 2), nodes=40, seconds=0.3, concurrency=4, channels=2, rounds=1)


POLICY = Policy(strategy="least_loaded", report_ttl_ms=3_600_000)


def _fleet(target: Target, p: Params, seed: int) -> tuple[str, Scheduler]:
    cell = target.new_cell("throughput")
    s = Scheduler.connect(target.url, cell=cell, policy=POLICY)
    nodes = mixed_fleet(p.nodes, random.Random(seed), load=(0.3, 0.6))
    send_heartbeats(s, [n.heartbeat() for n in nodes])
    return cell, s


def _row(
    path: str,
    replicas: int,
    schedules: int,
    wall: float,
    cpu: float,
    stats: tuple[int, int],
    note: str = "",
    *,
    server: str,
    concurrency: int,
    server_cpu: float | None,
) -> dict[str, Any]:
    calls, usec = stats
    return {
        "path": path,
        "server": server,
        "replicas": replicas,
        "concurrency": concurrency,
        "schedules_per_s": round(schedules / wall, 1) if wall > 0 else 0.0,
        "cpu_us_per_call": round(server_cpu / schedules * 1e6, 1)
        if server_cpu is not None and schedules
        else None,
        "ratio_to_bare": None,
        "ratio_low": None,
        "ratio_high": None,
        "redis_cpu_share": round(cpu / wall, 3) if wall > 0 else 0.0,
        "redis_us_per_schedule": round(usec / calls, 1) if calls else None,
        "note": note,
    }


def _cpu(pids: list[int]) -> float | None:
    if grpc_path.cpu_unmeasurable():
        return None
    return sum(grpc_path.process_cpu(pid) for pid in pids)


def auto_loop() -> str:
    """The loop ``schedctl serve`` picks by itself here."""
    return choose("auto").name


def run_library(target: Target, p: Params, pool: LibraryReplicas, replicas: int) -> dict[str, Any]:
    cell, s = _fleet(target, p, p.seed + replicas)
    pids = [proc.pid for proc in pool.procs]
    try:
        cpu0, stats0, own0 = target.cpu_seconds(), target.script_stats(), _cpu(pids)
        results, wall = pool.run([Stream(cell, p.seconds, p.cpu, p.memory_mb)] * replicas)
        cpu, stats, own = target.cpu_seconds() - cpu0, target.script_stats_since(stats0), _cpu(pids)
    finally:
        s.close()
        target.drop_cell(cell)
    done = [r for r in results if isinstance(r, StreamResult)]
    refused = sum(r.refused for r in done)
    note = f"{refused} refused" if refused else ""
    return _row(
        "library",
        replicas,
        sum(r.schedules for r in done),
        wall,
        cpu,
        stats,
        note,
        server="library",
        concurrency=1,
        server_cpu=None if own is None or own0 is None else own - own0,
    )


def run_grpc(target: Target, p: Params, replicas: int) -> dict[str, Any]:
    cell, s = _fleet(target, p, p.seed + replicas)
    try:
        with grpc_path.Replicas(target.url, cell, POLICY, replicas) as servers:
            pids = [proc.proc.pid for proc in servers.procs]
            stats0, own0 = target.script_stats(), _cpu(pids)
            schedules, refused, wall, cpu = servers.load(
                p.seconds, p.cpu, p.memory_mb, target.cpu_seconds
            )
            stats, own = target.script_stats_since(stats0), _cpu(pids)
    finally:
        s.close()
        target.drop_cell(cell)
    return _row(
        "grpc",
        replicas,
        schedules,
        wall,
        cpu,
        stats,
        f"{refused} refused" if refused else "",
        server=f"replica, {auto_loop()}",
        concurrency=1,
        server_cpu=None if own is None or own0 is None else own - own0,
    )


def measure_server(target: Target, p: Params, server: Server, seed: int) -> dict[str, Any]:
    """One ``cpu`` measurement: ``server`` under ``concurrency`` calls in flight."""

    def load(port: int, pid: int) -> grpc_path.Measured:
        return grpc_path.measure(
            port,
            pid,
            seconds=p.seconds,
            concurrency=p.concurrency,
            channels=p.channels,
            cpu=p.cpu,
            memory_mb=p.memory_mb,
            redis_cpu=target.cpu_seconds,
            rate=p.rate,
        )

    stats = (0, 0)
    if server.kind == "bare" and server.layer != "library":
        with grpc_path.BareServer(server.loop, server.layer, target.url) as bare:
            bare.wait_listening()
            m = load(bare.port, bare.pid)
    elif server.kind == "bare":
        cell, s = _fleet(target, p, seed)
        try:
            with grpc_path.BareServer(server.loop, server.layer, target.url, cell) as bare:
                bare.wait_listening()
                stats0 = target.script_stats()
                m = load(bare.port, bare.pid)
                stats = target.script_stats_since(stats0)
        finally:
            s.close()
            target.drop_cell(cell)
    else:
        cell, s = _fleet(target, p, seed)
        try:
            proc = ServeProcess(
                grpc_path.config(POLICY),
                target.url,
                cell,
                metrics=False,
                extra_args=grpc_path.serve_args(server.loop, server.workers, server.extra),
            )
            try:
                proc.wait_listening(120)
                if server.workers > 1:
                    grpc_path.wait_workers(proc, server.workers)
                stats0 = target.script_stats()
                m = load(proc.port, proc.proc.pid)
                stats = target.script_stats_since(stats0)
            finally:
                proc.close()
        finally:
            s.close()
            target.drop_cell(cell)
    return _row(
        "cpu",
        server.workers,
        m.calls,
        m.wall,
        m.redis_cpu,
        stats,
        f"{m.refused} refused" if m.refused else "",
        server=server.label,
        concurrency=p.concurrency,
        server_cpu=m.server_cpu,
    )


def _missing(server: Server) -> str | None:
    if server.loop == "uvloop":
        try:
            choose("uvloop")
        except LoopUnavailable:
            return "uvloop not installed"
    return None


def run_cpu(target: Target, p: Params, servers: tuple[Server, ...]) -> list[dict[str, Any]]:
    """Every server ``rounds`` times, in turn; one row per server (medians),
    its ratio to the bare server of the same round."""
    runs: dict[Server, list[dict[str, Any]]] = {sv: [] for sv in servers}
    for r in range(p.rounds):
        for sv in servers:
            if _missing(sv) is None:
                runs[sv].append(measure_server(target, p, sv, p.seed + 100 * r))
    rows = []
    floor = runs.get(BARE, [])
    for sv in servers:
        why = _missing(sv)
        got = runs[sv]
        if why or not got:
            rows.append(
                {c: None for c in COLUMNS}
                | {
                    "path": "cpu",
                    "server": sv.label,
                    "replicas": sv.workers,
                    "concurrency": p.concurrency,
                    "note": why or "not measured",
                }
            )
            continue
        row = dict(got[0])
        for key in (
            "schedules_per_s",
            "cpu_us_per_call",
            "redis_cpu_share",
            "redis_us_per_schedule",
        ):
            values = [g[key] for g in got if g[key] is not None]
            row[key] = (
                round(statistics.median(values), 1 if key != "redis_cpu_share" else 3)
                if values
                else None
            )
        ratios = [
            g["cpu_us_per_call"] / b["cpu_us_per_call"]
            for g, b in zip(got, floor, strict=False)
            if g["cpu_us_per_call"] and b["cpu_us_per_call"]
        ]
        if ratios:
            row["ratio_to_bare"] = round(statistics.median(ratios), 2)
            row["ratio_low"], row["ratio_high"] = round(min(ratios), 2), round(max(ratios), 2)
        refused = sum(int(g["note"].split()[0]) for g in got if g["note"])
        row["note"] = f"{refused} refused" if refused else ""
        row["rounds"] = [{k: g[k] for k in ("schedules_per_s", "cpu_us_per_call")} for g in got]
        rows.append(row)
    return rows


def run(target: Target, p: Params | None = None) -> Result:
    p = p or Params()
    facts = machine(target)  # before the run: its load average is the one that matters
    rows: list[dict[str, Any]] = []
    notes = [
        f"{p.nodes}-node mixed fleet, 30-60 % allocated; {p.cpu} CPU / {p.memory_mb} MB "
        f"creations back to back for {p.seconds} s per row; redis_cpu_share: redis-server "
        "CPU seconds per wall second; redis_us_per_schedule: INFO commandstats usec per "
        "script call during the row (only Schedule runs then); cpu_us_per_call: CPU "
        "(user + system) of the serving processes per call"
    ]
    if "library" in p.paths:
        with LibraryReplicas(target.url, max(p.replicas)) as pool:
            for replicas in p.replicas:
                rows.append(run_library(target, p, pool, replicas))
    if "grpc" in p.paths:
        missing = grpc_path.unavailable()
        for replicas in p.replicas:
            if missing:
                rows.append(
                    {c: None for c in COLUMNS}
                    | {"path": "grpc", "replicas": replicas, "note": "not available"}
                )
            else:
                rows.append(run_grpc(target, p, replicas))
        if missing:
            notes.append(f"grpc rows not measured: {missing}")
    if "cpu" in p.paths:
        why = grpc_path.unavailable() or grpc_path.cpu_unmeasurable()
        if why:
            notes.append(f"cpu rows not measured: {why}")
            rows += [
                {c: None for c in COLUMNS}
                | {"path": "cpu", "server": sv.label, "note": "not available"}
                for sv in SERVERS
            ]
        else:
            rows += run_cpu(target, p, SERVERS)
            paced = f", paced to {p.rate:g} a second" if p.rate else ""
            notes.append(
                f"cpu: {p.concurrency} Schedule RPCs in flight over {p.channels} "
                f"connections from one load process{paced}, {p.rounds} round(s) of "
                f"{p.seconds} s per server; the bare server answers a constant "
                "(schedules_per_s is its RPCs per second); ratio_*: to the bare "
                "asyncio server of the same round (median, lowest, highest)"
            )
    per_core = [
        f"{r['path']} {r['replicas']}: {r['schedules_per_s'] / r['redis_cpu_share']:,.1f}"
        for r in rows
        if r["path"] != "cpu" and r["schedules_per_s"] and r["redis_cpu_share"]
    ]
    if per_core:
        # less sensitive to other work on the machine than the rate itself
        notes.append(
            "schedules per Redis CPU-second (schedules_per_s / redis_cpu_share): "
            + ", ".join(per_core)
        )
    return Result("throughput", COLUMNS, rows, params=asdict(p), machine=facts, notes=notes)
