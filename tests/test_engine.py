"""The core engine on both backends: state model, scripts, selection, errors."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import redis

from scheduler import (
    AsyncScheduler,
    DefaultRequest,
    Heartbeat,
    InvalidArgument,
    Limits,
    MachineInfo,
    NodeSnapshot,
    NoNodesAvailable,
    NotFound,
    Overcommit,
    Policy,
    PolicyConflict,
    Request,
    Scheduler,
    StoreUnavailable,
    UnknownNode,
)
from scheduler.domain.records import DiskMetric, SandboxEvent
from scheduler.store.calls import Resync
from scheduler.store.contracts import ROSTER_DELTA, ROSTER_SAME, HeartbeatArgv, SteadyArgv
from scheduler.store.keys import CellKeys, validate_id
from scheduler.store.scripts import _files as script_files
from scheduler.store.scripts import library, sources
from scheduler.testing.redis_server import free_port
from tests.helpers import GIB, fleet, hb, heartbeat_argv, roster_form, rr_value, snapshot_keys

Make = Callable[..., Scheduler]


# -- key layout and ids -----------------------------------------------------


@pytest.mark.parametrize(
    "bad", ["", "   ", "a" * 257, "a{b}", "a:b", "a\nb", "a b", "x\x00", "caf\u00e9"]
)
def test_bad_ids_are_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        validate_id("sandbox_id", bad)
    assert e.value.field == "sandbox_id"
    assert str(e.value).startswith("sandbox_id ")


def test_ids_are_trimmed_and_keys_share_the_cell_hash_tag() -> None:
    assert validate_id("node_id", "  n-1.a_b@c/d  ") == "n-1.a_b@c/d"
    k = CellKeys("blue", "sched")
    keys = [
        k.policy,
        k.nodes,
        k.node("n1"),
        k.res("r1"),
        k.bind("s1"),
        k.node_res("n1"),
        k.node_sbx("n1"),
        k.rr,
        k.expiry,
        k.stats,
    ]
    assert all(key.startswith("sched:{blue}:") for key in keys)
    assert len(set(keys)) == len(keys)
    with pytest.raises(InvalidArgument):
        CellKeys("a}b")


def test_every_script_has_a_contract_header_and_declared_key_count() -> None:
    _, files = script_files()
    assert set(files) == set(sources()) == set(library().functions)
    for name, (nkeys, text) in files.items():
        assert text.lstrip().startswith("--[["), name
        assert "KEYS[1..5]" in text, name
        assert nkeys >= 5, name
    for name, (_, text) in sources().items():
        assert "\n-- @include" not in text, f"{name}: include not inlined"
    assert "\n-- @include" not in library().text


# -- heartbeat --------------------------------------------------------------


def test_heartbeat_stores_every_snapshot_field_with_redis_time(make_scheduler: Make) -> None:
    s = make_scheduler()
    snap = NodeSnapshot(
        status="READY",
        allocated_cpu=3,
        allocated_memory_bytes=5 * GIB,
        cpu_percent=41,
        cpu_count=32,
        memory_used_bytes=7 * GIB,
        memory_total_bytes=128 * GIB,
        disks=[DiskMetric(mount_point="/", used_bytes=1, total_bytes=2)],
        sandbox_count=4,
        sandbox_starting_count=1,
        create_successes=9,
        create_fails=2,
        reported_at_unix_ms=0,
        paused_sandbox_count=2,
        paused_allocated_cpu=1,
        paused_allocated_memory_bytes=GIB,
    )
    r = s.heartbeat(
        Heartbeat(
            node_id="n1",
            service_instance_id="boot-1",
            cluster_id="c1",
            version="1.2",
            commit="abc",
            endpoint="10.0.0.1:5000",
            machine_info=MachineInfo(cpu_family="6", cpu_config_json="{}"),
            snapshot=snap,
            sandbox_ids=["s1", " s2 ", "", "s1"],
            p2p_backend="bt",
            p2p_address="10.0.0.1:7000",
        )
    )
    assert (r.generation, r.restarted, r.roster_mode) == (1, False, True)
    rec = {k.decode(): v.decode() for k, v in s.client.hgetall(s.keys.node("n1")).items()}
    for name in (
        "allocated_cpu",
        "allocated_memory_bytes",
        "cpu_percent",
        "cpu_count",
        "memory_used_bytes",
        "memory_total_bytes",
        "sandbox_count",
        "sandbox_starting_count",
        "create_successes",
        "create_fails",
        "paused_sandbox_count",
        "paused_allocated_cpu",
        "paused_allocated_memory_bytes",
    ):
        assert rec[name] == str(getattr(snap, name)), name
    assert rec["status"] == "READY" and rec["cluster_id"] == "c1" and rec["version"] == "1.2"
    assert rec["reported_at_unix_ms"] == rec["last_seen_ms"] == str(r.now_ms)
    assert rec["roster_size"] == "2" and rec["generation"] == "1"
    assert rec["disks"].startswith("[{") and rec["cpu_config_json"] == "{}"
    assert rec["p2p_address"] == "10.0.0.1:7000" and rec["endpoint"] == "10.0.0.1:5000"
    # an empty cpu_config_json keeps the previous one; a new instance id is a restart
    r2 = s.heartbeat(
        Heartbeat(
            node_id="n1",
            service_instance_id="boot-2",
            snapshot=NodeSnapshot(cpu_count=32, reported_at_unix_ms=123),
        )
    )
    assert (r2.generation, r2.restarted) == (2, True)
    rec = {k.decode(): v.decode() for k, v in s.client.hgetall(s.keys.node("n1")).items()}
    assert rec["cpu_config_json"] == "{}" and rec["restarts"] == "1"
    assert rec["reported_at_unix_ms"] == "123"
    assert rec["service_instance_id"] == "boot-2" and rec["node_id"] == "n1"
    # the new instance is the record's now: its next heartbeat is no restart
    r3 = s.heartbeat(
        Heartbeat(
            node_id="n1",
            service_instance_id="boot-2",
            snapshot=NodeSnapshot(cpu_count=32, reported_at_unix_ms=124),
        )
    )
    assert (r3.generation, r3.restarted) == (3, False)
    assert s.client.hmget(s.keys.node("n1"), "restarts", "incarnation") == [
        b"1",
        rec["incarnation"].encode(),
    ]


def test_static_node_list_refuses_unknown_heartbeats(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(static_nodes=True))
    s.sync_nodes([("n1", "10.0.0.1:5000")])
    s.heartbeat(hb("n1"))
    with pytest.raises(UnknownNode, match="node is not in scheduler node list"):
        s.heartbeat(hb("intruder"))
    assert s.client.exists(s.keys.node("intruder")) == 0
    # the static endpoint wins over whatever a heartbeat says
    s.heartbeat(hb("n1", endpoint="elsewhere:1"))
    assert s.nodes()[0].endpoint == "10.0.0.1:5000"


def test_bad_heartbeat_writes_nothing(make_scheduler: Make) -> None:
    s = make_scheduler()
    before = sorted(s.client.keys("*"))
    for bad, field in [
        (hb("n:1"), "node_id"),
        (hb("n1", sid=""), "service_instance_id"),
        (hb("n1", cpu=-1), "snapshot.cpu_count"),
        (hb("n1", roster=["ok", "b{a}d"]), "sandbox_ids[1]"),
        (hb("n1", sandbox_count=1 << 40), "snapshot.sandbox_count"),
    ]:
        with pytest.raises(InvalidArgument) as e:
            s.heartbeat(bad)
        assert e.value.field == field
    assert sorted(s.client.keys("*")) == before


# -- selection --------------------------------------------------------------


def test_least_loaded_places_by_projected_pressure(make_scheduler: Make) -> None:
    s = make_scheduler()
    s.heartbeat(hb("small", cpu=8, mem_gib=32))
    s.heartbeat(hb("big", cpu=64, mem_gib=256, allocated_cpu=16))
    p = s.schedule(Request.cold(4, 1024))
    # small: (0+4)/8 = 0.5; big: (16+4)/64 = 0.3125
    assert (p.node_id, p.pressure) == ("big", 20 / 64)
    assert p.reservation_id and p.cpu == 4 and p.memory_bytes == GIB
    res = s.reservation(p.reservation_id)
    assert (res.node_id, res.state, res.cpu, res.memory_bytes) == ("big", "pending", 4, GIB)
    # unassigned: it ends unassigned_reservation_ttl after its Schedule
    assert res.expires_ms - res.created_ms == 90_000
    s.assign("sb", "big", "big.local:5000", p.reservation_id)
    res = s.reservation(p.reservation_id)  # assigned: placement_reservation_ttl
    assert res.state == "assigned" and res.expires_ms - res.created_ms == 600_000


def test_ceiling_compares_after_the_placement(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=3)))
    s.heartbeat(hb("n1", sandbox_count=2))
    s.schedule(Request.cold(1, 1))  # 2 running + 0 pending + 1 <= 3
    with pytest.raises(NoNodesAvailable) as e:
        s.schedule(Request.cold(1, 1))  # 2 + 1 + 1 > 3
    assert str(e.value) == ("no nodes available: 0/1 nodes available: 1 at max_sandbox_count (3)")


def test_refusal_counts_every_reason(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=2), report_ttl_ms=1000))
    s.heartbeat(hb("full1", sandbox_count=2))
    s.heartbeat(hb("full2", sandbox_count=2))
    s.heartbeat(hb("tiny", cpu=1))
    s.heartbeat(hb("gone"))
    s.heartbeat(hb("parked"))
    s.set_lingering("parked", True)
    s.advance_clock(1500)
    for n in ("full1", "full2", "tiny", "parked"):
        s.heartbeat(
            hb(n, sandbox_count=2 if n.startswith("full") else 0, cpu=1 if n == "tiny" else 16)
        )
    with pytest.raises(NoNodesAvailable) as e:
        s.schedule(Request.cold(2, 1024))
    assert str(e.value) == (
        "no nodes available: 0/5 nodes available: 2 at max_sandbox_count (2), "
        "1 insufficient cpu, 1 lingering, 1 stale heartbeat"
    )
    assert s.stats().refused_total == 1 and s.stats().pending == 0


def test_routing_reserves_nothing_and_skips_capacity(make_scheduler: Make) -> None:
    s = make_scheduler()
    s.heartbeat(hb("n1", cpu=2, allocated_cpu=2))
    p = s.schedule(Request.route())
    assert p.node_id == "n1" and p.reservation_id is None
    assert s.stats().pending == 0 and s.reservations() == []
    with pytest.raises(NoNodesAvailable, match="1 insufficient cpu"):
        s.schedule(Request.cold(1, 0))


def test_template_creation_projects_the_default_request(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(default_request=DefaultRequest(cpu=2, memory_mb=2048)))
    s.heartbeat(hb("n1"))
    p = s.schedule(Request.template())
    assert (p.cpu, p.memory_bytes) == (2, 2 * GIB)
    assert s.nodes()[0].pending_reservations == 1
    assert s.nodes()[0].cpu_reserved == 2


def test_overcommit_per_dimension(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(overcommit=Overcommit(cpu=2.0, memory=1.0)))
    s.heartbeat(hb("n1", cpu=4, mem_gib=8))
    placed = 0
    with pytest.raises(NoNodesAvailable, match="1 insufficient cpu"):
        for _ in range(5):
            s.schedule(Request.cold(2, 1024))
            placed += 1
    assert placed == 4  # 8 CPUs = 4 * 2.0


def test_never_heard_from_nodes_are_a_fallback(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(static_nodes=True))
    s.sync_nodes([("quiet", "q:1"), ("known", "k:1")])
    s.heartbeat(hb("known", cpu=2, allocated_cpu=2))
    # known is full (capacity), so the never-heard-from node takes it
    assert s.schedule(Request.cold(1, 0)).node_id == "quiet"
    s.heartbeat(hb("known", cpu=64))
    assert s.schedule(Request.cold(1, 0)).node_id == "known"


def test_round_robin_rotates_through_redis(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(strategy="round_robin"))
    fleet(s, 3)
    s.heartbeat(hb("n1", allocated_cpu=15))
    picks = [s.schedule(Request.cold(0, 0)).node_id for _ in range(6)]
    assert picks == ["n0", "n1", "n2", "n0", "n1", "n2"]
    assert rr_value(s) == 6


def test_least_loaded_rotates_among_exact_equals(make_scheduler: Make) -> None:
    s = make_scheduler()
    fleet(s, 4)
    # every placement raises its node's pressure, so 8 creations visit each node twice
    picks = Counter(s.schedule(Request.cold(2, 0)).node_id for _ in range(8))
    assert picks == {"n0": 2, "n1": 2, "n2": 2, "n3": 2}
    # routing among equals rotates too
    s2 = make_scheduler(cell="other")
    fleet(s2, 3)
    assert [s2.schedule(Request.route()).node_id for _ in range(3)] == ["n0", "n1", "n2"]


def test_random_obeys_eligibility(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(strategy="random", limits=Limits(max_sandbox_count=1)))
    fleet(s, 3)
    got = sorted(s.schedule(Request.cold(1, 0)).node_id for _ in range(3))
    assert got == ["n0", "n1", "n2"]
    with pytest.raises(NoNodesAvailable, match="3 at max_sandbox_count"):
        s.schedule(Request.cold(1, 0))


def test_unknown_strategy_is_an_error(make_scheduler: Make) -> None:
    s = make_scheduler()
    fleet(s, 1)
    with pytest.raises(InvalidArgument, match="strategy"):
        s.schedule(Request.cold(1, 1), strategy="fastest")
    with pytest.raises(InvalidArgument, match="strategy"):
        Policy(strategy="fastest").validate()


def test_explain_matches_schedule_and_writes_nothing(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=2)))
    fleet(s, 3)
    s.heartbeat(hb("n2", sandbox_count=2))
    before = snapshot_keys(s.client)
    ex = s.explain(Request.cold(2, 4096))
    assert snapshot_keys(s.client) == before
    by_id = {v.node_id: v for v in ex.verdicts}
    assert by_id["n2"].reason == "at max_sandbox_count (2)" and by_id["n2"].rank is None
    assert [by_id["n0"].rank, by_id["n1"].rank] == [1, 2]
    p = s.schedule(Request.cold(2, 4096))
    assert p.node_id == ex.chosen and p.pressure == by_id[p.node_id].pressure


def test_policy_conflict_shows_both(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(limits=Limits(max_sandbox_count=10)))
    with pytest.raises(PolicyConflict) as e:
        s.sync_policy(Policy(limits=Limits(max_sandbox_count=12)))
    assert e.value.stored["max_sandbox_count"] == "10"
    assert e.value.wanted["max_sandbox_count"] == "12"
    assert "max_sandbox_count" in str(e.value) and "--overwrite-policy" in str(e.value)
    assert s.sync_policy(Policy(limits=Limits(max_sandbox_count=10))) == "same"
    assert (
        s.sync_policy(Policy(limits=Limits(max_sandbox_count=12)), overwrite=True) == "overwritten"
    )
    stored = s.policy()
    assert stored is not None and stored.limits.max_sandbox_count == 12


def test_scripts_refuse_an_uninitialised_cell(redis_client: Any) -> None:
    from scheduler import FailedPrecondition

    s = Scheduler(redis_client, cell="empty")
    with pytest.raises(FailedPrecondition, match="policy is not initialised"):
        s.schedule(Request.cold(1, 1))


# -- scripts and transport --------------------------------------------------


def test_unreachable_redis_is_one_clear_error() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    s = Scheduler(redis.Redis.from_url(url, socket_connect_timeout=0.5), url=url)
    unreachable = r"Redis at redis://127\.0\.0\.1:\d+/0 is unreachable"
    with pytest.raises(StoreUnavailable, match=unreachable):
        s.schedule(Request.cold(1, 1))


def test_async_client_mirrors_the_sync_one(redis_client: Any, backend: str) -> None:
    sync = Scheduler(redis_client, cell="async")
    sync.sync_policy(Policy(limits=Limits(max_sandbox_count=1)))
    fleet(sync, 2)

    async def go() -> list[str]:
        if backend == "real":
            kw = redis_client.connection_pool.connection_kwargs
            client = redis.asyncio.Redis(host=kw["host"], port=kw["port"])
        else:
            import fakeredis

            client = fakeredis.FakeAsyncRedis(
                server=redis_client.connection_pool.connection_kwargs["server"]
            )
        a = AsyncScheduler(client, cell="async")
        try:
            placed = [(await a.schedule(Request.cold(1, 1))).node_id for _ in range(2)]
            with pytest.raises(NoNodesAvailable):
                await a.schedule(Request.cold(1, 1))
            assert len(await a.nodes()) == 2
            return placed
        finally:
            await a.close()

    assert sorted(asyncio.run(go())) == ["n0", "n1"]


def test_delta_heartbeats_resync_when_another_replica_wrote(redis_client: Any) -> None:
    """Each replica sends only what changed since its own last write; a
    delta based on a record another replica has since replaced writes
    nothing and goes again in full."""
    a = Scheduler(redis_client, cell="delta")
    a.sync_policy(Policy())
    b = Scheduler(redis_client, cell="delta")
    a.heartbeat(hb("n1", roster=["s1"], sandbox_count=1, allocated_cpu=2))
    before = a.client.hgetall(a.keys.node("n1"))
    # unchanged: the steady script, no fields and no roster; only the instant moves
    steady = a.ops.heartbeat(hb("n1", roster=["s1"], sandbox_count=1, allocated_cpu=2), a.beats)
    assert steady.script == "heartbeat_steady"
    assert isinstance(steady.argv, SteadyArgv) and steady.argv.base.endswith(":1")
    assert steady.argv.reported_at == "0" and len(steady.args) == 4
    a.run(steady)
    after = a.client.hgetall(a.keys.node("n1"))
    # (the instant fields stay equal when both land in the same millisecond)
    changed = {k for k in after if after[k] != before.get(k)}
    assert b"generation" in changed
    assert changed <= {b"generation", b"last_seen_ms", b"reported_at_unix_ms"}
    assert int(after[b"last_seen_ms"]) >= int(before[b"last_seen_ms"])
    # one field changed: a delta with just that field, no roster
    delta = a.ops.heartbeat(hb("n1", roster=["s1"], sandbox_count=1, allocated_cpu=3), a.beats)
    assert delta.script == "heartbeat" and isinstance(delta.argv, HeartbeatArgv)
    assert delta.argv.base.endswith(":2") and delta.argv.roster_form == ROSTER_SAME
    assert sorted(delta.argv.fields[::2]) == [
        "allocated_cpu",
        "reported_at_unix_ms",
    ]
    a.run(delta)
    assert a.nodes()[0].cpu_allocated == 3
    # b writes in between: a's next delta is refused and resent in full
    b.heartbeat(hb("n1", roster=["s1", "s2"], sandbox_count=2, allocated_cpu=4))
    stale = a.ops.heartbeat(hb("n1", roster=["s1"], sandbox_count=1, allocated_cpu=2), a.beats)
    with pytest.raises(Resync):
        a.run(stale)
    assert a.client.hget(a.keys.node("n1"), "sandbox_count") == b"2"  # nothing written
    r = a.heartbeat(hb("n1", roster=["s1"], sandbox_count=1, allocated_cpu=2))
    assert r.generation == 5
    view = a.nodes()[0]
    assert (view.sandbox_count, view.cpu_allocated) == (1, 2)
    with pytest.raises(NotFound):
        a.lookup("s2")
    assert a.lookup("s1").node_id == "n1"


def _roster_state(s: Scheduler, node_id: str) -> tuple[Any, ...]:
    """What a roster leaves in Redis: the node's roster set and size, its
    bindings, and the binding of every sandbox it ever listed."""
    record = s.client.hgetall(s.keys.node(node_id))
    binds = {}
    for key in s.client.scan_iter(match=s.keys.base + "bind:*"):
        b = s.client.hgetall(key)
        binds[key.decode().rsplit(":", 1)[1]] = (
            b.get(b"node_id"),
            b.get(b"listed"),
            b.get(b"reservation_id"),
        )
    return (
        sorted(s.client.smembers(s.keys.node_roster(node_id))),
        sorted(s.client.smembers(s.keys.node_sbx(node_id))),
        record[b"roster_size"],
        record[b"roster_mode"],
        record[b"roster_digest"],
        binds,
    )


def test_a_changed_roster_goes_as_what_joined_and_left(redis_client: Any) -> None:
    """A delta heartbeat sends a changed roster as the sandboxes that joined
    and left since its base, and leaves Redis exactly as the whole roster
    sent in full does."""
    a = Scheduler(redis_client, cell="rdelta")
    full = Scheduler(redis_client, cell="rfull")
    rosters = [
        ["s1", "s2", "s3"],
        ["s2", "s3", "s4", "s5"],
        ["s5", "s2"],
        [],
        ["s6"],
        ["s6", "s1", "s2"],
    ]
    for s in (a, full):
        s.sync_policy(Policy())
        s.heartbeat(hb("n1", roster=rosters[0], sandbox_count=3))
    for i, roster in enumerate(rosters[1:]):
        call = a.ops.heartbeat(hb("n1", roster=roster, sandbox_count=len(roster)), a.beats)
        joined = [sb for sb in roster if sb not in rosters[i]]
        left = sorted(set(rosters[i]) - set(roster))
        assert roster_form(call) == ROSTER_DELTA
        assert call.args[-len(joined) - len(left) - 1 :] == [str(len(joined)), *joined, *left]
        a.run(call)
        full.beats.clear()  # always sent whole
        full.heartbeat(hb("n1", roster=roster, sandbox_count=len(roster)))
        assert _roster_state(a, "n1") == _roster_state(full, "n1")
    assert a.lookup("s6").node_id == "n1"
    with pytest.raises(NotFound):
        a.lookup("s3")


def test_a_roster_listed_again_is_checked_as_one_listed_anew(redis_client: Any) -> None:
    """A heartbeat that lists the roster this replica last wrote, in the same
    order, takes it as it was (no id checked again); any other listing, a
    reordering, a blank, a repeat or a bad id, is checked as any roster is."""
    a = Scheduler(redis_client, cell="ids")
    a.sync_policy(Policy())
    a.heartbeat(hb("n1", roster=["s1", "s2"], sandbox_count=2))
    same = a.ops.heartbeat(hb("n1", roster=["s1", "s2"], sandbox_count=2), a.beats)
    assert same.script == "heartbeat_steady"
    a.run(same)
    assert a.beats["n1"].ids == ("s1", "s2")
    for listed in (["s2", "s1"], ["s1", " ", "s2", "s1"], [" s1", "s2"]):
        call = a.ops.heartbeat(hb("n1", roster=listed, sandbox_count=2), a.beats)
        assert call.script == "heartbeat_steady", listed  # the same roster
        a.run(call)
    with pytest.raises(InvalidArgument, match=r"sandbox_ids\[2\]"):
        a.ops.heartbeat(hb("n1", roster=["s1", "s2", "s 3"], sandbox_count=3), a.beats)
    grown = a.ops.heartbeat(hb("n1", roster=["s1", "s2", "s3"], sandbox_count=3), a.beats)
    assert grown.script == "heartbeat" and roster_form(grown) == ROSTER_DELTA
    a.run(grown)
    assert a.beats["n1"].ids == ("s1", "s2", "s3")
    assert a.lookup("s3").node_id == "n1"


def test_a_roster_delta_resyncs_when_its_roster_lost_a_sandbox(redis_client: Any) -> None:
    """Only heartbeats add to a node's roster, but a sandbox another node now
    lists leaves it: the delta, built on the roster as it was, is refused
    (nothing written) and the whole roster goes, which takes the sandbox
    back, as a changed roster sent in full always has."""
    a = Scheduler(redis_client, cell="rmoved")
    a.sync_policy(Policy())
    a.heartbeat(hb("n1", roster=["s1", "s2"], sandbox_count=2))
    a.heartbeat(hb("n2", roster=["s2"], sandbox_count=1))
    assert a.lookup("s2").node_id == "n2"
    assert a.client.smembers(a.keys.node_roster("n1")) == {b"s1"}
    call = a.ops.heartbeat(hb("n1", roster=["s1", "s2", "s3"], sandbox_count=3), a.beats)
    assert roster_form(call) == ROSTER_DELTA
    before = a.client.hgetall(a.keys.node("n1"))
    with pytest.raises(Resync):
        a.run(call)
    assert a.client.hgetall(a.keys.node("n1")) == before
    r = a.heartbeat(hb("n1", roster=["s1", "s2", "s3"], sandbox_count=3))
    assert r.generation == 2
    assert a.lookup("s2").node_id == a.lookup("s3").node_id == "n1"
    assert a.client.smembers(a.keys.node_roster("n1")) == {b"s1", b"s2", b"s3"}
    assert a.client.hget(a.keys.node("n1"), "roster_size") == b"3"


def test_a_roster_delta_is_held_to_the_stored_limit(make_scheduler: Make) -> None:
    """The script checks the roster a delta makes against the stored
    max_roster_ids, before its first write (here from a client that has not
    read the policy, so only the default bound was checked before Redis)."""
    a = make_scheduler(Policy(max_roster_ids=4))
    a.heartbeat(hb("n1", roster=["s1", "s2", "s3"]))
    b = Scheduler(a.client, cell="test")
    b.beats.update(a.beats)
    call = b.ops.heartbeat(hb("n1", roster=["s1", "s2", "s3", "s4", "s5"]), b.beats)
    assert roster_form(call) == ROSTER_DELTA
    before = a.client.hgetall(a.keys.node("n1"))
    with pytest.raises(InvalidArgument) as e:
        a.run(call)
    assert e.value.field == "sandbox_ids"
    assert "5 entries, more than max_roster_ids (4)" in e.value.message
    assert a.client.hgetall(a.keys.node("n1")) == before
    with pytest.raises(InvalidArgument, match="a roster delta needs the record it is based on"):
        a.run(call.with_argv(msgspec.structs.replace(heartbeat_argv(call), base="")))


def test_a_delta_never_applies_to_a_record_made_again(redis_client: Any) -> None:
    """Unregistered and registered again through another replica, a node's
    record restarts at generation 1: a delta based on the old record's
    generation 1 must still be refused.  (The replica that unregisters a node
    drops its memory of it; another replica keeps its own.)"""
    a = Scheduler(redis_client, cell="again")
    a.sync_policy(Policy())
    b = Scheduler(redis_client, cell="again")
    a.heartbeat(hb("n1", allocated_cpu=2, sandbox_count=1))
    b.heartbeat(hb("n1", allocated_cpu=2, sandbox_count=1))
    b.unregister("n1", "boot-1")
    assert "n1" not in b.beats and "n1" in a.beats
    b.heartbeat(hb("n1", allocated_cpu=6, sandbox_count=3))  # generation 1 again
    stale = a.ops.heartbeat(hb("n1", allocated_cpu=2, sandbox_count=1), a.beats)
    # a steady heartbeat, against a's memory of the old record
    assert isinstance(stale.argv, SteadyArgv) and stale.argv.base.endswith(":1")
    with pytest.raises(Resync):
        a.run(stale)
    a.heartbeat(hb("n1", allocated_cpu=2, sandbox_count=1))
    view = a.nodes()[0]
    assert (view.cpu_allocated, view.sandbox_count) == (2, 1)


@pytest.mark.real_only
def test_connects_by_unix_socket(backend: str) -> None:
    from scheduler.testing.redis_server import RedisServer

    with RedisServer(unix_socket=True) as server:
        url = f"unix://{server.socket}"
        s = Scheduler.connect(url, cell="unix", policy=Policy())
        try:
            s.heartbeat(hb("n1"))
            assert s.schedule(Request.cold(1, 1)).node_id == "n1"
            assert s.target == url
        finally:
            s.close()
    with pytest.raises(InvalidArgument, match="redis_addr"):
        Scheduler.connect("http://example.invalid:6379")


def test_a_roster_delta_resyncs_after_an_event_or_another_roster_took_a_sandbox(
    redis_client: Any,
) -> None:
    """Two more ways a sandbox leaves a node's roster besides its heartbeat:
    the node reports it deleted (an event), or another node's roster lists
    it (an assignment to another node no longer takes a listed sandbox:
    docs/design.md, the moves row).  Each clears the record's roster digest,
    so the node's next delta, built on the roster as it was, writes nothing
    and goes in full."""
    a = Scheduler(redis_client, cell="runlisted")
    a.sync_policy(Policy())
    a.heartbeat(hb("n1", roster=["s1", "s2", "s3"], sandbox_count=3))
    a.heartbeat(hb("n2"))
    a.events("n1", [SandboxEvent(sandbox_id="s2", event_type="DELETE")])
    a.assign("s3", "n2", "n2.local:5000")  # (n1 lists it: the binding stays)
    assert a.client.smembers(a.keys.node_roster("n1")) == {b"s1", b"s3"}
    a.heartbeat(hb("n2", roster=["s3"], sandbox_count=1))
    assert a.client.smembers(a.keys.node_roster("n1")) == {b"s1"}
    assert a.client.hget(a.keys.node("n1"), "roster_digest") == b""
    # the node still lists both (the event and the assignment raced it)
    call = a.ops.heartbeat(hb("n1", roster=["s1", "s2", "s3", "s4"], sandbox_count=4), a.beats)
    assert roster_form(call) == ROSTER_DELTA
    before = snapshot_keys(a.client)
    with pytest.raises(Resync):
        a.run(call)
    assert snapshot_keys(a.client) == before
    r = a.heartbeat(hb("n1", roster=["s1", "s2", "s3", "s4"], sandbox_count=4))
    assert r.generation == 2
    # sent in full, the roster is what the node lists: s3 back on n1, as a
    # whole roster has always taken it; s2 stays buried (deleted on n1)
    assert a.lookup("s3").node_id == "n1"
    assert a.client.smembers(a.keys.node_roster("n1")) == {b"s1", b"s2", b"s3", b"s4"}
    assert a.client.hget(a.keys.node("n1"), "roster_size") == b"4"
