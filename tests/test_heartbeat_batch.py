"""Coalesced heartbeats: one batch call (lua/heartbeat_batch-5.lua) leaves
Redis exactly as the same heartbeats sent one by one (a property, on real
Redis and fakeredis), each heartbeat gets its own answer or error, and a
replica's client batches the heartbeats that queue while a call is in flight."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from scheduler import InvalidArgument, Limits, MachineInfo, Policy, Request, Scheduler
from scheduler.client.aio import AsyncScheduler
from scheduler.domain.errors import FailedPrecondition, SchedulerError
from scheduler.domain.records import Heartbeat, HeartbeatResult
from scheduler.ops.simnode import SimNode
from scheduler.store.calls import Followed, Resync
from scheduler.store.contracts import HeartbeatBatchArgv
from scheduler.store.cpuconfig import digest
from scheduler.testing.redis_server import RedisServer, wait_until
from tests.helpers import (
    GIB,
    bound_sandboxes_are_in_their_nodes_sets,
    hb,
    heartbeat_argv,
    records_name_only_registered_nodes,
    snapshot_keys,
)
from tests.test_index import index_is_consistent

POLICY = Policy(strategy="least_loaded", limits=Limits(max_sandbox_count=6))
MIB = 1 << 20
#: what happens to a node before its heartbeat: a placement listed, a sandbox
#: gone, nothing (a steady heartbeat), or a restart
ACTIONS = ("create", "delete", "same", "restart")


def _fleet() -> list[SimNode]:
    # n3 sends no roster (counter mode: creations release by create_successes)
    return [SimNode(f"n{i}", 8 + 8 * (i % 2), (16 + 16 * (i % 3)) * GIB) for i in range(4)]


def _beat(node: SimNode) -> Heartbeat:
    return node.heartbeat(roster=node.node_id != "n3")


def _frozen_cells(client: Any) -> tuple[Scheduler, Scheduler]:
    """Two cells of one server whose clocks stand still at the same instant:
    the same history writes the same bytes in both."""
    client.flushall()
    one, many = Scheduler(client, cell="one"), Scheduler(client, cell="many")
    for s in (one, many):
        s.sync_policy(POLICY)
    a = one.advance_clock(0, "freeze")
    b = many.advance_clock(0, "freeze")
    if a < b:
        one.advance_clock(b - a)
    elif b < a:
        many.advance_clock(a - b)
    return one, many


def _cell_keys(s: Scheduler) -> dict[bytes, Any]:
    """The cell's keys and content, named without the cell (the policy's
    packed copy and drill clock aside, which the freeze wrote)."""
    prefix = s.keys.base.encode()
    out = {}
    for key, value in snapshot_keys(s.client).items():
        if key.startswith(prefix):
            out[key[len(prefix) :]] = value
    return out


def _results(r: HeartbeatResult | Exception) -> Any:
    if isinstance(r, Exception):
        return type(r).__name__
    return (r.generation, r.restarted, r.released, r.roster_mode, r.now_ms)


def _outcome(s: Scheduler, call: Any) -> HeartbeatResult | Exception:
    try:
        return s.run(call)
    except (Resync, SchedulerError) as e:
        return e


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    creations=st.integers(0, 6),
    rounds=st.lists(
        st.lists(st.tuples(st.integers(0, 3), st.sampled_from(ACTIONS)), min_size=1, max_size=10),
        min_size=1,
        max_size=3,
    ),
)
def test_a_batch_of_heartbeats_leaves_redis_as_one_by_one(
    redis_client: Any, creations: int, rounds: list[list[tuple[int, str]]]
) -> None:
    """Rounds of heartbeats, each built (as a replica builds them) from what
    the replica last wrote, sent one by one to one cell and as one batch to
    its twin: the same answers (a node's second heartbeat of a round was
    built on a base its first replaced: RESYNC on both sides, then it goes in
    full) and, after each round, the same keys byte for byte."""
    one, many = _frozen_cells(redis_client)
    twins = {s: {n.node_id: n for n in _fleet()} for s in (one, many)}
    for s in (one, many):
        for node in twins[s].values():
            s.heartbeat(_beat(node))
    for k in range(creations):
        got = [s.schedule(Request.cold(1, 512), reservation_id=f"r{k}") for s in (one, many)]
        assert got[0].node_id == got[1].node_id
        for s in (one, many):
            s.assign(f"sb{k}", got[0].node_id, got[0].endpoint, f"r{k}")
            twins[s][got[0].node_id].create(f"sb{k}", 1, 512 * MIB)
    for r, stream in enumerate(rounds):
        beats: dict[Scheduler, list[Heartbeat]] = {one: [], many: []}
        for i, (which, action) in enumerate(stream):
            for s in (one, many):
                node = twins[s][f"n{which}"]
                if action == "delete" and node.sandboxes:
                    node.delete(next(iter(node.sandboxes)))
                elif action == "restart":
                    node.instance = f"boot-{r}-{i}"
                    node.sandboxes.clear()
                beats[s].append(_beat(node))
        calls = {s: [s.ops.heartbeat(b, s.beats) for b in beats[s]] for s in (one, many)}
        sequential = [_outcome(one, call) for call in calls[one]]
        batched = many.run(many.ops.heartbeat_batch(calls[many]))
        assert [_results(x) for x in batched] == [_results(x) for x in sequential]
        event(f"released: {sum(x.released for x in batched if isinstance(x, HeartbeatResult)) > 0}")
        event(f"resync: {any(isinstance(x, Resync) for x in batched)}")
        event(f"steady: {any(c.script == 'heartbeat_steady' for c in calls[many])}")
        for s, got in ((one, sequential), (many, batched)):
            for beat, x in zip(beats[s], got, strict=True):
                if isinstance(x, Resync):
                    s.heartbeat(beat)
        assert _cell_keys(many) == _cell_keys(one)
    index_is_consistent(many, POLICY, one.advance_clock(0))
    records_name_only_registered_nodes(many)
    bound_sandboxes_are_in_their_nodes_sets(many)


def test_a_bucket_a_batch_moved_into_then_emptied_leaves_the_streams(redis_client: Any) -> None:
    """A batch moves a node into a bucket another node holds (listed in its
    shape's streams, its size not known to the call), then both nodes out:
    the bucket leaves the streams as it does one heartbeat at a time."""
    one, many = _frozen_cells(redis_client)

    def beat(node_id: str, running: int) -> Heartbeat:
        return hb(node_id, cpu=16, mem_gib=64, sandbox_count=running, allocated_cpu=running)

    for s in (one, many):
        s.heartbeat(beat("n1", 1))
        s.heartbeat(beat("n2", 0))
    batch = [beat("n2", 1), beat("n2", 2), beat("n1", 3)]  # n2 joins n1, then both leave
    for b in batch:
        one.run(one.ops.heartbeat(b, full=True))
    many.run(many.ops.heartbeat_batch([many.ops.heartbeat(b, full=True) for b in batch]))
    assert _cell_keys(many) == _cell_keys(one)
    index_is_consistent(many, POLICY, one.advance_clock(0))


def test_each_heartbeat_of_a_batch_gets_its_own_answer(make_scheduler: Any) -> None:
    s = make_scheduler()
    s.heartbeat(hb("n1"))
    steady = s.ops.heartbeat(hb("n1"), s.beats)
    assert steady.script == "heartbeat_steady"
    changed = s.ops.heartbeat(hb("n2", cpu=8), s.beats)
    bad = s.ops.heartbeat(hb("n3"), s.beats)
    # (past the client's checks: the script's)
    bad = bad.with_argv(
        replace(heartbeat_argv(bad), field_count="1", fields=["no_such_field", "1"])
    )
    stale = s.ops.heartbeat(hb("n1", cpu=32), s.beats)  # on the base `steady` replaces
    before = snapshot_keys(s.client)
    got = s.run(s.ops.heartbeat_batch([steady, changed, bad, stale]))
    assert isinstance(got[0], HeartbeatResult) and got[0].generation == 2
    assert isinstance(got[1], HeartbeatResult) and got[1].generation == 1
    assert isinstance(got[2], InvalidArgument) and "no_such_field" in got[2].message
    assert isinstance(got[3], Resync)
    assert s.client.exists(s.keys.node("n2")) and not s.client.exists(s.keys.node("n3"))
    assert snapshot_keys(s.client) != before
    # a malformed batch writes nothing
    before = snapshot_keys(s.client)
    call = s.ops.heartbeat_batch([s.ops.heartbeat(hb("n4"), s.beats)])
    assert isinstance(call.argv, HeartbeatBatchArgv)
    kind, length, *argv = call.argv.heartbeats  # (each heartbeat: kind, ARGV length, ARGV)
    with pytest.raises(InvalidArgument, match="full"):
        s.run(call.with_argv(replace(call.argv, heartbeats=["sideways", length, *argv])))
    # a count that does not add up
    with pytest.raises(InvalidArgument, match="count"):
        s.run(call.with_argv(replace(call.argv, heartbeats=[kind, "3", *argv])))
    assert snapshot_keys(s.client) == before
    with pytest.raises(ValueError, match="heartbeats"):
        s.ops.heartbeat_batch([s.ops.schedule(Request.cold(1, 1))])  # type: ignore[list-item]
    # no policy: the whole call fails, writing nothing
    s.client.delete(s.keys.policy)
    with pytest.raises(FailedPrecondition):
        s.run(s.ops.heartbeat_batch([s.ops.heartbeat(hb("n5"), None)]))


@pytest.mark.real_only
def test_a_replica_client_batches_heartbeats_that_queue() -> None:
    with RedisServer() as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="beats", policy=Policy())
            try:
                nodes = [SimNode(f"n{i}", 16, 64 * GIB) for i in range(40)]
                first = await asyncio.gather(*(a.heartbeat(n.heartbeat()) for n in nodes))
                assert [r.generation for r in first] == [1] * 40
                assert a.beat_coalescer.batches >= 1 and a.beat_coalescer.batched > 1
                placed = await asyncio.gather(
                    *(a.schedule(Request.cold(1, 512)) for _ in range(20))
                )
                for i, p in enumerate(placed):
                    await a.assign(f"sb{i}", p.node_id, p.endpoint, p.reservation_id)
                    nodes[int(p.node_id[1:])].create(f"sb{i}", 1, 512 * MIB)
                # steady, changed and twice the same node, all at once
                beats = [n.heartbeat() for n in nodes] + [nodes[0].heartbeat()]
                again = await asyncio.gather(*(a.heartbeat(b) for b in beats))
                assert sum(r.released for r in again) == 20
                assert sorted(r.generation for r in again)[-2:] == [2, 3]
                stats = await a.stats()
                assert stats.pending == 0
                # coalescing off: the same, one call each
                a.beat_coalescer.enabled = False
                before = a.beat_coalescer.batches
                more = await asyncio.gather(*(a.heartbeat(n.heartbeat()) for n in nodes))
                assert a.beat_coalescer.batches == before
                assert all(r.generation >= 3 for r in more)
            finally:
                await a.close()

        asyncio.run(scenario())


def test_a_batch_sweeps_once_and_its_steady_heartbeats_need_no_resync(make_scheduler: Any) -> None:
    """Reservations due when a batch comes: it expires them first (one
    sweep), so its steady heartbeats apply where alone each would answer
    RESYNC; the nodes whose pending load fell are reindexed by the call."""
    policy = Policy(strategy="least_loaded", reservation_ttl_ms=60_000)
    s = make_scheduler(policy)
    now = s.advance_clock(0, "freeze")
    for i in range(3):
        s.heartbeat(hb(f"n{i}"))
    placed = [s.schedule(Request.cold(2, 1024)) for _ in range(6)]
    assert s.stats().pending == 6
    s.advance_clock(61_000)
    steady = [s.ops.heartbeat(hb(f"n{i}"), s.beats) for i in range(3)]
    assert {c.script for c in steady} == {"heartbeat_steady"}
    # (alone, it would answer RESYNC and write nothing: the full one sweeps)
    assert isinstance(_outcome(s, s.ops.heartbeat(hb("n0"), dict(s.beats))), Resync)
    got = s.run(s.ops.heartbeat_batch(steady))
    assert [type(x) for x in got] == [HeartbeatResult] * 3
    stats = s.stats()
    assert (stats.pending, stats.expired_total) == (0, len(placed))
    index_is_consistent(s, policy, now + 61_000)


@pytest.mark.real_only
def test_many_heartbeats_of_one_node_at_once_all_land() -> None:
    """A node's heartbeats that race each other (retries, a slow link) meet
    in one batch, built on the same base: all but one answer RESYNC, and
    each of those goes again in full, whatever base the memo holds by then
    (a second RESYNC would fail the heartbeat)."""
    with RedisServer() as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="race", policy=Policy())
            try:
                await a.heartbeat(hb("n1"))
                # waves that overlap: a retry meets heartbeats built on a newer base
                tasks = []
                for k in range(200):
                    tasks.append(
                        asyncio.create_task(
                            a.heartbeat(hb("n1", allocated_cpu=k % 4, roster=[f"s{k % 7}"]))
                        )
                    )
                    if k % 4 == 3:
                        await asyncio.sleep(0.0005)
                got = await asyncio.gather(*tasks)
                assert len({r.generation for r in got}) == 200
                assert a.beat_coalescer.batches >= 3
            finally:
                await a.close()

        asyncio.run(scenario())


def test_a_batch_carries_a_long_roster(make_scheduler: Any) -> None:
    """A heartbeat of more arguments than one unpack() may take (its roster)
    is sliced out of the batch's arguments all the same."""
    s = make_scheduler()
    roster = [f"long-{i}" for i in range(1500)]
    calls = [
        s.ops.heartbeat(hb("n1", roster=roster, sandbox_count=1500), s.beats),
        s.ops.heartbeat(hb("n2", roster=["short"], sandbox_count=1), s.beats),
    ]
    got = s.run(s.ops.heartbeat_batch(calls))
    assert [r.generation for r in got] == [1, 1]
    assert s.client.scard(s.keys.node_roster("n1")) == 1500
    assert s.lookup("long-1499").node_id == "n1" and s.lookup("short").node_id == "n2"


KVM = [json.dumps({"kvm_capabilities": ["171", str(i)]}) for i in range(6)]


@pytest.mark.real_only
def test_coalesced_heartbeat_rpcs_deliver_the_cpu_config_once_each() -> None:
    """A heartbeat RPC's next step, the CPU config exchange, joins the batch
    calls too: nodes heartbeating at once with their configs each get the
    cluster's intersection exactly once, as one by one."""

    def beat(i: int, config: str = "") -> Heartbeat:
        b = hb(f"c{i}")
        b.cluster_id = "k1"
        b.machine_info = MachineInfo(cpu_config_json=config)
        return b

    with RedisServer() as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="cfg", policy=Policy())
            try:
                got: dict[int, list[str]] = {i: [] for i in range(6)}
                first = await asyncio.gather(
                    *(a.heartbeat(beat(i, KVM[i]), cpu_config=True) for i in range(6))
                )
                for i, r in enumerate(first):
                    got[i].append(r.cpu_config_json)
                for _ in range(3):
                    more = await asyncio.gather(
                        *(a.heartbeat(beat(i), cpu_config=True) for i in range(6))
                    )
                    for i, r in enumerate(more):
                        got[i].append(r.cpu_config_json)
                # (24 heartbeats; more only if the exchange steps went in batches too)
                assert a.beat_coalescer.batched > 24, a.beat_coalescer.batched
                for i in range(6):
                    delivered = [json.loads(c) for c in got[i] if c]
                    assert delivered[-1:] == [
                        {"kvm_capabilities": ["171"], "cpuid_modifiers": [], "msr_modifiers": []}
                    ], (i, got[i])
                    # once the whole cluster's config is in, nothing more
                    assert got[i][-1] == "" or len(delivered) == 1
                assert all(got[i][-2:] == ["", ""] for i in range(6)), got
            finally:
                await a.close()

        asyncio.run(scenario())


