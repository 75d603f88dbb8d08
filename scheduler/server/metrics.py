"""Prometheus metrics of one replica, on a private registry.

The reference system's series keep its names, label values and buckets, so
its dashboards and alerts read ours unchanged (its
services/scheduler/internal/metrics.go and
services/shared/observability/buckets.go):

    agentenv_scheduler_rpc_duration_seconds{rpc,status}            histogram, this replica
    agentenv_scheduler_schedule_duration_seconds{strategy,status}  histogram, this replica
    agentenv_scheduler_schedule_assignments_total{strategy}        counter, this replica
    agentenv_scheduler_observed_nodes{status}                      gauge, whole cell

``status`` of a call is the reference's spelling of its gRPC code
(:func:`status_label`: ``ok``, ``unavailable``, ...), a node's status is
lower case (``ready``, ... and ``unspecified``), and the histograms use
:data:`DURATION_BUCKETS`.

Ours:

    sched_placements_total                      Schedules answered with a node, this replica
    sched_refusals_total{reason}                Schedules refused: each counted reason of a
                                                "no nodes available" answer, or ``redis``
    sched_locality_placements_total{warmth}     placements with locality on, by what the chosen
                                                node held: full, partial, cold (this replica)
    sched_locality_pull_bytes_total             bytes of requirements those placements' nodes
                                                lack (sizes given), this replica
    sched_build_info{version,commit}            1
    sched_reservations_pending                  gauge, whole cell
    sched_reservations_ended_total{outcome}     released / cancelled / expired, whole cell
    sched_redis_up                              1 while this replica reaches Redis
    sched_redis_errors_total                    calls this replica failed on Redis
    sched_redis_evicted_keys                    keys Redis evicted (INFO stats), as last probed
    sched_redis_rewinds_total{reason}           the cell settled because its data went back in
                                                time (rewound) or Redis time jumped (clock),
                                                by this replica
    sched_rewound_reservations_total            reservations that came back from the past,
                                                ended by this replica
    sched_replayed_assignments_total            assignments this replica wrote again after a
                                                failover settle or a rewind
    sched_owed_assignments                      RecordAssignments this replica refused for Redis
                                                and will write once it answers (gauge)
    sched_replayed_reservations_total{outcome}  placements this replica answered that the cell
                                                lacked after a settle, written back live
                                                (pending) or ended
    sched_script_duration_seconds{script}       Lua script call latency, this replica
    sched_batches_total{kind}                   batch calls sent (schedule, heartbeat), this replica
    sched_batched_calls_total{kind}             the calls they carried (their mean size: the ratio)

and the client library's ``process_*``, ``python_info`` and ``python_gc_*``.
Cell-wide values are read from Redis by the replica's monitor loop (every
replica reports the same numbers: aggregate them with max, not sum).  The
node counts are the cell's census (lua/census-5.lua): every replica's monitor
reads a bounded slice of the fleet a tick, all replicas sharing one pass, and
the gauge shows the last finished pass (all zero before the first one).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from scheduler import version
from scheduler.domain.catalog import ADMISSION_TEXT, CEILING_NAMES, NODE_STATUSES, OUTCOMES

#: the reference's duration buckets (services/shared/observability/buckets.go)
DURATION_BUCKETS = (
    0.001,
    0.002,
    0.005,
    0.010,
    0.025,
    0.050,
    0.100,
    0.250,
    0.500,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    900.0,
    1200.0,
    1800.0,
)
#: our own script latencies: a Lua call takes well under the reference's first bucket
SCRIPT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

#: gRPC code -> the reference's ``status`` label (GRPCStatusLabel); others: "other"
_STATUS_LABELS = {
    grpc.StatusCode.OK: "ok",
    grpc.StatusCode.CANCELLED: "canceled",
    grpc.StatusCode.INVALID_ARGUMENT: "invalid_argument",
    grpc.StatusCode.NOT_FOUND: "not_found",
    grpc.StatusCode.FAILED_PRECONDITION: "failed_precondition",
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "deadline_exceeded",
    grpc.StatusCode.INTERNAL: "internal",
}


def status_label(code: grpc.StatusCode) -> str:
    """The ``status`` label of a call answered with ``code``, as the reference spells it."""
    return _STATUS_LABELS.get(code, "other")


#: statuses a node can be derived to (read time never derives UNSPECIFIED)
DERIVED_STATUSES = tuple(s for s in NODE_STATUSES if s != "UNSPECIFIED")
#: a node's status label: the wire name in lower case (UNSPECIFIED included)
NODE_STATUS_LABELS = tuple(s.lower() for s in NODE_STATUSES)

#: The reasons the selection stages give for leaving a node out
#: (lua/includes/stages.lua: check_status, check_ceilings, check_capacity; a
#: ceiling's reason is counted without its limit), ``no nodes`` for a cell
#: with none, and ``redis`` for a Schedule that failed on Redis.  Each starts
#: at 0, so a rate() alert has a series before the first refusal.
REFUSAL_REASONS = (
    "corrupt record",
    "lingering",
    "stale heartbeat",
    "unhealthy",
    "not ready",
    "awaiting heartbeat",
    "no endpoint",
    *(f"not accepting: {text}" for text in ADMISSION_TEXT.values()),
    *(f"at {name}" for name in CEILING_NAMES),
    "insufficient cpu",
    "insufficient memory",
    "no nodes",
    "index behind",
    "redis",
)
_NO_NODES_PREFIX = "no nodes available: "
#: what a locality placement's node held (Placement.warmth)
WARMTHS = ("full", "partial", "cold")


def refusal_reasons(message: str) -> dict[str, int]:
    """The counted reasons of a "no nodes available" message, by label:
    ``no nodes available: 0/4 nodes available: 3 at max_sandbox_count (10),
    1 stale heartbeat`` -> ``{"at max_sandbox_count": 3, "stale heartbeat": 1}``;
    a cell without nodes -> ``{"no nodes": 0}``."""
    _, _, counted = message.removeprefix(_NO_NODES_PREFIX).partition(": ")
    reasons: dict[str, int] = {}
    for part in counted.split(", "):
        count, _, reason = part.strip().partition(" ")
        if not count.isdigit() or not reason:
            continue
        if reason.startswith("at ") and reason.endswith(")"):
            reason = reason.partition(" (")[0]  # the limit would make a label per value
        reasons[reason] = reasons.get(reason, 0) + int(count)
    return reasons or {"no nodes": 0}


class _CellCollector(Collector):
    """Cell-wide numbers from the latest snapshot the monitor loop took."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, int] = {}
        self._pending: int | None = None
        self._ended: dict[str, int] = {}

    def update(self, nodes: dict[str, int], pending: int, ended: dict[str, int]) -> None:
        with self._lock:
            self._nodes = dict(nodes)
            self._pending = pending
            self._ended = dict(ended)

    def update_nodes(self, nodes: dict[str, int]) -> None:
        with self._lock:
            self._nodes = dict(nodes)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            nodes, pending, ended = dict(self._nodes), self._pending, dict(self._ended)
        g = GaugeMetricFamily(
            "agentenv_scheduler_observed_nodes",
            "Nodes known to the cell, by derived status.",
            labels=["status"],
        )
        for status in NODE_STATUSES:
            g.add_metric([status.lower()], nodes.get(status, 0))
        yield g
        if pending is not None:
            yield GaugeMetricFamily(
                "sched_reservations_pending",
                "Placements not yet accounted for (whole cell).",
                value=pending,
            )
            c = CounterMetricFamily(
                "sched_reservations_ended",
                "Reservations ended, by outcome (whole cell).",
                labels=["outcome"],
            )
            for outcome in OUTCOMES:
                c.add_metric([outcome], ended.get(outcome, 0))
            yield c


