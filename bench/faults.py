"""Scenario ``faults``: Redis faults under load, with the nodes' own state as the truth.

Per scenario: real ``redis-server`` processes (one, or a primary, one replica
and three sentinels), three ``schedctl serve`` replica processes, simulated
runtime nodes heartbeating over gRPC with their rosters (stamped, one at a time,
as the reference reporter sends them), and gateways placing
about 40 creations a second over gRPC with 2 s deadlines, against a ceiling
of ``max_sandbox_count: 10``.  A node takes a while to create a sandbox
(listed in its roster and counted as starting meanwhile), runs it for a
while, and never refuses one: what it holds is what the scheduler let happen.
The fault comes after a few seconds of load:

- ``kill-empty``: kill -9 of Redis, restarted at once without its data;
- ``kill-aof``: kill -9 of Redis running ``appendonly yes``, restarted;
- ``pause``: SIGSTOP of Redis for 5 s (longer than the gateways' deadlines);
- ``replica-kill``: kill -9 of one scheduler replica;
- ``failover-0`` / ``failover-1``: ``SENTINEL FAILOVER`` with
  ``min_replicas_acked`` 0 (a primary and one replica) / 1 (a primary and two
  replicas: one must remain to acknowledge writes after the promotion);
- ``slot-move``: on a 3-primary Redis Cluster, the cell's hash slot migrated
  to another primary (``CLUSTER SETSLOT`` IMPORTING / MIGRATING, ``MIGRATE``
  in batches of 10 keys, then ``SETSLOT NODE``) while the load goes on;
- ``cluster-failover``: on a 3-primary cluster with a replica each,
  ``CLUSTER FAILOVER`` on the replica of the primary that serves the cell;
- ``corrupt``: for ``pause_s`` seconds, four times a second, one corruption
  written with plain Redis commands (``CORRUPTIONS``: a node's sandbox_count
  or pending_count not a number, negative or empty, garbage members of the
  placement index and the expiry set, a live reservation's state
  overwritten, the rotation counter not an integer), as an operator's
  script would; ``doctor_left`` is what ``schedctl doctor`` still finds
  after the settle (the nodes' heartbeats and the scripts heal the rest).
- ``rdb-rollback-20s`` / ``rdb-rollback-120s``: ``BGSAVE`` under load, the
  load goes on 20 s / 120 s, then kill -9 and a restart that loads that
  snapshot (Debian's default persistence: RDB only);
- ``rdb-rollback-replica``: the same at ``min_replicas_acked`` 1 with a
  replica (no Sentinel), the snapshot 20 s old: restarted from it, the
  primary is the one the replica follows, so the replica's newer data is
  replaced by the snapshot (a full resync);
- ``rdb-rollback-sentinel``: ``min_replicas_acked`` 1, a primary, two
  replicas and three sentinels; the snapshot 20 s old, the primary killed
  and kept down until Sentinel promoted a replica (which holds every
  acknowledged write), then restarted from its snapshot: Sentinel makes it
  a replica of the new primary;
- ``lagging-promotion``: ``min_replicas_acked`` 1, a primary and two
  replicas; the one Sentinel prefers (``replica-priority`` 1) replicates
  through a link that holds the primary's stream for 1 s (it stays
  connected and falls behind), then the primary is killed and Sentinel
  promotes the replica that is behind;
- ``clock-skew-ahead`` / ``clock-skew-behind``: ``min_replicas_acked`` 1, a
  primary and two replicas; the preferred replica's wall clock runs 15 min
  ahead / behind (``bench/clockshift.c``, an LD_PRELOAD shim), and
  ``SENTINEL FAILOVER`` promotes it.

What each row reports (invariants first):

- ``peak`` / ``ceiling``: the most sandboxes any node held at once (its own
  count: running + starting) against the ceiling;
- ``acked_missing``: placements answered OK to a gateway whose reservation
  the final primary does not have (a failover at 0, or data loss, may lose
  them; their sandboxes are still counted by the nodes' own numbers);
- ``phantoms``: live reservations no gateway was ever answered, counted
  once the nodes' heartbeats have been answered OK for ``settle`` seconds
  after the load stopped (``settled_after_s`` in the JSON: a cell still
  refusing writes, after a second failover say, applies no heartbeat and
  ends nothing; at most :data:`SETTLE_WAIT_MAX_S`, ``writable`` false if
  the heartbeats were still refused then); ``cut_short``: Schedules a
  killed replica had in flight (each may have left one, which its TTL
  ends: the most phantoms a replica kill may leave); ``stuck``: answered ones still
  live then (after a rollback: those that came back from the past), but
  those whose RecordAssignment the gateway gave up on (``unrecorded``, of
  which ``unrecorded_live`` still pending at the end: the replica that
  refused one for Redis writes it once Redis answers, and one that reached
  no replica is held until ``unassigned_reservation_ttl`` by contract);
- ``rewinds`` / ``rewound``: times the cell settled for data from the past
  or a clock that jumped (stats ``rewinds``), and reservations that came
  back from the past and were ended (stats ``rewound_total``);
- clock skew: ``cell_clock_off_s``: the cell's clock against this host's
  after the failover.  Redis itself expires every key with a TTL by its own
  clock, so on a primary 15 min ahead the tombstones of ended reservations
  (10 min) would vanish and read as lost placements: these rows keep them
  1 h (``reservation_tombstone_ttl``); bindings (30 s) do vanish, and the
  nodes' next heartbeats write them again;
- ``to_first_ok_s``: from the fault to the first successful Schedule that
  started after it (for failovers also ``after_switch_s``: from Sentinel's
  announcement of the new primary);
- ``codes``: gRPC codes the gateways and nodes saw from the fault until it
  was over (``INTERNAL`` must never appear);
- ``health_honest``: every live replica said NOT_SERVING at some point while
  Redis could not take writes (outages over 2 s), and none said SERVING
  during it after a 2 s detection grace; all SERVING at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import grpc
import redis
import redis.asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import clockshift
from bench.runner import Result, machine_own_servers, percentile
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.ops.simnode import SimNode
from scheduler.server.service import heartbeat_request
from scheduler.testing.lag import LaggingLink
from scheduler.testing.redis_server import (
    TILT_S,
    ClusterTopology,
    RedisServer,
    SentinelTopology,
    wait_until,
)
from scheduler.testing.replicas import ServeProcess, close_all

SCENARIOS = (
    "kill-empty",
    "kill-aof",
    "pause",
    "replica-kill",
    "failover-0",
    "failover-1",
    "slot-move",
    "cluster-failover",
    "eviction",
    "corrupt",
    "rdb-rollback-20s",
    "rdb-rollback-120s",
    "rdb-rollback-replica",
    "rdb-rollback-sentinel",
    "lagging-promotion",
    "clock-skew-ahead",
    "clock-skew-behind",
)
#: the clock-skew scenarios: the promoted replica's wall clock offset
SKEW_MS = {"clock-skew-ahead": 15 * 60_000, "clock-skew-behind": -15 * 60_000}
#: the rollbacks at min_replicas_acked 1, with a replica that holds what was acknowledged
ROLLBACK_ACKED = ("rdb-rollback-replica", "rdb-rollback-sentinel")
#: their snapshot's age (s)
ROLLBACK_ACKED_AGE_S = 20.0
#: scenarios at min_replicas_acked 1
ACKED_1 = ("failover-1", "lagging-promotion", *ROLLBACK_ACKED, *SKEW_MS)
#: how long the lagging replica's link holds the primary's stream before the primary dies
LAG_S = 1.0
GIB = 1 << 30
CELL = "faults"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
LIVE = {b"pending", b"assigned", b"acked"}


@dataclass(frozen=True)
class Params:
    scenarios: tuple[str, ...] = SCENARIOS
    nodes: int = 8
    ceiling: int = 10
    replicas: int = 3
    #: creations per second over all gateways, and concurrent gateway workers
    rate: float = 40.0
    gateways: int = 8
    #: a node creates a sandbox this long (starting), then runs it this long
    create_s: float = 0.3
    lifetime_s: float = 1.6
    heartbeat_s: float = 0.5
    deadline_s: float = 2.0
    #: load before the fault, and after it is over
    before_s: float = 3.0
    after_s: float = 6.0
    pause_s: float = 5.0
    #: phantom reservations are counted this long after the load stopped
    settle_s: float = 5.0
    seed: int = 1
    #: the rollback snapshot's age is the scenario's (20 s, 120 s), at most this
    snapshot_cap_s: float | None = None

    @classmethod
    def quick(cls) -> Params:
        # (a rollback of 12 s still outlasts the 10 s grace: every reservation
        # of the snapshot came back from the past)
        return cls(before_s=1.5, after_s=2.5, pause_s=3.5, settle_s=2.0, snapshot_cap_s=12.0)

    def snapshot_age_s(self, scenario: str) -> float:
        if scenario in ROLLBACK_ACKED:
            age = ROLLBACK_ACKED_AGE_S
        else:
            age = float(scenario.removeprefix("rdb-rollback-").removesuffix("s"))
        return age if self.snapshot_cap_s is None else min(age, self.snapshot_cap_s)


# ---------------------------------------------------------------------------
# The fleet: nodes that hold the truth, gateways that place
# ---------------------------------------------------------------------------
def fleet_node(k: int, params: Params) -> SimNode:
    """A node of the fleet (:class:`~scheduler.ops.simnode.SimNode`): 32 CPUs and
    64 GiB; its sandboxes start for ``create_s``, then run for ``lifetime_s``."""
    node_id = f"node-{k + 1:02d}"
    return SimNode(
        node_id,
        32,
        64 * GIB,
        endpoint=f"{node_id}.faults:5007",
        instance=f"{node_id}-boot",
        cluster_id="c1",
        busy_percent=0,
        memory_used_percent=0,
        starting_s=params.create_s,
        lifetime_s=params.lifetime_s,
    )


@dataclass
class Outcome:
    rpc: str
    start: float
    end: float
    code: grpc.StatusCode
    details: str = ""
    #: the replica it went to (-1: none)
    replica: int = -1


def heartbeats_refused_since(outcomes: list[Outcome], since: float) -> bool:
    """Whether a Heartbeat answered anything but OK after ``since``: the cell
    did not apply every heartbeat then, so what a settle ends may still be
    waiting for one."""
    return any(
        o.rpc == "Heartbeat" and o.code != grpc.StatusCode.OK and o.end > since for o in outcomes
    )


class Run:
    """One scenario's load: nodes, gateways and health samples against replicas."""

    def __init__(self, params: Params, addresses: list[str]) -> None:
        self.p = params
        self.addresses = addresses
        self.dead: set[int] = set()
        self.nodes = [fleet_node(k, params) for k in range(params.nodes)]
        self.by_id = {n.node_id: n for n in self.nodes}
        self.outcomes: list[Outcome] = []
        #: reservation id -> node id, for every placement answered OK
        self.acked: dict[str, str] = {}
        #: reservation ids whose RecordAssignment the gateway gave up on (no OK
        #: within its retries; the replicas that refused it write it later)
        self.unrecorded: set[str] = set()
        self.health: list[tuple[float, int, int | None]] = []
        self.stop = asyncio.Event()
        self.channels = [grpc.aio.insecure_channel(a) for a in addresses]
        self.stubs = [pb_grpc.SchedulerStub(c) for c in self.channels]
        self.rng = random.Random(params.seed)
        #: whether heartbeats were all answered OK at the end of the settle
        self.writable = True

    def _replicas_from(self, first: int) -> list[int]:
        n = len(self.stubs)
        order = [(first + i) % n for i in range(n)]
        return [i for i in order if i not in self.dead] or order

    async def _call(
        self,
        rpc: str,
        first: int,
        request: Any,
        timeout: float,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> tuple[Any, Any]:
        """One RPC to the first live replica from ``first``; a replica that is
        gone (connection refused) hands the call to the next, as a load
        balancer would.  Returns (response, call) or raises grpc.aio.AioRpcError."""
        last: grpc.aio.AioRpcError | None = None
        for i in self._replicas_from(first):
            start = time.monotonic()
            call = getattr(self.stubs[i], rpc)(request, timeout=timeout, metadata=metadata)
            try:
                response = await call
            except grpc.aio.AioRpcError as e:
                self.outcomes.append(
                    Outcome(rpc, start, time.monotonic(), e.code(), e.details() or "", i)
                )
                last = e
                if e.code() == grpc.StatusCode.UNAVAILABLE and "Redis" not in (e.details() or ""):
                    continue  # the replica itself is unreachable: try another
                raise
            self.outcomes.append(Outcome(rpc, start, time.monotonic(), grpc.StatusCode.OK, "", i))
            return response, call
        assert last is not None
        raise last

    async def node_loop(self, k: int, node: SimNode) -> None:
        await asyncio.sleep(self.rng.uniform(0, self.p.heartbeat_s))
        while not self.stop.is_set():
            # (stamped with the node's own clock, one at a time, as the reference
            # reporter sends them: unstamped, an assigned reservation whose sandbox
            # ended waits for the node's create_successes to pass every creation in
            # flight at its assignment, which a Schedule the fault cut short, made
            # in Redis and never created, keeps it from once the load stops)
            stamp = time.time_ns() // 1_000_000
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self._call(
                    "Heartbeat",
                    k,
                    heartbeat_request(node.heartbeat(reported_at_unix_ms=stamp)),
                    2.0,
                    (("x-node-endpoint", node.endpoint),),
                )
            await asyncio.sleep(self.p.heartbeat_s)

    async def gateway(self, w: int, t0: float, counter: list[int], until: list[float]) -> None:
        req = pb.ScheduleRequest(
            hint=pb.ScheduleRequestHint(
                new_cold_sandbox=pb.NewColdSandboxHint(cpu_count=1, memory_mb=1024)
            )
        )
        while True:
            i = counter[0]
            counter[0] += 1
            at = t0 + i / self.p.rate
            if at >= until[0]:
                return
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            try:
                resp, call = await self._call("Schedule", i, req, self.p.deadline_s)
            except grpc.aio.AioRpcError:
                continue
            rid = dict(await call.trailing_metadata() or ()).get("x-reservation-id", "")
            node = self.by_id[resp.node.node_id]
            self.acked[str(rid)] = node.node_id
            sandbox_id = f"sbx-{w}-{i}"
            node.create(sandbox_id, 1, GIB)  # (the request's size)
            await self._assign(i + 1, sandbox_id, resp.node, str(rid))

    async def _assign(self, first: int, sandbox_id: str, node: pb.Node, rid: str) -> None:
        """RecordAssignment, retried for a while: a gateway whose record failed
        during an outage tries again (the reservation would otherwise wait
        for its TTL).  The reference gateway makes one attempt; these retry
        for 10 s, and a write outage longer than that (a second failover
        whose primary has no replica to acknowledge writes yet) leaves the
        placement unrecorded."""
        give_up = time.monotonic() + 10
        while time.monotonic() < give_up:
            try:
                await self._call(
                    "RecordAssignment",
                    first,
                    pb.RecordAssignmentRequest(sandbox_id=sandbox_id, node=node),
                    2.0,
                    (("x-reservation-id", rid),),
                )
                return
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.2)
        self.unrecorded.add(rid)

    async def health_loop(self) -> None:
        stubs = [health_pb2_grpc.HealthStub(c) for c in self.channels]
        while not self.stop.is_set():
            for i, stub in enumerate(stubs):
                if i in self.dead:
                    continue
                status: int | None
                try:
                    r = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=0.5)
                    status = r.status
                except grpc.aio.AioRpcError:
                    status = None
                self.health.append((time.monotonic(), i, status))
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        for c in self.channels:
            await c.close()


