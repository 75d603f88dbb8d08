"""A replica's own memory is bounded: the heartbeat memo (what it last wrote
per node, the base of delta heartbeats) by size and age, and dropped when a
node is unregistered; 1,000 ghost nodes with 200-id rosters, once gone,
leave the replica's memory where it was."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Callable

import grpc
import pytest

from scheduler import Policy, Scheduler
from scheduler.client.aio import AsyncScheduler
from scheduler.client.plans import BeatMemo
from scheduler.domain.history import Assigned, AssignmentMemo
from scheduler.domain.limits import MAX_CPU_CONFIG, MAX_DISKS, MAX_TEXT
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.server.frames import CLIENT_MAX_BYTES, fit_observed
from scheduler.store.calls import Beat, HeartbeatResult
from scheduler.testing.replicas import ThreadedReplica
from tests.helpers import endpoint_md, hb, hb_request

pytestmark = pytest.mark.real_only


def beat(n: int = 0) -> Beat:
    return Beat(f"1:{n}", "i1", "e:1", {}, "d", (f"s{n}",))


def test_the_assignment_memo_keeps_only_its_window_and_size() -> None:
    """The assignments a replica writes again after a failover settle are the
    last window's, at most ``most`` of them, oldest first."""
    memo = AssignmentMemo(window_s=10, most=3)
    for i in range(5):
        memo.record(Assigned(float(i), f"s{i}", "n1", "e:1", f"r{i}"))
    assert [a.sandbox_id for a in memo.recent(5.0)] == ["s2", "s3", "s4"]  # (size)
    assert [a.reservation_id for a in memo.recent(13.5)] == ["r4"]  # (age: 3.5 s gone)
    assert memo.recent(100.0) == [] and len(memo) == 0


def test_the_memo_is_bounded_by_size_and_age() -> None:
    now = [0.0]
    memo = BeatMemo(max_entries=3, max_age_s=10, clock=lambda: now[0])
    for i in range(5):
        memo[f"n{i}"] = beat(i)
        now[0] += 1
    assert sorted(memo) == ["n2", "n3", "n4"]  # the ones written longest ago went
    memo["n2"] = beat(9)  # rewritten: now the youngest
    memo["n5"] = beat(5)
    assert sorted(memo) == ["n2", "n4", "n5"]
    now[0] = 14.5  # n4 (written at 4) is older than 10 s; n2 and n5 (at 5) are not yet
    assert memo.get("n4") is None and "n4" not in memo
    assert memo.get("n5") is not None
    now[0] += 20
    memo["n6"] = beat(6)  # a write drops what aged meanwhile
    assert sorted(memo) == ["n6"] and list(memo.written) == ["n6"]
    assert memo.pop("n6") is not None and memo.pop("n6") is None and not memo.written


