"""Redis under Sentinel, and a primary that stops being one, as operators meet
them: real redis-server and ``redis-server --sentinel`` processes on free
ports, replicas as ``schedctl serve`` processes, ``schedctl`` itself."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health_pb2
from scheduler.cli.main import main

from scheduler import Policy, Request, Scheduler
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.testing.redis_server import RedisServer, SentinelTopology, wait_until
from scheduler.testing.replicas import ServeProcess, health_status
from tests.helpers import cold, endpoint_md, hb, hb_request

pytestmark = pytest.mark.slow
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def topology(redis_server: RedisServer) -> Iterator[SentinelTopology]:
    with SentinelTopology(replicas=1, sentinels=3) as topo:
        yield topo


def test_a_primary_turned_replica_is_not_serving_until_it_takes_writes(
    processes: list[ServeProcess],
) -> None:
    """A replica pointed straight at a primary (no Sentinel) that another
    process demotes: it says NOT_SERVING and answers UNAVAILABLE naming Redis,
    instead of SERVING while every write fails; and it comes back by itself."""
    with RedisServer() as a, RedisServer() as b:
        p = ServeProcess({"scheduler": {}}, a.url, cell="demoted")
        processes.append(p)
        p.wait_serving()
        with grpc.insecure_channel(p.address) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"))
            stub.Schedule(cold())
            a.client().replicaof("127.0.0.1", b.port)
            wait_until(lambda: health_status(p.address) == NOT_SERVING, 10, "NOT_SERVING")
            with pytest.raises(grpc.RpcError) as e:
                stub.Schedule(cold())
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert f"Redis at {a.url}" in (e.value.details() or "")
            a.client().replicaof("no", "one")
            wait_until(lambda: health_status(p.address) == SERVING, 10, "SERVING again")
            # its data is now b's (empty): the replica restored the cell; the node
            # heartbeats again before it takes placements
            stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"))
            stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"))
            assert stub.Schedule(cold()).node.node_id == "n1"
        assert p.proc.poll() is None


def test_the_library_and_schedctl_follow_a_sentinel_failover(topology: SentinelTopology) -> None:
    url = topology.url
    s = Scheduler.connect(url, cell="follow", policy=Policy(), overwrite_policy=True)
    try:
        s.heartbeat(hb("n1"))
        first = s.schedule(Request.cold(1, 1024))
        runner = CliRunner()
        before = runner.invoke(main, ["nodes", "--redis", url, "--cell", "follow", "--json"])
        assert before.exit_code == 0, before.output
        assert [n["node_id"] for n in json.loads(before.stdout)] == ["n1"]
        old = topology.primary_port()
        new = topology.failover()
        assert new.port != old
        # the next calls reach the new primary: no error in between
        second = s.schedule(Request.cold(1, 1024))
        assert {r.reservation_id for r in s.reservations()} == {
            first.reservation_id,
            second.reservation_id,
        }
        after = runner.invoke(main, ["reservations", "--redis", url, "--cell", "follow", "--json"])
        assert after.exit_code == 0, after.output
        assert len(json.loads(after.stdout)) == 2
        assert new.client().exists(f"sched:{{follow}}:res:{second.reservation_id}")
    finally:
        s.close()


def test_a_sentinel_address_that_names_no_known_primary_is_unavailable() -> None:
    with RedisServer() as rs:  # not a sentinel: asking it for primaries fails
        result = CliRunner().invoke(
            main, ["nodes", "--redis", f"redis+sentinel://u:hunter2@127.0.0.1:{rs.port}/x"]
        )
    assert result.exit_code == 1
    assert "unreachable" in result.stderr and "hunter2" not in result.output + result.stderr
    assert "Traceback" not in result.output + result.stderr