# ---------------------------------------------------------------------------
# Topologies and faults
# ---------------------------------------------------------------------------
class Topology:
    """The Redis side of one scenario and its fault."""

    def __init__(self, scenario: str, params: Params) -> None:
        self.scenario = scenario
        self.params = params
        self.sentinels: SentinelTopology | None = None
        self.server: RedisServer | None = None
        self.cluster: ClusterTopology | None = None
        self.switched_at: float | None = None
        self.slot = 0
        self.corruptions = 0
        self.link: LaggingLink | None = None
        self.tilts_before = 0
        #: rdb-rollback-replica's replica
        self.replica: RedisServer | None = None
        if scenario in ("slot-move", "cluster-failover"):
            self.cluster = ClusterTopology(3, 1 if scenario == "cluster-failover" else 0)
        elif scenario.startswith("failover"):
            # min_replicas_acked 1 needs a replica left after the promotion (the old
            # primary rejoins as one only about 10 s later): a second replica
            self.sentinels = SentinelTopology(
                replicas=2 if scenario == "failover-1" else 1, sentinels=3
            )
        elif scenario == "lagging-promotion":
            # (failover-timeout: Sentinel re-points a replica whose primary is another
            # address, the link, only that long after it last changed)
            self.sentinels = SentinelTopology(replicas=2, sentinels=3, failover_timeout_ms=120_000)
            preferred = self.sentinels.replicas[1]
            self.link = LaggingLink(self.sentinels.primary.port)
            preferred.extra_args = (
                *preferred.extra_args[:-1],
                str(self.link.port),
                "--replica-priority",
                "1",
            )
        elif scenario == "rdb-rollback-replica":
            # (no Sentinel: the replica follows its primary, restarted or not)
            # (a replica attaches at once, as in SentinelTopology: Redis's default
            # waits 5 s for more replicas to share a full sync, writes held meanwhile)
            self.server = RedisServer(extra_args=["--repl-diskless-sync-delay", "0"])
            self.replica = RedisServer(
                extra_args=["--replicaof", "127.0.0.1", str(self.server.port)]
            )
        elif scenario == "rdb-rollback-sentinel":
            # (two replicas, as failover-1: one acknowledges writes after the promotion)
            self.sentinels = SentinelTopology(replicas=2, sentinels=3)
        elif scenario in SKEW_MS:
            self.sentinels = SentinelTopology(replicas=2, sentinels=3)
            preferred = self.sentinels.replicas[1]
            preferred.extra_args = (*preferred.extra_args, "--replica-priority", "1")
            preferred.env = clockshift.environment(SKEW_MS[scenario])
        else:
            extra = ["--appendonly", "yes"] if scenario == "kill-aof" else []
            if scenario == "eviction":  # (a managed Redis's default)
                extra = ["--maxmemory-policy", "allkeys-lru"]
            self.server = RedisServer(extra_args=extra)

    def start(self) -> Topology:
        if self.cluster is not None:
            self.cluster.start()
            self.slot = self.cluster.keyslot(f"sched:{{{CELL}}}:policy")
        elif self.sentinels is not None:
            if self.link is not None:
                self.link.start()
            self.sentinels.start()
        else:
            assert self.server is not None
            self.server.start()
            if self.replica is not None:
                self.replica.start()
                with self.replica.client() as c:
                    wait_until(
                        lambda: c.info("replication")["master_link_status"] == "up",
                        30,
                        "the replica in sync",
                    )
        return self

    @property
    def url(self) -> str:
        if self.cluster is not None:
            return self.cluster.url
        if self.sentinels is not None:
            return self.sentinels.url
        assert self.server is not None
        return self.server.url

    def primary(self) -> Any:
        if self.cluster is not None:
            return self.cluster.slot_owner(self.slot).client()
        if self.sentinels is not None:
            return self.sentinels.server(self.sentinels.primary_port()).client()
        assert self.server is not None
        return self.server.client()

    async def watch_switch(self) -> None:
        """Note when Sentinel announces a new primary (failover scenarios)."""
        if self.sentinels is None:
            return
        client = redis.asyncio.Redis(port=self.sentinels.sentinel_ports[0])
        pubsub: Any = client.pubsub()
        try:
            await pubsub.subscribe("+switch-master")
            async for message in pubsub.listen():
                if message.get("type") == "message" and self.switched_at is None:
                    self.switched_at = time.monotonic()
        finally:
            await pubsub.aclose()
            await client.aclose()

    def inject(self, replicas: list[ServeProcess], run: Run) -> tuple[float, float]:
        """Apply the fault (blocking); returns (fault start, fault over)."""
        if self.sentinels is not None:
            # (a sentinel in TILT acts on nothing for 30 s: on a loaded host one
            # enters it often; the fault waits until none is, and the row
            # reports the TILTs that came during it)
            self.sentinels.wait_untilted()
            self.tilts_before = self.sentinels.tilts()
        start = time.monotonic()
        s = self.scenario
        if s == "rdb-rollback-sentinel":
            assert self.sentinels is not None
            old = self.sentinels.primary
            with old.client() as admin:
                admin.bgsave()
                while int(admin.info("persistence")["rdb_bgsave_in_progress"]):
                    time.sleep(0.01)
            time.sleep(self.params.snapshot_age_s(s))  # the load goes on
            start = time.monotonic()
            old.kill()  # down longer than down-after: Sentinel promotes a replica
            wait_until(lambda: self.sentinels_primary() != old.port, 60 + TILT_S, "promoted")
            new = self.sentinels.server(self.sentinels_primary())
            with new.client() as c:
                wait_until(lambda: c.info("replication")["role"] == "master", 60, "a primary")
            old.start()  # it loads its snapshot; Sentinel turns it into a replica
            with old.client() as c:
                wait_until(
                    lambda: c.info("replication").get("master_link_status") == "up",
                    60 + TILT_S,
                    "the old primary a replica of the new one",
                )
        elif s.startswith("rdb-rollback"):
            assert self.server is not None
            admin = self.server.client()
            admin.bgsave()
            while int(admin.info("persistence")["rdb_bgsave_in_progress"]):
                time.sleep(0.01)
            admin.close()
            time.sleep(self.params.snapshot_age_s(s))  # the load goes on
            start = time.monotonic()
            self.server.kill()
            self.server.start()  # it loads the snapshot
            if self.replica is not None:
                # the fault is over once the replica resynced to the snapshot
                with self.replica.client() as c:

                    def resynced() -> bool:
                        info = c.info("replication")
                        return bool(
                            info["master_link_status"] == "up"
                            and info.get("master_sync_in_progress", 0) == 0
                        )

                    wait_until(resynced, 60, "the replica resynced")
        elif s == "lagging-promotion":
            assert self.sentinels is not None and self.link is not None
            behind = self.sentinels.replicas[1]
            self.link.hold()  # connected, and behind from now on
            time.sleep(LAG_S)
            self.sentinels.primary.kill()
            self.link.cut()  # what it held never arrives
            wait_until(lambda: self.sentinels_primary() == behind.port, 60, "promoted")
            with behind.client() as c:
                wait_until(lambda: c.info("replication")["role"] == "master", 60, "a primary")
        elif s in SKEW_MS:
            assert self.sentinels is not None
            new = self.sentinels.failover()
            assert new.port == self.sentinels.replicas[1].port, "the skewed replica promoted"
        elif s in ("kill-empty", "kill-aof"):
            assert self.server is not None
            self.server.kill()
            if s == "kill-empty":
                self.server.wipe()
            self.server.start()
        elif s == "pause":
            assert self.server is not None
            self.server.pause()
            time.sleep(self.params.pause_s)
            self.server.resume()
        elif s == "eviction":
            # maxmemory just above what the cell uses, then other keys: Redis
            # evicts the least recently used, the cell's among them
            assert self.server is not None
            admin = self.server.client()
            used = int(admin.info("memory")["used_memory"])
            admin.config_set("maxmemory", used + (1 << 20))
            filler = admin.pipeline(transaction=False)
            for i in range(8_000):
                filler.set(f"filler:{i}", "x" * 512)
            filler.execute()
            time.sleep(self.params.pause_s)
            admin.config_set("maxmemory", 0)
            admin.close()
        elif s == "corrupt":
            assert self.server is not None
            admin = self.server.client()
            rng = random.Random(self.params.seed)
            until = time.monotonic() + self.params.pause_s
            while time.monotonic() < until:
                kind = CORRUPTIONS[self.corruptions % len(CORRUPTIONS)]
                _corrupt(admin, kind, rng, [n.node_id for n in run.nodes])
                self.corruptions += 1
                time.sleep(0.25)
            admin.close()
        elif s == "replica-kill":
            run.dead.add(0)
            replicas[0].proc.kill()
            replicas[0].proc.wait()
        elif s == "slot-move":
            assert self.cluster is not None
            source = self.cluster.slot_owner(self.slot)
            target = next(p for p in self.cluster.primaries() if p.port != source.port)
            self.cluster.migrate_slot(self.slot, target, batch=10, between=lambda: time.sleep(0.02))
        elif s == "cluster-failover":
            assert self.cluster is not None
            self.cluster.failover(self.slot)
        else:
            assert self.sentinels is not None
            self.sentinels.failover()
        return start, time.monotonic()

    def sentinels_primary(self) -> int:
        assert self.sentinels is not None
        return self.sentinels.primary_port()

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
        if self.sentinels is not None:
            self.sentinels.close()
        if self.link is not None:
            self.link.close()
        if self.replica is not None:
            self.replica.close()
        if self.server is not None:
            self.server.close()


