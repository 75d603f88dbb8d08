"""A cluster's CPU config round as members join, change and leave: the
round's result is always the intersection of its members' configs (a
property, against cpuconfig.intersect on every step), and a member joining
with a config another member has keeps the round's result instead of
computing it again over the whole cluster (issue #31: a cluster's start,
members joining one after another, cost each join O(cluster): 8.3 ms of
Redis a call at 10,000 members)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import Heartbeat, NodeSnapshot, Policy, Scheduler
from scheduler.domain.records import MachineInfo
from scheduler.store.cpuconfig import CpuConfigOps, digest, intersect
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
# another; leave: unregistered)
steps = st.lists(
    st.tuples(
        st.sampled_from(["beat", "beat", "beat", "leave"]),
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
        if kind == "leave":
            if node in held:
                s.unregister(node, f"boot-{boots[node]}")
                left.add(held.pop(node))
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


def test_a_join_with_a_witnessed_config_keeps_the_result_and_others_compute(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    wide, narrow = CONFIGS[0], CONFIGS[1]
    s.heartbeat(beat("n1", wide), cpu_config=True)
    s.heartbeat(beat("n2", wide), cpu_config=True)
    assert round_result(s) == intersect([wide])
    # a narrower config joins: computed, and the result narrows
    s.heartbeat(beat("n3", narrow), cpu_config=True)
    assert round_result(s) == intersect([wide, narrow])
    key = s.keys.cpucfg("c1")
    assert s.client.hget(key, f"d:{digest(narrow)}") == b"n3"
    # the witness of `narrow` restarts with the wide config: it vouches for
    # nothing now, and n4 joining with `narrow` makes the round compute again
    s.heartbeat(beat("n3", wide, "boot-2"), cpu_config=True)
    assert round_result(s) == intersect([wide])
    assert s.client.hget(key, f"d:{digest(narrow)}") is None
    s.heartbeat(beat("n4", narrow), cpu_config=True)
    assert round_result(s) == intersect([wide, narrow])
    # a witness that left vouches for nothing either
    s.unregister("n4", "boot-1")
    assert s.client.hget(key, f"d:{digest(narrow)}") is None


def test_a_member_leaving_narrows_only_when_its_config_may_be_gone(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    wide, narrow = CONFIGS[0], CONFIGS[1]
    for node in ("n1", "n2", "n3"):
        s.heartbeat(beat(node, wide), cpu_config=True)
    s.heartbeat(beat("n4", narrow), cpu_config=True)
    key = s.keys.cpucfg("c1")
    # n1 leaves; n3, the witness of `wide`, still has it: the result is exact
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
