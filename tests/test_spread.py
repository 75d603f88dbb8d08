"""round_robin and random without reading the fleet (issue #31).

Both strategies used to evaluate every node on every decision (one HMGET
per node: 100,000 of them at 100,000 nodes, one long call).  Now each
decides from a bounded walk (round_robin: after the node it chose last) or
a bounded sample (random: rejection sampling), and when that finds no
eligible node of known capacity the decision is least_loaded's, through the
index (until this change the full scan applied the same rule: the fleet
again, whenever eligible nodes were few).  Here,
against a real Redis on a fleet where the old call read thousands of
records: the records each decision reads (counted by Redis itself), the
decision against the reference model, and the fairness each rule keeps.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import pytest
from msgspec.structs import replace

from scheduler import Limits, Policy, Request, Scheduler
from scheduler.domain.errors import NoNodesAvailable
from scheduler.store.scripts import library
from scheduler.testing.model import (
    SPREAD_DRAWS,
    Demand,
    ModelVerdict,
    decide,
    evaluate,
    spread_random,
)
from tests.helpers import hb, node_states, rr_cursor, rr_value, schedule_argv

pytestmark = pytest.mark.real_only

FLEET = 2_000
WALK = 64  # SPREAD.WALK: nodes a round_robin walk evaluates at most
FULL = 5  # every FULL-th node runs max_sandbox_count sandboxes: never eligible


def _cell(redis_client: Any, strategy: str, name: str, n: int = FLEET) -> tuple[Scheduler, int]:
    s = Scheduler(redis_client, cell=name)
    s.sync_policy(
        Policy(strategy=strategy, report_ttl_ms=3_600_000, limits=Limits(max_sandbox_count=4)),
        overwrite=True,
    )
    now = s.advance_clock(0, "freeze")
    pipe = s.client.pipeline(transaction=False)
    for i in range(n):
        beat = hb(f"s{i:05d}", cpu=16, mem_gib=64, sandbox_count=5 if i % FULL == 0 else i % 3)
        call = s.ops.heartbeat(beat)
        s.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
    pipe.execute()
    return s, now


def _policy(s: Scheduler) -> Policy:
    p = s.policy()
    assert p is not None
    return p


def _hmgets(s: Scheduler) -> int:
    """Node records Redis has served (a decision evaluates a node with one HMGET)."""
    stats = s.client.info("commandstats")
    return int(stats.get("cmdstat_hmget", {}).get("calls", 0))


def _verdicts(s: Scheduler, req: Request, now: int) -> list[ModelVerdict]:
    d = Demand.of(req, _policy(s))
    return [evaluate(n, _policy(s), d, now) for n in node_states(s)]


def test_the_bounds_are_the_scripts_own() -> None:
    text = library().text
    assert f"WALK = {WALK}," in text
    assert f"DRAWS = {SPREAD_DRAWS}," in text


def test_round_robin_reads_a_bounded_walk_and_cycles_the_eligible_in_order(
    redis_client: Any,
) -> None:
    s, now = _cell(redis_client, "round_robin", "rr")
    eligible = [v.node_id for v in _verdicts(s, Request.route(), now) if v.reason is None]
    assert len(eligible) == FLEET - FLEET // FULL
    picks = []
    states = node_states(s)  # (routes reserve nothing: the fleet stays as it is)
    for _ in range(3 * 40):
        want = decide(states, _policy(s), Request.route(), now, 1, rr_after=rr_cursor(s))
        before = _hmgets(s)
        got = s.schedule(Request.route()).node_id
        # a handful of records, never the fleet (the old call read all FLEET)
        assert _hmgets(s) - before <= 2, _hmgets(s) - before
        assert got == want.chosen
        picks.append(got)
    # the eligible nodes in byte order, each once, none skipped (the
    # cursor goes on from where it stopped)
    assert picks == eligible[: len(picks)]
    # a whole cycle comes back to the first: each eligible node once a cycle
    s.client.set(s.keys.rr_cursor, eligible[-2])
    assert [s.schedule(Request.route()).node_id for _ in range(3)] == [
        eligible[-1],
        eligible[0],
        eligible[1],
    ]


def test_round_robin_past_a_long_ineligible_run_takes_least_loaded_without_the_fleet(
    redis_client: Any,
) -> None:
    s, now = _cell(redis_client, "round_robin", "rr-sparse", 600)
    # a run of more than WALK full nodes right after the cursor
    pipe = s.client.pipeline(transaction=False)
    for i in range(100, 100 + 2 * WALK):
        call = s.ops.heartbeat(hb(f"s{i:05d}", cpu=16, mem_gib=64, sandbox_count=5))
        s.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
    pipe.execute()
    s.client.set(s.keys.rr_cursor, "s00099")
    states = node_states(s)
    want = decide(states, _policy(s), Request.route(), now, 1, rr_after="s00099")
    # the walk's WALK nodes hold none: least_loaded's choice, not the next
    # eligible node past the run (the old rule's, which read the fleet)
    assert (
        want.chosen
        == decide(states, _policy(s), Request.route(), now, 1, strategy="least_loaded").chosen
    )
    assert want.chosen != "s00228"
    before = _hmgets(s)
    got = s.schedule(Request.route()).node_id
    read = _hmgets(s) - before
    assert got == want.chosen
    # the walk's WALK records, then the index's pick checked against its
    # record: never the fleet (the full scan read all 600 more)
    assert WALK <= read <= WALK + 2, read
    assert rr_cursor(s) == got
    # creations change eligibility: still the model's choice at each step,
    # each reading a bounded count
    for _ in range(20):
        req = Request.cold(1, 0)
        want = decide(node_states(s), _policy(s), req, now, 1, rr_after=rr_cursor(s))
        before = _hmgets(s)
        assert s.schedule(req).node_id == want.chosen
        assert _hmgets(s) - before <= WALK + 2


def _schedule_with(s: Scheduler, req: Request, rand: float) -> str:
    call = s.ops.schedule(req)
    return s.run(call.with_argv(replace(schedule_argv(call), random=repr(rand)))).node_id


def test_random_reads_a_bounded_sample_and_decides_like_the_model(redis_client: Any) -> None:
    s, now = _cell(redis_client, "random", "rnd")
    rng = random.Random(31)
    states = node_states(s)  # (routes reserve nothing: the fleet stays as it is)
    for _ in range(60):
        rand = rng.random()
        req = Request.route()
        want = decide(states, _policy(s), req, now, 1, rand)
        before = _hmgets(s)
        assert _schedule_with(s, req, rand) == want.chosen
        assert _hmgets(s) - before <= SPREAD_DRAWS


def test_random_takes_least_loaded_when_the_sample_finds_nothing(
    redis_client: Any,
) -> None:
    # one eligible node in 300: 32 draws usually miss it
    s, now = _cell(redis_client, "random", "rnd-sparse", 300)
    pipe = s.client.pipeline(transaction=False)
    for i in range(300):
        if i != 137:
            call = s.ops.heartbeat(hb(f"s{i:05d}", cpu=16, mem_gib=64, sandbox_count=5))
            s.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
    pipe.execute()
    rng = random.Random(7)
    fell_back = 0
    for _ in range(10):
        rand = rng.random()
        before = _hmgets(s)
        assert _schedule_with(s, Request.route(), rand) == "s00137"
        read = _hmgets(s) - before
        # the draws, then the index's pick checked against its record:
        # never the fleet
        assert read <= SPREAD_DRAWS + 2, read
        fell_back += read > SPREAD_DRAWS
    assert fell_back >= 1


def test_random_gives_each_node_of_the_group_an_equal_share() -> None:
    """The rule itself (the model, which the tests above hold the Lua to):
    with eligibility in runs (a bounded walk's bias would show), every
    eligible node's share over many draws is 1 / len(group) within
    sampling error, and no ineligible node is ever chosen."""
    n = 200
    verdicts = [
        ModelVerdict(
            f"v{i:03d}", "READY", None if (i // 10) % 3 == 0 else "full", 0.0, True, 0, 0, 0, 0, 0
        )
        for i in range(n)
    ]
    group = [v for v in verdicts if v.reason is None]
    rng = random.Random(5)
    draws = 40_000
    got = Counter(spread_random(verdicts, group, rng.random(), 1) for _ in range(draws))
    assert set(got) <= {v.node_id for v in group}
    expected = draws / len(group)
    chi2 = sum((got[v.node_id] - expected) ** 2 / expected for v in group)
    # chi-square, len(group) - 1 = 69 degrees of freedom: p = 0.001 at about 111
    assert chi2 < 111, chi2
    # and a first draw on an all-eligible fleet is floor(rand * N), as before #31
    assert spread_random(verdicts[:10], verdicts[:10], 0.55, 1) == "v005"
    assert math.floor(0.55 * 10) == 5


@pytest.mark.parametrize("strategy", ["round_robin", "random"])
def test_sparse_fleets_decide_like_the_model_through_the_index_and_the_full_scan(
    redis_client: Any, strategy: str
) -> None:
    """Eligibility in runs longer than the walk, a few nodes of each shape
    eligible, a stream of creations filling them: every decision is the
    model's, through the walk or sample and the index (the call), and
    through the full scan (the dry run, which evaluates every node); and no
    call reads more than its walk or draws and the index's pick."""
    n = 180  # (at most FULL_SCAN_MAX: the dry run may read them all)
    s = Scheduler(redis_client, cell=f"sparse-{strategy}")
    s.sync_policy(
        Policy(strategy=strategy, report_ttl_ms=3_600_000, limits=Limits(max_sandbox_count=4)),
        overwrite=True,
    )
    now = s.advance_clock(0, "freeze")
    rng = random.Random(f"sparse-{strategy}")
    pipe = s.client.pipeline(transaction=False)
    for i in range(n):
        # runs of 80 full nodes, then a few with room of two shapes
        room = i % 100 >= 80
        beat = hb(
            f"p{i:04d}",
            cpu=rng.choice([8, 16]) if room else 16,
            mem_gib=64,
            sandbox_count=rng.randrange(0, 3) if room else 5,
        )
        call = s.ops.heartbeat(beat)
        s.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
    pipe.execute()
    s.client.set(s.keys.rr_cursor, "p0005")
    fell_back = placed = 0
    for _ in range(40):
        req = Request.cold(rng.choice([1, 2]), 0)
        rand = rng.random()
        states = node_states(s)
        rotation = rr_value(s) + 1
        want = decide(states, _policy(s), req, now, rotation, rand, rr_after=rr_cursor(s))
        if strategy == "round_robin":
            assert s.explain(req).chosen == want.chosen
        before = _hmgets(s)
        if want.chosen is None:
            with pytest.raises(NoNodesAvailable):
                _schedule_with(s, req, rand)
            continue
        assert _schedule_with(s, req, rand) == want.chosen
        placed += 1
        read = _hmgets(s) - before
        bound = WALK if strategy == "round_robin" else SPREAD_DRAWS
        assert read <= bound + 2, read
        fell_back += read > bound  # (the walk or draws missed: the index's pick read)
    assert placed >= 20 and fell_back >= 1, (placed, fell_back)
