"""A Redis that comes back with older data, or with its clock off, is
detected by the replicas' health probe (scheduler/domain/history.py) and the cell
settles: no node is placed on from numbers older than its next heartbeat,
reservations that came back from the past end, and a jumped clock is put
back instead of expiring (forward) or freshening (back) everything.  Real
redis-server processes; the skewed clock is bench/clockshift.c's shim."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2

from bench import clockshift
from scheduler import Policy, Scheduler
from scheduler.domain.history import HistoryWatch, Probe
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.store.connection import async_client
from scheduler.testing.lag import LaggingLink
from scheduler.testing.redis_server import TILT_S, RedisServer, SentinelTopology, wait_until
from scheduler.testing.replicas import (
    ServeProcess,
    ThreadedReplica,
    health_status,
    settings_for,
)
from tests.helpers import cold, endpoint_md, hb_request

pytestmark = pytest.mark.real_only
CELL = "rewind"
MD = endpoint_md("n1:5000")


@pytest.fixture
def server(redis_server: object) -> Iterator[RedisServer]:  # (skips without redis-server)
    with RedisServer() as rs:
        yield rs


@pytest.fixture
def replica(server: RedisServer) -> Iterator[ThreadedReplica]:
    settings = settings_for(Policy(), cell=CELL)
    with ThreadedReplica(settings, lambda: async_client(server.url), server.url) as r:
        yield r


@pytest.fixture
def served(server: RedisServer) -> Iterator[ThreadedReplica]:
    """A replica whose Redis client is made as ``schedctl serve`` makes it
    (cli/runtime.py): no socket timeout on its connections, every call
    bounded by its caller."""
    settings = settings_for(Policy(), cell=CELL)

    def client() -> Any:
        return async_client(server.url, caller_bounds=True)

    with ThreadedReplica(settings, client, server.url) as r:
        yield r


def ask(server: RedisServer, command: str, *args: Any, **kwargs: Any) -> Any:
    """One redis-py command on a connection of its own, closed after."""
    with server.client() as c:
        return getattr(c, command)(*args, **kwargs)


def rewinds(r: ThreadedReplica, reason: str) -> float:
    assert r.replica is not None
    value = r.replica.metrics.registry.get_sample_value(
        "sched_redis_rewinds_total", {"reason": reason}
    )
    return value or 0.0


def placed_id(call: Any) -> str:
    return str(dict(call.trailing_metadata() or ())["x-reservation-id"])


def place(r: ThreadedReplica) -> tuple[Any, str]:
    resp, call = r.stub.Schedule.with_call(cold(1, 16), timeout=5)
    return resp, placed_id(call)


def seen_by_probe(r: ThreadedReplica, url: str) -> None:
    """Wait until the replica's monitor has probed what Redis holds now."""
    admin = redis.Redis.from_url(url)
    try:
        wanted = int(admin.hget(f"sched:{{{CELL}}}:stats", "probes") or 0) + 2
    finally:
        admin.close()
    assert r.replica is not None
    history = r.replica.history
    wait_until(lambda: history.last is not None and history.last.sequence >= wanted, 10, "a probe")


def refused_awaiting_heartbeat(r: ThreadedReplica) -> str:
    with pytest.raises(grpc.RpcError) as e:
        r.stub.Schedule(cold(1, 16), timeout=5)
    return e.value.details() or ""


