"""ListP2pPeers at a cluster's scale: every P2P node asks for its cluster's
peers every few seconds, so a replica reads one (cluster, backend)'s list at
most once a second and answers every request meanwhile from it
(scheduler/server/peers.py), and the read itself costs one HMGET a member
(lua/includes/peers.lua).  Real redis-server; the nodes' own records are the
truth the answers are checked against."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from scheduler import Heartbeat, InvalidArgument, NodeSnapshot, Policy, Scheduler
from scheduler.client.aio import AsyncScheduler
from scheduler.domain.errors import StoreUnavailable
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.server.peers import PEERS_READ_TIMES, PeerLists, protos
from scheduler.store.calls import PEER_PAGE
from scheduler.testing.redis_server import RedisServer
from tests.test_scale import commands

pytestmark = pytest.mark.real_only


def script_calls(client: Any) -> int:
    """Script calls Redis ran (FCALL)."""
    return int(client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))


def p2p_beat(i: int, cluster: str = "big", backend: str = "iroh") -> Heartbeat:
    return Heartbeat(
        node_id=f"m{i:05d}",
        service_instance_id="boot-1",
        cluster_id=cluster,
        endpoint=f"m{i}.local:5000",
        p2p_backend=backend,
        p2p_address=f"addr-{i}",
        snapshot=NodeSnapshot(cpu_count=16, memory_total_bytes=64 << 30),
    )


def test_a_replica_reads_a_cluster_once_for_every_node_that_asks() -> None:
    with RedisServer() as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="peers", policy=Policy())
            now = [0.0]
            made: list[str] = []  # (the scripts the reads called, as metrics see them)
            lists = PeerLists(
                a, clock=lambda: now[0], observe=lambda script, _s, _e: made.append(script)
            )

            def reads() -> int:
                return made.count("peer_members")

            try:
                for i in range(60):
                    await a.heartbeat(p2p_beat(i, backend="iroh" if i % 4 else "http"))
                want = sorted(f"m{i:05d}" for i in range(60) if i % 4)
                # every node of the cluster asks at once, each leaving itself out
                answers = await asyncio.gather(
                    *(lists.peers("big", "iroh", f"m{i:05d}") for i in range(60))
                )
                assert reads() == 1 and made.count("peer_list") == 1  # (60 ids: one page)
                for i, peers in enumerate(answers):
                    ids = [p.node_id for p in peers]
                    assert ids == [n for n in want if n != f"m{i:05d}"]
                    assert all(p.address == f"addr-{int(p.node_id[1:])}" for p in peers)
                # the answer as sent: the peers' parts joined, the node's own left out
                raw = await lists.answer("big", "iroh", "m00003")
                wanted = pb.ListP2pPeersResponse(
                    peers=protos(await lists.peers("big", "iroh", "m00003"))
                )
                assert pb.ListP2pPeersResponse.FromString(raw) == wanted
                assert raw == wanted.SerializeToString()
                # within the second: from the list read; another backend: its own read
                await lists.peers("big", "iroh", "")
                assert [p.backend for p in await lists.peers("big", "http", "")] == ["http"] * 15
                assert reads() == 2
                # a node that leaves is gone from the answers once the list is a
                # second old, and not before
                await a.unregister("m00001", "boot-1")
                assert "m00001" in [p.node_id for p in await lists.peers("big", "iroh", "")]
                now[0] += 1.0
                assert "m00001" not in [p.node_id for p in await lists.peers("big", "iroh", "")]
                assert reads() == 3
                # bad input is refused before anything is read, naming the field
                with pytest.raises(InvalidArgument, match="exclude_node_id"):
                    await lists.peers("big", "iroh", "x{")
                assert reads() == 3
            finally:
                await a.close()

        asyncio.run(scenario())


def test_a_caller_that_gives_up_leaves_the_read_to_the_others() -> None:
    with RedisServer() as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="peers-gone", policy=Policy())
            lists = PeerLists(a)
            try:
                for i in range(5):
                    await a.heartbeat(p2p_beat(i))
                first = asyncio.ensure_future(lists.peers("big", "", "m00000"))
                second = asyncio.ensure_future(lists.peers("big", "", "m00001"))
                await asyncio.sleep(0)  # (both wait on the one read)
                first.cancel()
                peers = await second
                assert [p.node_id for p in peers] == ["m00000", "m00002", "m00003", "m00004"]
                assert first.cancelled()
                assert not lists._reading  # (nothing left in flight)
            finally:
                await a.close()

        asyncio.run(scenario())


def test_a_cluster_list_reads_each_member_once_a_page_at_a_time(make_scheduler: Any) -> None:
    """One HMGET a member, whatever the cluster's size (it read every field
    of the record and sorted the ids in Lua: 30 ms of Redis a call at 1,000
    members, 300 ms at 10,000, all in one call), and no call reads more than
    PEER_PAGE members: the member ids first, then a page of rows a call.
    The answer is in node-id order."""
    s: Scheduler = make_scheduler(Policy())
    per_member = []
    for start, size in ((0, 50), (50, 600)):
        for i in range(start, size):
            s.heartbeat(p2p_beat(i))
        before, calls = commands(s.client), script_calls(s.client)
        peers = s.peers("big", "iroh", "")
        assert [p.node_id for p in peers] == [f"m{i:05d}" for i in range(size)]
        per_member.append((commands(s.client) - before) / size)
        assert script_calls(s.client) - calls == 1 + -(-size // PEER_PAGE)
    small, large = per_member
    assert large <= small <= 1.2, per_member


def test_artifact_holders_come_in_node_id_order_with_and_without_a_limit(
    make_scheduler: Any,
) -> None:
    """Without a limit the script lists the holders in their set's order and
    the client sorts them; with one it sorts first, so the limit keeps the
    first usable holders by id (a holder that is not READY is skipped, not
    counted)."""
    s: Scheduler = make_scheduler(Policy())
    order = [7, 3, 11, 0, 9, 1, 5, 2, 10, 4, 8, 6]
    for i in order:
        s.heartbeat(p2p_beat(i))
        s.record_artifact("big", "iroh", "img:1", f"m{i:05d}")
    s.set_lingering("m00001", True)  # (not READY)
    every = [p.node_id for p in s.lookup_artifact("big", "iroh", "img:1")]
    assert every == [f"m{i:05d}" for i in range(12) if i != 1]
    first = [p.node_id for p in s.lookup_artifact("big", "iroh", "img:1", "m00000", limit=3)]
    assert first == ["m00002", "m00003", "m00004"]


def test_redis_down_is_unavailable_for_every_waiter_and_nothing_is_kept() -> None:
    """A read that fails fails each request waiting on it (UNAVAILABLE,
    naming Redis), keeps no list, and the next request reads again once
    Redis is back: the failure is not answered from a stale list either."""
    with RedisServer(extra_args=["--appendonly", "yes"]) as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="peers-down", policy=Policy())
            now = [0.0]
            lists = PeerLists(a, clock=lambda: now[0])
            try:
                for i in range(4):
                    await a.heartbeat(p2p_beat(i))
                assert len(await lists.peers("big", "", "")) == 4
                now[0] += 1.0  # (the list is a second old: the next request reads)
                rs.stop()
                failed = await asyncio.gather(
                    *(lists.peers("big", "", f"m{i:05d}") for i in range(4)),
                    return_exceptions=True,
                )
                assert all(isinstance(e, StoreUnavailable) for e in failed), failed
                assert all("Redis" in e.message for e in failed if isinstance(e, StoreUnavailable))
                assert not lists._reading
                rs.start()  # (its AOF kept the cell)
                back = [p.node_id for p in await lists.peers("big", "", "m00002")]
                assert back == ["m00000", "m00001", "m00003"]
            finally:
                await a.close()

        asyncio.run(scenario())


def test_an_artifact_of_many_holders_is_read_a_page_at_a_time(make_scheduler: Any) -> None:
    """The holders' ids first (and the recency), then their rows PEER_PAGE a
    call, stopping once the limit is reached: no call reads them all (it was
    one call of every holder, sorted in Lua: 158-163 ms at 5,000 holders)."""
    s: Scheduler = make_scheduler(Policy())
    size = 2 * PEER_PAGE + 44
    for i in range(size):
        s.heartbeat(p2p_beat(i))
        s.record_artifact("big", "iroh", "img:1", f"m{i:05d}", capacity=10)
    calls = script_calls(s.client)
    every = s.lookup_artifact("big", "iroh", "img:1")
    assert [p.node_id for p in every] == [f"m{i:05d}" for i in range(size)]
    assert script_calls(s.client) - calls == 1 + 3
    calls = script_calls(s.client)
    first = s.lookup_artifact("big", "iroh", "img:1", "m00000", limit=5)
    assert [p.node_id for p in first] == [f"m{i:05d}" for i in range(1, 6)]
    assert script_calls(s.client) - calls == 1 + 1


def test_a_list_that_took_long_to_read_is_read_again_later() -> None:
    """A replica spends at most 1/PEERS_READ_TIMES of its time reading one
    list: a read that took 0.2 s answers for 4 s, not 1 (the reference's
    default config puts every node in one cluster, so a cluster can be the
    fleet)."""
    with RedisServer() as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="peers-slow", policy=Policy())
            now = [0.0]
            reads = [0]

            def clock() -> float:
                return now[0]

            def observe(script: str, _s: float, _e: BaseException | None) -> None:
                if script == "peer_members":
                    reads[0] += 1
                    now[0] += 0.2  # (the read takes 0.2 s of this clock)

            lists = PeerLists(a, clock=clock, observe=observe)
            try:
                for i in range(3):
                    await a.heartbeat(p2p_beat(i))
                await lists.peers("big", "", "")
                assert reads[0] == 1 and PEERS_READ_TIMES * 0.2 == 4.0
                now[0] = 3.9  # (less than 20 x 0.2 s after the read began)
                await lists.peers("big", "", "")
                assert reads[0] == 1
                now[0] = 4.0
                await lists.peers("big", "", "")
                assert reads[0] == 2
            finally:
                await a.close()

        asyncio.run(scenario())
