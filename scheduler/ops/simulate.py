"""A simulated fleet: nodes that heartbeat with lag, N stateless replicas, gateway load.

``run(scenario)`` drives one scenario against a cell (the embedded store or a
real Redis) and returns a :class:`SimulationResult`.  It is what
``schedctl simulate`` shows and what benchmarks reuse.

    gateway worker ─ schedule (replica i mod R) ─► node.create (takes a while)
                   ─ assign   (replica i+1 mod R) or cancel when the create failed
    node k         ─ every heartbeat interval: snapshot, lag, heartbeat (replica k mod R)

Each replica is its own :class:`~scheduler.client.sync.Scheduler` with its own
connections and no state, like a ``schedctl serve`` process.  Nodes keep the
ground truth (what they really run); the scheduler only sees it through
heartbeats that arrive late, so the reservations are what hold the ceiling
in between.  The result compares the two: the highest count any node really
held against ``max_sandbox_count``, and whether the cell's numbers match the
nodes' once the fleet has settled.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import msgspec
import redis

from scheduler.client.sync import Scheduler
from scheduler.domain.catalog import STRATEGIES
from scheduler.domain.errors import (
    FailedPrecondition,
    InvalidArgument,
    NoNodesAvailable,
    SchedulerError,
)
from scheduler.domain.policy import Limits, Policy
from scheduler.domain.records import (
    MIB,
    Heartbeat,
    NodeView,
    Request,
    Stats,
)
from scheduler.ops.simnode import SimNode
from scheduler.store.keys import CellKeys
from scheduler.store.translate import reply_error, unreachable

DEFAULT_CELL = "sim"
_SHAPE = re.compile(r"(?P<cpu>\d+)x(?P<mem>\d+)(?P<unit>[MG]i?B?|)", re.I)


class NodeShape(msgspec.Struct, frozen=True, kw_only=True):
    cpu: int
    memory_mb: int

    def __str__(self) -> str:
        if self.memory_mb % 1024 == 0:
            return f"{self.cpu}x{self.memory_mb // 1024}G"
        return f"{self.cpu}x{self.memory_mb}M"


def parse_shapes(text: str) -> tuple[NodeShape, ...]:
    """``"16x32G,32x64G"`` -> shapes, cycled over the nodes.  Memory is MiB
    unless suffixed G (GiB); ``M`` / ``MiB`` / ``GiB`` are accepted too."""
    shapes = []
    for part in text.split(","):
        m = _SHAPE.fullmatch(part.strip())
        if not m:
            raise InvalidArgument(
                "node_shapes", f"entry {part.strip()!r} is not CPUxMEMORY (like 16x32G or 8x16384)"
            )
        mem = int(m["mem"]) * (1024 if m["unit"][:1].upper() == "G" else 1)
        shapes.append(NodeShape(cpu=int(m["cpu"]), memory_mb=mem))
    return tuple(shapes)


DEFAULT_SHAPES = parse_shapes("16x32G,32x64G")


class Scenario(msgspec.Struct, kw_only=True, frozen=True):
    """What to simulate.  Times are seconds of wall clock."""

    nodes: int = 8
    node_shapes: tuple[NodeShape, ...] = DEFAULT_SHAPES
    replicas: int = 3
    #: Concurrent gateway workers; 0 = two per replica.
    gateways: int = 0
    creates: int = 200
    #: Creations per second over all gateways; 0 = as fast as they go.
    rate: float = 100.0
    cpu: int = 1
    memory_mb: int = 1024
    strategy: str = "least_loaded"
    max_sandbox_count: int = 10
    heartbeat_interval: float = 0.25
    #: A heartbeat reaches the scheduler up to this long after its snapshot.
    heartbeat_lag: float = 0.1
    #: A node takes up to this long to create a sandbox.
    create_delay: float = 0.05
    #: A sandbox ends this long after it started; 0 = it stays.
    sandbox_lifetime: float = 0.0
    #: Fraction of creations the node fails (the gateway cancels the reservation).
    create_fail_rate: float = 0.0
    #: Nodes send their sandbox roster; False = counter mode (create_successes only).
    roster: bool = True
    seed: int = 1

    @property
    def gateway_workers(self) -> int:
        return self.gateways or 2 * self.replicas

    def validate(self) -> Scenario:
        def check(field: str, ok: bool, rule: str) -> None:
            if not ok:
                raise InvalidArgument(field, f"must be {rule}, not {getattr(self, field)!r}")

        check("nodes", 1 <= self.nodes <= 10_000, "1..10000")
        check("replicas", 1 <= self.replicas <= 64, "1..64")
        check("gateways", 0 <= self.gateways <= 256, "0..256")
        check("creates", 0 <= self.creates <= 1_000_000, "0..1000000")
        check("rate", self.rate >= 0, ">= 0")
        check("cpu", 0 <= self.cpu <= 4096, "0..4096")
        check("memory_mb", 0 <= self.memory_mb <= 1 << 24, "0..16777216")
        check("strategy", self.strategy in STRATEGIES, "one of " + ", ".join(STRATEGIES))
        check("max_sandbox_count", 0 <= self.max_sandbox_count <= 1_000_000, "0..1000000")
        check("heartbeat_interval", 0.01 <= self.heartbeat_interval <= 60, "0.01..60 s")
        for name in ("heartbeat_lag", "create_delay"):
            check(name, 0 <= getattr(self, name) <= 60, "0..60 s")
        check("sandbox_lifetime", self.sandbox_lifetime >= 0, ">= 0 s")
        check("create_fail_rate", 0 <= self.create_fail_rate <= 1, "0..1")
        check(
            "node_shapes",
            len(self.node_shapes) > 0
            and all(s.cpu > 0 and s.memory_mb > 0 for s in self.node_shapes),
            "non-empty, every cpu and memory > 0",
        )
        return self

    def policy(self) -> Policy:
        # Heartbeats of a healthy simulated node are never stale, however short the interval.
        report_ttl = max(30_000, int(20_000 * (self.heartbeat_interval + self.heartbeat_lag)))
        return Policy(
            strategy=self.strategy,
            report_ttl_ms=report_ttl,
            limits=Limits(max_sandbox_count=self.max_sandbox_count),
        )


class NodeResult(msgspec.Struct, kw_only=True):
    node_id: str
    cpu_count: int
    memory_mb: int
    placed: int
    #: What the node itself runs at the end.
    sandboxes: int
    #: The highest count the node itself ever ran (the number a ceiling is about).
    peak_sandboxes: int
    #: The highest max(cpu, memory) allocation / capacity the node itself ever held.
    peak_pressure: float


class SimulationResult(msgspec.Struct, kw_only=True):
    scenario: Scenario
    target: str
    cell: str
    placed: int
    refused: int
    #: Creations the node failed; their reservations were cancelled.
    failed_creates: int
    #: Refusal message -> how many requests got it.
    refusals: dict[str, int]
    #: Unexpected errors (e.g. Redis unreachable) by message.
    errors: dict[str, int]
    ceiling: int
    max_node_count: int
    max_node_id: str
    #: Every node stayed at or under max_sandbox_count (True when no ceiling is set).
    ceiling_held: bool
    peak_pressure: float
    peak_pressure_node: str
    #: After settling: no reservation left and every node's count in the cell
    #: equals what the node runs (each sandbox counted exactly once).
    settled: bool
    pending_after_settle: int
    heartbeats: int
    schedule_p50_ms: float
    schedule_p99_ms: float
    duration_s: float
    nodes: list[NodeResult]
    stats: Stats
    final_view: list[NodeView]


# ---------------------------------------------------------------------------
# The fleet
# ---------------------------------------------------------------------------
class _Node:
    """One simulated node (:class:`~scheduler.ops.simnode.SimNode`) as this
    scenario drives it: creates that take a while and may fail, and a
    heartbeat loop whose heartbeats arrive late, all drawn from its own seed."""

    def __init__(self, index: int, shape: NodeShape, scenario: Scenario) -> None:
        self.scenario = scenario
        node_id = f"node-{index + 1:02d}"
        self.sim = SimNode(
            node_id,
            shape.cpu,
            shape.memory_mb * MIB,
            endpoint=f"10.0.{index // 250}.{index % 250 + 1}:5007",
            instance=f"{node_id}-sim",
            busy_percent=60,
            memory_used_percent=70,
            lifetime_s=scenario.sandbox_lifetime,
        )
        self.shape = shape
        self.rng = random.Random(f"{scenario.seed}/node/{index}")
        self.placed = 0
        self.heartbeats = 0

    @property
    def node_id(self) -> str:
        return self.sim.node_id

    def create(self, sandbox_id: str, cpu: int, memory_bytes: int) -> bool:
        """The gateway forwards a create; the sandbox exists once this returns True."""
        with self.sim.lock:
            self.placed += 1
            delay = self.rng.uniform(0, self.scenario.create_delay)
            fails = self.rng.random() < self.scenario.create_fail_rate
        time.sleep(delay)
        if fails:
            self.sim.fail_create()
            return False
        self.sim.create(sandbox_id, cpu, memory_bytes)
        return True

    def snapshot(self) -> Heartbeat:
        return self.sim.heartbeat(roster=self.scenario.roster)

    def beat(self, replica: Scheduler) -> None:
        replica.heartbeat(self.snapshot())
        self.heartbeats += 1

    def heartbeat_loop(
        self, replica: Scheduler, stop: threading.Event, errors: Callable[[str], None]
    ) -> None:
        interval, lag = self.scenario.heartbeat_interval, self.scenario.heartbeat_lag
        if stop.wait(self.rng.uniform(0, interval)):  # spread the fleet's phases
            return
        while True:
            hb = self.snapshot()
            # The snapshot travels for a while: the scheduler sees the past.
            if stop.wait(self.rng.uniform(0, lag)):
                return
            try:
                replica.heartbeat(hb)
                self.heartbeats += 1
            except SchedulerError as e:
                errors(f"heartbeat: {e.message}")
            if stop.wait(interval * self.rng.uniform(0.8, 1.2)):
                return

    def result(self) -> NodeResult:
        with self.sim.lock:
            return NodeResult(
                node_id=self.node_id,
                cpu_count=self.shape.cpu,
                memory_mb=self.shape.memory_mb,
                placed=self.placed,
                sandboxes=len(self.sim.sandboxes),
                peak_sandboxes=self.sim.peak_sandboxes,
                peak_pressure=self.sim.peak_pressure,
            )


class _Tally:
    """What the gateway workers count, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_index = 0
        self.done = self.placed = self.refused = self.failed = 0
        self.refusals: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.latencies_ms: list[float] = []

    def take(self, total: int) -> int | None:
        with self.lock:
            if self.next_index >= total:
                return None
            self.next_index += 1
            return self.next_index - 1

    def error(self, message: str) -> None:
        with self.lock:
            self.errors[message] += 1


