"""``python -m bench locality`` at its quick size (issue #32 point 6): the
replay runs end to end against a real redis-server, its rows have the
documented keys, and what it exists to show holds: no ceiling broken, the
artifact index kept exactly in step with the nodes' caches, every counted
arrival placed or refused, a pinned decision placed where it was pinned.

No timing is asserted; the ratios are checked for shape only.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator

import msgspec
import pytest

from bench import locality
from bench.runner import Result, Target
from scheduler import Overcommit, Policy, Request
from scheduler.domain.records import MIB
from scheduler.ops.simnode import SimNode
from scheduler.testing.redis_server import RedisServer

pytestmark = pytest.mark.real_only


@pytest.fixture(scope="module")
def target(redis_server: RedisServer) -> Iterator[Target]:
    t = Target(redis_server.url, owned=True)
    yield t
    t.close()


@pytest.fixture(scope="module")
def result(target: Target) -> Result:
    return locality.run(target, locality.Params.quick())


def test_rows_have_the_documented_keys(result: Result) -> None:
    p = locality.Params.quick()
    assert json.loads(json.dumps(result.to_json()))["rows"] == result.rows
    replay = [r for r in result.rows if r["nodes"] == 3 and "note" not in r]
    expected = {(s, p.replicas) for s in p.strategies} | {(s, 1) for s in p.single}
    if not locality.library_locality():
        expected = {e for e in expected if e[0] != "ours"}
    assert {(r["strategy"], r["replicas"]) for r in replay} == expected
    for row in replay:
        assert set(locality.COLUMNS) <= set(row), row


def test_no_ceiling_broken_and_every_arrival_answered(result: Result) -> None:
    p = locality.Params.quick()
    tpls = locality.templates(p, random.Random(f"{p.seed}-templates"))
    stream = locality.arrivals(p, p.nodes_per_shape * sum(p.node_cpus))
    counted = sum(1 for a in stream if a.at >= p.warmup_s)
    assert len(tpls) == p.templates
    for row in result.rows:
        if "placed" not in row or row["nodes"] != 3:
            continue
        assert row["violations"] == 0, row
        assert max(row["per_node_peak_sandboxes"]) <= p.ceiling
        assert row["placed"] + row["refused"] == counted, row
        assert row["decisions"] == counted
        assert 0 <= row["warm_pct"] <= 100
        assert row["inflight_p99"] >= 1
        assert row["peak_pressure"] <= 1.0  # overcommit 1.0: the capacity test is exact
        # what the nodes' caches hold is exactly what the index says they hold
        assert row["index_agrees"] is True, row
        if row["strategy"] in locality.LIBRARY:
            assert row["diverted"] == 0
        assert row["vs_least_loaded"] is not None and row["vs_least_loaded"] > 0


def test_locality_helps_over_blind_rules(result: Result) -> None:
    """The replay's caches and index work: PR #51's max coverage, reading the
    index, starts warm more often and pulls less than round robin, which
    ignores it (a shape of the workload, not a timing)."""
    rows = {r["strategy"]: r for r in result.rows if r.get("replicas") == 3 and "placed" in r}
    assert rows["pr51"]["warm_pct"] > rows["round_robin"]["warm_pct"]
    assert rows["pr51"]["gib_pulled"] < rows["round_robin"]["gib_pulled"]
    if locality.library_locality():
        # and the library's own locality, reading the same index, pulls less
        # than least_loaded without it
        assert rows["ours"]["warm_pct"] > rows["least_loaded"]["warm_pct"]
        assert rows["ours"]["gib_pulled"] < rows["least_loaded"]["gib_pulled"]


def test_scale_rows_cover_each_fleet_size(result: Result) -> None:
    p = locality.Params.quick()
    scale = [r for r in result.rows if r["nodes"] in p.scale_nodes and "placed" in r]
    assert {(r["strategy"], r["nodes"]) for r in scale} >= {
        ("least_loaded", n) for n in p.scale_nodes
    }
    for row in scale:
        assert row["decisions"] == p.scale_decisions
        assert row["redis_us_per_decision"] > 0
        assert row["redis_calls_per_decision"] > 0


def test_a_pinned_decision_lands_on_its_node(target: Target) -> None:
    """The alternatives place through the library's script with their node
    pinned by the rotation counter: each of three nodes in turn gets it, and
    a pin to a node at its ceiling is refused by the script, not forced."""
    cell = target.new_cell("locality-pin")
    policy = Policy(
        strategy="least_loaded",
        overcommit=Overcommit(cpu=1.0, memory=1.0),
        limits=locality.Limits(max_sandbox_count=2),
    )
    r = locality.Replica(target.url, cell, policy, "pin")
    try:
        nodes = [SimNode(f"pin-{i}", 16, 64 * 1024 * MIB, cluster_id="loc") for i in range(3)]
        for n in nodes:
            r.s.heartbeat(locality._heartbeat(n))
        d = locality.Decider(locality.Params.quick(), "pr51", [])
        req = Request(cpu=1, memory_bytes=1024 * MIB)
        a = locality.Arrival(0, "x", 0, 1, 1024, 1.0)
        for want in ("pin-2", "pin-0", "pin-1", "pin-2"):
            group = locality._group(r.s.explain(req, "round_robin").verdicts)
            placed = d._pinned(r, a, req, group, want)
            assert placed.placement is not None and placed.placement.node_id == want
        # pin-2 holds 2 reservations: at max_sandbox_count, no longer eligible
        group = locality._group(r.s.explain(req, "round_robin").verdicts)
        assert [v.node_id for v in group] == ["pin-0", "pin-1"]
        stale = [*group, msgspec.structs.replace(group[0], node_id="pin-2")]
        refused_or_moved = d._pinned(r, a, req, stale, "pin-2")
        assert refused_or_moved.placement is not None
        assert refused_or_moved.placement.node_id != "pin-2"  # the script re-checks
    finally:
        r.close()
        target.drop_cell(cell)


def test_cache_evicts_least_recent_unpinned() -> None:
    gib = 1024 * MIB
    c = locality.Cache(3 * gib)
    a = locality.Template("a", (("a/0", 2 * gib),))
    b = locality.Template("b", (("b/0", 2 * gib),))
    warm, pulled, ready, began = c.start(a, 0.0, gib)
    assert (warm, pulled, ready, began) == (False, 2 * gib, 2.0, ["a/0"])
    # a second start of the same template waits for the pull in flight
    assert c.start(a, 1.0, gib) == (False, 0, 2.0, [])
    assert c.arrived(["a/0"], {"a/0": 2 * gib}) == []
    c.start(b, 3.0, gib)
    # a is in use: b's arrival cannot evict it, the cache runs over
    assert c.arrived(["b/0"], {"b/0": 2 * gib}) == []
    c.release(a)
    c.release(a)
    c.release(b)
    c.start(a, 5.0, gib)  # warm, and now the most recent
    c.release(a)
    cc = locality.Template("c", (("c/0", gib),))
    c.start(cc, 6.0, gib)
    assert c.arrived(["c/0"], {"c/0": gib}) == ["b/0"]
    assert list(c.held) == ["a/0", "c/0"]


def test_diagnose_sorts_every_cold_placement_and_places_the_same(target: Target) -> None:
    """``--diagnose`` (an explanation in the same MULTI/EXEC as each of
    ours' Schedules): every counted placement of ours on a node short of its
    template is sorted into one cause, the summary's counts add up to them,
    the placements themselves are the library's (no violation, the index in
    step), and the private per-arrival maps are not left in the rows."""
    if not locality.library_locality():
        pytest.skip("this tree's library has no locality")
    p = dataclasses.replace(
        locality.Params.quick(), strategies=("kube", "ours"), scale_nodes=(), diagnose=True
    )
    got = locality.run(target, p)
    ours = [r for r in got.rows if r["strategy"] == "ours"]
    assert {r["replicas"] for r in ours} == {1, 3}
    for row in got.rows:
        assert "_seen" not in row
    for row in ours:
        cold = row["cold_placements"]
        short = round(row["placed"] * (100 - row["warm_pct"]) / 100)
        assert abs(len(cold) - short) <= 1  # (warm_pct is rounded to 0.1)
        assert {c["cause"] for c in cold} <= {*locality.CAUSES, "no full holder"}
        assert sum(v["n"] for v in row["diagnosis"].values()) == len(cold)
        for c in cold:
            if c["cause"] == "gap":
                assert c["holder_pressure"] > c["coolest"]
            if c["cause"] == "ineligible":
                assert c["detail"]
        assert row["violations"] == 0 and row["index_agrees"] is True
        for h in row["hot_placements"]:
            assert h["after"] >= p.hot_pressure


def test_a_cause_is_read_from_the_verdict() -> None:
    """What kept a full holder from winning, from its verdict's fields."""
    from scheduler.domain.records import Verdict

    def v(reason: str | None = None, locality_text: str = "", bonus: float = 0.15) -> Verdict:
        return Verdict(
            node_id="n",
            status="READY",
            reason=reason,
            pressure=0.5,
            known_capacity=True,
            starting=0,
            running=0,
            paused=0,
            projected_cpu=1,
            projected_memory_bytes=1,
            cpu_capacity=16,
            memory_capacity_bytes=1,
            endpoint="n:1",
            coverage=1.0,
            bonus=bonus,
            locality=locality_text,
        )

    assert locality._cause(v("at max_sandbox_count (64)"), 0.15) == "ineligible"
    gap = "pressure 0.700 over 0.500 + max_pressure_gap 0.150"
    assert locality._cause(v(None, gap), 0.15) == "gap"
    capped = "pressure 0.812 over 0.562 + headroom_share 0.219"
    assert locality._cause(v(None, capped), 0.15) == "gap"
    lost = "pressure - bonus 0.600 not below 0.500"
    assert locality._cause(v(None, lost, bonus=0.075), 0.15) == "decay"
    assert locality._cause(v(None, lost, bonus=0.15), 0.15) == "score"
    assert locality._cause(v(None, "capacity unknown"), 0.15) == "capacity unknown"


def test_ordered_runs_of_a_seed_place_the_same(target: Target) -> None:
    """--ordered: the replicas decide each tick's arrivals in turn, so two
    runs of one seed place every arrival alike (the rows' placement figures
    equal; only the Redis time differs), with 3 replicas as with 1."""
    p = dataclasses.replace(
        locality.Params.quick(),
        strategies=("least_loaded", "kube", "ours"),
        scale_nodes=(),
        ordered=True,
    )
    placed = ["placed", "warm_pct", "gib_pulled", "peak_pressure", "inflight_p99", "refused"]
    results = [locality.run(target, p) for _ in range(2)]
    runs = [
        [{k: r[k] for k in ("strategy", "replicas", *placed)} for r in x.rows if "note" not in r]
        for x in results
    ]
    assert runs[0] == runs[1]
    assert ("kube", 3) in {(r["strategy"], r["replicas"]) for r in runs[0]}
    assert results[0].params["ordered"] is True
    assert any("in turn (--ordered)" in n for n in results[0].notes)