def test_a_restart_from_an_old_snapshot_settles_and_ends_what_came_back(
    server: RedisServer, replica: ThreadedReplica
) -> None:
    """Debian's Redis persists by RDB snapshots only: killed and restarted, it
    serves its last snapshot.  Before, the replica settled only a cell whose
    policy was gone, so the snapshot's reservations (ended since) held their
    slots for 10 min and nodes were placed on from the snapshot's numbers."""
    r = replica
    assert r.replica is not None
    r.replica.rewind_grace_ms = 0  # (every reservation of the snapshot came back)
    r.stub.Heartbeat(hb_request("n1"), metadata=MD, timeout=5)
    resp, old = place(r)
    ask(server, "save")  # the snapshot: `old` live
    # after it: the creation lands, its reservation ends, another is made
    r.stub.RecordAssignment(
        pb.RecordAssignmentRequest(sandbox_id="s1", node=resp.node),
        metadata=(("x-reservation-id", old),),
        timeout=5,
    )
    r.stub.Heartbeat(hb_request("n1", roster=["s1"]), metadata=MD, timeout=5)
    _, new = place(r)
    seen_by_probe(r, server.url)
    s = Scheduler.connect(server.url, cell=CELL)
    try:
        assert s.reservation(old).state == "released"
        server.kill()
        server.start()  # from the snapshot
        wait_until(lambda: rewinds(r, "rewound") >= 1, 15, "the rewind detected")
        # the reservation that came back from the past ended (and was counted)
        assert s.reservation(old).state == "cancelled"
        assert r.replica.metrics.registry.get_sample_value("sched_rewound_reservations_total") == 1
        assert all(res.reservation_id != new for res in s.reservations())  # (lost with the data)
        # nothing is placed on n1 from the snapshot's numbers: it heartbeats first
        assert "awaiting heartbeat" in refused_awaiting_heartbeat(r)
        r.stub.Heartbeat(hb_request("n1", roster=["s1"]), metadata=MD, timeout=5)
        assert r.stub.Schedule(cold(1, 16), timeout=5).node.node_id == "n1"
        assert rewinds(r, "rewound") == 1 and rewinds(r, "clock") == 0  # settled once
    finally:
        s.close()


def health(r: ThreadedReplica) -> int | None:
    assert r.replica is not None
    try:
        return health_status(f"127.0.0.1:{r.replica.port}")
    except grpc.RpcError:
        return None  # (no answer is no status)


def test_health_is_not_serving_while_redis_is_stopped(
    server: RedisServer, served: ThreadedReplica
) -> None:
    """The health check reads the server's run_id (INFO server: the restart
    guard's) before its probe.  That read went through the bare client, which
    in ``schedctl serve`` has no socket timeout: with Redis stopped (SIGSTOP)
    it waited as long as Redis was stopped, and health said SERVING all along
    (tests/test_faults.py's pause scenario).  Every read of the check is now
    bounded like the probe."""
    r = served
    r.stub.Heartbeat(hb_request("n1"), metadata=MD, timeout=5)
    seen_by_probe(r, server.url)  # (the guard knows this server's run_id)
    assert health(r) == health_pb2.HealthCheckResponse.SERVING
    server.pause()
    try:
        wait_until(
            lambda: health(r) == health_pb2.HealthCheckResponse.NOT_SERVING,
            15,
            "NOT_SERVING while Redis is stopped",
        )
    finally:
        server.resume()
    wait_until(lambda: health(r) == health_pb2.HealthCheckResponse.SERVING, 15, "SERVING again")
    assert r.stub.Schedule(cold(1, 16), timeout=5).node.node_id == "n1"
    assert rewinds(r, "rewound") == 0 and rewinds(r, "clock") == 0  # a pause is no rewind


@pytest.mark.parametrize("offset_ms", [15 * 60_000, -15 * 60_000], ids=["ahead", "behind"])
def test_redis_time_that_jumps_is_put_back_and_the_cell_settles(
    server: RedisServer, replica: ThreadedReplica, offset_ms: int
) -> None:
    """The same data on a server whose clock is 15 min off (a failover to a
    replica with a wrong clock, a stepped clock).  Before: ahead, every live
    reservation expired at the next sweep and every node read stale; behind,
    a node silent for minutes stayed READY."""
    r = replica
    assert r.replica is not None
    r.replica.rewind_grace_ms = 600_000  # (the settle ends no reservation of this test)
    r.stub.Heartbeat(hb_request("n1"), metadata=MD, timeout=5)
    _, rid = place(r)
    seen_by_probe(r, server.url)
    assert server.proc is not None
    ask(server, "shutdown", save=True)  # (the same data comes back)
    server.proc.wait(10)
    server.proc = None
    server.env = clockshift.environment(offset_ms)
    server.start()
    raw = int(ask(server, "time")[0]) * 1000
    assert abs(raw - time.time() * 1000 - offset_ms) < 60_000  # the shim shifts Redis TIME
    wait_until(lambda: rewinds(r, "clock") >= 1, 15, "the jump detected")
    s = Scheduler.connect(server.url, cell=CELL)
    try:
        # the cell's clock runs where it did: within seconds of this host's
        assert abs(s.advance_clock(0) - time.time() * 1000) < 10_000
        assert "awaiting heartbeat" in refused_awaiting_heartbeat(r)
        r.stub.Heartbeat(hb_request("n1"), metadata=MD, timeout=5)
        r.stub.Schedule(cold(1, 16), timeout=5)  # (its sweep ran at the cell's time)
        assert s.reservation(rid).state == "pending"  # not expired
        assert rewinds(r, "rewound") == 0
    finally:
        s.close()