Progress = Callable[[int, int, int], None]
"""Called as (creates done, placed, refused) after each create, from worker threads."""


def _gateway(
    scenario: Scenario,
    replicas: list[Scheduler],
    nodes: dict[str, _Node],
    tally: _Tally,
    t0: float,
    on_progress: Progress | None,
) -> None:
    req = Request.cold(scenario.cpu, scenario.memory_mb)
    while (i := tally.take(scenario.creates)) is not None:
        if scenario.rate > 0:
            delay = t0 + i / scenario.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        placer = replicas[i % len(replicas)]
        # Record through another replica: none of them holds state of its own.
        recorder = replicas[(i + 1) % len(replicas)]
        outcome, message, elapsed = "error", "", 0.0
        try:
            start = time.perf_counter()
            try:
                p = placer.schedule(req)
            finally:
                elapsed = (time.perf_counter() - start) * 1000
            node = nodes[p.node_id]
            sandbox_id = f"sbx-{i:06d}"
            if node.create(sandbox_id, p.cpu, p.memory_bytes):
                recorder.assign(sandbox_id, p.node_id, p.endpoint, p.reservation_id)
                outcome = "placed"
            else:
                assert p.reservation_id is not None
                recorder.cancel(p.reservation_id)
                outcome = "failed"
        except NoNodesAvailable as e:
            outcome, message = "refused", e.message
        except SchedulerError as e:
            outcome, message = "error", e.message
        except Exception as e:  # a bug must show in the result, not kill the worker silently
            outcome, message = "error", f"{type(e).__name__}: {e}"
        with tally.lock:
            tally.latencies_ms.append(elapsed)
            tally.done += 1
            if outcome == "placed":
                tally.placed += 1
            elif outcome == "failed":
                tally.failed += 1
            elif outcome == "refused":
                tally.refused += 1
                tally.refusals[message] += 1
            else:
                tally.errors[message] += 1
            progress = (tally.done, tally.placed, tally.refused)
        if on_progress is not None:
            on_progress(*progress)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def cell_has_state(replica: Scheduler) -> bool:
    return bool(
        next(iter(replica.client.scan_iter(match=replica.keys.base + "*", count=100)), None)
    )


