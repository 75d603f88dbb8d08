"""Multi-replica ceilings with heartbeats lagging behind, and callers that die."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections import Counter

import pytest

from scheduler import (
    Heartbeat,
    Limits,
    NodeSnapshot,
    NoNodesAvailable,
    Overcommit,
    Policy,
    Request,
    Scheduler,
)
from tests.helpers import GIB
from tests.workers import paced_gateway, schedule_then_die

pytestmark = [pytest.mark.real_only, pytest.mark.slow]
NODES = [f"n{i}" for i in range(8)]
LAG_S = 2.0


def test_paced_creates_with_lagging_heartbeats_never_exceed_the_ceiling(real_url: str) -> None:
    policy = Policy(limits=Limits(max_sandbox_count=10), overcommit=Overcommit(cpu=2.0))
    s = Scheduler.connect(real_url, cell="paced", policy=policy)
    s.sync_nodes([(n, f"{n}:5000") for n in NODES])
    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    created = manager.list()
    start = manager.Event()
    stop = threading.Event()
    undercounts: list[str] = []
    heartbeats = 0

    def nodes_heartbeat_with_lag() -> None:
        """Each node reports only what was created more than LAG_S ago."""
        nonlocal heartbeats
        while not stop.is_set():
            now = time.time()
            truth = Counter(node for node, _, _ in list(created))
            for node_id in NODES:
                seen = [sb for node, sb, t in list(created) if node == node_id and now - t >= LAG_S]
                s.heartbeat(
                    Heartbeat(
                        node_id=node_id,
                        service_instance_id="boot",
                        snapshot=NodeSnapshot(
                            cpu_count=16,
                            memory_total_bytes=64 * GIB,
                            sandbox_count=len(seen),
                            allocated_cpu=2 * len(seen),
                            allocated_memory_bytes=4 * GIB * len(seen),
                            create_successes=len(seen),
                        ),
                        sandbox_ids=seen,
                    )
                )
                heartbeats += 1
            # the scheduler's view must never count fewer than really exist
            for v in s.nodes():
                if v.sandbox_count + v.pending_reservations < truth[v.node_id]:
                    undercounts.append(
                        f"{v.node_id}: view {v.sandbox_count}+"
                        f"{v.pending_reservations} < real {truth[v.node_id]}"
                    )
            stop.wait(0.5)

    beat = threading.Thread(target=nodes_heartbeat_with_lag)
    beat.start()
    try:
        with ctx.Pool(8) as pool:
            jobs = [
                pool.apply_async(paced_gateway, (real_url, "paced", 25, 0.2, created, start))
                for _ in range(8)
            ]
            start.set()
            placed = sum(j.get(timeout=120) for j in jobs)
        time.sleep(LAG_S + 0.6)  # let the last heartbeats catch up
    finally:
        stop.set()
        beat.join()
    per_node = Counter(node for node, _, _ in list(created))
    assert placed == 80 and sum(per_node.values()) == 80
    assert max(per_node.values()) == 10 and set(per_node) == set(NODES)
    assert undercounts == []
    assert heartbeats >= 8 * 8  # the lag was really exercised over many rounds
    # once the heartbeats caught up, every placement was released by a roster
    st = s.stats()
    assert st.pending == 0 and st.released_total == 80 and st.expired_total == 0


def test_a_caller_that_dies_holds_its_room_until_the_ttl(real_url: str) -> None:
    s = Scheduler.connect(
        real_url,
        cell="dies",
        policy=Policy(limits=Limits(max_sandbox_count=1), reservation_ttl_ms=1500),
    )
    s.heartbeat(
        Heartbeat(
            node_id="n1",
            service_instance_id="b",
            endpoint="n1:1",
            snapshot=NodeSnapshot(cpu_count=4, memory_total_bytes=GIB),
        )
    )
    proc = mp.get_context("spawn").Process(target=schedule_then_die, args=(real_url, "dies"))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0 and s.stats().pending == 1
    born = time.monotonic()
    with pytest.raises(NoNodesAvailable, match="1 at max_sandbox_count"):
        s.schedule(Request.cold(1, 0))
    while time.monotonic() - born < 10:
        try:
            s.schedule(Request.cold(1, 0))
            break
        except NoNodesAvailable:
            time.sleep(0.1)
    assert time.monotonic() - born < 10
    assert s.stats().expired_total == 1
    dead = [
        s.client.hgetall(k)
        for k in s.client.scan_iter(s.keys.res("*"))
        if s.client.hget(k, "state") == b"expired"
    ]
    assert len(dead) == 1
    held_ms = int(dead[0][b"ended_ms"]) - int(dead[0][b"created_ms"])
    assert 1500 <= held_ms < 10_000  # not a moment before its TTL
