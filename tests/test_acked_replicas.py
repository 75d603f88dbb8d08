"""min_replicas_acked waits for every Redis replica connected to the primary
(never fewer than asked), so whichever one Sentinel promotes has every
acknowledged placement: with one replica stalled (connected, behind), a
placement is not acknowledged, and the one answered UNAVAILABLE leaves no
reservation once Redis takes writes again.  Before, WAIT 1 was satisfied by
whichever replica answered first (22-23 acknowledged placements lost when
Sentinel promoted the one behind)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from scheduler import Policy, Scheduler
from scheduler.store.connection import async_client
from scheduler.store.durability import Durability
from scheduler.testing.redis_server import RedisServer
from scheduler.testing.replicas import ThreadedReplica, settings_for
from tests.helpers import cold, endpoint_md, hb_request

pytestmark = pytest.mark.real_only
ACKED = Durability(replicas=1, timeout_ms=1000)  # (room for a loaded host, below 2 s)


@pytest.fixture
def topology() -> Iterator[tuple[RedisServer, RedisServer, RedisServer]]:
    primary = RedisServer().start()
    a = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    b = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    try:
        end = time.monotonic() + 20
        while not _online(primary, 2):
            assert time.monotonic() < end, "replicas did not connect"
            time.sleep(0.05)
        yield primary, a, b
    finally:
        for s in (b, a, primary):
            s.resume() if s.proc is not None else None
            s.close()


def _online(primary: RedisServer, n: int) -> bool:
    info = primary.client().info("replication")
    return sum(1 for i in range(n) if info.get(f"slave{i}", {}).get("state") == "online") == n


def live(url: str) -> int:
    s = Scheduler.connect(url, cell="acked")
    try:
        return sum(1 for r in s.reservations() if r.state == "pending")
    finally:
        s.close()


def test_a_placement_is_acknowledged_only_once_every_connected_replica_has_it(
    topology: tuple[RedisServer, RedisServer, RedisServer],
) -> None:
    primary, _, behind = topology
    settings = settings_for(Policy(), cell="acked", durability=ACKED)
    with ThreadedReplica(settings, lambda: async_client(primary.url), primary.url) as r:
        assert r.replica is not None
        r.replica.sched.durability = ACKED  # (the test harness builds its client plainly)
        r.stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"), timeout=5)
        r.stub.Schedule(cold(1, 16), timeout=5)  # both replicas have it
        assert r.replica.sched.replicas_connected == 2
        behind.pause()  # connected, and behind from now on
        try:
            with pytest.raises(grpc.RpcError) as e:
                r.stub.Schedule(cold(1, 16), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()
            assert "reached 1 of the 2 replica(s) (every connected replica)" in (
                e.value.details() or ""
            )
        finally:
            behind.resume()
        # the unacknowledged placement's reservation is cancelled once writes are replicated
        end = time.monotonic() + 15
        while live(primary.url) != 1 or r.replica.sched.abandoned:
            assert time.monotonic() < end, (live(primary.url), r.replica.sched.abandoned)
            time.sleep(0.1)
        assert live(behind.url) == 1  # what the replica that was behind holds
