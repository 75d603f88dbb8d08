"""A node-list sync (static list, Kubernetes discovery) goes in bounded steps
(lua/sync_begin-5.lua, sync_stage-5.lua, sync_walk-5.lua; issue #31): no
call of it reads more than a chunk of the list or a step of the fleet, two
passes at once end in one list (never a mix), and a pass cut short leaves
its own keys with a TTL and is superseded by the next.  Work is counted in
Redis commands (INFO commandstats), never timed."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from scheduler import Policy, Request, Scheduler
from scheduler.domain.errors import NoNodesAvailable, SyncSuperseded
from scheduler.store.calls import MAX_SYNC_CHUNK, SYNC_CHUNK, SYNC_WALK_STEP, Call
from tests.helpers import hb

#: what one walk step removes at most (lua/includes/sync_pass.lua WALK_REMOVALS)
WALK_REMOVALS = 16
#: ...and the bindings, reservations and artifacts its removals drop (WALK_WORK)
WALK_WORK = 256


def _stats(client: Any) -> dict[str, int]:
    return {
        k.removeprefix("cmdstat_").lower(): int(v["calls"])
        for k, v in client.info("commandstats").items()
    }


#: what the counts leave out: the script calls themselves and this bookkeeping
SKIP = {"evalsha", "eval", "fcall", "fcall_ro", "info", "config|resetstat", "config"}
#: the commands that read a node record
RECORD_READS = ("hmget", "hget", "hgetall")
WRITES = {"hset", "hdel", "sadd", "srem", "zadd", "zrem", "del", "unlink", "hincrby", "pexpire"}


class Counted:
    """Every call ``s`` runs, with the Redis commands it ran (by name)."""

    def __init__(self, s: Scheduler) -> None:
        self.calls: list[tuple[str, dict[str, int]]] = []
        run = s.run

        def counted(call: Call[Any]) -> Any:
            s.client.config_resetstat()
            try:
                return run(call)
            finally:
                got = {k: v for k, v in _stats(s.client).items() if k not in SKIP}
                self.calls.append((call.script, got))

        s.run = counted  # type: ignore[method-assign]

    def records(self) -> list[int]:
        """Node-record reads of each call."""
        return [sum(c.get(k, 0) for k in RECORD_READS) for _, c in self.calls]

    def commands(self) -> list[int]:
        return [sum(c.values()) for _, c in self.calls]


def listed(s: Scheduler) -> set[str]:
    return {n.node_id for n in s.list_nodes()}


def static_set(s: Scheduler) -> set[str]:
    return {x.decode() for x in s.client.smembers(s.keys.base + "static")}


def nodes(lo: int, hi: int) -> list[tuple[str, str]]:
    return [(f"m{i:05d}", f"10.1.{i // 256}.{i % 256}:5000") for i in range(lo, hi)]


def test_the_bounds_are_the_scripts_own() -> None:
    from pathlib import Path

    text = (Path(__file__).parent.parent / "lua/includes/sync_pass.lua").read_text()
    assert re.search(rf"^local WALK_REMOVALS = {WALK_REMOVALS}\b", text, re.M)
    assert re.search(rf"^local WALK_WORK = {WALK_WORK}\b", text, re.M)
    assert re.search(rf"^local STAGE_MAX = {MAX_SYNC_CHUNK}\b", text, re.M)
    assert SYNC_CHUNK <= MAX_SYNC_CHUNK


# ---------------------------------------------------------------------------
# Bounded calls at 10,000 listed nodes
# ---------------------------------------------------------------------------
@pytest.mark.real_only
def test_no_call_of_a_sync_of_10000_nodes_reads_more_than_a_step(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    for i in range(40):  # heartbeat-registered nodes, some with bindings: they leave
        s.heartbeat(hb(f"h{i:03d}", roster=[f"sb{i}-{k}" for k in range(3)]))
    first = nodes(0, 10_000)
    count = Counted(s)
    assert s.sync_nodes(first) == (10_000, 40)
    assert listed(s) == {i for i, _ in first} == static_set(s)
    # a list of another 10,000, half of them the same: 5,000 leave
    second = nodes(5_000, 15_000)
    assert s.sync_nodes(second) == (5_000, 5_000)
    assert listed(s) == {i for i, _ in second} == static_set(s)
    # discovery's list of the same fleet: every node changes (lingering)
    assert s.sync_discovered([7, 7, 7], [(i, e, True) for i, e in nodes(5_000, 14_000)]) == (
        True,
        9_000,
        1_000,
    )
    assert listed(s) == {f"m{i:05d}" for i in range(5_000, 14_000)}
    # bounded: a chunk reads a listed node's record, and once more to index it
    # when it changed; a walk step reads no kept node, one record a removal
    # (and a few of what the removed node holds); the one call these
    # replaced read every node of the fleet (10,000 and more)
    reads, cmds = count.records(), count.commands()
    # (every call of the syncs: whatever their scripts; the list pages read
    # back above are bounded on their own)
    most = max(2 * SYNC_CHUNK, WALK_REMOVALS * (2 + 2 * 3)) + 8
    ours = [
        (script, r)
        for (script, _), r in zip(count.calls, reads, strict=True)
        if script not in ("observed", "nodes_view")
    ]
    assert max(r for _, r in ours) <= most, [x for x in ours if x[1] > most][:3]
    chunks_sent = sum(-(-n // SYNC_CHUNK) for n in (10_000, 10_000, 9_000))
    assert [name for name, _ in ours].count("sync_stage") == chunks_sent
    staged = [
        r for (script, _), r in zip(count.calls, reads, strict=True) if script == "sync_stage"
    ]
    assert max(staged) <= 2 * SYNC_CHUNK + 8, max(staged)
    walked = [r for (script, _), r in zip(count.calls, reads, strict=True) if script == "sync_walk"]
    # (a removal reads as an unregister of the node: its record, and each of
    # its bindings, 3 here)
    assert max(walked) <= WALK_REMOVALS * (2 + 2 * 3) + 8, max(walked)
    assert sorted(walked)[len(walked) // 2] <= 2 * WALK_REMOVALS + 8  # (most remove bare records)
    # (a changed listed node: its compare, its writes and its reindex)
    chunks = [c for (script, _), c in zip(count.calls, cmds, strict=True) if script == "sync_stage"]
    assert max(chunks) <= 12 * SYNC_CHUNK + 16, max(chunks)
    walk = [c for (script, _), c in zip(count.calls, cmds, strict=True) if script == "sync_walk"]
    assert max(walk) <= 2 * SYNC_WALK_STEP + 16 * WALK_REMOVALS, max(walk)


def _walk_removals(s: Scheduler, token: str) -> list[int]:
    """A pass's walk, step by step until it commits: the nodes each step removed."""
    removed, done = [0], False
    while not done:
        done, _, so_far = s.run(s.ops.sync_walk(token))
        removed.append(so_far)
    return [b - a for a, b in zip(removed, removed[1:], strict=False)]


