"""/metrics as the reference's dashboards and alerts read it: its label values
and buckets on a live ``schedctl serve``, refusals counted by reason (a full
cell and a Redis that cannot serve are different series), build info and the
process' own series."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from scheduler import Limits, Policy, Scheduler, version
from scheduler.domain.catalog import ADMISSION_TEXT, CEILING_NAMES, FULL_SCAN_MAX
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.server.metrics import (
    DURATION_BUCKETS,
    REFUSAL_REASONS,
    refusal_reasons,
    status_label,
)
from scheduler.testing.replicas import ServeProcess, ThreadedReplica
from tests.helpers import cold, endpoint_md, fleet, hb_request

Make = Callable[..., ThreadedReplica]
ROOT = Path(__file__).resolve().parent.parent

#: services/shared/observability/buckets.go of the reference, as written there
UPSTREAM_BUCKETS = [
    "0.001",
    "0.002",
    "0.005",
    "0.010",
    "0.025",
    "0.050",
    "0.100",
    "0.250",
    "0.500",
    "1.0",
    "2.5",
    "5.0",
    "10.0",
    "30.0",
    "60.0",
    "120.0",
    "300.0",
    "600.0",
    "900.0",
    "1200.0",
    "1800.0",
]


def scrape(port: int) -> list[Sample]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def select(samples: list[Sample], query: str) -> list[Sample]:
    """A PromQL instant-vector selector with ``=`` matchers:
    ``name{label="value",...}``."""
    m = re.fullmatch(r"(\w+)(?:\{(.*)\})?", query)
    assert m is not None, query
    name, matchers = m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
    return [
        s
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in matchers.items())
    ]


def one(samples: list[Sample], query: str) -> float:
    found = select(samples, query)
    assert len(found) == 1, f"{query}: {found}"
    return float(found[0].value)


BUILD_COMMIT = "0123456789ab"


@pytest.mark.slow
@pytest.mark.real_only
def test_upstream_queries_read_a_live_replicas_metrics(
    processes: list[ServeProcess], real_url: str
) -> None:
    p = ServeProcess(
        {"scheduler": {"node_resource_limit": {"max_sandbox_count": 1}}},
        real_url,
        cell="upstream-metrics",
        # the commit as an image bakes it in (read from git otherwise, which a
        # commit made while the suite runs would move under the test)
        env={"SCHEDULER_BUILD_COMMIT": BUILD_COMMIT},
    )
    processes.append(p)
    p.wait_serving()
    with grpc.insecure_channel(p.address) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"))
        assert stub.Schedule(cold(1, 16)).node.node_id == "n1"
        with pytest.raises(grpc.RpcError) as refused:
            stub.Schedule(cold(1, 16))  # n1 is at its ceiling
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError):
            stub.LookupNode(pb.LookupNodeRequest(sandbox_id="nobody"))

    # the monitor reads the cell's nodes every 5 s: until it has seen n1
    deadline = time.monotonic() + 30
    while True:
        samples = scrape(p.metrics_port)
        if one(samples, 'agentenv_scheduler_observed_nodes{status="ready"}') == 1:
            break
        assert time.monotonic() < deadline, "the monitor never counted n1"
        time.sleep(0.2)

    # upstream's queries, label for label
    ok = 'agentenv_scheduler_rpc_duration_seconds_count{rpc="Schedule",status="ok"}'
    assert one(samples, ok) == 1
    assert (
        one(
            samples,
            'agentenv_scheduler_rpc_duration_seconds_count{rpc="Schedule",status="unavailable"}',
        )
        == 1
    )
    assert (
        one(
            samples,
            'agentenv_scheduler_rpc_duration_seconds_count{rpc="LookupNode",status="not_found"}',
        )
        == 1
    )
    assert (
        one(samples, 'agentenv_scheduler_schedule_assignments_total{strategy="least_loaded"}') == 1
    )
    for status in ("ready", "connecting", "unhealthy", "lingering", "unspecified"):
        assert select(samples, f'agentenv_scheduler_observed_nodes{{status="{status}"}}')
    assert not [s for s in samples if s.labels.get("status") in ("OK", "READY", "UNAVAILABLE")]

    # histogram_quantile over upstream's buckets: every le it writes, and +Inf
    for name in (
        'agentenv_scheduler_rpc_duration_seconds_bucket{rpc="Schedule",status="ok"}',
        'agentenv_scheduler_schedule_duration_seconds_bucket{strategy="least_loaded",status="ok"}',
    ):
        buckets = select(samples, name)
        les = [float(s.labels["le"]) for s in buckets]
        assert les == [float(b) for b in UPSTREAM_BUCKETS] + [float("inf")]
        assert buckets[-1].value == 1
    for le in UPSTREAM_BUCKETS:  # a query that spells le as upstream's Go client does
        assert select(
            samples,
            f'agentenv_scheduler_schedule_duration_seconds_bucket{{status="ok",le="{float(le)}"}}',
        )

    # ours beside them: the refusal by its reason, build info, the process' series
    assert one(samples, "sched_placements_total") == 1
    assert one(samples, 'sched_refusals_total{reason="at max_sandbox_count"}') == 1
    assert one(samples, 'sched_refusals_total{reason="redis"}') == 0
    assert (
        one(
            samples,
            f'sched_build_info{{version="{version.version()}",commit="{BUILD_COMMIT}"}}',
        )
        == 1
    )
    assert one(samples, "process_resident_memory_bytes") > 0
    assert one(samples, "process_cpu_seconds_total") > 0
    assert select(samples, "python_info")
    assert select(samples, 'python_gc_collections_total{generation="0"}')


@pytest.mark.real_only
def test_a_full_cell_and_a_redis_that_cannot_serve_are_different_refusals(
    make_replica: Make, redis_client: Any
) -> None:
    r = make_replica(Policy(limits=Limits(max_sandbox_count=1)))
    assert r.replica is not None
    reg = r.replica.metrics.registry

    def refusals(reason: str) -> float | None:
        v: float | None = reg.get_sample_value("sched_refusals_total", {"reason": reason})
        return v

    # every reason has a series from the start (rate() alerts need one)
    assert all(refusals(reason) == 0 for reason in REFUSAL_REASONS)
    for node_id in ("n1", "n2"):
        r.stub.Heartbeat(hb_request(node_id), metadata=endpoint_md(f"{node_id}:5000"))
    r.stub.Schedule(cold(1, 16))
    r.stub.Schedule(cold(1, 16))
    with pytest.raises(grpc.RpcError) as full:
        r.stub.Schedule(cold(1, 16))
    assert "2 at max_sandbox_count (1)" in (full.value.details() or "")
    # one refused call naming one reason (for two nodes) counts once
    assert refusals("at max_sandbox_count") == 1
    assert refusals("redis") == 0

    redis_client.config_set("maxmemory", "1")
    try:
        with pytest.raises(grpc.RpcError) as down:
            r.stub.Schedule(cold(1, 16))
    finally:
        redis_client.config_set("maxmemory", "0")
    assert down.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (down.value.details() or "").startswith("Redis at ")
    assert refusals("redis") == 1
    assert refusals("at max_sandbox_count") == 1
    assert reg.get_sample_value("sched_placements_total") == 2
    assert (
        reg.get_sample_value(
            "agentenv_scheduler_schedule_duration_seconds_count",
            {"strategy": "least_loaded", "status": "unavailable"},
        )
        == 2
    )


@pytest.mark.real_only  # (fakeredis: the test's client and the replica's loop share one Lua)
def test_a_schedule_the_index_cannot_decide_is_unavailable_and_counted(
    make_replica: Make, redis_client: Any
) -> None:
    """On a fleet larger than the full scan reads (FULL_SCAN_MAX), a
    Schedule the placement index cannot decide (here: the index of an
    older layout being dropped) answers UNAVAILABLE naming what is under
    way, reserves nothing, and counts under the reason `index behind`."""
    policy = Policy(report_ttl_ms=3_600_000)
    r = make_replica(policy)
    assert r.replica is not None
    monitor = r.replica._monitor

    async def stop_monitor() -> None:  # (its index steps would end the drop)
        assert r.replica is not None
        r.replica._stopping = True  # (the monitor ends after its tick)
        await monitor

    r.call(stop_monitor())
    reg = r.replica.metrics.registry
    s = Scheduler(redis_client, cell=r.settings.cell)
    fleet(s, FULL_SCAN_MAX + 100)
    s.client.hset(s.keys.policy, "index_format", "0")  # (an older version's)
    assert s.sync_policy(policy) == "same"
    assert s.client.hget(s.keys.policy, "index_format") == b"dropping"
    with pytest.raises(grpc.RpcError) as behind:
        r.stub.Schedule(cold(1, 16))
    assert behind.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "the placement index is being built anew" in (behind.value.details() or "")
    assert reg.get_sample_value("sched_refusals_total", {"reason": "index behind"}) == 1
    assert reg.get_sample_value("sched_refusals_total", {"reason": "redis"}) == 0
    assert s.stats().pending == 0
    while not s.index_rebuild().done:  # (the steps a monitor takes)
        pass
    r.stub.Schedule(cold(1, 16))
    assert s.stats().pending == 1


def test_refusal_reasons_are_counted_without_their_limits() -> None:
    msg = (
        "no nodes available: 0/6 nodes available: 3 at max_sandbox_count (10), "
        "2 stale heartbeat, 1 at max_memory_used_percent (85.5)"
    )
    assert refusal_reasons(msg) == {
        "at max_sandbox_count": 3,
        "stale heartbeat": 2,
        "at max_memory_used_percent": 1,
    }
    assert refusal_reasons("no nodes available: 0/0 nodes available") == {"no nodes": 0}
    # a fleet past the nodes a refusal counts: the reasons of those counted
    many = (
        "no nodes available: 0/10000 nodes available, the first 64 by id counted: "
        "60 at max_sandbox_count (10), 4 draining"
    )
    assert refusal_reasons(many) == {"at max_sandbox_count": 60, "draining": 4}


def test_every_reason_the_stages_give_has_a_series() -> None:
    """The reasons lua/includes/stages.lua writes are the ones counted from 0."""
    stages = (ROOT / "lua" / "includes" / "stages.lua").read_text()
    written = set(re.findall(r"return '([a-z ]+)'(?!\s*\.\.)", stages))
    assert written, "no reason found in stages.lua"
    assert "return 'not accepting: ' .." in stages  # one per admission reason
    accepting = {f"not accepting: {text}" for text in ADMISSION_TEXT.values()}
    others = {"no nodes", "index behind", "redis"}
    assert written | accepting | {f"at {c}" for c in CEILING_NAMES} | others == set(REFUSAL_REASONS)


def test_status_labels_are_upstreams() -> None:
    assert status_label(grpc.StatusCode.OK) == "ok"
    assert status_label(grpc.StatusCode.CANCELLED) == "canceled"
    assert status_label(grpc.StatusCode.UNAVAILABLE) == "unavailable"
    assert status_label(grpc.StatusCode.FAILED_PRECONDITION) == "failed_precondition"
    assert status_label(grpc.StatusCode.RESOURCE_EXHAUSTED) == "other"
    assert [str(b) for b in DURATION_BUCKETS] == [str(float(b)) for b in UPSTREAM_BUCKETS]