@pytest.mark.slow
def test_an_acknowledged_placement_survives_the_promotion_of_the_replica_that_was_behind(
    redis_server: object, processes: list[ServeProcess]
) -> None:
    """min_replicas_acked 1 waits for every connected Redis replica, so the
    replica Sentinel promotes has every acknowledged placement even when it
    was behind and replica-priority prefers it.  (With WAIT 1 answered by
    whichever replica came first, 22-23 acknowledged placements were lost
    this way.)"""
    # (failover-timeout: Sentinel "fixes" a replica whose primary is another
    # address, the link, only that long after it last changed)
    topo = SentinelTopology(replicas=2, sentinels=3, failover_timeout_ms=120_000)
    behind = topo.replicas[1]
    link = LaggingLink(topo.primary.port)
    # it replicates through the link, and Sentinel prefers it
    behind.extra_args = (
        *behind.extra_args[:-1],
        str(link.port),
        "--replica-priority",
        "1",
    )
    with link, topo:
        config = {"scheduler": {"min_replicas_acked": 1, "replica_ack_timeout": "1s"}}
        p = ServeProcess(config, topo.url, cell=CELL)
        processes.append(p)
        p.wait_serving(90)  # (a loaded host starts a replica slowly)
        with grpc.insecure_channel(p.address) as channel:
            stub = pb_grpc.SchedulerStub(channel)
            stub.Heartbeat(hb_request("n1"), metadata=MD, timeout=5)
            acked = [placed_id(stub.Schedule.with_call(cold(1, 16), timeout=5)[1])]
            time.sleep(2)  # (the replica's monitor counts both Redis replicas every second)
            assert ask(behind, "info", "replication")["master_port"] == link.port
            link.hold()  # connected, and behind from now on
            futures = [stub.Schedule.future(cold(1, 16), timeout=5) for _ in range(3)]
            for f in futures:
                try:
                    f.result()
                    acked.append(placed_id(f))
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE, e.details()
            primary = topo.primary
            held = len(ask(primary, "keys", f"sched:{{{CELL}}}:res:*"))
            assert held == 4  # the primary has all four; the one behind lacks three
            primary.kill()  # the primary dies while that replica is behind
            link.cut()  # (what it held never arrives)
            wait_until(lambda: topo.primary_port() == behind.port, 30, "the one behind promoted")
            wait_until(
                lambda: ask(behind, "info", "replication")["role"] == "master", 30, "promoted"
            )
            key = f"sched:{{{CELL}}}:res:"
            missing = [rid for rid in acked if not ask(behind, "exists", key + rid)]
            assert missing == [], (missing, acked)
            assert len(ask(behind, "keys", key + "*")) < held  # it was behind