def test_a_walk_step_ends_once_its_removals_dropped_its_work(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    """A removal costs what its node holds: a step stops after the removal
    that brings what its removals dropped to WALK_WORK, so nodes of 100
    sandboxes leave three a step, not sixteen; every node and binding of
    them still goes by the pass's end."""
    s = make_scheduler(Policy())
    big = [f"h{i:03d}" for i in range(20)]
    for i, node_id in enumerate(big):
        s.heartbeat(hb(node_id, roster=[f"sb{i}-{k}" for k in range(100)]))
    lst = s.ops.static_list(nodes(0, 5))
    assert s.run(s.ops.sync_begin("1", lst)) == ("begun", "1")
    s.run(s.ops.sync_stage("1", lst.nodes))
    per_step = _walk_removals(s, "1")
    # (the removal that reaches 256 ends the step: 3 nodes of 100)
    assert max(per_step) == -(-WALK_WORK // 100) < WALK_REMOVALS, per_step
    assert sum(per_step) == len(big)
    assert listed(s) == {n[0] for n in lst.nodes}
    assert not list(s.client.scan_iter(match=s.keys.base + "bind:*"))


def test_an_empty_static_list_removes_big_static_nodes_a_few_a_step(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    """The other walk, an empty static list reading the static set: the
    same bound, three static nodes of 100 sandboxes a step, all gone at
    the end with their bindings."""
    s = make_scheduler(Policy())
    static = nodes(0, 20)
    assert s.sync_nodes(static) == (20, 0)
    for i, (node_id, endpoint) in enumerate(static):
        s.heartbeat(hb(node_id, endpoint=endpoint, roster=[f"sb{i}-{k}" for k in range(100)]))
    assert s.run(s.ops.sync_begin("2", s.ops.static_list([]))) == ("begun", "2")
    per_step = _walk_removals(s, "2")
    assert max(per_step) == -(-WALK_WORK // 100) < WALK_REMOVALS, per_step
    assert sum(per_step) == len(static)
    assert listed(s) == set() == static_set(s)
    assert not list(s.client.scan_iter(match=s.keys.base + "bind:*"))


# ---------------------------------------------------------------------------
# Two passes at once
# ---------------------------------------------------------------------------
def test_a_newer_pass_of_another_list_supersedes_and_the_older_writes_nothing(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    s.sync_nodes(nodes(0, 10))
    a, b = s.ops.static_list(nodes(0, 5)), s.ops.static_list(nodes(3, 8) + [("x", "x:1")])
    assert s.run(s.ops.sync_begin("1", a)) == ("begun", "1")
    s.run(s.ops.sync_stage("1", a.nodes[:2]))
    assert s.run(s.ops.sync_begin("2", b)) == ("begun", "2")
    before = {k: s.client.type(k) for k in s.client.keys(s.keys.base + "*")}
    # the older pass: each step refused, naming the newer one, and nothing written
    for call in (s.ops.sync_stage("1", a.nodes[2:]), s.ops.sync_walk("1")):
        with pytest.raises(SyncSuperseded, match="pass 2 began since"):
            s.run(call)
    assert {k: s.client.type(k) for k in s.client.keys(s.keys.base + "*")} == before
    s.run(s.ops.sync_stage("2", b.nodes))
    while not s.run(s.ops.sync_walk("2", 3))[0]:
        pass
    assert listed(s) == {i for i, _, _ in b.nodes} == static_set(s)


@pytest.mark.real_only
def test_a_refused_step_runs_no_write(make_scheduler: Callable[..., Scheduler]) -> None:
    s = make_scheduler(Policy())
    lst = s.ops.static_list(nodes(0, 4))
    s.run(s.ops.sync_begin("11", lst))
    s.run(s.ops.sync_begin("12", s.ops.static_list(nodes(0, 3))))
    for call in (s.ops.sync_stage("11", lst.nodes), s.ops.sync_walk("11")):
        s.client.config_resetstat()
        with pytest.raises(SyncSuperseded):
            s.run(call)
        assert not WRITES & set(_stats(s.client)), _stats(s.client)


def _interleave(plans: list[Iterator[Any]], s: Scheduler) -> list[Any]:
    """Run the plans' calls in turn, one call of each at a time: each plan's
    value, or the error it ended with."""
    out: list[Any] = [None] * len(plans)
    pending: dict[int, Any] = {}
    for i, p in enumerate(plans):
        pending[i] = next(p)
    while pending:
        for i in list(pending):
            try:
                reply = s.run(pending[i])
            except SyncSuperseded as e:
                try:
                    pending[i] = plans[i].throw(e)
                except SyncSuperseded as final:
                    out[i] = final
                    del pending[i]
                except StopIteration as done:
                    out[i] = done.value
                    del pending[i]
                continue
            try:
                pending[i] = plans[i].send(reply)
            except StopIteration as done:
                out[i] = done.value
                del pending[i]
    return out


def test_replicas_syncing_the_same_list_at_once_join_one_pass(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    for i in range(6):
        s.heartbeat(hb(f"h{i}"))
    lst = nodes(0, 3 * SYNC_CHUNK + 5)
    out = _interleave([s._sync_nodes(lst), s._sync_nodes(lst), s._sync_nodes(lst)], s)
    # one pass: every replica answers its counts, the list was added once
    assert out == [(len(lst), 6)] * 3
    assert listed(s) == {i for i, _ in lst} == static_set(s)
    assert not s.client.exists(s.keys.base + "sync-pass")
    assert not s.client.keys(s.keys.base + "sync-stage:*")


def test_replicas_syncing_other_lists_at_once_end_in_one_of_them(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    lists = [nodes(0, 2 * SYNC_CHUNK), nodes(SYNC_CHUNK, 3 * SYNC_CHUNK), nodes(7, 9)]
    out = _interleave([s._sync_nodes(x) for x in lists], s)
    won = [i for i, o in enumerate(out) if not isinstance(o, SyncSuperseded)]
    # whoever lost says so; the nodes are exactly the winner's list, never a mix
    assert len(won) == 1, out
    assert all("superseded in a row" in str(o) for o in out if isinstance(o, SyncSuperseded))
    assert listed(s) == {i for i, _ in lists[won[0]]} == static_set(s)


# ---------------------------------------------------------------------------
# A pass cut short
# ---------------------------------------------------------------------------
def test_a_pass_cut_short_expires_and_the_next_pass_supersedes_it(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    for i in range(4):
        s.heartbeat(hb(f"h{i}"))
    # a replica killed mid-pass: two chunks of a list without the h nodes staged
    cut = s.ops.static_list(nodes(0, 3 * SYNC_CHUNK))
    s.run(s.ops.sync_begin("21", cut))
    for chunk in cut.chunks()[:2]:
        s.run(s.ops.sync_stage("21", chunk))
    # its keys expire (Redis time) unless a step comes
    for key in (s.keys.base + "sync-pass", s.keys.base + "sync-stage:21"):
        assert 0 < s.client.pttl(key) <= 60_000, key
    # and what it left is consistent (schedctl doctor finds nothing)
    from scheduler.ops.doctor import doctor

    assert doctor(s).ok, doctor(s).findings
    # nothing it wrote is placeable: the heartbeat-registered nodes it would
    # remove still take every placement, its listed nodes none
    placed = {s.schedule(Request.cold(1, 1)).node_id for _ in range(8)}
    assert placed <= {f"h{i}" for i in range(4)}
    assert {f"h{i}" for i in range(4)} <= listed(s)
    # the next pass (another replica's, another list) supersedes it
    # (h1, m00000 change; the other 255 staged nodes and h0, h2, h3 leave)
    assert s.sync_nodes([("h1", "h1:1"), ("m00000", "a:1")]) == (2, 2 * SYNC_CHUNK - 1 + 3)
    assert listed(s) == {"h1", "m00000"} == static_set(s)
    assert not s.client.keys(s.keys.base + "sync-stage:*")
    with pytest.raises(SyncSuperseded, match="expired"):
        s.run(s.ops.sync_walk("21"))


def test_a_cut_short_walk_removes_only_what_it_walked_and_the_next_pass_ends_it(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    for i in range(10):
        s.heartbeat(hb(f"h{i}"))
    keep = [("h0", "h0:1"), ("h9", "h9:1")]
    lst = s.ops.static_list(keep)
    s.run(s.ops.sync_begin("31", lst))
    s.run(s.ops.sync_stage("31", lst.nodes))
    assert s.run(s.ops.sync_walk("31", 4)) == (False, 2, 3)  # (h0 kept, h1..h3 left)
    assert listed(s) == {"h0", *(f"h{i}" for i in range(4, 10))}
    # a listed node is never removed, whoever ends the pass: the same list
    # joins it, and answers the pass's counts (h0, h9 changed; h1..h8 left)
    assert s.sync_nodes(keep) == (2, 8)
    assert listed(s) == {"h0", "h9"} == static_set(s)


# ---------------------------------------------------------------------------
# Bad input: nothing written
# ---------------------------------------------------------------------------
def test_a_bad_list_writes_nothing(make_scheduler: Callable[..., Scheduler]) -> None:
    from scheduler.domain.errors import InvalidArgument

    s = make_scheduler(Policy())
    s.sync_nodes([("a", "a:1")])
    before = sorted(s.client.keys(s.keys.base + "*"))
    with pytest.raises(InvalidArgument, match=r"nodes\[1\].endpoint"):
        s.sync_nodes([("b", "b:1"), ("c", " ")])
    with pytest.raises(InvalidArgument, match="positions"):
        s.sync_discovered([1, 2], [("b", "b:1", False)])
    assert sorted(s.client.keys(s.keys.base + "*")) == before
    assert listed(s) == {"a"}


def test_an_empty_discovered_list_removes_every_node(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy(static_nodes=True))
    assert s.sync_discovered([3, 3, 3], [(i, e, False) for i, e in nodes(0, 5)]) == (True, 5, 0)
    assert s.sync_discovered([4, 4, 4], []) == (True, 0, 5)
    assert listed(s) == set() == static_set(s)
    with pytest.raises(NoNodesAvailable):
        s.schedule(Request.cold(1, 1))


def test_a_chunk_moves_the_index_when_lingering_changes_and_only_then(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    for i in range(2):
        s.heartbeat(hb(f"h{i}"))
    # discovery marks h0 lingering: no placement goes to it any more
    assert s.sync_discovered([1, 1, 1], [("h0", "h0:9", True), ("h1", "h1:9", False)]) == (
        True,
        2,
        0,
    )
    assert {s.schedule(Request.cold(1, 1)).node_id for _ in range(6)} == {"h1"}
    # back active: placements go to it again, at the listed endpoint
    assert s.sync_discovered([2, 2, 2], [("h0", "h0:7", False), ("h1", "h1:9", False)]) == (
        True,
        1,
        0,
    )
    got = {(p.node_id, p.endpoint) for p in (s.schedule(Request.cold(1, 1)) for _ in range(8))}
    assert ("h0", "h0:7") in got
    # a static list moving only the endpoint: the node keeps its placements
    s.sync_nodes([("h0", "h0:5"), ("h1", "h1:9")])
    got = {(p.node_id, p.endpoint) for p in (s.schedule(Request.cold(1, 1)) for _ in range(8))}
    assert ("h0", "h0:5") in got and ("h1", "h1:9") in got


def test_async_replicas_starting_at_once_with_one_list_make_it_whole(real_url: str) -> None:
    """Replicas starting together (each prepare_cell syncs its static list,
    concurrently, through the asyncio client) end with the list, every one
    of them answering OK."""
    import asyncio

    from scheduler.client.aio import AsyncScheduler
    from scheduler.store.connection import async_client

    lst = nodes(0, 4 * SYNC_CHUNK + 3)

    async def go() -> list[Any]:
        replicas = [
            AsyncScheduler(async_client(real_url), cell="startup", url=real_url) for _ in range(3)
        ]
        try:
            for r in replicas:
                r.keep_cell(Policy(static_nodes=True), lst)
            return await asyncio.gather(*(r.prepare_cell(overwrite=True) for r in replicas))
        finally:
            for r in replicas:
                await r.close()

    outcomes = asyncio.run(go())
    assert len(outcomes) == 3 and set(outcomes) <= {"created", "same", "overwritten"}
    s = Scheduler.connect(real_url, cell="startup")
    try:
        assert listed(s) == {i for i, _ in lst} == static_set(s)
        assert not s.client.keys(s.keys.base + "sync-stage:*")
    finally:
        s.close()