def test_a_batch_runs_cpu_config_steps_as_one_by_one(make_scheduler: Any) -> None:
    """Steps of the CPU config exchange in a batch answer and write what the
    same steps one by one do (cpu_config-6.lua), a node with no record too."""
    one, many = make_scheduler(cell="one"), make_scheduler(cell="many")
    for s in (one, many):
        for i in range(3):
            b = hb(f"c{i}")
            b.cluster_id = "k1"
            b.machine_info = MachineInfo(cpu_config_json=KVM[i])
            s.heartbeat(b)

    def steps(s: Scheduler) -> list[Any]:
        out = [s.cpu_ops.ingest(f"c{i}", "k1", digest(KVM[i]), False) for i in range(3)]
        return [
            *out,
            s.cpu_ops.ingest("nobody", "k1", "", False),
            s.cpu_ops.ingest("c0", "k1", "", True),
        ]

    sequential = [one.run(c) for c in steps(one)]
    batched = many.run(many.ops.heartbeat_batch(steps(many)))
    assert batched == sequential
    assert sequential[2].needs_compute  # (the last member in: the client computes)
    stored = [s.client.hgetall(s.keys.cpucfg("k1")) for s in (many, one)]
    # (the computation's lease ends at an instant of Redis time: each call's own)
    leases = [int(h.pop(b"compute_until")) for h in stored]
    assert all(lease > 0 for lease in leases)
    assert stored[0] == stored[1]