def reset_cell(replica: Scheduler) -> int:
    """Delete every key of the replica's cell; returns how many went."""
    gone = 0
    for key in list(replica.client.scan_iter(match=replica.keys.base + "*", count=500)):
        gone += int(replica.client.delete(key))
    return gone


@contextmanager
def _replicas(url: str | None, cell: str, count: int) -> Iterator[list[Scheduler]]:
    replicas = [Scheduler.connect(url, cell=cell) for _ in range(count)]
    try:
        yield replicas
    finally:
        for r in replicas:
            r.close()


def run(
    scenario: Scenario,
    url: str | None = None,
    cell: str = DEFAULT_CELL,
    *,
    reset: bool = False,
    on_progress: Progress | None = None,
) -> SimulationResult:
    """Run ``scenario`` against ``url`` (None = the embedded store) in ``cell``.

    The cell must be empty unless ``reset`` (which deletes every key of the
    cell first).  The cell is left as the run ends, to inspect with schedctl.
    Raises InvalidArgument for a bad scenario, FailedPrecondition for a cell
    that holds state, StoreUnavailable when Redis cannot be reached.
    """
    scenario.validate()
    CellKeys(cell)  # validates the cell name before anything is written
    with _replicas(url, cell, scenario.replicas) as replicas:
        first = replicas[0]
        try:
            first.ping()
            if cell_has_state(first):
                if not reset:
                    raise FailedPrecondition(
                        f"cell {cell!r} at {first.target} already holds scheduler state; "
                        "pass --reset (reset=True) to wipe it, or choose another cell"
                    )
                reset_cell(first)
        except SchedulerError:
            raise
        except Exception as e:  # scan/delete go straight to the client
            raise _unavailable(first, e) from None
        first.sync_policy(scenario.policy(), overwrite=True)
        return _run(scenario, replicas, cell, on_progress)