def test_a_fleet_past_ten_thousand_nodes_heartbeats_steady(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    """A fleet that heartbeats in turn needs every node's entry at once.  The
    memo kept 10,000: past that, each node found its entry gone (written
    longest ago, dropped first) and every heartbeat went in full, which at
    100,000 nodes cost the steady heartbeats 3-4 times their Redis CPU."""
    s = make_scheduler()
    n = 10_400
    for lo in range(0, n, 64):
        beats = [s.ops.heartbeat(hb(f"n{i:05d}"), s.beats) for i in range(lo, min(n, lo + 64))]
        assert all(isinstance(r, HeartbeatResult) for r in s.run(s.ops.heartbeat_batch(beats)))
    assert len(s.beats) == n
    # the next round starts with the nodes written first
    again = [s.ops.heartbeat(hb(f"n{i:05d}"), s.beats) for i in range(0, 512)]
    assert {c.script for c in again} == {"heartbeat_steady"}
    for lo in range(0, len(again), 64):
        out = s.run(s.ops.heartbeat_batch(again[lo : lo + 64]))
        assert all(isinstance(r, HeartbeatResult) for r in out), out
    assert all(int(s.beats[f"n{i:05d}"].base.split(":")[1]) == 2 for i in range(512))


def test_ghost_nodes_leave_nothing_behind_once_unregistered(real_url: str) -> None:
    """Before: 1,000 ghosts with 200-id rosters took a replica from 59 to
    125 MB, never freed after they were unregistered."""

    async def run() -> tuple[int, int, int, int]:
        # (tracemalloc slows every allocation; on a busy host 50 gathered
        # heartbeats of 200-id rosters outlast the default 2 s deadline,
        # which this test of memory does not measure)
        s = await AsyncScheduler.connect(
            real_url, cell="ghosts", policy=Policy(), overwrite_policy=True, timeout_s=30
        )
        try:
            await s.heartbeat(hb("warm", roster=[f"w{i}" for i in range(200)]))
            await s.unregister("warm", "boot-1")
            gc.collect()
            tracemalloc.start()
            baseline = tracemalloc.get_traced_memory()[0]
            for start in range(0, 1000, 50):
                await asyncio.gather(
                    *(
                        s.heartbeat(hb(f"g{n}", roster=[f"g{n}-{i}" for i in range(200)]))
                        for n in range(start, start + 50)
                    )
                )
            held = len(s.beats)
            gc.collect()
            full = tracemalloc.get_traced_memory()[0]
            for start in range(0, 1000, 50):
                await asyncio.gather(
                    *(s.unregister(f"g{n}", "boot-1") for n in range(start, start + 50))
                )
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            return baseline, full, after, held
        finally:
            await s.close()

    baseline, full, after, held = asyncio.run(run())
    print(f"memo: baseline {baseline}, 1,000 ghosts {full}, unregistered {after} bytes traced")
    assert held == 1000
    grown = full - baseline
    assert grown > 10 << 20, grown  # (the memo held the rosters: about 22 MB here)
    # back to the baseline, within 2% of what the ghosts took
    assert after - baseline < grown * 0.02, (baseline, full, after)


def test_list_observed_nodes_fits_a_default_client(
    make_replica: Callable[..., ThreadedReplica],
) -> None:
    """Six nodes within every documented field limit (256 disks of 1,024-char
    fields, a 64 KiB cpu_config_json) made 5.2 MB: a default client (4 MiB)
    got RESOURCE_EXHAUSTED.  Now the answer fits, large fields left out first
    (said in trailing metadata), and GetNode answers each node whole."""
    r = make_replica()
    text = "x" * MAX_TEXT
    disks = [
        pb.DiskMetric(mount_point=f"/{i:03d}" + text[4:], device=text, filesystem_type=text)
        for i in range(MAX_DISKS)
    ]
    config = '{"flags": "' + "f" * (MAX_CPU_CONFIG - 20) + '"}'
    for i in range(6):
        req = hb_request(f"n{i}", disks=disks)
        req.machine_info.cpu_config_json = config
        r.stub.Heartbeat(req, metadata=endpoint_md(f"n{i}:5000"), timeout=30)
    full = sum(
        r.stub.GetNode(pb.GetNodeRequest(node_id=f"n{i}"), timeout=30).node.ByteSize()
        for i in range(6)
    )
    assert full > CLIENT_MAX_BYTES  # (what the answer would be, whole)
    assert r.replica is not None
    with grpc.insecure_channel(f"127.0.0.1:{r.replica.port}") as ch:  # default options: 4 MiB
        reply, call = pb_grpc.SchedulerStub(ch).ListObservedNodes.with_call(
            pb.ListObservedNodesRequest(), timeout=30
        )
    assert sorted(n.node_id for n in reply.nodes) == [f"n{i}" for i in range(6)]
    assert reply.ByteSize() <= CLIENT_MAX_BYTES
    trailers = dict(call.trailing_metadata() or ())
    assert int(trailers["x-observed-stripped"]) > 0 and trailers["x-observed-omitted"] == "0"
    whole = [n for n in reply.nodes if n.machine_info.cpu_config_json]
    assert all(len(n.snapshot.disks) == MAX_DISKS for n in whole)
    node = r.stub.GetNode(pb.GetNodeRequest(node_id="n0"), timeout=30).node
    assert node.machine_info.cpu_config_json == config and len(node.snapshot.disks) == MAX_DISKS


def test_fit_observed_leaves_out_large_fields_then_entries() -> None:
    nodes = [
        pb.ObservedNode(
            node_id=f"n{i}",
            machine_info=pb.MachineInfo(cpu_config_json="c" * 1000),
            snapshot=pb.NodeSnapshot(disks=[pb.DiskMetric(device="d" * 500)]),
        )
        for i in range(4)
    ]
    assert fit_observed(nodes, budget=10_000) == (0, 0)
    assert fit_observed(nodes, budget=5_000) == (2, 0)  # two configs left out suffice
    assert [bool(n.machine_info.cpu_config_json) for n in nodes].count(False) == 2
    bare = pb.ObservedNode(
        node_id="n0", machine_info=pb.MachineInfo(), snapshot=pb.NodeSnapshot()
    ).ByteSize()
    budget = 2 * (bare + 2)  # two bare entries, with their tag and length
    stripped, omitted = fit_observed(nodes, budget=budget)  # bare, then the last left out
    assert (stripped, omitted) == (2, 2) and [n.node_id for n in nodes] == ["n0", "n1"]
    assert all(not n.snapshot.disks and not n.machine_info.cpu_config_json for n in nodes)
