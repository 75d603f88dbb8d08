"""Many cells on one Redis Cluster: real ``redis-server --cluster-enabled yes``
processes on free ports (``redis-cli --cluster create``), replicas as
``schedctl serve`` processes, ``schedctl`` itself.  A live slot move and a
failover inside the cluster under load are scenarios of the fault suite
(tests/test_faults.py: ``slot-move``, ``cluster-failover``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health_pb2
from scheduler.cli.main import main

from scheduler import Policy, Request, Scheduler, StoreUnavailable
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.store.scripts import library
from scheduler.testing.redis_server import ClusterTopology, RedisServer, wait_until
from scheduler.testing.replicas import ServeProcess, health_status
from tests.helpers import cold, endpoint_md, hb, hb_request, places_on_a_fresh_node

pytestmark = pytest.mark.slow
REQ = Request.cold(1, 1024)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def cluster(redis_server: RedisServer) -> Iterator[ClusterTopology]:
    with ClusterTopology(primaries=3, replicas=0) as topo:
        yield topo


def cell_on(
    topo: ClusterTopology, port: int, taken: set[str] | None = None, stem: str = "cell"
) -> str:
    """A cell name whose hash slot the primary on ``port`` serves."""
    for i in range(10_000):
        name = f"{stem}{i}"
        if (
            name not in (taken or set())
            and topo.slot_owner(topo.keyslot(f"sched:{{{name}}}:policy")).port == port
        ):
            return name
    raise AssertionError(f"no cell name lands on {port}")


def has_library(server: RedisServer) -> bool:
    rows = server.client().execute_command("FUNCTION", "LIST")
    names = {(row.get("library_name") or row.get(b"library_name")) for row in rows}
    return library().name in names or library().name.encode() in names


def test_a_cell_on_each_primary_and_the_library_on_every_primary(cluster: ClusterTopology) -> None:
    primaries = cluster.primaries()
    assert len(primaries) == 3
    cells: dict[str, int] = {}
    for p in primaries:
        cells[cell_on(cluster, p.port, set(cells))] = p.port
    for cell, port in cells.items():
        s = Scheduler.connect(cluster.url, cell=cell, policy=Policy(), overwrite_policy=True)
        try:
            s.heartbeat(hb("n1"))
            s.heartbeat(hb("n2"))
            assert s.schedule(REQ).node_id in ("n1", "n2")
            assert f"of cell {cell}" in s.target  # errors will name the slot
        finally:
            s.close()
        # every key of the cell is on the primary that serves its slot
        assert cluster.by_port(port).client().exists(f"sched:{{{cell}}}:policy")
    assert all(has_library(p) for p in primaries)

    runner = CliRunner()
    out = runner.invoke(main, ["cells", "--redis", cluster.url, "--json"])
    assert out.exit_code == 0, out.output
    listed = {row["cell"]: row for row in json.loads(out.stdout)}
    for cell, port in cells.items():
        row = listed[cell]
        assert row["primary"] == f"127.0.0.1:{port}"
        assert row["slot"] == cluster.keyslot(f"sched:{{{cell}}}:policy")
        assert (row["nodes"], row["ready"], row["pending_reservations"]) == (2, 2, 1)
    table = runner.invoke(main, ["cells", "--redis", cluster.url])
    assert table.exit_code == 0 and all(cell in table.output for cell in cells)

    cell = next(iter(cells))
    nodes = runner.invoke(main, ["nodes", "--redis", cluster.url, "--cell", cell, "--json"])
    assert nodes.exit_code == 0, nodes.output
    assert sorted(n["node_id"] for n in json.loads(nodes.stdout)) == ["n1", "n2"]


def test_a_primary_without_the_library_gets_it(cluster: ClusterTopology) -> None:
    """A primary that lost the library (or never had it: a new shard, a slot
    moved to it) gets it at its first call."""
    target = cluster.primaries()[1]
    cell = cell_on(cluster, target.port, stem="lib")
    s = Scheduler.connect(cluster.url, cell=cell, policy=Policy(), overwrite_policy=True)
    try:
        s.heartbeat(hb("n1"))
        target.client().execute_command("FUNCTION", "FLUSH")
        assert not has_library(target)
        s.schedule(REQ)
        assert has_library(target)
        # a slot moved onto a primary that never had the library
        other = next(p for p in cluster.primaries() if p.port != target.port)
        other.client().execute_command("FUNCTION", "FLUSH")
        cluster.migrate_slot(cluster.keyslot(f"sched:{{{cell}}}:policy"), other)
        placed = s.schedule(REQ)
        assert has_library(other)
        assert other.client().exists(f"sched:{{{cell}}}:res:{placed.reservation_id}")
        assert s.stats().pending == 2
    finally:
        s.close()


def test_a_replica_serves_a_cell_on_any_primary(
    cluster: ClusterTopology, processes: list[ServeProcess]
) -> None:
    """The report: a replica whose cell lives on another primary than the one
    in its address exited with a MovedError traceback."""
    first = cluster.servers[0].port
    port = next(p.port for p in cluster.primaries() if p.port != first)
    cell = cell_on(cluster, port, stem="serve")
    p = ServeProcess({"scheduler": {}}, f"redis+cluster://127.0.0.1:{first}", cell=cell)
    processes.append(p)
    p.wait_serving()
    assert places_on_a_fresh_node(p.address) == "n1"


def test_a_cell_whose_primary_is_down_is_unavailable_naming_the_slot(
    processes: list[ServeProcess],
) -> None:
    with ClusterTopology(primaries=3, replicas=0) as topo:
        owner = topo.primaries()[2]
        cell = cell_on(topo, owner.port)
        slot = topo.keyslot(f"sched:{{{cell}}}:policy")
        p = ServeProcess({"scheduler": {"redis_timeout": "1s"}}, topo.url, cell=cell)
        processes.append(p)
        p.wait_serving()
        with grpc.insecure_channel(p.address) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"))
            stub.Schedule(cold())
            owner.kill()
            with pytest.raises(grpc.RpcError) as e:
                stub.Schedule(cold(), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert f"slot {slot} of cell {cell}" in (e.value.details() or "")
            wait_until(lambda: health_status(p.address) == NOT_SERVING, 10, "NOT_SERVING")
            owner.start()  # back, without its data (no persistence)
            topo.wait_ok()
            wait_until(lambda: health_status(p.address) == SERVING, 20, "SERVING again")
            for _ in range(2):  # the node heartbeats again after the cell was restored
                stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"))
            assert stub.Schedule(cold()).node.node_id == "n1"
        assert p.proc.poll() is None
        # the library too: schedctl through the cluster, one clear line on failure
        owner.kill()
        out = CliRunner().invoke(main, ["nodes", "--redis", topo.url, "--cell", cell])
        assert out.exit_code == 1 and "Traceback" not in out.output + out.stderr
        assert f"slot {slot} of cell {cell}" in out.stderr


def test_schedctl_and_the_library_say_one_line_for_a_redis_that_is_no_cluster(
    redis_server: RedisServer,
) -> None:
    url = f"redis+cluster://127.0.0.1:{redis_server.port}"
    out = CliRunner().invoke(main, ["cells", "--redis", url])
    assert out.exit_code == 1
    assert "Traceback" not in out.output + out.stderr
    assert "Cluster mode is not enabled" in out.stderr
    with pytest.raises(StoreUnavailable, match="Cluster mode is not enabled"):
        Scheduler.connect(url, cell="x")