def _unavailable(replica: Scheduler, e: Exception) -> SchedulerError:
    refused = (
        reply_error(e, replica.target) if isinstance(e, redis.exceptions.ResponseError) else None
    )
    return refused or unreachable(replica.target, e)


def _run(
    scenario: Scenario, replicas: list[Scheduler], cell: str, on_progress: Progress | None
) -> SimulationResult:
    shapes = scenario.node_shapes
    fleet = [_Node(k, shapes[k % len(shapes)], scenario) for k in range(scenario.nodes)]
    by_id = {n.node_id: n for n in fleet}
    for k, node in enumerate(fleet):  # everyone is READY before the load starts
        node.beat(replicas[k % len(replicas)])

    tally = _Tally()
    stop = threading.Event()
    beaters = [
        threading.Thread(
            target=n.heartbeat_loop,
            name=f"sim-{n.node_id}",
            args=(replicas[k % len(replicas)], stop, tally.error),
            daemon=True,
        )
        for k, n in enumerate(fleet)
    ]
    t0 = time.monotonic()
    workers = [
        threading.Thread(
            target=_gateway,
            name=f"sim-gateway-{w}",
            args=(scenario, replicas, by_id, tally, t0, on_progress),
            daemon=True,
        )
        for w in range(scenario.gateway_workers)
    ]
    try:
        for t in beaters + workers:
            t.start()
        for t in workers:
            t.join()
        settled, pending = _settle(scenario, replicas[0], fleet)
    finally:
        stop.set()
        for t in beaters:
            t.join()
    duration = time.monotonic() - t0
    view = replicas[0].nodes()
    stats = replicas[0].stats()

    results = [n.result() for n in fleet]
    worst = max(results, key=lambda r: r.peak_sandboxes)  # the first of equals
    hottest = max(results, key=lambda r: r.peak_pressure)
    ceiling = scenario.max_sandbox_count
    return SimulationResult(
        scenario=scenario,
        target=replicas[0].target,
        cell=cell,
        placed=tally.placed,
        refused=tally.refused,
        failed_creates=tally.failed,
        refusals=dict(tally.refusals),
        errors=dict(tally.errors),
        ceiling=ceiling,
        max_node_count=worst.peak_sandboxes,
        max_node_id=worst.node_id,
        ceiling_held=ceiling == 0 or worst.peak_sandboxes <= ceiling,
        peak_pressure=round(hottest.peak_pressure, 6),
        peak_pressure_node=hottest.node_id,
        settled=settled,
        pending_after_settle=pending,
        heartbeats=sum(n.heartbeats for n in fleet),
        schedule_p50_ms=_percentile(tally.latencies_ms, 0.5),
        schedule_p99_ms=_percentile(tally.latencies_ms, 0.99),
        duration_s=round(duration, 3),
        nodes=results,
        stats=stats,
        final_view=view,
    )


def _settle(scenario: Scenario, replica: Scheduler, fleet: list[_Node]) -> tuple[bool, int]:
    """Let heartbeats catch up: until no reservation is left and the cell counts
    exactly what every node runs, or a few heartbeat rounds have passed."""
    rounds = 4 * (scenario.heartbeat_interval * 1.2 + scenario.heartbeat_lag)
    deadline = time.monotonic() + rounds + scenario.create_delay + 2.0  # slack for busy machines
    pending = -1
    while True:
        try:
            pending = replica.stats().pending
            counts = {v.node_id: v.sandbox_count for v in replica.nodes()}
            if pending == 0 and all(counts.get(n.node_id) == n.sim.count() for n in fleet):
                return True, 0
        except SchedulerError:
            pass
        if time.monotonic() > deadline:
            return False, pending
        time.sleep(min(0.05, scenario.heartbeat_interval / 2))


__all__ = [
    "DEFAULT_CELL",
    "NodeResult",
    "NodeShape",
    "Scenario",
    "SimulationResult",
    "parse_shapes",
    "reset_cell",
    "run",
]