class _BatchCollector(Collector):
    """The coalescers' own counters, read when scraped: batch calls sent and
    the calls they carried, by kind."""

    def __init__(self, coalescers: dict[str, Any]) -> None:
        self.coalescers = coalescers

    def collect(self) -> Iterator[Metric]:
        sent = CounterMetricFamily(
            "sched_batches", "Batch calls this replica sent, by kind.", labels=["kind"]
        )
        carried = CounterMetricFamily(
            "sched_batched_calls", "Calls those batch calls carried, by kind.", labels=["kind"]
        )
        for kind, c in self.coalescers.items():
            sent.add_metric([kind], c.batches)
            carried.add_metric([kind], c.batched)
        yield sent
        yield carried


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rpc_duration = Histogram(
            "agentenv_scheduler_rpc_duration_seconds",
            "Scheduler gRPC duration by RPC and status.",
            ["rpc", "status"],
            registry=r,
            buckets=DURATION_BUCKETS,
        )
        self.schedule_duration = Histogram(
            "agentenv_scheduler_schedule_duration_seconds",
            "Scheduler Schedule duration by strategy and status.",
            ["strategy", "status"],
            registry=r,
            buckets=DURATION_BUCKETS,
        )
        self.assignments = Counter(
            "agentenv_scheduler_schedule_assignments",
            "Successful scheduler assignments by strategy.",
            ["strategy"],
            registry=r,
        )
        self.placements = Counter(
            "sched_placements", "Schedule calls this replica answered with a node.", registry=r
        )
        self.refusals = Counter(
            "sched_refusals",
            "Schedule calls this replica refused, by reason: each counted reason of a "
            "'no nodes available' answer (a ceiling without its limit), index behind (the "
            "placement index catching up on a fleet too large to scan), or redis.",
            ["reason"],
            registry=r,
        )
        for reason in REFUSAL_REASONS:
            self.refusals.labels(reason)
        self.warmth = Counter(
            "sched_locality_placements",
            "Placements with locality on, by what the chosen node held of the request's "
            "artifacts (or its template's recent starts): full, partial or cold.",
            ["warmth"],
            registry=r,
        )
        for warmth in WARMTHS:
            self.warmth.labels(warmth)
        self.pull_bytes = Counter(
            "sched_locality_pull_bytes",
            "Bytes of locality requirements (sizes given) the chosen nodes lack.",
            registry=r,
        )
        Gauge(
            "sched_build_info",
            "This build: its version and commit (always 1).",
            ["version", "commit"],
            registry=r,
        ).labels(version.version(), version.commit()).set(1)
        self.redis_up = Gauge("sched_redis_up", "1 while this replica reaches Redis.", registry=r)
        self.redis_errors = Counter(
            "sched_redis_errors",
            "Calls this replica failed because Redis was unreachable.",
            registry=r,
        )
        self.redis_evicted_keys = Gauge(
            "sched_redis_evicted_keys",
            "Keys Redis evicted for memory (INFO stats evicted_keys), as this replica last read.",
            registry=r,
        )
        self.redis_rewinds = Counter(
            "sched_redis_rewinds",
            "Times this replica settled the cell because its data went back in time "
            "(reason rewound) or Redis time jumped (reason clock).",
            ["reason"],
            registry=r,
        )
        self.rewound_reservations = Counter(
            "sched_rewound_reservations",
            "Reservations that came back from the past (a rewound dataset), ended by this replica.",
            registry=r,
        )
        self.replayed_assignments = Counter(
            "sched_replayed_assignments",
            "Assignments this replica answered lately and wrote again after a failover "
            "settle or a rewind (Redis may have lost them).",
            registry=r,
        )
        self.owed_assignments = Gauge(
            "sched_owed_assignments",
            "RecordAssignments this replica refused for Redis (down, failing over, writes "
            "held) and writes once Redis answers.",
            registry=r,
        )
        self.replayed_reservations = Counter(
            "sched_replayed_reservations",
            "Placements this replica answered OK that the cell lacked after a failover "
            "settle or a rewind, written back: live (pending) or ended.",
            ["outcome"],
            registry=r,
        )
        self.script_duration = Histogram(
            "sched_script_duration_seconds",
            "Lua script call latency by script.",
            ["script"],
            registry=r,
            buckets=SCRIPT_BUCKETS,
        )
        self.cell = _CellCollector()
        r.register(self.cell)
        # the process' own series, as on the library's default registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self._server: Any = None

    def refused(self, message: str) -> None:
        """Count a "no nodes available" answer under each reason it counts."""
        for reason in refusal_reasons(message):
            self.refusals.labels(reason).inc()

    def watch_batches(self, coalescers: dict[str, Any]) -> None:
        """Report these coalescers' counters (kind -> ``scheduler.client.aio.Coalescer``)."""
        self.registry.register(_BatchCollector(coalescers))

    def serve(self, listen: str) -> int:
        """Start /metrics on ``host:port`` (a thread); returns the bound port."""
        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        if host == "::":
            host = "0.0.0.0"
        server, _thread = start_http_server(int(port), addr=host, registry=self.registry)
        self._server = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