def _cfg_beat(i: int, config: str = "", sid: str = "sid-1", **snap: Any) -> Heartbeat:
    b = hb(f"c{i}", sid=sid, **snap)
    b.cluster_id = "k1"
    b.machine_info = MachineInfo(cpu_config_json=config)
    return b


def _script_calls(client: Any) -> int:
    """Script calls Redis has served."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha"))


@pytest.mark.real_only
def test_a_heartbeat_rpc_and_its_cpu_config_ingest_go_in_one_trip() -> None:
    """A Heartbeat RPC's CPU config ingest goes after its heartbeat in the
    same batch call, even alone, its ``restarted`` from the heartbeat's
    answer: one script call a heartbeat where it took two, and each node
    gets what the two calls in turn give it (the sync client runs them so,
    on the same history in another cell): the intersection once, again
    after a restart, every node again after a config changed."""
    steps = [(i, KVM[i], "sid-1") for i in range(3)]
    steps += [(i, "", "sid-1") for _ in range(3) for i in range(3)]
    steps += [(1, "", "sid-2"), (1, "", "sid-2"), (0, "", "sid-1")]  # a restart
    steps += [(2, KVM[5], "sid-1")]  # a changed config: a new round
    steps += [(i, "", f"sid-{1 + (i == 1)}") for _ in range(2) for i in range(3)]
    with RedisServer() as rs:
        turns = Scheduler.connect(rs.url, cell="turns", policy=Policy())
        alone = [turns.heartbeat(_cfg_beat(i, c, sid), cpu_config=True) for i, c, sid in steps]

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="fused", policy=Policy())
            try:
                got = []
                for i, c, sid in steps:
                    before = _script_calls(turns.client)
                    r = await a.heartbeat(_cfg_beat(i, c, sid), cpu_config=True)
                    calls = _script_calls(turns.client) - before
                    # one trip; a second only to store a round's intersection
                    assert calls == 1 or (calls == 2 and r.cpu_config_json), (i, c, sid, calls)
                    got.append(r)
                assert a.beat_coalescer.batches == 0  # (each alone, with its ingest)
                assert [r.cpu_config_json for r in got] == [r.cpu_config_json for r in alone]
                assert [r.restarted for r in got] == [r.restarted for r in alone]
                assert sum(r.restarted for r in got) == 1
                sent = [r.cpu_config_json for r in got]
                # the restarted node again, once; every node the new round, once
                assert sent[12] and not sent[13] and not sent[14], sent
                assert sum(map(bool, sent[15:])) == 3, sent
                final = json.loads(next(c for c in reversed(sent) if c))
                assert final["kvm_capabilities"] == ["171"], final
                hashes = [turns.client.hgetall(s.keys.cpucfg("k1")) for s in (turns, a)]
                for h in hashes:
                    h.pop(b"compute_until")  # (an instant of each call's own Redis time)
                assert hashes[0] == hashes[1]
            finally:
                await a.close()

        asyncio.run(scenario())


def test_an_ingest_runs_only_after_its_heartbeat_applied(make_scheduler: Any) -> None:
    """In a batch, an ingest after a heartbeat that answers RESYNC or fails
    does not run (the heartbeat's answer stands for both, and the ingest
    writes nothing); after a full or steady heartbeat that applied it runs,
    told by that heartbeat whether the node restarted; an ingest out of
    place is refused with the whole batch."""
    s = make_scheduler()

    def ingest() -> Any:
        return s.cpu_ops.ingest("c0", "k1", "", False)

    s.heartbeat(_cfg_beat(0, KVM[0]))
    # a delta on a base another heartbeat replaced meanwhile: RESYNC
    stale = s.ops.heartbeat(_cfg_beat(0, allocated_cpu=1), s.beats).then(ingest())
    s.heartbeat(_cfg_beat(0, allocated_cpu=2))
    bad = s.ops.heartbeat(_cfg_beat(0, allocated_cpu=3), s.beats)
    bad = bad.with_argv(
        replace(heartbeat_argv(bad), field_count="1", fields=["no_such_field", "1"])
    ).then(ingest())
    before = snapshot_keys(s.client)
    got = s.run(s.ops.heartbeat_batch([stale, bad]))
    assert isinstance(got[0], Resync) and isinstance(got[1], InvalidArgument), got
    assert snapshot_keys(s.client) == before  # (no ingest ran: c0 joined no round)
    assert not s.client.exists(s.keys.cpucfg("k1"))
    # applied: the ingest runs; c0 alone in its round, its config is computed
    (first,) = s.run(s.ops.heartbeat_batch([s.ops.heartbeat(_cfg_beat(0), s.beats).then(ingest())]))
    assert isinstance(first, Followed) and first.then is not None and first.then.needs_compute
    assert not first.first.restarted
    config = s.run(s.cpu_ops.store("c0", "k1", first.then.epoch, KVM[0])).config
    assert json.loads(config) == json.loads(KVM[0])
    steady = s.ops.heartbeat(_cfg_beat(0), s.beats)
    assert steady.script == "heartbeat_steady"
    (again,) = s.run(s.ops.heartbeat_batch([steady.then(ingest())]))
    assert isinstance(again, Followed) and again.then is not None
    assert again.then.config == "" and not again.then.needs_compute  # (delivered once)
    # a restart (another service instance): the ingest hears it from the heartbeat
    restarted = s.ops.heartbeat(_cfg_beat(0, sid="sid-2"), s.beats).then(ingest())
    (after,) = s.run(s.ops.heartbeat_batch([restarted]))
    assert isinstance(after, Followed) and after.first.restarted
    assert after.then is not None and after.then.config == config
    # out of place: first, or another node's after a heartbeat
    call = s.ops.heartbeat_batch([s.ops.heartbeat(_cfg_beat(0), s.beats).then(ingest())])
    assert isinstance(call.argv, HeartbeatBatchArgv)
    items = call.argv.heartbeats
    head, tail = items[:-7], items[-7:]  # (the ingest: kind, 5, its ARGV)
    assert tail[:3] == ["ingest", "5", "ingest"], tail
    before = snapshot_keys(s.client)
    for count, heartbeats in (
        ("1", tail),
        ("2", [*head, *tail[:3], "c9", *tail[4:]]),
        ("2", [*head, *tail[:2], "store", *tail[3:]]),
        ("3", [*head, *tail, *tail]),
    ):
        with pytest.raises(InvalidArgument, match="must follow a heartbeat of its node"):
            s.run(call.with_argv(replace(call.argv, count=count, heartbeats=heartbeats)))
    assert snapshot_keys(s.client) == before


@pytest.mark.real_only
def test_heartbeats_with_long_rosters_go_a_few_at_a_time() -> None:
    """A batch holds Redis for all of its calls' work: heartbeats in full with
    long rosters (every node's, after Redis lost its data) go in batches of
    at most MAX_ARGS arguments, a longer one alone."""
    with RedisServer() as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="long", policy=Policy())
            try:
                beats = [
                    hb(f"n{i}", roster=[f"n{i}-s{k}" for k in range(1000)], sandbox_count=1000)
                    for i in range(12)
                ]
                beats.append(
                    hb("big", roster=[f"big-{k}" for k in range(4090)], sandbox_count=4090)
                )
                got = await asyncio.gather(*(a.heartbeat(b) for b in beats))
                assert [r.generation for r in got] == [1] * 13
                per_call = a.ops.heartbeat(beats[0], None)
                assert 3 * len(per_call.args) <= a.beat_coalescer.MAX_ARGS < 4 * len(per_call.args)
                assert a.beat_coalescer.batches >= 4 and a.beat_coalescer.largest == 3
                assert (await a.lookup("big-4089")).node_id == "big"
            finally:
                await a.close()

        asyncio.run(scenario())


@pytest.mark.real_only
def test_what_queues_behind_a_stalled_call_still_reaches_redis() -> None:
    """A batch in flight too long lets the next go behind it: heartbeats that
    arrive while Redis is stopped are written to it, and run when it
    resumes (the nodes' reports of that moment), as one call each would
    have been, instead of waiting in the queue past their deadlines."""
    with RedisServer() as rs:

        async def scenario() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="stall", policy=Policy())
            try:
                for node in ("n1", "n2"):
                    await a.heartbeat(hb(node))

                async def beat(node: str, cpu: int) -> Any:
                    with a.scoped(timeout=1.0):
                        return await a.heartbeat(hb(node, allocated_cpu=cpu))

                rs.pause()
                try:
                    first = asyncio.create_task(beat("n1", 1))
                    await asyncio.sleep(0.2)  # (the first is in flight, stalled)
                    got = await asyncio.gather(first, beat("n2", 2), return_exceptions=True)
                    assert all(isinstance(x, SchedulerError) for x in got), got
                finally:
                    rs.resume()
                s = Scheduler.connect(rs.url, cell="stall")
                try:
                    await asyncio.to_thread(
                        wait_until,
                        lambda: (
                            [s.client.hget(s.keys.node(n), "allocated_cpu") for n in ("n1", "n2")]
                            == [b"1", b"2"]
                        ),
                        5,
                        "both stalled heartbeats run on resume",
                    )
                finally:
                    s.close()
            finally:
                await a.close()

        asyncio.run(scenario())