#: what the ``corrupt`` scenario writes, in turn (docs/operations.md "Corrupt state")
CORRUPTIONS = (
    "sandbox_count abc",
    "pending_count abc",
    "idx-shapes garbage",
    "sandbox_count -5",
    "idx-cpu garbage",
    "reservation state",
    "pending_count -1",
    "idx-bucket ghost",
    "sandbox_count empty",
    "expiry ghost",
    "rr abc",
    "idx-seen ghost",
)


def _corrupt(admin: Any, kind: str, rng: random.Random, node_ids: list[str]) -> None:
    """Write one corruption of ``kind`` into the cell with plain commands."""
    base = f"sched:{{{CELL}}}:"
    node = base + "node:" + rng.choice(node_ids)
    if kind.startswith(("sandbox_count", "pending_count")):
        field, value = kind.split(" ")
        admin.hset(node, field, "" if value == "empty" else value)
    elif kind == "idx-shapes garbage":
        admin.sadd(base + "idx-shapes", "zz")
    elif kind in ("idx-cpu garbage", "idx-bucket ghost"):
        bucket = admin.hget(node, "idx")
        if bucket:
            b = bucket.decode()
            if kind == "idx-cpu garbage":
                shape = ":".join(b.split(":")[1:3])
                admin.zadd(base + "idx-cpu:" + shape, {"not-a-bucket": 0})
            else:
                admin.zadd(base + "idx-bucket:" + b, {"ghost": 0})
    elif kind == "reservation state":
        live = admin.zrange(base + "expiry", 0, 0)
        if live:
            admin.hset(base + "res:" + live[0].decode(), "state", "bogus")
    elif kind == "expiry ghost":
        admin.zadd(base + "expiry", {"ghost": 1})
    elif kind == "rr abc":
        admin.set(base + "rr", "abc")
    elif kind == "idx-seen ghost":
        admin.zadd(base + "idx-seen", {"ghost": 1})


