"""A cluster's CPU config round as members join, change and leave: the
round's result is always the intersection of its members' configs (a
property, against cpuconfig.intersect on every step), and a member joining
with a config another member has keeps the round's result instead of
computing it again over the whole cluster (issue #31: a cluster's start,
members joining one after another, cost each join O(cluster): 8.3 ms of
Redis a call at 10,000 members)."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable

import msgspec
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.versus import library_at
from scheduler import Heartbeat, NodeSnapshot, Policy, Scheduler
from scheduler.domain.records import MachineInfo
from scheduler.ops.doctor import doctor
from scheduler.store.cpuconfig import CpuConfigOps, digest, intersect
from scheduler.store.scripts import FUNCTION
from tests.test_deploy_upgrade import fcall, older_revision
from tests.test_scale import commands


def config(caps: list[str], ecx: str, msr: str, leaves: tuple[str, ...] = ("0x1",)) -> str:
    return msgspec.json.encode(
        {
            "kvm_capabilities": caps,
            "cpuid_modifiers": [
                {
                    "leaf": leaf,
                    "subleaf": "0x0",
                    "flags": 0,
                    "modifiers": [
                        {"register": "ecx", "bitmap": ecx},
                        {"register": "edx", "bitmap": "0b1"},
                    ],
                }
                for leaf in leaves
            ],
            "msr_modifiers": [{"addr": "0x10", "bitmap": msr}],
        }
    ).decode()


#: configs whose intersections differ in every part (kvm sets, CPUID leaves
#: and register bits, a leaf always dropped, MSR bits), one that is invalid
CONFIGS = [
    config(["a", "b", "c"], "0b1111", "0b11", ("0x1", "0x7", "0xb")),
    config(["a", "b"], "1100", "0b10", ("0x1", "0x7")),
    config(["b", "c"], "0b0110", "0b11"),
    config(["a", "c"], "0b1111", "0b01", ("0x1", "0x7")),
    config(["a", "b", "c"], "0b1111", "0b11", ("0x1", "0x7", "0xb")),
    "{not json",
]


@given(st.lists(st.sampled_from(CONFIGS), min_size=1, max_size=6), st.sampled_from(CONFIGS))
def test_a_result_narrowed_by_one_config_is_the_intersection_of_all(
    some: list[str], one: str
) -> None:
    """What a new config's round computes from (the result so far, as a
    config of its own, and the new one) gives what all the configs give."""
    so_far = intersect(some)
    assert intersect([so_far if so_far is not None else "", one]) == intersect([*some, one])


def beat(node: str, config: str, boot: str = "boot-1", cluster: str = "c1") -> Heartbeat:
    return Heartbeat(
        node_id=node,
        service_instance_id=boot,
        cluster_id=cluster,
        endpoint=f"{node}.local:5000",
        machine_info=MachineInfo(cpu_config_json=config),
        snapshot=NodeSnapshot(cpu_count=16, memory_total_bytes=64 << 30),
    )


def round_result(s: Scheduler, cluster: str = "c1") -> str | None:
    """The round's current result ("" = invalid), or None while it has none."""
    r = s.client.hgetall(s.keys.cpucfg(cluster))
    epoch = r.get(b"epoch", b"0")
    if r.get(b"result_epoch") != epoch:
        return None
    return r.get(b"result", b"").decode()


# (join: a node's first heartbeat with a config; change: a restart that sends
# another; leave: unregistered; move: a heartbeat from another cluster, sent
# without the CPU config step)
steps = st.lists(
    st.tuples(
        st.sampled_from(["beat", "beat", "beat", "leave", "move"]),
        st.integers(0, 4),
        st.integers(0, len(CONFIGS) - 1),
    ),
    min_size=1,
    max_size=16,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=steps)