@pytest.mark.slow
def test_an_assignment_the_promoted_replica_lacked_is_written_again_and_ends(
    redis_server: object, processes: list[ServeProcess]
) -> None:
    """At min_replicas_acked 0 the replica Sentinel promotes may lack the last
    writes: here a placement's assignment, answered OK by the old primary.
    The reservation came over pending, and nothing ended it (the gateway does
    not send the assignment again; no roster names a pending reservation)
    before unassigned_reservation_ttl (90 s): "stuck" in bench faults'
    failover rows.  The replica writes again the assignments it answered
    lately after the failover settle; the roster rules then end it."""
    topo = SentinelTopology(replicas=1, sentinels=3, failover_timeout_ms=120_000)
    behind = topo.replicas[0]
    link = LaggingLink(topo.primary.port)
    behind.extra_args = (*behind.extra_args[:-1], str(link.port))
    with link, topo:
        p = ServeProcess({"scheduler": {"min_replicas_acked": 0}}, topo.url, cell=CELL)
        processes.append(p)
        p.wait_serving(90)  # (a loaded host starts a replica slowly)
        stamps = iter(range(int(time.time() * 1000), 1 << 62, 10))

        with grpc.insecure_channel(p.address) as channel:
            stub = pb_grpc.SchedulerStub(channel)

            def beat(*roster: str) -> None:
                request = hb_request("n1", roster=list(roster), reported_at_unix_ms=next(stamps))
                stub.Heartbeat(request, metadata=MD, timeout=5)

            beat("s0")  # (a roster: the node is in roster mode)
            resp, call = stub.Schedule.with_call(cold(1, 16), timeout=5)
            rid = placed_id(call)
            key = f"sched:{{{CELL}}}:res:{rid}"
            wait_until(lambda: ask(behind, "exists", key), 10, "the reservation replicated")
            link.hold()  # connected, and behind from now on
            stub.RecordAssignment(
                pb.RecordAssignmentRequest(sandbox_id="s1", node=resp.node),
                metadata=(("x-reservation-id", rid),),
                timeout=5,
            )
            assert ask(topo.primary, "hget", key, "state") == b"assigned"
            topo.wait_untilted()  # (a sentinel in TILT would act 30 s later)
            topo.primary.kill()
            link.cut()  # (what it held never arrives)
            wait_until(
                lambda: topo.primary_port() == behind.port, 60 + TILT_S, "the one behind promoted"
            )
            wait_until(
                lambda: ask(behind, "info", "replication")["role"] == "master", 30, "promoted"
            )
            # written again by the replica after its settle (it came over pending)
            wait_until(
                lambda: ask(behind, "hget", key, "sandbox_id") == b"s1",
                30,
                "the assignment written again",
            )
            assert ask(behind, "hget", key, "state") == b"assigned"
            # s1 has ended: two heartbeats that do not list it release the reservation
            beat("s0")
            beat("s0")
            assert ask(behind, "hget", key, "state") == b"released"
            assert "wrote again 1 assignment(s)" in p.log()


def test_a_probe_sent_before_another_is_not_compared_after_it(
    server: RedisServer, replica: ThreadedReplica
) -> None:
    """A probe in flight to the old primary when Sentinel switched may be
    answered after one the new primary answered.  Ordered by when each was
    answered, the old primary's (older data, another clock, a lower
    generation) was compared with the new primary's and read as data from
    the past: the cell settled a second time (the clock-skew-ahead row's
    `rewinds` 2).  Ordered by when each was sent, it is dropped."""
    r = replica
    assert r.replica is not None
    rep = r.replica
    seen_by_probe(r, server.url)
    fresh = r.call(rep.sched.probe_cell(5))
    r.call(rep.check_history(fresh))
    # answered after `fresh`, sent before it, by a server 15 min behind with older data
    stale = Probe(
        now_ms=fresh.now_ms - 900_000,
        has_policy=True,
        raw_ms=fresh.raw_ms - 900_000,
        sequence=max(0, fresh.sequence - 5),
        generation=fresh.generation,
        at=fresh.at + 0.5,
        sent=fresh.sent - 0.5,
    )
    r.call(rep.check_history(stale))
    assert rewinds(r, "rewound") == 0 and rewinds(r, "clock") == 0
    assert int(ask(server, "hget", f"sched:{{{CELL}}}:stats", "rewinds") or 0) == 0


def test_a_placement_answered_while_the_probe_was_on_its_way_is_not_expected_in_it() -> None:
    """A probe and a Schedule go on different connections: Redis may run the
    probe first and the replica see the placement's answer first.  Counted
    as a placement the probe must include, it read as data from the past and
    the cell settled with one Redis that never went back (the throughput
    bench's grpc row: every node "awaiting heartbeat" for the rest of the
    run, 1 run in 9 under CPU hogs).  Only placements answered before the
    probe was sent are expected in it; one of those missing is a rewind."""
    h = HistoryWatch()
    base = Probe(now_ms=1_000, has_policy=True, raw_ms=1_000, sequence=10, generation=0,
                 at=1.0, sent=0.9)  # fmt: skip
    assert h.observe(base) is None
    h.placement(sent_at=1.5, answered_at=2.2)  # answered after the probe below was sent
    racing = Probe(now_ms=2_500, has_policy=True, raw_ms=2_500, sequence=11, generation=0,
                   at=2.5, sent=2.0)  # fmt: skip
    assert h.observe(racing) is None  # (11: the probe's own +1; Redis ran it first)
    h.placement(sent_at=2.6, answered_at=2.8)  # answered before the next probe was sent
    lost = Probe(now_ms=3_500, has_policy=True, raw_ms=3_500, sequence=12, generation=0,
                 at=3.5, sent=3.0)  # fmt: skip
    verdict = h.observe(lost)  # its own +1 only: the placement is missing
    assert verdict is not None and verdict.reason == "rewound"
    assert (verdict.expected_sequence, verdict.sequence) == (13, 12)


