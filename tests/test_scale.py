"""Nothing proportional to the fleet on a periodic path or per call (issue #31):
the replica's monitor, a CPU-config round while members lack a config, and
the paged node lists.  Work is counted in Redis commands (INFO commandstats
counts the calls a script makes), never timed."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from scheduler import Heartbeat, NodeSnapshot, Policy, Request, Scheduler
from scheduler.client.aio import AsyncScheduler
from scheduler.domain.records import MachineInfo, NodeView
from scheduler.server.replica import Replica
from scheduler.store.calls import CENSUS_STEP, Call, Page
from scheduler.store.connection import async_client
from scheduler.store.cpuconfig import CpuConfigOps, digest
from scheduler.testing.replicas import settings_for
from tests.helpers import hb

CONFIG = '{"kvm_capabilities": ["a"]}'
BATCH = 64


def commands(client: Any) -> int:
    """Commands Redis ran since the last CONFIG RESETSTAT, the calls scripts
    make included; the script calls themselves and this bookkeeping not."""
    stats = client.info("commandstats")
    skip = {"evalsha", "eval", "fcall", "fcall_ro", "info", "config|resetstat", "config"}
    return sum(
        int(v["calls"]) for k, v in stats.items() if k.removeprefix("cmdstat_").lower() not in skip
    )


def add_fleet(s: Scheduler, n: int, start: int = 0, **kw: Any) -> None:
    for lo in range(start, start + n, BATCH):
        hi = min(lo + BATCH, start + n)
        s.run(
            s.ops.heartbeat_batch([s.ops.heartbeat(hb(f"n{i:05d}", **kw)) for i in range(lo, hi)])
        )


# ---------------------------------------------------------------------------
# The monitor
# ---------------------------------------------------------------------------
def monitor_commands(url: str, client: Any, nodes: int, cell: str) -> int:
    """Redis commands one stats refresh of a replica's monitor runs on a cell
    of ``nodes`` nodes (a census pass under way: the cursor mid-fleet)."""
    s = Scheduler(client, cell=cell)
    s.sync_policy(Policy(), overwrite=True)
    add_fleet(s, nodes)
    s.census()  # (the first step: the pass is under way from here)

    async def refresh() -> int:
        sched = AsyncScheduler(async_client(url), cell=cell)
        replica = Replica(settings_for(cell=cell), sched)
        try:
            await replica.refresh_cell_metrics()  # (scripts loaded)
            client.config_resetstat()
            await replica.refresh_cell_metrics()
            return commands(client)
        finally:
            replica.metrics.close()
            await sched.close()

    return asyncio.run(refresh())


@pytest.mark.real_only
def test_the_monitor_reads_a_bounded_slice_whatever_the_fleet(
    backend: str, redis_client: Any, real_url: str
) -> None:
    small = monitor_commands(real_url, redis_client, 100, "small")
    mid = monitor_commands(real_url, redis_client, 3 * CENSUS_STEP, "mid")
    big = monitor_commands(real_url, redis_client, 2_000 + 3 * CENSUS_STEP, "big")
    # the census reads at most CENSUS_STEP nodes a tick (one HMGET each); the
    # rest of the refresh is a few commands whatever the fleet
    assert small < 100 + 64, small
    # (the same whatever the fleet, give or take the sweeps' few commands)
    assert abs(mid - big) <= 8, (mid, big)
    assert big < CENSUS_STEP + 64, big


def test_a_census_pass_counts_every_node_exactly_once_while_nodes_change(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    add_fleet(s, 300)
    present = {f"n{i:05d}" for i in range(300)}
    step, added, checked, passes = 64, 300, 0, 0
    during: list[set[str]] = []  # the fleet at each step of the pass under way
    while checked < 3:
        during.append(set(present))
        census = s.census(step)
        if census.passes != passes:  # this step finished a pass
            passes = census.passes
            # every node there for the whole pass counted once, one that came
            # or went meanwhile at most once
            total = sum(census.nodes.values())
            stayed, ever = set.intersection(*during), set.union(*during)
            assert len(stayed) <= total <= len(ever), (len(stayed), total, len(ever))
            assert len(stayed) < len(ever)  # (nodes did change during it)
            during, checked = [], checked + 1
        # between two steps: nodes join at the end, one leaves from the middle
        add_fleet(s, 4, start=added)
        present |= {f"n{i:05d}" for i in range(added, added + 4)}
        added += 4
        gone = sorted(present)[len(present) // 2]
        assert s.unregister(gone, "boot-1")
        present.discard(gone)
    # once the fleet holds still, a whole pass counts it exactly, by status
    while s.census(step).passes < passes + 2:
        pass
    assert s.census(step).nodes == dict(Counter(n.status for n in s.list_nodes()))
    assert sum(s.census(step).nodes.values()) == len(present)


def test_a_small_fleet_is_counted_whole_in_each_census_step(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy(report_ttl_ms=60_000))
    add_fleet(s, 5)
    s.set_lingering("n00001", True)
    census = s.census()
    assert census.done_ms is not None
    assert census.nodes == {"READY": 4, "LINGERING": 1}
    s.advance_clock(120_000)
    assert s.census().nodes == {"UNHEALTHY": 5}


# ---------------------------------------------------------------------------
# A CPU-config round while members lack a config
# ---------------------------------------------------------------------------
def member(i: int, cluster: str, config: str) -> Heartbeat:
    return Heartbeat(
        node_id=f"{cluster}-{i:05d}",
        service_instance_id="boot-1",
        cluster_id=cluster,
        endpoint=f"{cluster}-{i}.local:5000",
        machine_info=MachineInfo(cpu_config_json=config),
        snapshot=NodeSnapshot(cpu_count=16, memory_total_bytes=64 << 30),
    )


def join(s: Scheduler, cluster: str, members: int, missing: int) -> None:
    """A cluster of ``members`` in the round, the first ``missing`` without a config."""
    cpu = CpuConfigOps(s.keys)
    for lo in range(0, members, BATCH):
        calls: list[Any] = []
        for i in range(lo, min(lo + BATCH, members)):
            config = "" if i < missing else CONFIG
            calls.append(s.ops.heartbeat(member(i, cluster, config)))
            calls.append(cpu.ingest(f"{cluster}-{i:05d}", cluster, config, False))
        s.run(s.ops.heartbeat_batch(calls))


def round_commands(s: Scheduler, cluster: str, members: int) -> float:
    """Redis commands per heartbeat's CPU-config step of members that have one."""
    cpu = CpuConfigOps(s.keys)
    beats = [
        cpu.ingest(f"{cluster}-{i:05d}", cluster, CONFIG, False)
        for i in range(members - 40, members)  # (members with their config)
    ]
    s.client.config_resetstat()
    for call in beats:
        assert not s.run(call).needs_compute
    return commands(s.client) / len(beats)