def _doctor_left(url: str) -> str:
    """What ``schedctl doctor`` still finds in the cell, by check."""
    from scheduler.client.sync import Scheduler
    from scheduler.ops.doctor import doctor

    s = Scheduler.connect(url, cell=CELL)
    try:
        left = Counter(f.check for f in doctor(s).findings)
    finally:
        s.close()
    return ", ".join(f"{k} {v}" for k, v in sorted(left.items())) or "none"


def _replica_config(
    params: Params, acked: int, allow_eviction: bool = False, tombstones: str = ""
) -> dict[str, Any]:
    return {
        "scheduler": {
            "node_resource_limit": {"max_sandbox_count": params.ceiling},
            "min_replicas_acked": acked,
            **({"allow_eviction": True} if allow_eviction else {}),
            **({"reservation_tombstone_ttl": tombstones} if tombstones else {}),
        }
    }


def _refused_at_start(params: Params, url: str) -> str:
    """The eviction scenario: a replica without allow_eviction must refuse to
    start; its last log line ("" when it started)."""
    p = ServeProcess(_replica_config(params, 0), url, cell=CELL)
    try:
        p.wait_serving(30)
    except RuntimeError:
        lines = [x for x in p.log().splitlines() if x.strip()]
        return lines[-1] if lines else "exited"
    finally:
        p.close(10)
    return ""


