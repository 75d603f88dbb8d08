"""A refusal without reading the fleet (issue #31).

least_loaded's refusal used to be the full scan's: every node's record read
to count its reason (229 ms of Redis at 10,000 nodes, per refused Schedule,
while the fleet is full).  The placement index holds every node schedulable
whatever the request, so when it finds nothing eligible nothing is; the
refusal now counts the reasons of the first REFUSAL_COUNTED nodes by id, as
the reference model does.  Against a real Redis, on a fleet of thousands:
the records a refusal reads (counted by Redis itself), its message against
the model's, and what happens when a record disagrees with the index.
"""

from __future__ import annotations

from typing import Any

import pytest

from scheduler import Limits, Policy, Request, Scheduler
from scheduler.domain.catalog import FULL_SCAN_MAX, REFUSAL_COUNTED
from scheduler.domain.errors import IndexBehind, NoNodesAvailable
from scheduler.domain.policy import Overcommit
from scheduler.ops.doctor import doctor
from scheduler.testing.model import SPREAD_DRAWS, decide
from tests.helpers import hb, node_states

pytestmark = pytest.mark.real_only

FLEET = 2_000
CEILING = 4
WALK = 64  # SPREAD.WALK: nodes a round_robin walk evaluates at most (tests/test_spread.py)


def _full_cell(
    redis_client: Any, name: str, strategy: str = "least_loaded"
) -> tuple[Scheduler, int]:
    """FLEET nodes, each at its sandbox ceiling or too small for 8 CPUs."""
    s = Scheduler(redis_client, cell=name)
    policy = Policy(
        strategy=strategy, report_ttl_ms=3_600_000, limits=Limits(max_sandbox_count=CEILING)
    )
    s.sync_policy(policy, overwrite=True)
    now = s.advance_clock(0, "freeze")
    pipe = s.client.pipeline(transaction=False)
    for i in range(FLEET):
        beat = hb(
            f"r{i:05d}", cpu=4 if i % 3 else 16, mem_gib=64, sandbox_count=1 if i % 3 else CEILING
        )
        call = s.ops.heartbeat(beat)
        s.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
    pipe.execute()
    return s, now


def _hmgets(s: Scheduler) -> int:
    """Node records Redis has served (a decision evaluates a node with one HMGET)."""
    return int(s.client.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0))


@pytest.mark.parametrize("strategy", ["least_loaded", "round_robin", "random"])
def test_a_refusal_reads_a_bounded_count_and_says_what_the_model_says(
    redis_client: Any, strategy: str
) -> None:
    """round_robin and random walk or sample their bounded count first
    (SPREAD), then ask the index before the full scan."""
    s, now = _full_cell(redis_client, f"refusal-{strategy}", strategy)
    req = Request.cold(8, 1024)
    want = decide(node_states(s), s.policy() or Policy(), req, now, 1)
    assert want.chosen is None and want.refusal
    before = _hmgets(s)
    with pytest.raises(NoNodesAvailable) as refused:
        s.schedule(req)
    read = _hmgets(s) - before
    # the first REFUSAL_COUNTED records (and the spread's walk or sample of
    # at most 64), never the fleet (the old call read all FLEET)
    spread = {"least_loaded": 0, "round_robin": WALK, "random": SPREAD_DRAWS}[strategy]
    assert read <= spread + REFUSAL_COUNTED + 2, read
    assert refused.value.message == want.refusal
    assert refused.value.message.startswith(
        f"no nodes available: 0/{FLEET} nodes available, the first {REFUSAL_COUNTED} by id "
        "counted: "
    )
    # the counts add up to the nodes counted
    counted = refused.value.message.partition("counted: ")[2].split(", ")
    assert sum(int(part.split(" ")[0]) for part in counted) == REFUSAL_COUNTED
    # a dry run (explain) still evaluates every node, and counts the same
    assert s.explain(req).refusal == want.refusal


@pytest.mark.parametrize("strategy", ["least_loaded", "round_robin", "random"])
def test_a_counted_node_the_index_lacks_is_placed_on_and_the_index_rebuilt(
    redis_client: Any, strategy: str
) -> None:
    """A foreign write took an eligible node out of the index: the count
    finds it eligible and the index is rebuilt; the fleet being larger than
    the full scan reads, that decision is refused BEHIND with nothing
    reserved, and once the steps end the rebuild the node is placed on.
    round_robin and random come to the index when their walk or sample
    misses the node (until now they took the full scan: the fleet)."""
    s, now = _full_cell(redis_client, f"refusal-lost-{strategy}", strategy)
    # (round_robin's walk starts far from r00001)
    s.client.set(s.keys.rr_cursor, "r01000")
    call = s.ops.heartbeat(hb("r00001", cpu=64, mem_gib=256, sandbox_count=0))
    s.scripts[call.script](keys=call.keys, args=call.args)
    bucket = s.client.hget(s.keys.node("r00001"), "idx")
    assert bucket
    assert s.client.zrem(f"{s.keys.base}idx-bucket:{bucket.decode()}", "r00001") == 1
    # (what `schedctl doctor` says of it)
    found = doctor(s).findings
    assert any("r00001" in f"{f}" for f in found), found
    req = Request.cold(8, 1024)
    want = decide(node_states(s), s.policy() or Policy(), req, now, 1, rr_after="r01000")
    assert want.chosen == "r00001"
    assert s.client.zcard(s.keys.nodes) > FULL_SCAN_MAX
    before = _hmgets(s)
    with pytest.raises(IndexBehind, match="the placement index is being rebuilt; retry"):
        s.schedule(req)
    # the walk or the draws, the index's (empty) pick, the first
    # REFUSAL_COUNTED counted: never the fleet
    spread = {"least_loaded": 0, "round_robin": WALK, "random": SPREAD_DRAWS}[strategy]
    assert _hmgets(s) - before <= spread + REFUSAL_COUNTED + 2
    assert s.client.hget(s.keys.policy, "index_rebuild") is not None
    assert s.stats().pending == 0
    while not s.index_rebuild().done:
        pass
    assert s.schedule(req).node_id == "r00001"


@pytest.mark.parametrize("overcommit", [1.0, 1.5, 0.3])
def test_a_creation_at_the_overcommit_edge_is_placed_like_the_model_places_it(
    redis_client: Any, overcommit: float
) -> None:
    """The index walk ends a stream once its lower bound passes the
    dimension's overcommit (no later bucket can fit): a bucket exactly at
    the edge still fits, one a CPU beyond it does not."""
    s = Scheduler(redis_client, cell=f"edge-{overcommit}")
    s.sync_policy(
        Policy(report_ttl_ms=3_600_000, overcommit=Overcommit(cpu=overcommit)), overwrite=True
    )
    now = s.advance_clock(0, "freeze")
    edge = int(16 * overcommit) - 4  # allocated CPUs that leave exactly 4 within the edge
    for i, allocated in enumerate([edge + 1, edge + 2, edge, edge + 3]):
        s.heartbeat(hb(f"e{i}", cpu=16, mem_gib=64, allocated_cpu=allocated))
    req = Request.cold(4, 1024)
    want = decide(node_states(s), s.policy() or Policy(), req, now, 1)
    assert want.chosen == "e2"
    assert s.schedule(req).node_id == "e2"
    # the edge is taken now: nothing fits, counted as the model counts it
    want = decide(node_states(s), s.policy() or Policy(), req, now, 1)
    assert want.chosen is None
    with pytest.raises(NoNodesAvailable) as refused:
        s.schedule(req)
    assert (
        refused.value.message
        == want.refusal
        == ("no nodes available: 0/4 nodes available: 4 insufficient cpu")
    )
