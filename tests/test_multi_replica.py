"""End to end with real processes: one redis-server, N ``schedctl serve``
replicas, simulated runtime nodes heartbeating to one fixed replica each
(skewed), simulated gateways spreading creates over every replica.

The reference system, measured the same way, let every node go over its
ceiling of 10 (the worst to 30) with zero rejections; here a ceiling of 10
means exactly 10, whichever replica a node or a gateway talks to.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from scheduler import Scheduler
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.ops.simnode import SimNode
from scheduler.server.service import heartbeat_request
from scheduler.testing.replicas import ServeProcess
from tests.helpers import cold, endpoint_md

pytestmark = [pytest.mark.real_only, pytest.mark.slow]

NODES = 8
CREATES = 200
CEILING = 10
GIB = 1024**3
REFUSAL = f"no nodes available: 0/{NODES} nodes available: {NODES} at max_sandbox_count (10)"


@dataclass
class GrpcNode:
    """A runtime node (the one simulated node, :class:`SimNode`) whose
    heartbeats (full roster) and events go to its home replica only, one at
    a time, as one process would send them."""

    node: SimNode
    stub: pb_grpc.SchedulerStub
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def node_id(self) -> str:
        return self.node.node_id

    async def heartbeat(self) -> None:
        async with self.lock:
            await self.stub.Heartbeat(
                heartbeat_request(self.node.heartbeat()),
                metadata=endpoint_md(self.node.endpoint),
                timeout=10,
            )

    async def create(self, sandbox_id: str) -> None:
        """The gateway forwarded a create: the sandbox starts and is reported."""
        async with self.lock:
            await self.stub.ReportSandboxEvent(
                pb.ReportSandboxEventRequest(
                    node_id=self.node_id,
                    cluster_id="c1",
                    service_instance_id="boot-1",
                    events=[
                        pb.SandboxEvent(
                            sandbox_id=sandbox_id,
                            event_type=pb.SANDBOX_EVENT_TYPE_CREATE,
                            requested_cpu=2,
                            requested_memory_bytes=4 * GIB,
                        )
                    ],
                ),
                timeout=10,
            )
            self.node.create(sandbox_id, 2, 4 * GIB)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.heartbeat()
            await asyncio.sleep(0.2)


@dataclass
class Result:
    placed: dict[str, str] = field(default_factory=dict)  # sandbox -> node
    via: dict[str, int] = field(default_factory=dict)  # sandbox -> replica index
    refusals: list[tuple[grpc.StatusCode, str]] = field(default_factory=list)


async def run_fleet(addresses: list[str], homes: list[int]) -> tuple[Result, list[GrpcNode]]:
    channels = [grpc.aio.insecure_channel(a) for a in addresses]
    stubs = [pb_grpc.SchedulerStub(ch) for ch in channels]
    nodes = [
        GrpcNode(
            SimNode(
                f"node-{i}",
                32,
                64 * GIB,
                endpoint=f"node-{i}.nodes:5000",
                cluster_id="c1",
                busy_percent=0,
                memory_used_percent=0,
            ),
            stubs[homes[i]],
        )
        for i in range(NODES)
    ]
    by_id = {n.node_id: n for n in nodes}
    result = Result()
    rng = random.Random(7)
    try:
        await asyncio.gather(*(n.heartbeat() for n in nodes))
        stop = asyncio.Event()
        beating = [asyncio.create_task(n.run(stop)) for n in nodes]

        async def gateway(k: int) -> None:
            sandbox = f"sbx-{k:03d}"
            replica = k % len(stubs)
            try:
                resp, call = await _with_call(stubs[replica], cold(2, 4096))
            except grpc.aio.AioRpcError as e:
                result.refusals.append((e.code(), e.details() or ""))
                return
            rid = dict(call)["x-reservation-id"]
            await by_id[resp.node.node_id].create(sandbox)
            await stubs[rng.randrange(len(stubs))].RecordAssignment(
                pb.RecordAssignmentRequest(sandbox_id=sandbox, node=resp.node),
                metadata=(("x-reservation-id", rid),),
                timeout=10,
            )
            result.placed[sandbox] = resp.node.node_id
            result.via[sandbox] = replica

        # One placement through each replica while the fleet has room (so a
        # replica no node talks to is seen placing, whatever answers first),
        # then the rest of the burst at once.
        await asyncio.gather(*(gateway(k) for k in range(len(stubs))))
        await asyncio.gather(*(gateway(k) for k in range(len(stubs), CREATES)))
        stop.set()
        await asyncio.gather(*beating)
        await asyncio.gather(*(n.heartbeat() for n in nodes))  # the nodes' final word
        return result, nodes
    finally:
        for ch in channels:
            await ch.close()


async def _with_call(
    stub: pb_grpc.SchedulerStub,
    req: pb.ScheduleRequest,
) -> tuple[pb.ScheduleResponse, list[tuple[str, str]]]:
    call = stub.Schedule(req, timeout=10)
    resp = await call
    return resp, [(k, v) for k, v in await call.trailing_metadata()]


async def lookups(addresses: list[str], sandboxes: list[str]) -> list[dict[str, str]]:
    out = []
    for address in addresses:
        async with grpc.aio.insecure_channel(address) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            replies = await asyncio.gather(
                *(
                    stub.LookupNode(pb.LookupNodeRequest(sandbox_id=s), timeout=10)
                    for s in sandboxes
                )
            )
            out.append({s: r.node.node_id for s, r in zip(sandboxes, replies, strict=True)})
    return out


@pytest.fixture
def replicas(request: pytest.FixtureRequest, real_url: str) -> Iterator[list[ServeProcess]]:
    count: int = request.param
    config = {
        "scheduler": {"node_resource_limit": {"max_sandbox_count": CEILING}},
        "log_level": "warn",
    }
    procs = [ServeProcess(config, real_url, cell="fleet") for _ in range(count)]
    try:
        # (eight interpreters starting at once on a busy two-core host take
        # a while; the deadline bounds a hang, it measures nothing)
        for p in procs:
            p.wait_serving(timeout=30 + 10 * count)
        yield procs
    finally:
        for p in procs:
            p.signal_stop()
        codes = [p.terminate() for p in procs]
    assert codes == [0] * count  # each drained and exited cleanly


@pytest.mark.parametrize(
    ("replicas", "homes"),
    [
        pytest.param(3, [0, 0, 0, 0, 0, 0, 2, 2], id="3-replicas-6/0/2"),
        pytest.param(8, [0, 0, 0, 2, 2, 4, 4, 5], id="8-replicas-3/0/2/0/2/1/0/0"),
    ],
    indirect=["replicas"],
)
def test_ceiling_holds_across_replicas(
    replicas: list[ServeProcess], homes: list[int], real_url: str
) -> None:
    addresses = [p.address for p in replicas]
    result, nodes = asyncio.run(run_fleet(addresses, homes))

    assert len(result.placed) == NODES * CEILING == 80
    assert len(result.refusals) == CREATES - 80 == 120
    assert Counter(result.refusals) == {(grpc.StatusCode.UNAVAILABLE, REFUSAL): 120}
    assert Counter(result.placed.values()) == {n.node_id: CEILING for n in nodes}
    assert all(len(n.node.heartbeat().sandbox_ids) == CEILING for n in nodes)

    views = {v.node_id: v for v in Scheduler.connect(real_url, cell="fleet").nodes()}
    assert {(v.sandbox_count, v.pending_reservations) for v in views.values()} == {(CEILING, 0)}

    every = asyncio.run(lookups(addresses, sorted(result.placed)))
    assert all(answers == result.placed for answers in every)  # every replica agrees

    # Nodes heartbeating only to replica A are placed correctly through replica B.
    home_of = {f"node-{i}": h for i, h in enumerate(homes)}
    foreign = [s for s, node in result.placed.items() if home_of[node] != result.via[s]]
    assert foreign
    silent = [i for i in range(len(replicas)) if i not in homes]  # no node talks to these
    assert silent
    for i in silent:
        assert any(result.via[s] == i for s in result.placed)