async def _drive(params: Params, topo: Topology, replicas: list[ServeProcess]) -> dict[str, Any]:
    run = Run(params, [r.address for r in replicas])
    watcher = asyncio.create_task(topo.watch_switch())
    tasks = [asyncio.create_task(run.node_loop(k, n)) for k, n in enumerate(run.nodes)]
    tasks.append(asyncio.create_task(run.health_loop()))
    await asyncio.sleep(params.heartbeat_s * 2)  # every node heard of before the load
    t0 = time.monotonic()
    counter = [0]
    loop_end = (
        t0 + params.before_s + params.after_s + (params.pause_s if topo.scenario == "pause" else 0)
    )
    if topo.scenario.startswith("rdb-rollback"):
        loop_end += params.snapshot_age_s(topo.scenario)
    # (the load goes on while the fault lasts, and after_s past its end: a Sentinel
    # election may outlast the planned load)
    until = [float("inf")]
    gateways = [
        asyncio.create_task(run.gateway(w, t0, counter, until)) for w in range(params.gateways)
    ]
    await asyncio.sleep(params.before_s)
    fault_start, fault_end = await asyncio.to_thread(topo.inject, replicas, run)
    until[0] = max(loop_end, time.monotonic() + params.after_s)
    # the load goes on for after_s past the fault (the gateways stop at loop_end)
    await asyncio.gather(*gateways)
    load_end = time.monotonic()
    # Nodes keep heartbeating: reservations settle.  The settle is counted from
    # when the cell takes writes again: while Redis refuses them (a second
    # failover, min_replicas_acked with no replica attached yet) no heartbeat
    # is applied and nothing can end, which is the write outage, not a
    # reservation the settle left behind.
    settled_by = load_end + SETTLE_WAIT_MAX_S
    while True:
        await asyncio.sleep(params.settle_s)
        refused = heartbeats_refused_since(run.outcomes, time.monotonic() - params.settle_s)
        if not refused or time.monotonic() >= settled_by:
            break
    run.writable = not refused
    run.stop.set()
    await asyncio.gather(*tasks)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    await run.close()
    return _measure(params, topo, run, fault_start, fault_end, load_end)