def test_a_probe_answered_late_is_no_clock_jump_and_a_real_jump_still_is() -> None:
    """Redis ran a probe somewhere between its send and its answer: one
    answered 6 s late (a loaded host, a reconnect during a failover) read as
    Redis time falling 6 s behind this replica's clock, past the 5 s bound,
    and the cell settled for a clock that never moved.  The move is now the
    least the round trips allow; a jump of 15 minutes either way, answered
    as late, is still one, by at least its size less the round trips."""
    base = Probe(now_ms=10_000, has_policy=True, raw_ms=10_000, sequence=5, generation=0,
                 at=1.0, sent=0.9)  # fmt: skip

    def after(raw_ms: int, sent: float, at: float) -> Probe:
        return replace(base, now_ms=raw_ms, raw_ms=raw_ms, sequence=6, at=at, sent=sent)

    late = after(11_000, sent=2.0, at=8.0)  # (ran at about 2.0 s: 1 s of Redis time)
    assert (late.raw_ms - base.raw_ms) - round((late.at - base.at) * 1000) < -5_000
    h = HistoryWatch()
    assert h.observe(base) is None
    assert h.observe(late) is None
    for jump in (900_000, -900_000):
        h = HistoryWatch()
        assert h.observe(base) is None
        verdict = h.observe(after(11_000 + jump, sent=2.0, at=8.0))
        assert verdict is not None and verdict.reason == "clock", jump
        # (at least the jump less the round trips: 0.1 s and 6 s)
        assert abs(jump) - 6_100 <= abs(verdict.skew_ms) <= abs(jump), verdict
        assert (verdict.skew_ms > 0) == (jump > 0)
        assert verdict.expected_now_ms == base.now_ms + 7_000  # (where the clock goes back to)
    # a probe answered at once: the move is its point figure less 0.1 s at most
    h = HistoryWatch()
    assert h.observe(base) is None
    verdict = h.observe(after(11_000 + 6_000, sent=2.0, at=2.0))
    # (7 s of Redis time in 1.0-1.1 s of this replica's: at least 5.9 s ahead)
    assert verdict is not None and verdict.skew_ms == 5_900, verdict


def test_a_probe_of_another_server_with_a_lower_generation_settles_nothing(
    server: RedisServer, replica: ThreadedReplica
) -> None:
    """Sent after the replica's last probe, and still the old primary's (it
    answers until Sentinel demotes it): its generation is below the one the
    replica saw, which read as data from the past, and the settle went to
    the new primary, which has that generation: a second settle there (the
    clock-skew-ahead row's `rewinds` 2 in about one run in three).  The
    settle now names the generation the probe read; a server that has the
    one the replica saw is not settled."""
    r = replica
    assert r.replica is not None
    rep = r.replica
    s = Scheduler.connect(server.url, cell=CELL)
    try:
        assert s.rewound(0, None, 5_000)[0]  # a first settle: generation 1
    finally:
        s.close()
    seen_by_probe(r, server.url)
    assert rep.history.last is not None and rep.history.last.generation == 1
    fresh = r.call(rep.sched.probe_cell(5))
    stale = Probe(
        now_ms=fresh.now_ms - 900_000,
        has_policy=True,
        raw_ms=fresh.raw_ms - 900_000,
        sequence=max(0, fresh.sequence - 5),
        generation=0,
        at=time.monotonic(),
        sent=time.monotonic(),
    )
    r.call(rep.check_history(stale))
    assert rewinds(r, "rewound") == 0 and rewinds(r, "clock") == 0
    assert int(ask(server, "hget", f"sched:{{{CELL}}}:stats", "rewinds") or 0) == 1
    # the baseline is still this server's: its next probe finds nothing to settle
    r.call(rep.check_history(r.call(rep.sched.probe_cell(5))))
    assert int(ask(server, "hget", f"sched:{{{CELL}}}:stats", "rewinds") or 0) == 1
