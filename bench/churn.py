"""Scenario ``churn``: short-lived sandboxes, lost events, failed and missing
creates, with the nodes' own state as the truth (issue #28's measurement).

Per setting: one real ``redis-server``, three ``schedctl serve`` replica
processes, simulated runtime nodes (:class:`~scheduler.ops.simnode.SimNode`) and
gateways, all over gRPC:

- **nodes** heartbeat every ``heartbeat_s`` (5 s, the reporter's default
  ``interval_secs``), one call at a time, each stamped
  (``reported_at_unix_ms``, the wall clock), with their whole roster, as the reference system's
  node reporter does (its whole sandbox store every time; in ``counter``
  mode no roster, only the counters), each
  heartbeat through the next replica (a load balancer's rotation).  Their
  lifecycle events (CREATE once a created sandbox runs, when the create
  returns; DELETE when a sandbox ended) go as ReportSandboxEvent batches,
  best-effort like the reporter's (no retry; a share ``lost`` of them is
  dropped, as a lagged broadcast receiver drops them).
- **gateways** behave as the reference gateway: Schedule (no reservation id
  kept: the reference gateway never reads ``x-reservation-id``), the create
  forwarded to the node, then RecordAssignment(sandbox, node).  A create that
  fails records nothing (the node counts ``create_fails``); a share of
  Schedules is never followed by a create at all (the reference gateway
  calls Schedule before the node authenticates the request).
- **sandboxes** start for ``create_s`` (listed in the roster and counted as
  starting meanwhile; the gateway's create call returns then), then run for
  a lifetime drawn from two ranges: short (0.5-3 s) and long (30-300 s,
  scaled by ``long_scale`` so that a CI-sized run sees them end too).

What each row reports, from the nodes' truth against the scheduler's view:

- ``peak`` / ``ceiling``: the most sandboxes a node itself held at once;
  ``violations``: creates that took a node over the ceiling;
- ``held_mean`` / ``held_peak``: capacity held by creations that are gone,
  sampled every ``sample_s``: summed over nodes, the scheduler's count of a
  node (its last heartbeat's running + starting, plus its live
  reservations) less what the node really holds, where positive.
  ``allowance``: one heartbeat interval's worth of the fleet's creations
  (placements per ``heartbeat_s``), the most the issue's target allows;
- ``refused_room`` (and in percent of Schedules): Schedules refused while
  some node's own truth had room under the ceiling;
- ``refused_reported_room``: of those, refused while some node's own reports
  had room (the sandboxes of its stored heartbeat, those it made since, and
  creates on their way to it, under the ceiling): room the scheduler could
  have known of; those ended since the node's last heartbeat are not (an
  aid to the reading, not the issue's target, which is ``refused_room``);
- ``by_*``: each refusal with room attributed to the cause holding the most
  of the room its nodes' truth had (summed over the nodes whose truth had
  room, read from Redis and the nodes at the refusal, :data:`CAUSES`);
  ``room_held`` in the JSON: those slots summed per cause over all such
  refusals;
- ``held_by`` in the JSON: the difference ``held`` samples split by the
  same causes, per sample (its sum is ``held_mean`` less the nodes counted
  under their truth);
- ``live_end``: reservations still live when the load stopped;
- ``assign_lag_p99_s`` / ``_max_s``: from a Schedule sent to its
  RecordAssignment answered, less the create's own time (what the
  scheduler's replicas add to a creation's way to its assignment).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc
import redis

from bench.runner import Result, machine_own_servers, percentile
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.ops.simnode import SimNode
from scheduler.server.service import RESERVATION_METADATA, heartbeat_request
from scheduler.store.keys import CellKeys
from scheduler.testing.redis_server import RedisServer
from scheduler.testing.replicas import ServeProcess, close_all

GIB = 1 << 30
CELL = "churn"
MODES = ("roster", "counter")
EVENT_TYPES = {
    "CREATE": pb.SANDBOX_EVENT_TYPE_CREATE,
    "DELETE": pb.SANDBOX_EVENT_TYPE_DELETE,
}
#: the reference node reporter's timeout of every RPC, and the reference
#: gateway's of RecordAssignment
REPORTER_TIMEOUT_S = 10.0
ASSIGN_TIMEOUT_S = 5.0
#: What can hold a slot the node's own truth does not, at a refusal with room
#: (the scheduler's view of a node less what the node holds, per cause):
#:
#: - ``gone_assigned``: an assigned reservation whose sandbox is gone, not yet
#:   ended (its DELETE lost; the two-heartbeat rule has not released it yet);
#: - ``never``: an unassigned reservation of a Schedule never followed by a
#:   create, waiting for ``unassigned_reservation_ttl``;
#: - ``failed``: an unassigned reservation of a failed create, waiting for the
#:   ``create_fails`` rise (or the TTL);
#: - ``hb_lag``: sandboxes the node's last heartbeat counted that have ended
#:   since (the next heartbeat says so);
#: - ``listed``: a live sandbox counted twice, by the last heartbeat and by its
#:   reservation (not yet released by a roster or counter that includes it);
#: - ``gone_unassigned``: an unassigned reservation whose creation ran and
#:   ended (its assignment took another reservation, or never came);
#: - ``swapped``: an unassigned reservation whose creation runs under another
#:   reservation (its assignment, which names none, took the node's oldest
#:   unclaimed one: a never-created or failed placement's); it stands for that
#:   one until ``unassigned_reservation_ttl``;
#: - ``in_flight``: the bench's truth, not the scheduler: a placement answered
#:   whose create has not reached the node yet (its slot is promised, the
#:   node's truth does not hold it yet);
#: - ``other``: the rest of the difference (negative: the scheduler counted
#:   less than the node holds).
CAUSES = (
    "gone_assigned",
    "never",
    "failed",
    "hb_lag",
    "listed",
    "gone_unassigned",
    "swapped",
    "in_flight",
    "other",
)


@dataclass(frozen=True)
class Params:
    nodes: int = 8
    ceiling: int = 8
    replicas: int = 3
    #: load per setting
    seconds: float = 45.0
    #: creations per second over all gateways, and gateway workers
    rate: float = 5.0
    gateways: int = 8
    heartbeat_s: float = 5.0
    create_s: float = 0.3
    short_s: tuple[float, float] = (0.5, 3.0)
    long_s: tuple[float, float] = (30.0, 300.0)
    #: the share of sandboxes that live long, and the factor their lifetimes
    #: are scaled by (CI-sized runs: 0.1, so 3-30 s)
    long_share: float = 0.2
    long_scale: float = 0.1
    losses: tuple[float, ...] = (0.0, 0.1, 1.0)
    modes: tuple[str, ...] = ("roster",)
    create_fail: float = 0.02
    never_created: float = 0.02
    deadline_s: float = 2.0
    sample_s: float = 0.25
    #: the replicas' ``unassigned_reservation_ttl`` (None: the default)
    unassigned_ttl_s: float | None = None
    seed: int = 1

    @classmethod
    def quick(cls) -> Params:
        return cls(seconds=6.0, heartbeat_s=1.0, losses=(0.0, 1.0))


@dataclass
class Tally:
    schedules: int = 0
    placed: int = 0
    refused: int = 0
    refused_room: int = 0
    #: of those, refused while a node's own reports had room (its ended
    #: sandboxes reported by a heartbeat; the bench's, not the issue's, target)
    refused_reported_room: int = 0
    errors: int = 0
    created: int = 0
    failed: int = 0
    never: int = 0
    violations: int = 0
    #: refusals with room, by the cause that held the most of the room
    by_cause: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    #: the slots each cause held on the nodes with room, summed over refusals
    room_held: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    held: list[int] = field(default_factory=list)
    #: the scheduler's count less the nodes' truth by cause, summed over the
    #: nodes and the samples (``held_by`` in the JSON: the mean per sample)
    held_by: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    #: of the gone_assigned reservations on nodes with room at a refusal: the
    #: seconds since their assignment, and how many of their node's heartbeats
    #: were answered since it (0, 1, 2, 3 or more)
    gone_age: list[float] = field(default_factory=list)
    gone_beats: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    #: seconds from a Schedule sent to its RecordAssignment answered, less the
    #: create's own time: what the scheduler adds to a creation's way
    assign_lag: list[float] = field(default_factory=list)


class Run:
    """One setting's load against the replicas at ``addresses``."""

    def __init__(self, p: Params, mode: str, lost: float, addresses: list[str], url: str) -> None:
        self.p = p
        self.mode = mode
        self.lost = lost
        self.rng = random.Random(f"{p.seed}-{mode}-{lost}")
        self.nodes = [
            SimNode(
                f"node-{k + 1:02d}",
                32,
                64 * GIB,
                endpoint=f"node-{k + 1:02d}.churn:5007",
                instance=f"node-{k + 1:02d}-boot",
                busy_percent=0,
                memory_used_percent=0,
                starting_s=p.create_s,
                record_events=True,
            )
            for k in range(p.nodes)
        ]
        self.by_id = {n.node_id: n for n in self.nodes}
        self.channels = [grpc.aio.insecure_channel(a) for a in addresses]
        self.stubs = [pb_grpc.SchedulerStub(c) for c in self.channels]
        self.redis = redis.Redis.from_url(url)
        self.keys = CellKeys(CELL)
        self.stop = asyncio.Event()
        self.tally = Tally()
        self.seq = 0
        #: the count the last node :meth:`causes` read had reported
        self.reported = 0
        #: reservation id -> what its gateway did with it: "in_flight" (the
        #: create not at the node yet), "never", "failed", or the sandbox id
        self.fate: dict[str, str] = {}
        #: node id -> stamp -> the sandboxes that heartbeat counted (the last few)
        self.sent_seen: dict[str, dict[int, frozenset[str]]] = {}
        #: node id -> wall-clock times (ms) its heartbeats were answered OK
        self.answered: dict[str, list[int]] = {}

    def lifetime(self) -> float:
        if self.rng.random() < self.p.long_share:
            return self.rng.uniform(*self.p.long_s) * self.p.long_scale
        return self.rng.uniform(*self.p.short_s)

    def stub(self) -> pb_grpc.SchedulerStub:
        self.seq += 1
        return self.stubs[self.seq % len(self.stubs)]

    def room(self) -> bool:
        """Does some node's own truth have room under the ceiling?"""
        return any(n.count() < self.p.ceiling for n in self.nodes)

    # -- the nodes ----------------------------------------------------------
    async def heartbeats(self, node: SimNode) -> None:
        await asyncio.sleep(self.rng.uniform(0, self.p.heartbeat_s))
        while not self.stop.is_set():
            # (stamped from the wall clock once the snapshot is taken, one call
            # at a time, as the reference reporter does)
            seen = node.observe()
            stamp = int(time.time() * 1000)
            hb = node.heartbeat(seen, roster=self.mode == "roster", reported_at_unix_ms=stamp)
            sent = self.sent_seen.setdefault(node.node_id, {})
            sent[stamp] = frozenset(seen.sandboxes)
            for old in sorted(sent)[:-4]:
                del sent[old]
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.stub().Heartbeat(
                    heartbeat_request(hb),
                    timeout=REPORTER_TIMEOUT_S,
                    metadata=(("x-node-endpoint", node.endpoint),),
                )
                self.answered.setdefault(node.node_id, []).append(int(time.time() * 1000))
            await asyncio.sleep(self.p.heartbeat_s)

    async def events(self, node: SimNode) -> None:
        while not self.stop.is_set():
            await asyncio.sleep(0.1)
            kept = [e for e in node.take_events() if self.rng.random() >= self.lost]
            if not kept:
                continue
            req = pb.ReportSandboxEventRequest(
                node_id=node.node_id,
                service_instance_id=node.instance,
                events=[
                    pb.SandboxEvent(
                        sandbox_id=sb,
                        event_type=EVENT_TYPES[kind],
                        requested_cpu=1,
                        requested_memory_bytes=GIB,
                    )
                    for sb, kind in kept
                ],
            )
            with contextlib.suppress(grpc.aio.AioRpcError):  # best-effort: no retry
                await self.stub().ReportSandboxEvent(req, timeout=REPORTER_TIMEOUT_S)

    # -- the gateways ---------------------------------------------------------
    async def gateway(self, w: int, t0: float, counter: list[int], until: float) -> None:
        req = pb.ScheduleRequest(
            hint=pb.ScheduleRequestHint(
                new_cold_sandbox=pb.NewColdSandboxHint(cpu_count=1, memory_mb=1024)
            )
        )
        t = self.tally
        while True:
            i = counter[0]
            counter[0] += 1
            at = t0 + i / self.p.rate
            if at >= until:
                return
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            t.schedules += 1
            sent = time.monotonic()
            call = self.stub().Schedule(req, timeout=self.p.deadline_s)
            try:
                resp = await call
                rid = dict(await call.trailing_metadata() or ()).get(RESERVATION_METADATA, "")
            except grpc.aio.AioRpcError as e:
                if "no nodes available" in (e.details() or ""):
                    t.refused += 1
                    if self.room():
                        t.refused_room += 1
                        self.attribute()
                else:
                    t.errors += 1
                continue
            t.placed += 1
            node = self.by_id[resp.node.node_id]
            draw = self.rng.random()
            if draw < self.p.never_created:
                self.fate[str(rid)] = "never"
                t.never += 1  # the gateway never forwards the create
                continue
            if draw < self.p.never_created + self.p.create_fail:
                self.fate[str(rid)] = "in_flight"
                await asyncio.sleep(self.p.create_s)
                node.fail_create()  # the node counts it; the gateway records nothing
                self.fate[str(rid)] = "failed"
                t.failed += 1
                continue
            sandbox_id = f"sbx-{w}-{i}"
            self.fate[str(rid)] = sandbox_id
            node.create(sandbox_id, 1, GIB, self.lifetime())
            t.created += 1
            if node.count() > self.p.ceiling:
                t.violations += 1
            await asyncio.sleep(self.p.create_s)  # the create returns once it is ready
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.stub().RecordAssignment(
                    pb.RecordAssignmentRequest(sandbox_id=sandbox_id, node=resp.node),
                    timeout=ASSIGN_TIMEOUT_S,
                )
                t.assign_lag.append(time.monotonic() - sent - self.p.create_s)

    # -- the measurement --------------------------------------------------------
    def causes(self, node: SimNode, ages: bool = False) -> dict[str, int]:
        """What holds the slots the scheduler counts for ``node`` that the node
        does not hold, per cause (:data:`CAUSES`): read from Redis and the node
        at once (no other coroutine of the bench runs meanwhile); ``ages``:
        record the gone_assigned reservations' ages (at a refusal)."""
        k = self.keys
        running, starting, pending, order = (
            int(v or 0)
            for v in self.redis.hmget(
                k.node(node.node_id),
                "sandbox_count",
                "sandbox_starting_count",
                "pending_count",
                "reported_order_ms",
            )
        )
        rids = [r.decode() for r in self.redis.zrange(k.node_res(node.node_id), 0, -1)]
        pipe = self.redis.pipeline(transaction=False)
        for rid in rids:
            pipe.hmget(k.res(rid), "state", "sandbox_id", "assigned_ms")
            # (the reservation its creation's binding carries, if it ran)
            pipe.hget(k.bind(self.fate.get(rid, "") or "-"), "reservation_id")
        pipe.time()
        *replies, (secs, micros) = pipe.execute()
        records = replies[0::2]
        charged = [(b or b"").decode() for b in replies[1::2]]
        now_ms = secs * 1000 + micros // 1000
        with node.lock:
            truth = set(node.sandboxes)
        # (the heartbeat Redis holds: the one whose stamp it stored)
        seen = self.sent_seen.get(node.node_id, {}).get(order, frozenset())
        answered = self.answered.get(node.node_id, [])
        c = dict.fromkeys(CAUSES, 0)
        c["hb_lag"] = len(seen - truth)
        for rid, (state, sb, assigned), bound in zip(rids, records, charged, strict=True):
            state = (state or b"").decode()
            sb = (sb or b"").decode()
            if state in ("assigned", "acked") and sb:
                if sb not in truth:
                    c["gone_assigned"] += 1
                    if not ages:
                        continue
                    at = int(assigned or 0)
                    self.tally.gone_age.append((now_ms - at) / 1000)
                    beats = sum(1 for a in answered if a > at)
                    self.tally.gone_beats[min(beats, 3)] += 1
                elif sb in seen:
                    c["listed"] += 1
                continue
            fate = self.fate.get(rid, "")
            if fate in ("never", "failed", "in_flight"):
                c[fate] += 1
            elif fate and fate not in truth:
                c["gone_unassigned"] += 1
            elif fate and bound and bound != rid:
                c["swapped"] += 1
            elif fate in seen:
                c["listed"] += 1
        excess = running + starting + pending - len(truth)
        c["other"] = excess - sum(c.values())
        # (what the node had reported: its stored heartbeat's sandboxes, those
        # it made since, and the creates on their way to it)
        self.reported = len(seen) + len(truth - seen) + c["in_flight"]
        return c

    def attribute(self) -> None:
        """A Schedule was refused while some node's truth had room: charge it
        to the cause that held the most of that room."""
        room = dict.fromkeys(CAUSES, 0)
        reported_room = False
        for n in self.nodes:
            if n.count() < self.p.ceiling:
                for cause, held in self.causes(n, ages=True).items():
                    room[cause] += held
                reported_room = reported_room or self.reported < self.p.ceiling
        self.tally.refused_reported_room += reported_room
        for cause, held in room.items():
            self.tally.room_held[cause] += held
        top = max(CAUSES, key=lambda cause: (room[cause], -CAUSES.index(cause)))
        self.tally.by_cause[top if room[top] > 0 else "other"] += 1

    def held_now(self) -> int:
        """Capacity the scheduler counts that no node holds, summed over nodes."""
        pipe = self.redis.pipeline(transaction=False)
        for n in self.nodes:
            pipe.hmget(
                self.keys.node(n.node_id),
                "sandbox_count",
                "sandbox_starting_count",
                "pending_count",
            )
        held = 0
        for n, fields in zip(self.nodes, pipe.execute(), strict=True):
            view = sum(int(v or 0) for v in fields)
            held += max(0, view - n.count())
        return held

    async def sampler(self) -> None:
        while not self.stop.is_set():
            self.tally.held.append(await asyncio.to_thread(self.held_now))
            # (the same split by cause, read at once: no other coroutine runs)
            for n in self.nodes:
                for cause, held in self.causes(n).items():
                    self.tally.held_by[cause] += held
            await asyncio.sleep(self.p.sample_s)

    def live_reservations(self) -> int:
        return sum(int(self.redis.zcard(self.keys.node_res(n.node_id))) for n in self.nodes)

    async def close(self) -> None:
        for c in self.channels:
            await c.close()
        self.redis.close()


