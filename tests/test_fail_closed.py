"""A Redis that refuses writes, or would lose state, through a real replica:
reads go on while writes are refused (CLIENT PAUSE WRITE, maxmemory), health
says which of the two is degraded, and an evicting ``maxmemory-policy`` is
refused at start and in the health probe (or, allowed, its evictions are
counted)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scheduler import Policy, Request, Scheduler
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.server.replica import READS_SERVICE_NAME, SERVICE_NAME
from scheduler.store.connection import EvictionRisk, async_client
from scheduler.store.scripts import FLAGS, library
from scheduler.testing.redis_server import RedisServer
from scheduler.testing.replicas import ThreadedReplica, settings_for
from tests.helpers import cold, endpoint_md, hb_request

pytestmark = pytest.mark.real_only
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A server of its own: these tests pause it, fill it and change its config."""
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    client.flushall()
    client.config_set("maxmemory-policy", "noeviction")
    yield client
    client.execute_command("CLIENT", "UNPAUSE")
    client.config_set("maxmemory", 0)
    client.config_set("maxmemory-policy", "noeviction")
    client.flushall()
    client.close()


def start(server: RedisServer, **settings: Any) -> ThreadedReplica:
    r = ThreadedReplica(
        settings_for(Policy(), cell="fc", **settings), lambda: async_client(server.url), server.url
    )
    try:
        return r.__enter__()
    except BaseException:
        if r.replica is not None:  # (refused at start: close what it opened)
            r.call(r.replica.sched.close())
        r.loop_thread.close()
        raise


def health(r: ThreadedReplica, service: str) -> int:
    assert r.channel is not None
    reply = health_pb2_grpc.HealthStub(r.channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5
    )
    return int(reply.status)


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def reads(r: ThreadedReplica, sandbox_id: str) -> None:
    """LookupNode, GetNode and the list calls, each answered."""
    assert (
        r.stub.LookupNode(pb.LookupNodeRequest(sandbox_id=sandbox_id), timeout=5).node.node_id
        == "n1"
    )
    assert r.stub.GetNode(pb.GetNodeRequest(node_id="n1"), timeout=5).node.node_id == "n1"
    assert [n.node_id for n in r.stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes] == ["n1"]
    observed = r.stub.ListObservedNodes(pb.ListObservedNodesRequest(), timeout=5).nodes
    assert [n.node_id for n in observed] == ["n1"]


def with_a_binding(r: ThreadedReplica, server: RedisServer) -> str:
    r.stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"))
    s = Scheduler.connect(server.url, cell="fc")
    try:
        p = s.schedule(Request.cold(1, 0))
        s.assign("sb1", p.node_id, p.endpoint, p.reservation_id)
    finally:
        s.close()
    return "sb1"


def test_the_read_functions_are_registered_no_writes() -> None:
    text = library().text
    for name, fn in library().functions.items():
        head = text[text.index(f"function_name = '{fn}'") :].split("callback", 1)[0]
        assert ("'no-writes'" in head) == (name in FLAGS), (name, head)
    assert set(FLAGS) >= {"lookup", "nodes_view", "observed", "reservations", "stats"}


def test_reads_answer_while_writes_are_paused(admin: redis.Redis, server: RedisServer) -> None:
    """CLIENT PAUSE WRITE holds every call that may write (before, every
    function, reads too): LookupNode, GetNode and the list calls answer; a
    Schedule waits and fails UNAVAILABLE; health says writes are degraded and
    reads are not."""
    r = start(server)
    with r:
        sandbox = with_a_binding(r, server)
        admin.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
        try:
            reads(r, sandbox)
            with pytest.raises(grpc.RpcError) as e:
                r.stub.Schedule(cold(1, 16), timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()
            wait_for(lambda: health(r, SERVICE_NAME) == NOT_SERVING, "writes NOT_SERVING")
            assert health(r, "") == NOT_SERVING
            assert health(r, READS_SERVICE_NAME) == SERVING
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
        wait_for(lambda: health(r, SERVICE_NAME) == SERVING, "SERVING again")
        assert health(r, READS_SERVICE_NAME) == SERVING


def test_reads_answer_at_maxmemory(admin: redis.Redis, server: RedisServer) -> None:
    """At maxmemory under noeviction Redis refuses every function that may
    write (OOM); the reads are flagged no-writes and answer."""
    r = start(server)
    with r:
        sandbox = with_a_binding(r, server)
        admin.config_set("maxmemory", 1)  # (below what is used: every write is OOM)
        try:
            reads(r, sandbox)
            with pytest.raises(grpc.RpcError) as e:
                r.stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "maxmemory" in (e.value.details() or "")
            wait_for(lambda: health(r, SERVICE_NAME) == NOT_SERVING, "writes NOT_SERVING")
            assert health(r, READS_SERVICE_NAME) == SERVING
        finally:
            admin.config_set("maxmemory", 0)
        wait_for(lambda: health(r, SERVICE_NAME) == SERVING, "SERVING again")


def test_reads_health_follows_a_redis_that_is_down(server: RedisServer) -> None:
    r = start(server)
    with r:
        assert health(r, READS_SERVICE_NAME) == SERVING
        server.stop()
        try:
            wait_for(lambda: health(r, READS_SERVICE_NAME) == NOT_SERVING, "reads NOT_SERVING")
            assert health(r, SERVICE_NAME) == NOT_SERVING
        finally:
            server.start()
        wait_for(lambda: health(r, READS_SERVICE_NAME) == SERVING, "reads SERVING again")


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "volatile-ttl"])
def test_an_evicting_redis_is_refused_at_start(
    admin: redis.Redis, server: RedisServer, policy: str
) -> None:
    admin.config_set("maxmemory-policy", policy)
    with pytest.raises(EvictionRisk) as e:
        start(server)
    assert f"maxmemory-policy {policy}" in e.value.message
    assert "scheduler.allow_eviction" in e.value.message
    assert admin.keys("sched:*") == []  # refused before the cell was touched


def test_an_evicting_policy_set_later_turns_health_not_serving(
    admin: redis.Redis, server: RedisServer
) -> None:
    r = start(server)
    with r:
        assert health(r, SERVICE_NAME) == SERVING
        admin.config_set("maxmemory-policy", "allkeys-lru")
        wait_for(lambda: health(r, SERVICE_NAME) == NOT_SERVING, "NOT_SERVING")
        admin.config_set("maxmemory-policy", "noeviction")
        wait_for(lambda: health(r, SERVICE_NAME) == SERVING, "SERVING again")


def test_allowed_eviction_is_counted_and_logged(
    admin: redis.Redis, server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    admin.config_set("maxmemory-policy", "allkeys-lru")
    r = start(server, allow_eviction=True)
    with r:
        assert r.replica is not None
        gauge = r.replica.metrics.redis_evicted_keys
        before = gauge._value.get()
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", used + (2 << 20))
        filler = admin.pipeline(transaction=False)
        for i in range(20_000):
            filler.set(f"other:{i}", "x" * 512)
        filler.execute()
        evicted = int(admin.info("stats")["evicted_keys"])
        assert evicted > 0
        wait_for(lambda: gauge._value.get() >= evicted, "the gauge reads INFO's evicted_keys")
        assert gauge._value.get() > before
        assert any("evicted" in rec.getMessage() for rec in caplog.records)