def test_the_round_result_is_the_intersection_of_its_members(
    make_scheduler: Callable[..., Scheduler], steps: list[tuple[str, int, int]]
) -> None:
    s = make_scheduler(Policy())
    s.client.delete(s.keys.cpucfg("c1"))
    held: dict[str, str] = {}  # member -> its config, as the cluster holds them
    left: set[str] = set()  # configs of members that left since the last round
    boots: dict[str, int] = {}
    served: set[str] = set()  # members given this round's result
    for kind, i, k in steps:
        node = f"n{i}"
        if kind in ("leave", "move"):
            if node in held:
                if kind == "leave":
                    s.unregister(node, f"boot-{boots[node]}")
                else:
                    s.heartbeat(beat(node, held[node], f"boot-{boots[node]}", cluster="c2"))
                left.add(held.pop(node))
                assert counts(s) == Counter(digest(cfg) for cfg in held.values())
            continue
        if node in held and held[node] != CONFIGS[k]:
            boots[node] += 1  # (a runtime sends another config after a restart)
        boots.setdefault(node, 1)
        joined = node not in held or held[node] != CONFIGS[k]
        result = s.heartbeat(beat(node, CONFIGS[k], f"boot-{boots[node]}"), cpu_config=True)
        held[node] = CONFIGS[k]
        if joined:
            left = set()  # (a new round: computed over the members, or kept)
            served = set()
        got = round_result(s)
        # every member has a config: the round has its result, and each
        # member gets it once a round, with its first heartbeat in it
        # (an invalid config makes the result "": nothing is delivered)
        exact = intersect(sorted(set(held.values()))) or ""
        assert got is not None
        assert result.cpu_config_json == ("" if node in served else got)
        served.add(node)
        # a member that left starts no new round: the result may still
        # hold its config too (narrower: safe), never less
        assert got in {exact, intersect(sorted(set(held.values()) | left)) or ""}
        # and the counts the next computation reads are the members' own
        assert counts(s) == Counter(digest(cfg) for cfg in held.values())


def counts(s: Scheduler, cluster: str = "c1") -> dict[str, int] | None:
    """The round's counts of members by config digest, or None while they are
    not exact (an older version's step came between, or a config of unknown
    digest): the next computation then goes over every member."""
    r = s.client.hmget(s.keys.cpucfg(cluster), "epoch", "counted")
    kept_key = s.keys.base + "cpucfg-configs:" + cluster
    if r[0] is None:  # (no round, nothing kept for one)
        assert not s.client.exists(kept_key)
        return {}
    if r[1] is None or r[1] != (r[0] or b"0"):
        return None
    kept = s.client.hgetall(kept_key)
    held = {k.decode()[2:]: int(v) for k, v in kept.items() if k.startswith(b"n:")}
    configs = {k.decode()[2:]: v.decode() for k, v in kept.items() if k.startswith(b"c:")}
    assert set(configs) == set(held)  # (a config kept while any member has it)
    assert all(digest(cfg) == d for d, cfg in configs.items())
    return held


