"""What a replica does, the library does: the sync and asyncio clients run
the CPU-config exchange of a heartbeat and put back a cell Redis lost, with
no gRPC in sight (the servicer only calls these)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import fakeredis
import pytest

from scheduler import AsyncScheduler, Heartbeat, Limits, MachineInfo, Policy, Scheduler
from scheduler.client.sync import async_client
from scheduler.domain.errors import CellNotInitialised
from tests.helpers import hb

KVM_A = json.dumps({"kvm_capabilities": ["9", "171"]})
KVM_B = json.dumps({"kvm_capabilities": ["171", "56"]})
BOTH = {"kvm_capabilities": ["171"], "cpuid_modifiers": [], "msr_modifiers": []}


def beat(node_id: str, config: str = "") -> Heartbeat:
    base = hb(node_id)
    base.cluster_id = "c1"
    base.machine_info = MachineInfo(cpu_config_json=config)
    return base


def test_a_library_heartbeat_delivers_the_cpu_config_intersection(make_scheduler: Any) -> None:
    s: Scheduler = make_scheduler()
    alone = s.heartbeat(beat("a", KVM_A), cpu_config=True).cpu_config_json
    assert json.loads(alone)["kvm_capabilities"] == ["171", "9"]  # its cluster is itself
    delivered = s.heartbeat(beat("b", KVM_B), cpu_config=True).cpu_config_json
    assert json.loads(delivered) == BOTH
    # each node gets it exactly once; the runtime sends its config only at first
    assert json.loads(s.heartbeat(beat("a"), cpu_config=True).cpu_config_json) == BOTH
    assert s.heartbeat(beat("a"), cpu_config=True).cpu_config_json == ""
    assert s.heartbeat(beat("b"), cpu_config=True).cpu_config_json == ""
    # without cpu_config a heartbeat is only recorded, as before
    assert s.heartbeat(beat("a")).cpu_config_json == ""


def test_the_async_client_runs_the_same_exchange(backend: str, request: Any) -> None:
    async def go() -> list[str]:
        if backend == "real":
            client = async_client(request.getfixturevalue("real_url"))
        else:
            client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
        a = AsyncScheduler(client, cell="t")
        await a.sync_policy(Policy())
        try:
            return [
                (await a.heartbeat(beat("a", KVM_A), cpu_config=True)).cpu_config_json,
                (await a.heartbeat(beat("b", KVM_B), cpu_config=True)).cpu_config_json,
            ]
        finally:
            await a.close()

    first, second = asyncio.run(go())
    assert json.loads(first)["kvm_capabilities"] == ["171", "9"]
    assert json.loads(second) == BOTH


def test_a_kept_cell_is_put_back_when_redis_lost_it(make_scheduler: Any, redis_client: Any) -> None:
    policy = Policy(limits=Limits(max_sandbox_count=3))
    s: Scheduler = make_scheduler(policy)
    other: Scheduler = make_scheduler(policy)
    s.keep_cell(policy, [("n1", "n1.local:5000")])
    assert s.prepare_cell() == "same"
    redis_client.flushall()  # Redis came back empty
    with pytest.raises(CellNotInitialised):
        other.nodes()  # a client that keeps no cell says so
    (view,) = s.nodes()  # this one puts the cell back first, then answers
    # its static node is back, and must heartbeat before it takes placements
    assert (view.node_id, view.static, view.reason) == ("n1", True, "awaiting heartbeat")
    assert redis_client.hget(s.keys.policy, "settle_ms")
    assert other.policy() == policy


def test_prepare_cell_refuses_another_static_node_list(make_scheduler: Any) -> None:
    from scheduler.domain.errors import StaticNodesConflict

    s: Scheduler = make_scheduler()
    s.keep_cell(Policy(static_nodes=True), [("n1", "n1:1")])
    assert s.prepare_cell(overwrite=True) == "overwritten"
    s.keep_cell(Policy(static_nodes=True), [("n2", "n2:1")])
    with pytest.raises(StaticNodesConflict, match="n1=n1:1"):
        s.prepare_cell()


def test_prepare_cell_compares_a_long_static_list_page_by_page(
    make_scheduler: Any, redis_client: Any
) -> None:
    """A start with a static list compares the stored one through ListNodes'
    pages (lua/observed-5.lua's brief form), not one read of every whole
    record (issue #31): no HGETALL, and a difference past the first page is
    still found."""
    from scheduler.domain.errors import StaticNodesConflict
    from scheduler.store.calls import LIST_PAGE

    s: Scheduler = make_scheduler()
    nodes = [(f"n{i:04d}", f"n{i:04d}:1") for i in range(2 * LIST_PAGE + 5)]
    s.keep_cell(Policy(static_nodes=True), nodes)
    assert s.prepare_cell(overwrite=True) == "overwritten"
    real = not type(redis_client).__module__.startswith("fakeredis")
    if real:
        redis_client.config_resetstat()
    s.keep_cell(Policy(static_nodes=True), list(nodes))
    s.prepare_cell()  # the same list: no conflict
    if real:  # (Redis' own command counts: the policy's read, no node record's)
        stats = redis_client.info("commandstats")
        assert stats.get("cmdstat_hgetall", {}).get("calls", 0) <= 1, stats["cmdstat_hgetall"]
    changed = [*nodes[:-1], (nodes[-1][0], "elsewhere:1")]
    s.keep_cell(Policy(static_nodes=True), changed)
    with pytest.raises(StaticNodesConflict, match=nodes[-1][0]):
        s.prepare_cell()
