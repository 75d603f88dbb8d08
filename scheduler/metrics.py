"""Prometheus metrics of one replica, on a private registry.

The reference system's names keep their meaning (dashboards keep working):

    agentenv_scheduler_rpc_duration_seconds{rpc,status}        histogram, this replica
    agentenv_scheduler_schedule_duration_seconds{strategy,status}  histogram, this replica
    agentenv_scheduler_schedule_assignments_total{strategy}   counter, this replica
    agentenv_scheduler_observed_nodes{status}                  gauge, whole cell

Ours:

    sched_reservations_pending                  gauge, whole cell
    sched_reservations_ended_total{outcome}     released / cancelled / expired, whole cell
    sched_redis_up                              1 while this replica reaches Redis
    sched_redis_errors_total                    calls this replica failed on Redis
    sched_redis_evicted_keys                    keys Redis evicted (INFO stats), as last probed
    sched_script_duration_seconds{script}       Lua script call latency, this replica
    sched_batches_total{kind}                   batch calls sent (schedule, heartbeat), this replica
    sched_batched_calls_total{kind}             the calls they carried (their mean size: the ratio)

Cell-wide values are read from Redis by the replica's monitor loop (every
replica reports the same numbers: aggregate them with max, not sum).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler.catalog import NODE_STATUSES, OUTCOMES

#: statuses a node can be derived to (read time never derives UNSPECIFIED)
DERIVED_STATUSES = tuple(s for s in NODE_STATUSES if s != "UNSPECIFIED")
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


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

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            nodes, pending, ended = dict(self._nodes), self._pending, dict(self._ended)
        g = GaugeMetricFamily(
            "agentenv_scheduler_observed_nodes",
            "Nodes known to the cell, by derived status.",
            labels=["status"],
        )
        for status in DERIVED_STATUSES:
            g.add_metric([status], nodes.get(status, 0))
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
            "gRPC call latency by RPC and status code.",
            ["rpc", "status"],
            registry=r,
            buckets=_BUCKETS,
        )
        self.schedule_duration = Histogram(
            "agentenv_scheduler_schedule_duration_seconds",
            "Schedule latency by strategy and status code.",
            ["strategy", "status"],
            registry=r,
            buckets=_BUCKETS,
        )
        self.assignments = Counter(
            "agentenv_scheduler_schedule_assignments",
            "Schedule calls that picked a node.",
            ["strategy"],
            registry=r,
        )
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
        self.script_duration = Histogram(
            "sched_script_duration_seconds",
            "Lua script call latency by script.",
            ["script"],
            registry=r,
            buckets=_BUCKETS,
        )
        self.cell = _CellCollector()
        r.register(self.cell)
        self._server: Any = None

    def watch_batches(self, coalescers: dict[str, Any]) -> None:
        """Report these coalescers' counters (kind -> ``scheduler.aio.Coalescer``)."""
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