async def _drive(p: Params, mode: str, lost: float, addresses: list[str], url: str) -> Run:
    run = Run(p, mode, lost, addresses, url)
    nodes = [asyncio.create_task(run.heartbeats(n)) for n in run.nodes]
    nodes += [asyncio.create_task(run.events(n)) for n in run.nodes]
    await asyncio.sleep(p.heartbeat_s + 0.5)  # every node heard of before the load
    t0 = time.monotonic()
    counter = [0]
    sampler = asyncio.create_task(run.sampler())
    gateways = [
        asyncio.create_task(run.gateway(w, t0, counter, t0 + p.seconds)) for w in range(p.gateways)
    ]
    await asyncio.gather(*gateways)
    run.stop.set()
    await asyncio.gather(sampler, *nodes)
    return run


def _row(p: Params, mode: str, lost: float, run: Run) -> dict[str, Any]:
    t = run.tally
    held = t.held or [0]
    return {
        "mode": mode,
        "lost": lost,
        "schedules": t.schedules,
        "placed": t.placed,
        "refused": t.refused,
        "refused_room": t.refused_room,
        "refused_room_pct": round(100.0 * t.refused_room / max(1, t.schedules), 2),
        "refused_reported_room": t.refused_reported_room,
        "errors": t.errors,
        "peak": max(n.peak_sandboxes for n in run.nodes),
        "ceiling": p.ceiling,
        "violations": t.violations,
        "held_mean": round(sum(held) / len(held), 2),
        "held_peak": max(held),
        "allowance": round(t.placed / p.seconds * p.heartbeat_s, 1),
        **{f"by_{cause}": t.by_cause[cause] for cause in CAUSES},
        "room_held": dict(t.room_held),
        "held_by": {c: round(v / max(1, len(t.held)), 2) for c, v in t.held_by.items()},
        "gone_age_p50_s": round(percentile(t.gone_age, 50), 2) if t.gone_age else None,
        "gone_age_max_s": round(max(t.gone_age), 2) if t.gone_age else None,
        "gone_beats_since": t.gone_beats,
        "live_end": run.live_reservations(),
        "assign_lag_p99_s": round(percentile(t.assign_lag, 99), 3) if t.assign_lag else None,
        "assign_lag_max_s": round(max(t.assign_lag), 3) if t.assign_lag else None,
        "created": t.created,
        "create_failed": t.failed,
        "never_created": t.never,
        "per_node_peak": [n.peak_sandboxes for n in run.nodes],
    }


