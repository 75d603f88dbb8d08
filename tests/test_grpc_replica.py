"""``schedctl serve`` as a real process: start-up log, embedded store,
--overwrite-policy, SIGTERM drain, and a Redis outage under load."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2

from bench.faults import Outcome
from scheduler import Limits, Policy, Scheduler
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.testing.redis_server import RedisServer
from scheduler.testing.replicas import ServeProcess, health_status
from tests.helpers import cold, endpoint_md, hb_request, places_on_a_fresh_node

pytestmark = pytest.mark.slow


def wait_until(predicate: Any, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def test_embedded_store_warns_logs_effective_settings_and_serves(
    processes: list[ServeProcess],
) -> None:
    p = ServeProcess(
        {
            "scheduler": {
                "node_resource_limit": {"max_sandbox_count": 3},
                "report_ttl": "20s",
                "overcommit": {"cpu": 1.5},
            },
            "log_format": "json",
        },
        redis_url=None,
    )
    processes.append(p)
    p.wait_serving()
    assert places_on_a_fresh_node(p.address) == "n1"
    assert p.terminate() == 0
    records = [json.loads(line) for line in p.log().splitlines() if line.startswith("{")]
    messages = [r["msg"] for r in records]
    assert any(
        r["level"] == "warning" and "serves this one replica only" in r["msg"] for r in records
    )
    text = "\n".join(messages)
    for expected in (
        "strategy: least_loaded",
        "node_resource_limit: max_sandbox_count=3",
        "report_ttl: 20000ms",
        "placement_reservation_ttl: 600000ms",
        "overcommit: cpu 1.5 memory 1.0",
        "Redis: embedded in-process store (fakeredis, one replica only)",
        "stopping: draining in-flight calls",
    ):
        assert expected in text


@pytest.mark.real_only
def test_overwrite_policy_replaces_the_stored_one(
    processes: list[ServeProcess], real_url: str
) -> None:
    Scheduler.connect(real_url, cell="ow", policy=Policy(limits=Limits(max_sandbox_count=10)))
    p = ServeProcess(
        {"scheduler": {"node_resource_limit": {"max_sandbox_count": 20}}},
        real_url,
        cell="ow",
        extra_args=("--overwrite-policy",),
    )
    processes.append(p)
    p.wait_serving()
    stored = Scheduler.connect(real_url, cell="ow").policy()
    assert stored is not None and stored.limits.max_sandbox_count == 20
    assert "cell policy: overwrote the stored one" in p.log()


@pytest.mark.real_only
def test_sigterm_drains_in_flight_calls_and_exits_0(
    processes: list[ServeProcess], real_url: str
) -> None:
    p = ServeProcess({"scheduler": {}}, real_url, cell="drain")
    processes.append(p)
    p.wait_serving()
    ctl = redis.Redis.from_url(real_url)
    with grpc.insecure_channel(p.address) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"))
        ctl.client_pause(1500, all=True)  # every Redis call now waits 1.5 s
        paused_at = time.monotonic()
        calls = [stub.Schedule.future(cold(1, 16), timeout=10) for _ in range(20)]
        time.sleep(0.3)  # the calls are in flight, blocked on Redis
        p.signal_stop()
        placed = [c.result().node.node_id for c in calls]
        assert p.proc.wait(15) == 0
        exited_after = time.monotonic() - paused_at
    ctl.close()
    assert placed == ["n1"] * 20
    assert exited_after >= 1.4  # it waited for Redis to answer the in-flight calls
    s = Scheduler.connect(real_url, cell="drain")
    assert s.stats().reserved_total == 20


async def _load(
    address: str,
    stop: asyncio.Event,
    out: list[Outcome],
    workers: int = 4,
) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = pb_grpc.SchedulerStub(ch)

        async def one(rpc: str, coro: Any) -> None:
            start = time.monotonic()
            code, details = grpc.StatusCode.OK, ""
            try:
                await coro
            except grpc.aio.AioRpcError as e:
                code, details = e.code(), e.details() or ""
            out.append(Outcome(rpc, start, time.monotonic(), code, details))

        async def worker(i: int) -> None:
            while not stop.is_set():
                await one(
                    "Heartbeat",
                    stub.Heartbeat(
                        hb_request("n1", cpu=100_000, mem_gib=100_000),
                        timeout=5,
                        metadata=endpoint_md("n1:5000"),
                    ),
                )
                await one("Schedule", stub.Schedule(cold(1, 16), timeout=5))
                await one("ListNodes", stub.ListNodes(pb.ListNodesRequest(), timeout=5))
                await asyncio.sleep(0.01)

        await asyncio.gather(*(worker(i) for i in range(workers)))


@pytest.mark.real_only
def test_redis_outage_fails_fast_and_recovers_under_load(processes: list[ServeProcess]) -> None:
    rs = RedisServer().start()
    try:
        p = ServeProcess({"scheduler": {}}, rs.url, cell="outage")
        processes.append(p)
        p.wait_serving()
        outcomes: list[Outcome] = []
        marks: dict[str, float] = {}

        async def scenario() -> None:
            stop = asyncio.Event()
            load = asyncio.create_task(_load(p.address, stop, outcomes))
            await asyncio.sleep(0.7)
            marks["down"] = time.monotonic()
            await asyncio.to_thread(rs.stop)
            marks["stopped"] = time.monotonic()
            marks["not_serving_after"] = await asyncio.to_thread(
                wait_until,
                lambda: health_status(p.address) == health_pb2.HealthCheckResponse.NOT_SERVING,
                5,
                "NOT_SERVING",
            )
            await asyncio.sleep(0.7)
            marks["starting"] = time.monotonic()
            await asyncio.to_thread(rs.start)  # returns once it answers PING
            marks["up"] = time.monotonic()

            def heartbeats_back() -> list[Outcome]:
                return [
                    o
                    for o in outcomes
                    if o.start > marks["up"]
                    and o.rpc == "Heartbeat"
                    and o.code == grpc.StatusCode.OK
                ]

            marks["recovered_after"] = await asyncio.to_thread(
                wait_until, heartbeats_back, 10, "a heartbeat after Redis came back"
            )
            marks["recovered"] = min(o.end for o in heartbeats_back())
            await asyncio.to_thread(
                wait_until,
                lambda: health_status(p.address) == health_pb2.HealthCheckResponse.SERVING,
                5,
                "SERVING",
            )
            await asyncio.sleep(0.3)
            stop.set()
            await load

        asyncio.run(scenario())
        assert p.proc.poll() is None  # the replica stayed up throughout

        before = [o for o in outcomes if o.end < marks["down"]]
        during = [o for o in outcomes if o.start > marks["stopped"] and o.end < marks["starting"]]
        # Redis came back empty (no persistence): the first heartbeat restored the cell's
        # policy and re-registered the node; from then on everything succeeds.
        after = [o for o in outcomes if o.start > marks["recovered"]]
        assert before and during and after
        assert {o.code for o in before} == {grpc.StatusCode.OK}, p.log()
        assert {o.code for o in during} == {grpc.StatusCode.UNAVAILABLE}
        assert [
            o.details
            for o in during
            if "Redis at" not in o.details or "unreachable" not in o.details
        ] == []
        assert max(o.end - o.start for o in during) < 1.0  # fails fast
        assert {o.code for o in after} == {grpc.StatusCode.OK}, [
            (o.rpc, round(o.start - marks["up"], 3), o.details)
            for o in after
            if o.code != grpc.StatusCode.OK
        ]
        assert marks["recovered_after"] < 2.0
        assert not [
            o for o in outcomes if o.code not in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE)
        ], p.log()[-8000:]
        restored = Scheduler.connect(rs.url, cell="outage").policy()
        assert restored == Policy()
        metrics = (
            urllib.request.urlopen(f"http://127.0.0.1:{p.metrics_port}/metrics", timeout=5)
            .read()
            .decode()
        )
        errors = next(
            line for line in metrics.splitlines() if line.startswith("sched_redis_errors_total ")
        )
        assert float(errors.split()[1]) >= len(during)
        assert "sched_redis_up 1.0" in metrics
        assert p.terminate() == 0
    finally:
        rs.close()


@pytest.mark.real_only
def test_a_replica_started_before_redis_waits_and_then_serves(
    processes: list[ServeProcess],
) -> None:
    server = RedisServer()  # its port is chosen, nothing listens there yet
    try:
        p = ServeProcess(
            {"scheduler": {"node_resource_limit": {"max_sandbox_count": 2}}},
            server.url,
            cell="late",
        )
        processes.append(p)
        deadline = time.monotonic() + 10
        while "retrying in" not in p.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "retrying in" in p.log() and f"Redis at {server.url}" in p.log()
        assert p.proc.poll() is None  # still running, not serving anything unchecked
        server.start()
        p.wait_serving(timeout=20)
        with grpc.insecure_channel(p.address) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"))
            assert stub.Schedule(cold()).node.node_id == "n1"
        policy = Scheduler.connect(server.url, cell="late").policy()
        assert policy is not None and policy.limits.max_sandbox_count == 2
        assert p.terminate() == 0
    finally:
        server.close()


def test_sigterm_while_waiting_for_redis_exits_0(processes: list[ServeProcess]) -> None:
    from scheduler.testing.redis_server import free_port

    p = ServeProcess({"scheduler": {}}, f"redis://127.0.0.1:{free_port()}/0", cell="never")
    processes.append(p)
    deadline = time.monotonic() + 10
    while "retrying in" not in p.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert p.terminate() == 0
    assert "stopped before Redis could be reached" in p.log()
