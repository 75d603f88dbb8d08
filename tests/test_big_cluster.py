"""A CPU-config cluster of 10,000 members, past Lua's unpack() limit (about 8,000 values): the
round's "compute" answer lists every member, 2 + 2N values, and a
coalesced heartbeat batch must carry it whole (issue #31: a cluster of 4,000
nodes or more got INTERNAL on every coalesced Heartbeat after an epoch
change)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from scheduler import Heartbeat, NodeSnapshot, Policy, Scheduler
from scheduler.domain.records import MachineInfo
from scheduler.store.cpuconfig import CpuConfigOps, Outcome

CONFIG = '{"kvm_capabilities": ["a"]}'
MEMBERS = 10_000  # 2 + 2 * 10,000 values: far past unpack()'s limit


def member(i: int) -> Heartbeat:
    return Heartbeat(
        node_id=f"m{i:05d}",
        service_instance_id="boot-1",
        cluster_id="big",
        endpoint=f"m{i}.local:5000",
        machine_info=MachineInfo(cpu_config_json=CONFIG),
        snapshot=NodeSnapshot(cpu_count=16, memory_total_bytes=64 << 30),
    )


@pytest.mark.slow
@pytest.mark.real_only
def test_a_compute_answer_of_a_big_cluster_travels_in_a_batch(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(Policy())
    for start in range(0, MEMBERS, 64):
        calls = [s.ops.heartbeat(member(i)) for i in range(start, min(start + 64, MEMBERS))]
        s.run(s.ops.heartbeat_batch(calls))
    # every member already in the round with a config of unknown digest ("stored",
    # as the script marks one it found on the record), nothing missing: written
    # the way cpu_config.lua writes them, since the round's own way there is a
    # join per member, each pruning the whole cluster (the O(cluster) cost #31
    # names separately)
    key = s.keys.cpucfg("big")
    pipe = s.client.pipeline(transaction=False)
    for i in range(MEMBERS):
        pipe.hset(key, f"m:m{i:05d}", "stored")
        pipe.hset(s.keys.node(f"m{i:05d}"), "cpucfg_cluster", "big")
    pipe.hset(key, mapping={"missing": 0, "epoch": 1})
    pipe.execute()
    cpu = CpuConfigOps(s.keys)
    # the first member's digest differs from "stored": a new epoch, and the
    # answer asks the caller to compute over all 10,000 members
    (out,) = s.run(s.ops.heartbeat_batch([cpu.ingest("m00000", "big", CONFIG, False)]))
    assert isinstance(out, Outcome), out
    assert out.needs_compute
    assert len(out.configs) == MEMBERS
    assert {c for _, c in out.configs} == {CONFIG}