def _replica_config(p: Params) -> dict[str, Any]:
    sec: dict[str, Any] = {"node_resource_limit": {"max_sandbox_count": p.ceiling}}
    if p.unassigned_ttl_s is not None:
        sec["unassigned_reservation_ttl"] = f"{p.unassigned_ttl_s * 1000:.0f}ms"
    return {"scheduler": sec}


def run_setting(p: Params, mode: str, lost: float) -> dict[str, Any]:
    with RedisServer() as server:
        replicas = [
            ServeProcess(_replica_config(p), server.url, cell=CELL) for _ in range(p.replicas)
        ]
        try:
            for r in replicas:
                r.wait_serving(60)

            async def go() -> dict[str, Any]:
                run = await _drive(p, mode, lost, [r.address for r in replicas], server.url)
                try:
                    return _row(p, mode, lost, run)
                finally:
                    await run.close()

            row = asyncio.run(go())
            with redis.Redis.from_url(server.url) as r:
                ttl = r.hget(CellKeys(CELL).policy, "unassigned_reservation_ttl_ms")
            row["unassigned_ttl_ms"] = int(ttl or 0)
            row["replica_exits"] = [r.proc.poll() for r in replicas]
            return row
        finally:
            close_all(replicas, 10)


COLUMNS = [
    "mode",
    "lost",
    "schedules",
    "refused",
    "refused_room",
    "refused_room_pct",
    "refused_reported_room",
    "peak",
    "ceiling",
    "violations",
    "held_mean",
    "held_peak",
    "allowance",
    *(f"by_{cause}" for cause in CAUSES),
    "live_end",
]