def _measure(
    params: Params, topo: Topology, run: Run, fault_start: float, fault_end: float, load_end: float
) -> dict[str, Any]:
    settled_at = time.monotonic()
    primary = topo.primary()
    base = f"sched:{{{CELL}}}:"
    missing = 0
    for rid in run.acked:
        if not primary.exists(base + f"res:{rid}"):
            missing += 1
    stats = primary.hgetall(base + "stats")
    cell_clock_off = None
    if topo.scenario in SKEW_MS:
        policy = primary.hgetall(base + "policy")
        raw_s, raw_us = primary.time()
        offset = int(policy.get(b"time_offset_ms", 0))
        cell_ms = int(raw_s) * 1000 + int(raw_us) // 1000 + offset
        cell_clock_off = round(cell_ms / 1000 - time.time(), 1)
    phantoms = stuck = unrecorded_live = 0
    #: the stuck ones by state, and whether a replica wrote them back (lua/replay-5.lua)
    stuck_kinds: Counter[str] = Counter()
    for key in primary.scan_iter(match=base + "res:*", count=1000):
        state = primary.hget(key, "state")
        if state in LIVE:
            rid = key.decode().rsplit(":", 1)[1]
            if rid in run.unrecorded and state == b"pending":
                # (never answered OK: not written yet by the replicas that
                # refused it, or it reached none; the settle cannot end it)
                unrecorded_live += 1
            elif rid in run.acked:
                stuck += 1
                replayed = primary.hget(key, "replayed") == b"1"
                stuck_kinds[state.decode() + (" written back" if replayed else "")] += 1
            else:
                phantoms += 1
    primary.close()
    schedules = [o for o in run.outcomes if o.rpc == "Schedule"]
    firsts = [o.end for o in schedules if o.code == grpc.StatusCode.OK and o.start >= fault_start]
    after_switch = None
    if topo.switched_at is not None:
        ok = [
            o.end for o in schedules if o.code == grpc.StatusCode.OK and o.start >= topo.switched_at
        ]
        after_switch = round(min(ok) - topo.switched_at, 3) if ok else None
    # Schedules a killed replica had in flight: Redis may have written their
    # reservations, and no one answered them (design.md: a replica killed
    # mid-request leaves at most such a reservation, which its TTL clears)
    cut_short = sum(
        1
        for o in schedules
        if o.replica in run.dead and o.code != grpc.StatusCode.OK and o.start < fault_end
    )
    window = [o for o in run.outcomes if fault_start <= o.start <= fault_end + 2.0]
    codes = Counter(o.code.name for o in window)
    every_code = Counter(o.code.name for o in run.outcomes)
    after_codes = Counter(f"{o.rpc} {o.code.name}" for o in run.outcomes if o.start >= fault_start)
    peak = max(n.peak_sandboxes for n in run.nodes)
    latencies = [o.end - o.start for o in schedules if o.code == grpc.StatusCode.OK]
    # (whether the cell took writes again before the settle ended: a stuck
    # reservation of a cell still refusing heartbeats is one nothing could end)
    refused = [o for o in run.outcomes if o.code != grpc.StatusCode.OK and o.start >= fault_start]
    settle_refused = [o for o in refused if o.rpc == "Heartbeat" and o.end > load_end]
    details = Counter(o.details[:160] for o in refused)
    return {
        "scenario": topo.scenario,
        "peak": peak,
        "ceiling": params.ceiling,
        "ceiling_held": peak <= params.ceiling,
        "placed": len(run.acked),
        "acked_missing": missing,
        "phantoms": phantoms,
        "cut_short": cut_short,
        "stuck": stuck,
        "stuck_kinds": dict(stuck_kinds),
        "unrecorded": len(run.unrecorded),
        "unrecorded_live": unrecorded_live,
        "rewinds": int(stats.get(b"rewinds", 0)),
        "rewound": int(stats.get(b"rewound_total", 0)),
        "cell_clock_off_s": cell_clock_off,
        "to_first_ok_s": round(min(firsts) - fault_start, 3) if firsts else None,
        "after_switch_s": after_switch,
        "fault_s": round(fault_end - fault_start, 3),
        "codes": ", ".join(f"{k} {v}" for k, v in sorted(codes.items())),
        "internal": every_code.get("INTERNAL", 0),
        "after_codes": dict(after_codes),
        "fault_to_load_end_s": round(load_end - fault_start, 2),
        "health_honest": _health_honest(topo.scenario, run, fault_start, fault_end),
        "schedule_p50_ms": round(percentile(latencies, 50) * 1000, 2) if latencies else None,
        "schedule_p99_ms": round(percentile(latencies, 99) * 1000, 2) if latencies else None,
        "peaks": {n.node_id: n.peak_sandboxes for n in run.nodes},
        "load_s": round(load_end - fault_start + params.before_s, 1),
        "settle_refused": len(settle_refused),
        # (the settle's length: settle_s once heartbeats were all answered OK
        # for that long; writable false: they were not within SETTLE_WAIT_MAX_S)
        "settled_after_s": round(settled_at - load_end, 2),
        "writable": run.writable,
        "last_refused_s": round(max(o.end for o in refused) - load_end, 2) if refused else None,
        "refused_details": dict(details.most_common(3)),
    }


