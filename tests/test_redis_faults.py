"""Redis faults as the library meets them: addresses, restarts under an idle
pool, a lost reply, a pause longer than the caller's deadline, WAIT, and the
count ceilings that hold whatever Redis remembers.  (Sentinel failovers and
the multi-process fault suite: tests/test_sentinel.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest

from scheduler import (
    FailedPrecondition,
    InvalidArgument,
    Limits,
    NoNodesAvailable,
    Policy,
    Request,
    Scheduler,
    StoreUnavailable,
)
from scheduler.client.sync import AsyncScheduler
from scheduler.domain.errors import NotReplicated
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.store.address import describe_target, parse_address, sentinel_url
from scheduler.store.connection import async_client
from scheduler.store.durability import Durability
from scheduler.testing.redis_server import RedisServer, SentinelTopology, wait_until
from scheduler.testing.replicas import ThreadedReplica, settings_for
from tests.helpers import cold, endpoint_md, hb, hb_request
from tests.tcp_proxy import ReplyDroppingProxy

Make = Callable[..., Scheduler]
REQ = Request.cold(1, 1024)


# ---------------------------------------------------------------------------
# Addresses
# ---------------------------------------------------------------------------
def test_sentinel_address_forms() -> None:
    a = parse_address("redis+sentinel://app:s3cret@10.0.0.1:26379,[::1]:26380/sched?db=2")
    assert a.kind == "sentinel" and a.service == "sched"
    assert a.sentinels == (("10.0.0.1", 26379), ("::1", 26380))
    assert (a.options["db"], a.options["username"], a.options["password"]) == (2, "app", "s3cret")
    assert "ssl" not in a.options and "password" not in a.sentinel_options
    t = parse_address("rediss+sentinel://h:1/m?ssl_cert_reqs=none&sentinel_password=p2")
    assert t.options["ssl"] and t.sentinel_options["ssl"]
    assert t.options["ssl_cert_reqs"] == "none" == t.sentinel_options["ssl_cert_reqs"]
    assert t.sentinel_options["password"] == "p2" and "sentinel_password" not in t.options
    assert parse_address("localhost:6379").url == "redis://localhost:6379"
    assert parse_address("").kind == "embedded"
    url = sentinel_url([("h", 1), ("g", 2)], "m", user="u", password="p w")
    assert parse_address(url).options["password"] == "p w"


@pytest.mark.parametrize(
    "text, problem",
    [
        ("redis+sentinel://h:1", "names no primary"),
        ("redis+sentinel://h/m", "sentinel 'h' is not host:port"),
        ("redis+sentinel://h:99999/m", "is not host:port"),
        ("redis+sentinel://h:1/m?db=x", "db must be a whole number"),
        ("memcached://h:1", "must be host:port or a redis://"),
    ],
)
def test_bad_addresses_name_redis_addr(text: str, problem: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        parse_address(text)
    assert e.value.field == "redis_addr" and problem in e.value.message


def test_addresses_are_shown_without_secrets() -> None:
    for text in (
        "redis://:hunter2@h:1/0",
        "redis+sentinel://u:hunter2@h:1,g:2/m",
        "rediss+sentinel://h:1/m?sentinel_password=hunter2&db=1",
    ):
        shown = describe_target(text)
        assert "hunter2" not in shown and "***" in shown
    with pytest.raises(InvalidArgument) as e:
        parse_address("memcached://u:hunter2@h:1")
    assert "hunter2" not in e.value.message


# ---------------------------------------------------------------------------
# Connections: a restart under an idle pool, a reply lost after the call ran
# ---------------------------------------------------------------------------
@pytest.mark.real_only
def test_an_idle_pool_survives_a_restart() -> None:
    """Every pooled connection died with the restart; the next calls (sync and
    asyncio, several at once) still succeed, with no error in between."""
    with RedisServer() as rs:
        s = Scheduler.connect(rs.url, cell="idle", policy=Policy())

        async def scenario() -> list[bool]:
            a = await AsyncScheduler.connect(rs.url, cell="idle")
            try:
                await asyncio.gather(*(a.probe() for _ in range(8)))  # 8 pooled connections
                s.probe()
                rs.stop()
                rs.start()  # back empty
                s_ok = s.probe()
                return [s_ok, *await asyncio.gather(*(a.probe() for _ in range(8)))]
            finally:
                await a.close()

        # (False: the cell's policy went with the data; the calls themselves succeeded)
        assert asyncio.run(scenario()) == [False] * 9
        s.close()


@pytest.mark.real_only
def test_a_lost_reply_is_retried_without_placing_twice(redis_server: RedisServer) -> None:
    """The Schedule ran in Redis but its reply never came back: the client's one
    retry sends the same reservation id, and the script answers it again."""
    with ReplyDroppingProxy(redis_server.port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        s = Scheduler.connect(url, cell="lost", policy=Policy(), overwrite_policy=True)
        try:
            s.heartbeat(hb("n1"))
            s.heartbeat(hb("n2"))
            proxy.drop_next(b"schedule")
            p = s.schedule(REQ)
            assert proxy.dropped == 1
            st = s.stats()
            assert (st.reserved_total, st.pending) == (1, 1)
            assert [r.reservation_id for r in s.reservations()] == [p.reservation_id]
            assert s.reservation(p.reservation_id).node_id == p.node_id
        finally:
            s.close()


def test_a_retried_schedule_answers_the_same_placement(make_scheduler: Make) -> None:
    s = make_scheduler()
    for n in ("n1", "n2", "n3"):
        s.heartbeat(hb(n))
    first = s.schedule(REQ, reservation_id="retry-1")
    again = s.schedule(REQ, reservation_id="retry-1")
    assert (again.node_id, again.endpoint, again.reservation_id, again.pressure) == (
        first.node_id,
        first.endpoint,
        "retry-1",
        first.pressure,
    )
    assert (s.stats().reserved_total, s.stats().pending) == (1, 1)
    with pytest.raises(InvalidArgument, match="already used by another request"):
        s.schedule(Request.cold(2, 1024), reservation_id="retry-1")
    s.cancel("retry-1")
    with pytest.raises(FailedPrecondition, match="was cancelled"):
        s.schedule(REQ, reservation_id="retry-1")
    assert s.stats().pending == 0


def test_forget_stops_a_schedule_that_is_still_on_its_way(make_scheduler: Make) -> None:
    """The caller gave up before its Schedule reached Redis: the tombstone the
    cancel leaves makes the late call place nothing."""
    s = make_scheduler()
    s.heartbeat(hb("n1"))
    s.run(s.ops.abandon("late-1"))
    with pytest.raises(FailedPrecondition, match="late-1 was cancelled"):
        s.schedule(REQ, reservation_id="late-1")
    assert s.stats().pending == 0
    assert s.reservation("late-1").state == "cancelled"
    # forgetting again, or forgetting what ended, is not an error
    s.run(s.ops.abandon("late-1"))
    p = s.schedule(REQ)
    s.cancel(p.reservation_id or "")
    s.run(s.ops.abandon(p.reservation_id or ""))
    with pytest.raises(FailedPrecondition, match="already cancelled"):
        s.cancel(p.reservation_id or "")


def test_a_connection_closed_under_a_call_is_redis_unavailable(redis_server: RedisServer) -> None:
    """On uvloop, a write to a connection another task closed (redis-py's
    cluster client resets a node's connections while a slot moves) raises a
    bare RuntimeError; it was answered INTERNAL.  It is Redis that cannot
    take the call now: UNAVAILABLE naming Redis, and the next call works.

    The error is uvloop's own, on a real connection to the real server:
    redis-py 8 checks its transport before each send, so a close between two
    of its calls no longer reaches the write (a client on that release
    reconnects, below); the race inside one send is what the cluster client
    still meets."""
    uvloop = pytest.importorskip("uvloop")
    import redis.asyncio as aredis

    from scheduler.store.translate import translated

    async def go() -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", redis_server.port)
        writer.transport.close()  # (closed under the writer)
        await asyncio.sleep(0)
        unreachable = r"Redis at r1 is unreachable: .*the handler is closed"
        with pytest.raises(StoreUnavailable, match=unreachable), translated("r1"):
            writer.write(b"PING\r\n")
        client = aredis.Redis(port=redis_server.port, single_connection_client=True)
        try:
            await client.ping()
            client.connection._writer.transport.close()  # (closed under the client)
            await asyncio.sleep(0)
            try:
                with translated("r1"):
                    await client.ping()
            except StoreUnavailable as e:  # (a redis-py that writes anyway)
                assert "unreachable" in str(e)
            with translated("r1"):
                assert await client.ping()  # redis-py dropped it: a new connection
        finally:
            await client.aclose()

    uvloop.run(go())
    # any other RuntimeError is a bug, raised as it is
    with pytest.raises(RuntimeError, match="not ours"), translated("r1"):
        raise RuntimeError("not ours")


# ---------------------------------------------------------------------------
# Deadlines: Redis paused longer than the caller waits
# ---------------------------------------------------------------------------
@pytest.mark.real_only
def test_a_pause_longer_than_the_deadline_leaves_no_reservation() -> None:
    with RedisServer() as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="pause", policy=Policy())
            try:
                await a.heartbeat(hb("n1"))
                rs.pause()
                try:
                    results = await asyncio.gather(
                        *(a.schedule(REQ, timeout=0.3) for _ in range(5)), return_exceptions=True
                    )
                finally:
                    rs.resume()
                assert all(
                    isinstance(r, StoreUnavailable) and "did not answer within" in r.message
                    for r in results
                ), results
                # the calls still ran once Redis resumed, or were stopped by the
                # tombstones; either way nothing stays reserved
                await asyncio.to_thread(
                    wait_until, lambda: not a.abandoned, 10, "abandoned placements cancelled"
                )
                st = await a.stats()
                assert st.pending == 0
                assert st.reserved_total == st.cancelled_total
            finally:
                await a.close()

        asyncio.run(scenario())


@pytest.mark.real_only
def test_a_caller_that_cancels_leaves_no_reservation() -> None:
    with RedisServer() as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="gone", policy=Policy())
            try:
                await a.heartbeat(hb("n1"))
                rs.pause()
                task = asyncio.create_task(a.schedule(REQ))
                await asyncio.sleep(0.2)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                rs.resume()
                await asyncio.to_thread(
                    wait_until, lambda: not a.abandoned, 10, "abandoned placement cancelled"
                )
                assert (await a.stats()).pending == 0
            finally:
                await a.close()

        asyncio.run(scenario())


# ---------------------------------------------------------------------------
# WAIT: acknowledged means replicated
# ---------------------------------------------------------------------------
@pytest.mark.real_only
def test_min_replicas_acked_answers_only_replicated_placements() -> None:
    with SentinelTopology(replicas=1, sentinels=0) as topo:
        replica = topo.replicas[0]
        # (generous while the replica is up: a busy machine may be slow to ack)
        durable = Durability(replicas=1, timeout_ms=10_000)

        async def scenario() -> None:
            a = await AsyncScheduler.connect(
                topo.primary.url, cell="acked", policy=Policy(), durability=durable
            )
            try:
                await a.heartbeat(hb("n1"))
                p = await a.schedule(REQ)
                on_replica = replica.client().hget(
                    f"sched:{{acked}}:res:{p.reservation_id}", "state"
                )
                assert on_replica == b"pending"  # it was there before the answer
                a.durability = Durability(replicas=1, timeout_ms=300)
                replica.pause()
                try:
                    with pytest.raises(NotReplicated, match="reached 0 of the 1 replica"):
                        await a.schedule(REQ)
                    with pytest.raises(NotReplicated):
                        await a.probe()
                finally:
                    replica.resume()
                a.durability = Durability(replicas=1, timeout_ms=10_000)
                await asyncio.to_thread(
                    wait_until, lambda: not a.abandoned, 10, "the unreplicated placement cancelled"
                )
                st = await a.stats()
                assert (st.pending, st.reserved_total, st.cancelled_total) == (1, 2, 1)
            finally:
                await a.close()

        asyncio.run(scenario())


@pytest.mark.real_only
def test_sync_client_waits_too() -> None:
    with SentinelTopology(replicas=1, sentinels=0) as topo:
        s = Scheduler.connect(
            topo.primary.url,
            cell="acked",
            policy=Policy(),
            durability=Durability(replicas=1, timeout_ms=10_000),
        )
        try:
            s.heartbeat(hb("n1"))
            p = s.schedule(REQ)
            assert topo.replicas[0].client().exists(f"sched:{{acked}}:res:{p.reservation_id}")
            s.durability = Durability(replicas=1, timeout_ms=300)
            topo.replicas[0].pause()
            try:
                with pytest.raises(NotReplicated):
                    s.schedule(REQ)
            finally:
                topo.replicas[0].resume()
            s.durability = Durability(replicas=1, timeout_ms=10_000)
            s.probe()  # the next call first cancels the placement that was not replicated
            assert s.stats().pending == 1 and not s.abandoned
        finally:
            s.close()


# ---------------------------------------------------------------------------
# Count ceilings: running + starting + pending, whatever Redis remembers
# ---------------------------------------------------------------------------
def test_a_sandbox_still_starting_counts_against_the_ceiling(make_scheduler: Make) -> None:
    """The roster lists a sandbox while it is being created (the node counts it
    in sandbox_starting_count): its reservation is released, and the node's
    own starting count keeps it counted."""
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=2)))
    s.heartbeat(hb("n1", roster=["a"], sandbox_count=1))
    p = s.schedule(REQ)
    s.assign("b", "n1", "n1.local:5000", p.reservation_id)
    r = s.heartbeat(hb("n1", roster=["a", "b"], sandbox_count=1, sandbox_starting_count=1))
    assert r.released == 1 and s.stats().pending == 0
    with pytest.raises(NoNodesAvailable, match=r"1 at max_sandbox_count \(2\)"):
        s.schedule(REQ)


@pytest.mark.real_only
def test_a_redis_that_came_back_empty_still_counts_what_nodes_hold() -> None:
    """Redis restarted without its data: the reservations are gone, but the
    nodes' next heartbeats carry what they run and start, so the ceiling holds."""
    with RedisServer() as rs:
        policy = Policy(limits=Limits(max_sandbox_count=3))
        s = Scheduler.connect(rs.url, cell="empty", policy=policy)
        s.heartbeat(hb("n1"))
        placed = [s.schedule(REQ) for _ in range(3)]
        with pytest.raises(NoNodesAvailable):
            s.schedule(REQ)
        rs.stop()
        rs.start()
        assert s.sync_policy(policy, restore=True) == "created"  # what a replica does
        s.advance_clock(1)
        # the node is creating all three
        s.heartbeat(hb("n1", roster=[f"sb{i}" for i in range(3)], sandbox_starting_count=3))
        with pytest.raises(NoNodesAvailable, match=r"at max_sandbox_count \(3\)"):
            s.schedule(REQ)
        assert len(placed) == 3
        s.close()


def test_after_a_settle_nodes_take_placements_once_they_heartbeat(make_scheduler: Make) -> None:
    """A failover may have lost placements made just before: no node takes a new
    one until its next heartbeat says what it really holds (one report TTL)."""
    s = make_scheduler(Policy(report_ttl_ms=30_000))
    for n in ("n1", "n2", "n3"):
        s.heartbeat(hb(n))
    s.schedule(REQ)  # the index is in use
    s.settle()
    s.advance_clock(1)
    with pytest.raises(NoNodesAvailable, match="0/3 nodes available: 3 awaiting heartbeat"):
        s.schedule(REQ)
    s.heartbeat(hb("n2"))
    assert {s.schedule(REQ).node_id for _ in range(3)} == {"n2"}
    assert [v.reason for v in s.explain(REQ).verdicts] == [
        "awaiting heartbeat",
        None,
        "awaiting heartbeat",
    ]
    # a second settle moves the mark; after one report TTL it no longer applies
    s.settle()
    s.advance_clock(1)
    with pytest.raises(NoNodesAvailable, match="3 awaiting heartbeat"):
        s.schedule(REQ)
    s.advance_clock(30_000)
    for n in ("n1", "n3"):
        s.heartbeat(hb(n))
    assert {s.schedule(REQ).node_id for _ in range(4)} == {"n1", "n3"}


def test_a_heartbeat_in_the_same_millisecond_as_the_settle_counts(make_scheduler: Make) -> None:
    """Milliseconds cannot order a settle and a heartbeat ingested right after
    it: the heartbeat is stamped just past the mark, so it counts as heard
    since (a replica that restored a lost cell replays the heartbeat that
    found it lost at once, often within the same millisecond)."""
    s = make_scheduler(Policy(report_ttl_ms=30_000))
    s.heartbeat(hb("n1"))
    s.heartbeat(hb("n2"))
    s.advance_clock(0, mode="freeze")
    s.settle()
    with pytest.raises(NoNodesAvailable, match="2 awaiting heartbeat"):
        s.schedule(REQ)
    s.heartbeat(hb("n2"))  # the same frozen millisecond as the settle
    assert s.schedule(REQ).node_id == "n2"
    assert [v.reason for v in s.explain(REQ).verdicts] == ["awaiting heartbeat", None]


def test_static_nodes_wait_for_a_heartbeat_after_a_restore(make_scheduler: Make) -> None:
    """Redis came back empty and a replica restored the policy and the static
    list: a static node never heard from since is no fallback until it is."""
    policy = Policy(static_nodes=True)
    s = make_scheduler(policy)
    s.client.flushall()
    assert s.sync_policy(policy, restore=True) == "created"
    s.sync_nodes([("n1", "n1.local:5000"), ("n2", "n2.local:5000")])
    s.advance_clock(1)
    with pytest.raises(NoNodesAvailable, match="2 awaiting heartbeat"):
        s.schedule(REQ)
    s.heartbeat(hb("n1"))
    assert s.schedule(REQ).node_id == "n1"
    # a restore that finds the policy in place is no loss: nothing settles
    assert s.sync_policy(policy, restore=True) == "same"
    assert s.schedule(REQ).node_id == "n1"


# ---------------------------------------------------------------------------
# A RecordAssignment refused for Redis is written once Redis answers
# ---------------------------------------------------------------------------
@pytest.mark.real_only
def test_an_assignment_refused_while_redis_is_down_is_written_once_it_answers() -> None:
    """The gateway sends RecordAssignment once, after the create succeeded
    (the reference gateway logs a failure and goes on).  Refused because Redis
    was down, it is answered UNAVAILABLE, and the replica writes it once
    Redis answers again: the reservation is assigned and LookupNode finds the
    sandbox, where before it stayed pending (counted beside the node's own
    count of the sandbox) until unassigned_reservation_ttl."""
    with RedisServer(extra_args=["--appendonly", "yes"]) as rs:
        settings = settings_for(Policy(), cell="owed")
        with ThreadedReplica(settings, lambda: async_client(rs.url, 0.5), rs.url) as r:
            r.stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5007"))
            reply, call = r.stub.Schedule.with_call(cold(1, 1024), timeout=10)
            rid = dict(call.trailing_metadata() or ())["x-reservation-id"]
            node = pb.Node(node_id=reply.node.node_id, endpoint=reply.node.endpoint)
            rs.stop()
            with pytest.raises(grpc.RpcError) as refused:
                r.stub.RecordAssignment(
                    pb.RecordAssignmentRequest(sandbox_id="sbx-1", node=node),
                    metadata=(("x-reservation-id", rid),),
                    timeout=10,
                )
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "Redis" in (refused.value.details() or "")
            assert r.replica is not None
            registry = r.replica.metrics.registry
            assert registry.get_sample_value("sched_owed_assignments") == 1
            rs.start()
            s = Scheduler.connect(rs.url, cell="owed")
            try:
                wait_until(
                    lambda: s.reservation(rid).state == "assigned",
                    30,
                    "the refused assignment written",
                )
                assert s.lookup("sbx-1").node_id == "n1"
                found = r.stub.LookupNode(pb.LookupNodeRequest(sandbox_id="sbx-1"), timeout=10)
                assert found.node.node_id == "n1"
                # nothing is owed any more: written once
                assert not r.replica.sched.owed
                assert registry.get_sample_value("sched_owed_assignments") == 0
            finally:
                s.close()


@pytest.mark.real_only
def test_the_sync_client_writes_an_owed_assignment_before_its_next_call() -> None:
    """The library's own gateway path: an assignment it could not write for
    Redis, handed to owe_assignment, is written before the client's next
    call once Redis answers (and kept while it does not)."""
    with RedisServer(extra_args=["--appendonly", "yes"]) as rs:
        s = Scheduler.connect(rs.url, cell="owed-sync", policy=Policy(), timeout_s=0.5)
        try:
            s.heartbeat(hb("n1"))
            placed = s.schedule(REQ)
            rs.stop()
            with pytest.raises(StoreUnavailable):
                s.assign("sbx-1", "n1", "n1.local:5000", placed.reservation_id)
            s.owe_assignment("sbx-1", "n1", "n1.local:5000", placed.reservation_id)
            assert set(s.owed) == {"sbx-1"}  # (Redis down: kept)
            rs.start()
            assert s.reservation(placed.reservation_id).state == "assigned"
            assert not s.owed
            assert s.lookup("sbx-1").node_id == "n1"
        finally:
            s.close()