def run(p: Params) -> Result:
    facts = machine_own_servers()
    rows = [run_setting(p, mode, lost) for mode in p.modes for lost in p.losses]
    notes = [
        f"{p.nodes} nodes, max_sandbox_count {p.ceiling}, {p.replicas} schedctl serve replicas, "
        f"{p.rate:g} Schedules/s by {p.gateways} gateways for {p.seconds:g} s per setting; "
        f"heartbeats every {p.heartbeat_s:g} s ({'full roster' if 'roster' in p.modes else ''}"
        f"{', ' if len(p.modes) > 1 else ''}{'counters only' if 'counter' in p.modes else ''}).",
        f"sandboxes start {p.create_s:g} s, then live {p.short_s[0]:g}-{p.short_s[1]:g} s, or "
        f"{p.long_share:.0%} of them {p.long_s[0]:g}-{p.long_s[1]:g} s x {p.long_scale:g}; "
        f"{p.create_fail:.0%} of creates fail, {p.never_created:.0%} of Schedules are never "
        "followed by a create; lost: the share of CREATE/DELETE events dropped.",
        "held: capacity counted by the scheduler (last heartbeat's running + starting, plus "
        "live reservations) that the node does not hold, summed over nodes, sampled every "
        f"{p.sample_s:g} s; allowance: placements per heartbeat interval (the target's bound "
        "on held_mean); refused_room: refusals while a node's own truth had room; by_<cause>: "
        "each such refusal charged to the cause holding the most of that room (bench/churn.py "
        "CAUSES).",
    ]
    return Result(
        scenario="churn", columns=COLUMNS, rows=rows, params=asdict(p), machine=facts, notes=notes
    )
