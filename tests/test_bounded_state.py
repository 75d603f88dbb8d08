"""State that goes away: nodes silent for node_forget_after are forgotten by
bounded sweeps (static ones stay listed), tombstones keep for the policy's
reservation_tombstone_ttl, and every key pattern of scheduler/store/keys.py either
carries a TTL or is removed by a sweep."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

import scheduler.store.keys
from scheduler import NoNodesAvailable, Policy, Request, Scheduler
from scheduler.domain.policy import Locality
from scheduler.domain.records import LocalityRequirement as LR
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.store.keys import LIFETIMES
from scheduler.testing.replicas import ThreadedReplica
from tests.helpers import endpoint_md, hb, hb_request, records_name_only_registered_nodes

Make = Callable[..., Scheduler]
HOUR = 3_600_000


def keys_of(s: Scheduler, pattern: str = "*") -> list[str]:
    return sorted(k.decode() for k in s.client.scan_iter(match=s.keys.base + pattern, count=5000))


def sweep_all(s: Scheduler, calls: int = 200) -> int:
    """Run the cell's sweeps until one forgets nothing and expires nothing."""
    total = 0
    for _ in range(calls):
        forgotten, expired = s.sweep()
        total += forgotten
        if forgotten == 0 and expired == 0:
            return total
    raise AssertionError(f"still sweeping after {calls} calls")


# ---------------------------------------------------------------------------
# Forgetting nodes
# ---------------------------------------------------------------------------
def test_nodes_that_vanish_are_forgotten(make_scheduler: Make) -> None:
    s = make_scheduler(Policy())
    # frozen: the 200 heartbeats below may take longer than the second of
    # slack the steps leave, on a loaded machine
    s.advance_clock(0, "freeze")
    for i in range(200):
        s.heartbeat(hb(f"gone{i:03d}", roster=[f"sb{i}a", f"sb{i}b"], sandbox_count=2))
    p = s.schedule(Request.cold(1, 1))
    s.assign("assigned-sb", p.node_id, p.endpoint, p.reservation_id)
    assert len(s.nodes()) == 200
    s.advance_clock(HOUR - 1000)
    assert s.sweep()[0] == 0  # not yet: silent for less than node_forget_after
    s.heartbeat(hb("alive"))
    s.advance_clock(2000)
    # a full heartbeat (something changed) sweeps too: at most 4 silent nodes a call
    s.heartbeat(hb("alive", cpu_percent=5))
    assert len(s.nodes()) == 197
    assert sweep_all(s) == 196
    assert [v.node_id for v in s.nodes()] == ["alive"]
    left = keys_of(s)
    for i in (0, 199):
        assert not [k for k in left if k.endswith(f":gone{i:03d}") or f"sb{i}" in k], left
    assert not keys_of(s, "bind:*")
    assert s.client.zcard(s.keys.seen) == 1
    records_name_only_registered_nodes(s)


def test_node_forget_after_0_keeps_them(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(node_forget_after_ms=0))
    s.heartbeat(hb("n1", roster=["a"]))
    s.advance_clock(48 * HOUR)
    assert s.sweep() == (0, 0)
    assert [(v.node_id, v.status) for v in s.nodes()] == [("n1", "UNHEALTHY")]


def test_a_node_is_forgotten_only_once_stale(make_scheduler: Make) -> None:
    """node_forget_after shorter than report_ttl acts as report_ttl."""
    s = make_scheduler(Policy(report_ttl_ms=600_000, node_forget_after_ms=1000))
    s.heartbeat(hb("n1"))
    s.advance_clock(599_000)
    assert s.sweep() == (0, 0)
    s.advance_clock(2000)
    assert s.sweep() == (1, 0)


def test_static_nodes_stay_listed_without_their_state(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(static_nodes=True))
    s.sync_nodes([("n1", "n1.local:5000")])
    s.heartbeat(hb("n1", endpoint="", roster=["a", "b"], sandbox_count=2))
    s.advance_clock(HOUR + 1000)
    assert sweep_all(s) == 1
    [view] = s.nodes()
    assert (view.node_id, view.endpoint, view.status, view.static) == (
        "n1",
        "n1.local:5000",
        "UNHEALTHY",
        True,
    )
    assert not keys_of(s, "bind:*") and not keys_of(s, "node-roster:*")
    rec = {k.decode() for k in s.client.hgetall(s.keys.node("n1"))}
    assert rec == {"node_id", "endpoint", "static", "lingering", "forgotten_ms", "last_seen_ms"}
    records_name_only_registered_nodes(s)
    # it comes back like any node
    s.heartbeat(hb("n1", endpoint="", roster=["a"], sandbox_count=1))
    assert s.lookup("a").node_id == "n1"
    assert [v.status for v in s.nodes()] == ["READY"]