@pytest.mark.real_only
def test_a_round_waiting_for_configs_costs_each_heartbeat_the_same_at_any_size(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    join(s, "small", 100, missing=10)
    join(s, "big", 2_000, missing=1_000)
    small, big = round_commands(s, "small", 100), round_commands(s, "big", 2_000)
    # (the whole cluster, once per heartbeat, was 2 + 2,000 commands)
    assert big <= small * 1.2, (small, big)
    assert big < 32, big


def test_a_member_gone_unnoticed_stops_blocking_the_round(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    join(s, "k", 40, missing=1)
    # k-00000, the one without a config, goes without the round hearing of it
    s.client.delete(s.keys.node("k-00000"))
    cpu = CpuConfigOps(s.keys)
    computed = None
    for turn in range(200):  # the bounded prune gets round to it
        out = s.run(cpu.ingest(f"k-{1 + turn % 39:05d}", "k", CONFIG, False))
        if out.needs_compute:
            computed = out
            break
    assert computed is not None
    # the round is computed over the 39 members left, all of one config: the
    # config goes once, as the round counted it (no member named), never the
    # one gone (lua/cpu_config-6.lua)
    ((node, config),) = computed.configs
    assert (node, config) == ("", CONFIG)
    assert s.client.hget(s.keys.cpucfg("k"), "m:k-00000") is None
    assert int(s.client.hget(s.keys.cpucfg("k"), "missing") or 0) == 0


def test_one_heartbeat_at_a_time_computes_a_round(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    join(s, "k", 3, missing=0)
    cpu = CpuConfigOps(s.keys)
    # a new member's config: a new epoch; the first heartbeat computes it, the
    # others of that moment wait for its result instead of computing again
    s.heartbeat(member(3, "k", CONFIG.replace('"a"', '"b"')))
    first = s.run(cpu.ingest("k-00003", "k", CONFIG.replace('"a"', '"b"'), False))
    assert first.needs_compute
    again = [s.run(cpu.ingest(f"k-{i:05d}", "k", CONFIG, False)) for i in range(3)]
    assert not any(o.needs_compute for o in again)
    assert digest(CONFIG)  # (the digest the members carry)
    stored = s.run(cpu.store("k-00003", "k", first.epoch, '{"kvm_capabilities": []}'))
    assert stored.config == '{"kvm_capabilities": []}'
    assert [s.run(cpu.ingest(f"k-{i:05d}", "k", CONFIG, False)).config for i in range(3)] == [
        '{"kvm_capabilities": []}'
    ] * 3


# ---------------------------------------------------------------------------
# ListNodes and ListObservedNodes, page by page
# ---------------------------------------------------------------------------
def test_pages_list_every_node_exactly_once_while_nodes_change(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    add_fleet(s, 200)
    present = {f"n{i:05d}" for i in range(200)}
    for form in ("listed", "observed", "view"):
        during: list[set[str]] = []
        got: list[str] = []
        after, added = "", {"listed": 1_000, "observed": 2_000, "view": 3_000}[form]
        while True:
            during.append(set(present))
            call: Call[Page[Any]] = (
                s.ops.listed(after, 16)
                if form == "listed"
                else s.ops.observed("", "", after, 16)
                if form == "observed"
                else s.ops.nodes_page(after, 16)
            )
            after, rows = s.run(call)
            got += [n.node_id for n in rows]
            if not after:
                break
            # between two pages: a node joins, one leaves (both sides of the cursor)
            add_fleet(s, 1, start=added)
            present.add(f"n{added:05d}")
            added += 1
            gone = sorted(present)[(len(got) * 7) % len(present)]
            assert s.unregister(gone, "boot-1")
            present.discard(gone)
        assert len(got) == len(set(got)), form  # nobody twice
        assert got == sorted(got), form  # node-id byte order
        stayed, ever = set.intersection(*during), set.union(*during)
        assert stayed <= set(got) <= ever, form  # everyone there throughout, once


def test_a_big_list_is_read_in_pages_and_comes_back_whole(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    from scheduler.store.calls import LIST_PAGE, NODES_PAGE

    s = make_scheduler(Policy())
    n = 2 * LIST_PAGE + 10
    add_fleet(s, n)
    ids = [f"n{i:05d}" for i in range(n)]
    assert [x.node_id for x in s.list_nodes()] == ids
    assert [x.node_id for x in s.observed_nodes()] == ids
    # the nodes' view (Scheduler.nodes, schedctl nodes): page by page, each
    # page at most NODES_PAGE nodes, the same views as one read of the whole
    pages = []
    after = ""
    while True:
        after, rows = s.run(s.ops.nodes_page(after))
        assert len(rows) <= NODES_PAGE
        pages.append(rows)
        if not after:
            break
    assert len(pages) == -(-n // NODES_PAGE)
    _, whole = s.run(s.ops.nodes())

    def ageless(views: list[NodeView]) -> list[NodeView]:  # (the clock moves between reads)
        return [msgspec.structs.replace(v, heartbeat_age_ms=None) for v in views]

    paged = ageless([v for rows in pages for v in rows])
    assert ageless(s.nodes()) == paged == ageless(whole)
    assert [v.node_id for v in whole] == ids
    # one node's view, or one page of one for the cell's clock
    assert [v.node_id for v in s.run(s.ops.nodes(ids[-1]))[1]] == [ids[-1]]
    assert [v.node_id for v in s.run(s.ops.nodes(page=1))[1]] == ids[:1]
    assert s.run(s.ops.nodes("not-a-node"))[1] == []
    # the cell's live reservations: the nodes' pages, the same as one whole read
    for _ in range(5):
        s.schedule(Request.cold(1, 512))
    whole_res = s.run(s.ops.reservations())
    assert len(whole_res) == 5
    assert s.reservations() == whole_res
    after, first = s.run(s.ops.reservations_page("", 2))
    assert after == ids[1] and all(r.node_id in ids[:2] for r in first)
    # ListP2pPeers without a cluster: the cell's nodes in pages of LIST_PAGE
    beats = [msgspec.structs.replace(hb(i), p2p_backend="bt", p2p_address=f"{i}:7000") for i in ids]
    for lo in range(0, n, BATCH):
        s.run(s.ops.heartbeat_batch([s.ops.heartbeat(b) for b in beats[lo : lo + BATCH]]))
    assert [p.node_id for p in s.peers()] == ids
    assert [p.node_id for p in s.peers(exclude_node_id=ids[3])] == ids[:3] + ids[4:]
    after, page = s.run(s.peer_ops.peers("", "", "", "", LIST_PAGE))
    assert after == ids[LIST_PAGE - 1] and len(page) == LIST_PAGE
    last = ids[-1]  # (one of the last page)
    assert s.observed_node(last).node_id == last


# ---------------------------------------------------------------------------
# Start-up: sync_nodes with an empty list reads the static nodes alone
# ---------------------------------------------------------------------------
def static_set(s: Scheduler) -> set[str]:
    return {x.decode() for x in s.client.smembers(s.keys.base + "static")}


def test_the_static_set_follows_the_static_list(make_scheduler: Callable[..., Scheduler]) -> None:
    s = make_scheduler(Policy())
    add_fleet(s, 5)  # heartbeat-registered, not static
    assert s.sync_nodes([]) == (0, 0) and static_set(s) == set()
    assert s.sync_nodes([("n00001", "a:1"), ("x1", "b:1")]) == (2, 4)
    assert static_set(s) == {"n00001", "x1"}
    assert [n.node_id for n in s.list_nodes()] == ["n00001", "x1"]
    # an unregistered static node keeps its bare record: still static
    assert s.unregister("n00001", "boot-1")
    assert static_set(s) == {"n00001", "x1"}
    # an empty list: the static nodes leave, heartbeat-registered ones stay
    s.heartbeat(hb("n00009"))
    assert s.sync_nodes([]) == (0, 2)
    assert static_set(s) == set() and [n.node_id for n in s.list_nodes()] == ["n00009"]


@pytest.mark.real_only
def test_an_empty_sync_reads_no_node_of_a_big_fleet(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    add_fleet(s, 2_000)
    s.sync_nodes([])  # (the first makes the static set whole: it reads the fleet once)
    s.client.config_resetstat()
    assert s.sync_nodes([]) == (0, 0)
    assert commands(s.client) < 16, commands(s.client)


# ---------------------------------------------------------------------------
# schedctl doctor checks the derived sets against the records
# ---------------------------------------------------------------------------
def test_doctor_checks_and_rewrites_the_derived_sets(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    from scheduler.ops.doctor import doctor

    s = make_scheduler(Policy())
    join(s, "k", 6, missing=2)
    s.sync_nodes([("a", "a:1"), ("b", "b:1")])
    join(s, "k", 6, missing=2)  # (the sync removed them: back, heartbeat-registered)
    s.census()
    assert doctor(s).ok, doctor(s).findings
    mkey = s.keys.base + "cpucfg-missing:k"
    assert {x.decode() for x in s.client.smembers(mkey)} == {"k-00000", "k-00001"}
    # the derived sets and the count go wrong behind the scripts' back
    s.client.srem(mkey, "k-00001")
    s.client.sadd(mkey, "k-00004")
    s.client.hset(s.keys.cpucfg("k"), "missing", 7)
    s.client.srem(s.keys.base + "static", "b")
    report = doctor(s, repair=True)
    assert sorted(f.check for f in report.findings) == ["cpucfg", "cpucfg", "static"]
    assert all(f.repaired for f in report.findings)
    assert doctor(s).ok
    assert {x.decode() for x in s.client.smembers(mkey)} == {"k-00000", "k-00001"}


def test_a_round_from_before_the_missing_set_builds_it_once(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    join(s, "k", 10, missing=3)
    mkey = s.keys.base + "cpucfg-missing:k"
    s.client.delete(mkey)  # (as a round written by an earlier version)
    s.client.hset(s.keys.cpucfg("k"), "missing", 5)  # (and a count gone wrong)
    cpu = CpuConfigOps(s.keys)
    assert not s.run(cpu.ingest("k-00009", "k", CONFIG, False)).needs_compute
    assert {x.decode() for x in s.client.smembers(mkey)} == {"k-00000", "k-00001", "k-00002"}
    assert s.client.hget(s.keys.cpucfg("k"), "missing") == b"3"


@pytest.mark.real_only
def test_a_list_row_reads_its_node_once(make_scheduler: Callable[..., Scheduler]) -> None:
    """ListNodes and ListObservedNodes read one command a node (the brief
    form's fields, or the whole record), not the decision's numbers besides
    (2.3 and 1.8 times cheaper at 10,000 nodes), and derive each status as a
    whole read does: a stale, a lingering and a never-heard node included."""
    s = make_scheduler(Policy(report_ttl_ms=30_000))
    s.advance_clock(0, "freeze")
    s.heartbeat(hb("a-stale"))
    s.advance_clock(40_000)
    for i in range(40):
        s.heartbeat(hb(f"n{i:03d}"))
    s.set_lingering("n001", True)
    # (a static list of them all and one never heard from)
    s.sync_nodes(
        [(n, f"{n}.local:5000") for n in ["a-stale", *(f"n{i:03d}" for i in range(40))]]
        + [("u-unheard", "u.local:5000")]
    )
    status = {v.node_id: v.status for v in s.nodes()}  # (the decision's own reading)
    before = commands(s.client)
    listed = s.list_nodes()
    assert (commands(s.client) - before) / len(listed) <= 1.2
    assert {r.node_id: r.status for r in listed} == status
    before = commands(s.client)
    observed = s.observed_nodes()  # (heard-from nodes only)
    assert (commands(s.client) - before) / len(observed) <= 1.2
    assert {r.node_id: r.snapshot.status for r in observed} == {
        n: st for n, st in status.items() if n != "u-unheard"
    }
    assert status["a-stale"] == "UNHEALTHY" and status["n001"] == "LINGERING"