def test_a_join_with_a_counted_config_keeps_the_result_and_others_compute(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    wide, narrow = CONFIGS[0], CONFIGS[1]
    s.heartbeat(beat("n1", wide), cpu_config=True)
    s.heartbeat(beat("n2", wide), cpu_config=True)
    assert round_result(s) == intersect([wide])
    assert counts(s) == {digest(wide): 2}
    # a narrower config joins: computed, and the result narrows
    s.heartbeat(beat("n3", narrow), cpu_config=True)
    assert round_result(s) == intersect([wide, narrow])
    assert counts(s) == {digest(wide): 2, digest(narrow): 1}
    # n3 restarts with the wide config: nobody has `narrow` now, and n4
    # joining with it makes the round compute again
    s.heartbeat(beat("n3", wide, "boot-2"), cpu_config=True)
    assert round_result(s) == intersect([wide])
    assert counts(s) == {digest(wide): 3}
    key = s.keys.cpucfg("c1")
    lease = s.client.hget(key, "compute_epoch")
    s.heartbeat(beat("n4", narrow), cpu_config=True)
    assert s.client.hget(key, "compute_epoch") != lease
    assert round_result(s) == intersect([wide, narrow])
    # n5 joins with `narrow`, which n4 has: the result is kept, not computed
    lease = s.client.hget(key, "compute_epoch")
    s.heartbeat(beat("n5", narrow), cpu_config=True)
    assert s.client.hget(key, "compute_epoch") == lease
    assert round_result(s) == intersect([wide, narrow])
    for node in ("n4", "n5"):
        s.unregister(node, "boot-1")
    assert counts(s) == {digest(wide): 3}  # (and the config itself went)


def test_a_member_leaving_narrows_only_when_its_config_may_be_gone(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    wide, narrow = CONFIGS[0], CONFIGS[1]
    for node in ("n1", "n2", "n3"):
        s.heartbeat(beat(node, wide), cpu_config=True)
    s.heartbeat(beat("n4", narrow), cpu_config=True)
    key = s.keys.cpucfg("c1")
    # n1 leaves; n2 and n3 still have `wide`: the result is exact
    s.unregister("n1", "boot-1")
    assert s.client.hget(key, "narrow") is None
    # so n5 joining with `wide` keeps the result: no computation handed out
    lease = s.client.hget(key, "compute_epoch")
    s.heartbeat(beat("n5", wide), cpu_config=True)
    assert s.client.hget(key, "compute_epoch") == lease
    assert round_result(s) == intersect([wide, narrow])
    # n4, the only member with `narrow`, leaves: its config may be gone
    s.unregister("n4", "boot-1")
    assert s.client.hget(key, "narrow") == b"1"
    # and the next join computes: the result widens to the members' own
    s.heartbeat(beat("n6", wide), cpu_config=True)
    assert s.client.hget(key, "compute_epoch") != lease
    assert round_result(s) == intersect([wide])
    assert s.client.hget(key, "narrow") is None


def test_a_new_config_narrows_the_result_from_two_configs(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    """A new member whose config nobody has: the round is computed from its
    result so far and that config, not from every member's."""
    s = make_scheduler(Policy())
    wide, narrow = CONFIGS[0], CONFIGS[1]
    for node in ("n1", "n2", "n3"):
        s.heartbeat(beat(node, wide), cpu_config=True)
    s.heartbeat(beat("n4", narrow))  # (its record, then its CPU config step)
    out = s.run(CpuConfigOps(s.keys).ingest("n4", "c1", narrow, False))
    assert out.needs_compute
    assert [c for _, c in out.configs] == [intersect([wide]), narrow]
    # the next heartbeats compute it and store it, as a replica does
    s.heartbeat(beat("n5", narrow), cpu_config=True)
    assert round_result(s) == intersect([wide, narrow])


@pytest.mark.real_only
def test_members_joining_with_one_config_cost_the_same_at_any_size(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    """Members join one at a time, each with the cluster's one config (a
    cluster's start): the last hundred joins of 3,000 make the same Redis
    commands as the first hundred (on the tree before: each join computed the
    round over every member, about 2 x members commands)."""
    s = make_scheduler(Policy())

    counts = []
    for start in (0, 2_900):
        if start:
            for i in range(100, start, 50):  # (the members between, 50 a batch)
                batch = [beat(f"m{j:05d}", CONFIGS[0], cluster="big") for j in range(i, i + 50)]
                for hb in batch:
                    s.heartbeat(hb, cpu_config=True)
        before = commands(s.client)
        for j in range(start, start + 100):
            result = s.heartbeat(beat(f"m{j:05d}", CONFIGS[0], cluster="big"), cpu_config=True)
            assert result.cpu_config_json == intersect([CONFIGS[0]])
        counts.append(commands(s.client) - before)
    first, last = counts
    assert last <= 1.2 * first, counts


@pytest.mark.real_only
def test_members_replaced_one_by_one_cost_the_same_at_any_size(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    """A node leaves and another joins in its place, with the cluster's one
    config (a fleet's churn): 50 such replacements in a cluster of 3,000 make
    the same Redis commands as 50 in a cluster of 100 (on the tree before,
    each join after a leave computed the round over every member)."""
    s = make_scheduler(Policy())

    joined = 0

    def add(n: int) -> None:
        nonlocal joined
        for j in range(joined, joined + n):
            s.heartbeat(beat(f"m{j:05d}", CONFIGS[0], cluster="big"), cpu_config=True)
        joined += n

    counts = []
    gone = 0
    for size in (100, 3_000):
        add(size - (joined - gone))
        before = commands(s.client)
        for _ in range(50):  # (the oldest member out, a new one in)
            s.unregister(f"m{gone:05d}", "boot-1")
            gone += 1
            add(1)
        counts.append(commands(s.client) - before)
        assert s.client.hget(s.keys.cpucfg("big"), "narrow") is None
        assert round_result(s, "big") == intersect([CONFIGS[0]])
    small, large = counts
    assert large <= 1.2 * small, counts


@pytest.mark.real_only
def test_configs_changing_and_arriving_cost_the_same_at_any_size(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    """A member's config changing (which may widen the intersection) and a
    missing config arriving make the round compute again: in a cluster of
    3,000 that costs the same Redis commands as in one of 100, as the
    computation reads the cluster's distinct configs, counted, not its
    members (on the tree before, it checked every member's record: 10,005
    HMGETs at 10,000 members, 52-61 ms of Redis)."""
    s = make_scheduler(Policy())
    wide, narrow = CONFIGS[0], CONFIGS[1]
    joined = 0
    counts_by_size = []
    for size in (100, 3_000):
        for j in range(joined, size):
            s.heartbeat(beat(f"m{j:05d}", wide, cluster="big"), cpu_config=True)
        joined = size
        before = commands(s.client)
        for j in range(10):
            member = f"m{size - 1 - j:05d}"
            # a restart with another config, then back: computed each time
            s.heartbeat(beat(member, narrow, "boot-2", cluster="big"), cpu_config=True)
            assert round_result(s, "big") == intersect([wide, narrow])
            s.heartbeat(beat(member, wide, "boot-3", cluster="big"), cpu_config=True)
            assert round_result(s, "big") == intersect([wide])
            # a node that joins without a config, then restarts with one
            late = f"late-{size}-{j}"
            s.heartbeat(beat(late, "", cluster="big"), cpu_config=True)
            assert round_result(s, "big") is None  # (the round waits for it)
            s.heartbeat(beat(late, narrow, "boot-2", cluster="big"), cpu_config=True)
            assert round_result(s, "big") == intersect([wide, narrow])
            s.unregister(late, "boot-2")
        counts_by_size.append(commands(s.client) - before)
    small, large = counts_by_size
    assert large <= 1.2 * small, counts_by_size
    assert counts(s, "big") == {digest(wide): 3_000}


@pytest.mark.real_only
def test_a_round_an_older_version_shares_is_never_wider(real_url: str) -> None:
    """A rolling upgrade: the library of the last revision before rounds
    counted their configs (tests/test_deploy_upgrade.py) joins and removes
    members of a round this tree counts.  Its joins move the epoch without
    counting, so this tree's next computation goes over every member and
    counts them again; its removals leave a count too high, which keeps a
    departed config in the intersection: narrower, never wider."""
    old = library_at(older_revision(introducing="cpucfg-configs"))
    s = Scheduler.connect(real_url, cell="cpucfg-upgrade", policy=Policy())
    client = redis.Redis.from_url(real_url)
    try:
        s.heartbeat(beat("n0", CONFIGS[0]))  # (loads this tree's library)
        if s.scripts.mode != FUNCTION:
            pytest.skip("this Redis has no functions (FUNCTION / FCALL)")
        client.execute_command("FUNCTION", "LOAD", "REPLACE", old.text)
        ops = CpuConfigOps(s.keys)
        wide, narrow, third = CONFIGS[0], CONFIGS[1], CONFIGS[2]

        def old_beat(node: str, cfg: str) -> None:
            s.heartbeat(beat(node, cfg))  # (the record: the same in both versions)
            out = fcall(s, old, ops.ingest(node, "c1", cfg, False))
            if out.needs_compute:
                result = intersect([c for _, c in out.configs])
                fcall(s, old, ops.store(node, "c1", out.epoch, result))

        def new_beat(node: str, cfg: str) -> None:
            s.heartbeat(beat(node, cfg), cpu_config=True)

        new_beat("n1", wide)
        new_beat("n2", wide)
        assert counts(s) == {digest(wide): 2}
        old_beat("n3", narrow)  # the older version joins a member
        assert counts(s) is None and round_result(s) == intersect([wide, narrow])
        new_beat("n4", wide)  # (computed from the result so far and wide)
        assert round_result(s) == intersect([wide, narrow])
        s.unregister("n3", "boot-1")  # `narrow` may be gone: the next join computes
        new_beat("n5", wide)
        assert round_result(s) == intersect([wide])  # over every member: exact
        assert counts(s) == {digest(wide): 4}  # and counted again
        new_beat("n6", third)
        assert round_result(s) == intersect([wide, third])
        # the older version removes n6, the only member with `third`: its count
        # stays, and the next computation keeps that config: narrower, safe
        assert fcall(s, old, s.ops.unregister("n6", "boot-1"))
        new_beat("n7", narrow)
        got = round_result(s)
        exact = intersect([wide, narrow])
        assert got == intersect([wide, narrow, third])
        assert got is not None and exact is not None and intersect([got, exact]) == got
    finally:
        with contextlib.suppress(redis.ResponseError):  # (loaded or not)
            client.execute_command("FUNCTION", "DELETE", old.name)
        s.close()
        client.close()


@pytest.mark.real_only
def test_doctor_has_a_round_whose_counts_drifted_computed_again(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    """A count too high (an older version removed the only member with a
    config) keeps that config in the intersection; `schedctl doctor` finds it
    and its repair has the round computed again over every member."""
    s = make_scheduler(Policy())
    wide, narrow, third = CONFIGS[0], CONFIGS[1], CONFIGS[2]
    for node, cfg in (("n1", wide), ("n2", wide), ("n3", narrow)):
        s.heartbeat(beat(node, cfg), cpu_config=True)
    assert doctor(s).findings == []
    # (what an older version's removal of a member with `third` leaves)
    ckey = s.keys.base + "cpucfg-configs:c1"
    s.client.hset(ckey, mapping={f"n:{digest(third)}": 1, f"c:{digest(third)}": third})
    found = [f for f in doctor(s).findings if f.check == "cpucfg"]
    assert [f.fix for f in found] == ["compute the round again"], found
    assert "counts 1 config(s) not as its members have them" in found[0].problem
    assert doctor(s, repair=True).findings[0].repaired
    assert doctor(s).findings == []
    # the next heartbeat computes over every member: exact, and delivered
    result = s.heartbeat(beat("n1", wide), cpu_config=True)
    assert result.cpu_config_json == intersect([wide, narrow]) == round_result(s)
    assert counts(s) == {digest(wide): 2, digest(narrow): 1}