def test_steady_heartbeats_keep_a_node(make_scheduler: Make) -> None:
    """Steady heartbeats do not move the node's `seen` score; the sweep reads
    the record before it forgets anything."""
    s = make_scheduler(Policy(node_forget_after_ms=60_000))
    s.heartbeat(hb("n1", roster=["a"], sandbox_count=1))
    seen = s.client.zscore(s.keys.seen, "n1")
    for _ in range(6):
        s.advance_clock(20_000)
        s.heartbeat(hb("n1", roster=["a"], sandbox_count=1))
    assert s.client.zscore(s.keys.seen, "n1") == seen  # only steady ones since
    assert s.sweep() == (0, 0)
    assert s.client.zscore(s.keys.seen, "n1") > seen  # rescored from the record
    assert s.lookup("a").node_id == "n1"


def test_a_big_node_goes_in_bounded_steps_and_may_come_back_midway(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(max_roster_ids=3000))
    ids = [f"sb{i}" for i in range(3000)]
    s.heartbeat(hb("big", roster=ids, sandbox_count=3000))
    s.advance_clock(HOUR + 1000)
    assert s.sweep() == (0, 0)  # 1,024 members went, the node is not gone yet
    left = s.client.scard(s.keys.node_roster("big"))
    assert 0 < left < 3000
    assert len(keys_of(s, "bind:*")) == left  # (the listed bindings went with their members)
    # the node heartbeats again with its whole roster; this client's memo of
    # its last write is stale (a delta would miss the removed members): RESYNC
    s.heartbeat(hb("big", roster=ids, sandbox_count=3000))
    assert s.client.scard(s.keys.node_roster("big")) == 3000
    assert s.client.scard(s.keys.node_sbx("big")) == 0
    assert len(keys_of(s, "bind:*")) == 3000
    assert not s.client.hexists(s.keys.node("big"), "forgetting")
    assert s.schedule(Request.cold(1, 1)).node_id == "big"  # back in the index


# ---------------------------------------------------------------------------
# Tombstones
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("policy", "ttl_ms"), [(Policy(), 600_000), (Policy(reservation_tombstone_ttl_ms=5_000), 5_000)]
)
def test_tombstones_keep_for_the_policy_ttl(
    make_scheduler: Make, policy: Policy, ttl_ms: int
) -> None:
    s = make_scheduler(policy)
    s.heartbeat(hb("n1"))
    p = s.schedule(Request.cold(1, 1))
    assert s.client.pttl(s.keys.res(p.reservation_id or "")) == -1  # live: the expiry sweep's
    s.cancel(p.reservation_id or "")
    pttl = s.client.pttl(s.keys.res(p.reservation_id or ""))
    assert ttl_ms - 2_000 < pttl <= ttl_ms


# ---------------------------------------------------------------------------
# Every key: a TTL or a sweep
# ---------------------------------------------------------------------------
def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(
        re.escape(name)
        .replace(r"<", "<")
        .replace(">", ">")
        .replace(r"<C>:<M>", r"[^:]+:[^:]+")
        .replace("<", "(?:")
        .replace(">", ")")
        .replace("(?:node)", "[^:]+")
        .replace("(?:reservation)", "[^:]+")
        .replace("(?:sandbox)", "[^:]+")
        .replace("(?:bucket)", ".+")
        .replace("(?:cluster)", "[^:]+")
        .replace("(?:replica)", "[^:]+")
        .replace("(?:digest)", "[0-9a-f]+")
        + "$"
    )


def classify(base: str, key: str) -> str:
    rest = key[len(base) :]
    matches = [name for name in LIFETIMES if _pattern(name).match(rest)]
    assert len(matches) == 1, (key, matches)
    return matches[0]


def test_lifetimes_cover_the_documented_layout() -> None:
    doc = scheduler.store.keys.__doc__ or ""
    documented = re.findall(r"^\s+<base>(\S+)\s+\w+", doc, re.M)
    assert sorted(documented) == sorted(LIFETIMES)
    assert set(LIFETIMES.values()) <= {"ttl", "sweep", "ttl+sweep", "cell"}