#: how long after the load the settle may wait for the cell to take writes
#: again (heartbeats answered OK for settle_s): Sentinel re-attaching a replica
#: after a second failover took about 10 s here under load
SETTLE_WAIT_MAX_S = 60.0

#: how long a replica may take to notice that Redis stopped taking writes: its
#: monitor probes every second with a 1 s timeout (a failing call wakes it at once)
GRACE_S = 2.5
REDIS_DOWN = ("kill-empty", "kill-aof", "pause")


def _health_honest(scenario: str, run: Run, fault_start: float, fault_end: float) -> bool:
    """Every live replica SERVING at the end; and while Redis could not take
    writes for longer than the grace, each said NOT_SERVING, and none said
    SERVING after the grace.

    "At the end" is the last answer a replica gave, which must come after the
    fault: a health check that timed out (None, on a machine too busy to
    answer within 0.5 s) is no answer, not a NOT_SERVING."""
    live = [i for i in range(len(run.addresses)) if i not in run.dead]
    last = {i: (t, s) for t, i, s in run.health if s is not None}
    if any(i not in last or last[i][0] < fault_end or last[i][1] != SERVING for i in live):
        return False
    if scenario not in REDIS_DOWN or fault_end - fault_start <= GRACE_S:
        return True
    for i in live:
        samples = [(t, s) for t, j, s in run.health if j == i and fault_start <= t <= fault_end]
        if NOT_SERVING not in [s for _, s in samples]:
            return False
        if any(s == SERVING for t, s in samples if t > fault_start + GRACE_S):
            return False
    return True


