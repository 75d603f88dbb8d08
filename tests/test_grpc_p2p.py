"""P2P peers and the artifact index over gRPC: filters, LRU capacity, lookup
limit, unregister, and the same answers from a second replica."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import grpc
import pytest

from scheduler import Policy, Scheduler
from scheduler.client.sync import async_client
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.testing.replicas import LoopThread, ThreadedReplica, settings_for
from tests.helpers import endpoint_md, hb_request

Pair = tuple[ThreadedReplica, ThreadedReplica]


def _client_factory(
    backend: str,
    redis_client: Any,
    request: pytest.FixtureRequest,
) -> tuple[Callable[[], Any], str | None]:
    if backend == "real":
        url: str = request.getfixturevalue("redis_server").url
        return (lambda: async_client(url)), url
    server = redis_client.connection_pool.connection_kwargs["server"]
    return (lambda: fakeredis.FakeAsyncRedis(server=server)), None


@pytest.fixture
def pair(backend: str, redis_client: Any, request: pytest.FixtureRequest) -> Iterator[Pair]:
    make, url = _client_factory(backend, redis_client, request)
    settings = settings_for(
        Policy(report_ttl_ms=30_000), artifact_store_capacity=3, artifact_lookup_node_limit=2
    )
    loop = LoopThread()
    try:
        with (
            ThreadedReplica(settings, make, url, loop) as a,
            ThreadedReplica(settings, make, url, loop) as b,
        ):
            yield a, b
    finally:
        loop.close()


@pytest.fixture
def sched(redis_client: Any) -> Scheduler:
    return Scheduler(redis_client, cell="test")


def p2p_node(
    r: ThreadedReplica,
    node_id: str,
    cluster: str = "c1",
    backend: str = "bt",
    address: str | None = None,
) -> None:
    req = hb_request(node_id, cluster=cluster)
    req.p2p_endpoint.backend = backend
    req.p2p_endpoint.address = f"{node_id}:6881" if address is None else address
    r.stub.Heartbeat(req, metadata=endpoint_md(f"{node_id}:5000"))


def peers(resp: Any) -> list[tuple[str, str, str]]:
    return [(p.node_id, p.endpoint.backend, p.endpoint.address) for p in resp.peers]


def record(r: ThreadedReplica, key: str, node_id: str, cluster: str = "c1") -> None:
    r.stub.RecordP2pArtifact(
        pb.RecordP2pArtifactRequest(cluster_id=cluster, backend="bt", key=key, node_id=node_id)
    )


def lookup(
    r: ThreadedReplica,
    key: str,
    exclude: str = "",
    cluster: str = "c1",
) -> list[str]:
    resp = r.stub.LookupP2pArtifact(
        pb.LookupP2pArtifactRequest(
            cluster_id=cluster, backend="bt", key=key, exclude_node_id=exclude
        )
    )
    return [p.node_id for p in resp.peers]


def test_list_peers_filters(pair: Pair, sched: Scheduler) -> None:
    a, b = pair
    p2p_node(a, "n1")
    p2p_node(a, "n2", backend="http")
    p2p_node(b, "n3", cluster="c2")
    p2p_node(b, "n4", address="")  # no P2P endpoint
    p2p_node(b, "n5")
    sched.set_lingering("n5", True)  # not READY
    every = peers(b.stub.ListP2pPeers(pb.ListP2pPeersRequest()))
    assert every == [("n1", "bt", "n1:6881"), ("n2", "http", "n2:6881"), ("n3", "bt", "n3:6881")]
    assert peers(a.stub.ListP2pPeers(pb.ListP2pPeersRequest(cluster_id="c1"))) == every[:2]
    assert (
        peers(a.stub.ListP2pPeers(pb.ListP2pPeersRequest(cluster_id="c1", backend="bt")))
        == every[:1]
    )
    assert (
        peers(b.stub.ListP2pPeers(pb.ListP2pPeersRequest(cluster_id="c1", exclude_node_id="n1")))
        == every[1:2]
    )
    sched.advance_clock(30_001)  # stale heartbeats: UNHEALTHY, not READY
    assert peers(a.stub.ListP2pPeers(pb.ListP2pPeersRequest())) == []


def test_artifacts_recorded_on_one_replica_are_found_on_the_other(pair: Pair) -> None:
    a, b = pair
    for n in ("n1", "n2", "n3"):
        p2p_node(a, n)
    record(a, "img:sha256:1", "n2")
    record(b, "img:sha256:1", "n1")
    assert lookup(b, "img:sha256:1") == ["n1", "n2"]
    assert lookup(a, "img:sha256:1", exclude="n1") == ["n2"]
    assert lookup(a, "img:sha256:1", cluster="c2") == []  # other cluster: another artifact
    record(a, "img:sha256:1", "n3")
    assert lookup(b, "img:sha256:1") == ["n1", "n2"]  # artifact_lookup_node_limit 2
    b.stub.ForgetP2pArtifact(
        pb.ForgetP2pArtifactRequest(cluster_id="c1", backend="bt", key="img:sha256:1", node_id="n1")
    )
    assert lookup(a, "img:sha256:1") == ["n2", "n3"]
    b.stub.ForgetP2pArtifact(
        pb.ForgetP2pArtifactRequest(  # idempotent
            cluster_id="c1", backend="bt", key="img:sha256:1", node_id="n1"
        )
    )
    assert lookup(a, "missing") == []


def test_unknown_node_cannot_record(pair: Pair) -> None:
    a, _ = pair
    with pytest.raises(grpc.RpcError) as e:
        record(a, "k", "ghost")
    assert (e.value.code(), e.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "node is not in scheduler node list",
    )


def test_store_capacity_is_an_lru_refreshed_by_record_and_lookup(pair: Pair) -> None:
    a, b = pair
    p2p_node(a, "n1")
    for key in ("k1", "k2", "k3"):
        record(a, key, "n1")
    assert lookup(b, "k1") == ["n1"]  # k1 is now the most recent; k2 the least
    record(b, "k4", "n1")  # capacity 3: k2 goes
    assert lookup(a, "k2") == []
    assert [lookup(a, k) for k in ("k1", "k3", "k4")] == [["n1"]] * 3
    record(a, "k1", "n1")
    record(a, "k5", "n1")  # k3 was least recent (k4, k1 refreshed after it)... now k3 goes
    assert lookup(b, "k3") == []
    assert [lookup(b, k) for k in ("k1", "k4", "k5")] == [["n1"]] * 3


def test_unregister_drops_the_nodes_artifacts(pair: Pair) -> None:
    a, b = pair
    p2p_node(a, "n1")
    p2p_node(a, "n2")
    record(a, "k", "n1")
    record(a, "k", "n2")
    b.stub.UnregisterNode(pb.UnregisterNodeRequest(node_id="n1", service_instance_id="i1"))
    p2p_node(a, "n1")  # comes back: it holds nothing until it records again
    assert lookup(b, "k") == ["n2"]


def test_every_node_asking_at_once_costs_the_replica_one_read(pair: Pair) -> None:
    """The runtime asks for its cluster's peers every few seconds, each node
    leaving itself out: a replica reads the list once for all of them
    (scheduler/server/peers.py), and each answer is its node's own."""
    a, _ = pair
    ids = [f"n{i:02d}" for i in range(30)]
    for node in ids:
        p2p_node(a, node)
    reg = a.replica.metrics.registry
    # (a list fresh for the whole test: the count below does not hang on how
    # fast the calls come)
    a.replica.service.peer_lists.fresh_s = 3600.0

    def reads() -> float:
        return (
            reg.get_sample_value("sched_script_duration_seconds_count", {"script": "peer_list"})
            or 0.0
        )

    before = reads()
    asked = [
        (
            node,
            a.stub.ListP2pPeers.future(
                pb.ListP2pPeersRequest(cluster_id="c1", exclude_node_id=node)
            ),
        )
        for node in ids
    ]
    for node, answer in asked:
        assert peers(answer.result()) == [(n, "bt", f"{n}:6881") for n in ids if n != node]
    assert reads() - before == 1