@pytest.fixture
def replica(make_replica: Callable[..., ThreadedReplica]) -> ThreadedReplica:
    return make_replica(Policy(reservation_tombstone_ttl_ms=60_000, locality=Locality(weight=0.1)))


def test_every_key_has_a_ttl_or_is_swept(replica: ThreadedReplica, redis_client: Any) -> None:
    s = Scheduler(redis_client, cell="test")
    stub = replica.stub
    # a cell that uses every key of the layout
    for i in range(6):
        req = hb_request(f"n{i}", cpu=8 * (1 + i % 2), roster=[f"r{i}"])
        req.machine_info.cpu_config_json = '{"kvm_capabilities": ["1"]}'
        req.p2p_endpoint.CopyFrom(pb.P2pEndpoint(backend="bt", address=f"10.0.0.{i}:7000"))
        stub.Heartbeat(req, metadata=endpoint_md(f"n{i}.local:5000"))
    # one without a CPU config: its cluster's round waits for it
    stub.Heartbeat(hb_request("n6", cpu=8), metadata=endpoint_md("n6.local:5000"))
    placed = [s.schedule(Request.cold(1, 1)) for _ in range(4)]
    s.schedule(Request.route(), strategy="round_robin")  # (its cursor: rr-cursor)
    s.assign("assigned", placed[0].node_id, placed[0].endpoint, placed[0].reservation_id)
    s.cancel(placed[1].reservation_id or "")
    stub.ReportSandboxEvent(
        pb.ReportSandboxEventRequest(
            node_id="n0",
            events=[pb.SandboxEvent(sandbox_id="r0", event_type=pb.SANDBOX_EVENT_TYPE_DELETE)],
        )
    )
    stub.RecordP2pArtifact(
        pb.RecordP2pArtifactRequest(cluster_id="c1", backend="bt", key="img", node_id="n1")
    )
    s.census()  # (what replicas' monitors take a step of, a tick)
    s.index_rebuild("start")  # (what a policy change starts: an index rebuild in steps)
    # a placement with locality: affinity and the node's pending starts of its template
    s.schedule(Request(cpu=1, memory_bytes=1, template_id="t", locality=(LR(key="img"),)))
    seen = {classify(s.keys.base, k) for k in keys_of(s)}
    # static holds members only in a cell with a static node list (not this
    # one: tests/test_scale.py); a node-list sync pass's keys live only while
    # one is under way (their TTL: tests/test_sync_pass.py)
    transient = {"static", "sync-pass", "sync-stage:<token>"}
    assert seen == set(LIFETIMES) - transient, set(LIFETIMES) - seen

    # everything goes quiet past every TTL the scripts keep by Redis time
    s.advance_clock(2 * HOUR)
    assert sweep_all(s) == 7
    with pytest.raises(NoNodesAvailable):
        s.schedule(Request.cold(1, 1))  # a pick prunes the index's empty shapes
    for key in keys_of(s):
        name = classify(s.keys.base, key)
        kind = LIFETIMES[name]
        if "ttl" in kind and s.client.pttl(key) > 0:
            continue
        assert kind == "cell", f"{key} ({kind}) outlived its sweep without a TTL"
        # (census: a cursor and a count per status, whatever the fleet; idx-rebuild
        # an epoch and a cursor; rr-cursor one node id)
        assert name in ("policy", "stats", "rr", "rr-cursor", "census", "idx-rebuild"), (
            f"{key}: {name} still holds members"
        )
    # (the live replica's own roster entry stays: it refreshes it, with a TTL, checked
    # above; so does a template's affinity, whose TTL runs on Redis' own clock, not
    # the drill clock this test moves)
    left = [classify(s.keys.base, k) for k in keys_of(s)]
    ttl_only = ("replica:<replica>", "aff:<digest>")
    assert {LIFETIMES[n] for n in left if n not in ttl_only} <= {"cell", "ttl+sweep"}


def test_a_replica_sweeps_the_cell_with_its_metrics(
    replica: ThreadedReplica, redis_client: Any
) -> None:
    """A cell whose heartbeats are all steady still forgets: every replica
    runs the sweeps every few seconds (here called once, directly)."""
    s = Scheduler(redis_client, cell="test")
    replica.stub.Heartbeat(hb_request("quiet", roster=["q1"]), metadata=endpoint_md("q:5000"))
    s.advance_clock(HOUR + 1000)
    assert replica.replica is not None
    replica.call(replica.replica.refresh_cell_metrics())
    assert s.nodes() == [] and s.stats().forgotten_total == 1