def _error_lines(replicas: list[ServeProcess], most: int = 80) -> list[str]:
    """The replicas' log lines from the first error on (its traceback), at
    most ``most`` of them."""
    out: list[str] = []
    for i, r in enumerate(replicas):
        lines = r.log().splitlines()
        first = next((k for k, x in enumerate(lines) if " ERROR " in x or "Traceback" in x), None)
        if first is not None:
            out += [f"replica {i}: {x}" for x in lines[first : first + most - len(out)]]
    return out


def run_scenario(params: Params, scenario: str) -> dict[str, Any]:
    topo = Topology(scenario, params).start()
    replicas: list[ServeProcess] = []
    try:
        acked = 1 if scenario in ACKED_1 else 0
        evicting = scenario == "eviction"
        refusal = _refused_at_start(params, topo.url) if evicting else ""
        replicas = [
            ServeProcess(
                _replica_config(params, acked, evicting, "1h" if scenario in SKEW_MS else ""),
                topo.url,
                cell=CELL,
            )
            for _ in range(params.replicas)
        ]
        for r in replicas:
            r.wait_serving(120)  # (a start takes 30 s on a machine this loaded)
        row = asyncio.run(_drive(params, topo, replicas))
        row["replica_exits"] = [r.proc.poll() for r in replicas]
        if row.get("internal"):
            # (what the replicas logged of it: an INTERNAL answer says only
            # "see the replica's log", which goes with the replica)
            row["internal_log"] = _error_lines(replicas)
        if scenario == "corrupt":
            row["corruptions"] = topo.corruptions
            row["doctor_left"] = _doctor_left(topo.url)
        if scenario.startswith("rdb-rollback"):
            row["snapshot_age_s"] = params.snapshot_age_s(scenario)
        if topo.sentinels is not None:
            row["tilts"] = topo.sentinels.tilts() - topo.tilts_before
        if evicting:
            # refused at start without allow_eviction; with it, each replica's log
            # and sched_redis_evicted_keys say that keys went
            row["refused_at_start"] = refusal
            row["evicted_keys"] = int(topo.primary().info("stats")["evicted_keys"])
            row["evictions_reported"] = sum(
                1
                for r in replicas
                if "evicted" in r.log() and "keys since the last check" in r.log()
            )
        return row
    finally:
        close_all(replicas, 10)  # (and their directories: config and log, read above)
        topo.close()


COLUMNS = [
    "scenario",
    "peak",
    "ceiling",
    "placed",
    "acked_missing",
    "phantoms",
    "stuck",
    "rewinds",
    "rewound",
    "to_first_ok_s",
    "after_switch_s",
    "health_honest",
    "tilts",
    "codes",
]


def run(params: Params) -> Result:
    rows = []
    for scenario in params.scenarios:
        try:
            row = run_scenario(params, scenario)
        except Exception as e:  # (the harness could not make the fault: say so, go on)
            row = {"scenario": scenario, "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
    notes = [
        f"{params.nodes} nodes, ceiling max_sandbox_count {params.ceiling}, {params.replicas} "
        f"replica processes, {params.rate:g} creations/s by {params.gateways} gateways with "
        f"{params.deadline_s:g} s deadlines; a sandbox starts for {params.create_s:g} s and "
        f"runs {params.lifetime_s:g} s; heartbeats every {params.heartbeat_s:g} s.",
        "peak: the most sandboxes a node itself held (running + starting); acked_missing: "
        "placements answered OK whose reservation the final primary lacks; phantoms: live "
        "reservations no gateway was answered; stuck: answered ones still live "
        f"once heartbeats were answered OK for {params.settle_s:g} s after the load.",
    ]
    notes += [f"{r['scenario']}: not measured ({r['error']})" for r in rows if "error" in r]
    return Result(
        scenario="faults",
        columns=COLUMNS,
        rows=rows,
        params=asdict(params),
        machine=machine_own_servers(),
        notes=notes,
    )
