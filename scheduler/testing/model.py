"""The reference model of the selection semantics (docs/design.md), in plain Python.

The test oracle: a full scan, written to be obviously right, with no Redis.
The stages carry the names the Lua uses (lua/includes/stages.lua): project,
check_status, check_ceilings, check_capacity, then pick.  Property tests drive the Lua path
and this model with the same fleets and requests and require the same
decisions; any optimisation of the Lua path is judged against it.

    filter:  status (incl. settling) ─► ceilings (after placement, <=) ─► capacity
             (<= cap * overcommit)
    score:   known capacity, pressure, starting (+pending), running, paused
    pick:    least_loaded: best, round-robin over exact equals
             round_robin: the first eligible known-capacity node among the
             SPREAD_WALK nodes after the node it chose last (node-id byte
             order, wrapping); random: the first eligible known-capacity
             node of SPREAD_DRAWS draws over all nodes (spread_random);
             either, when that finds none: least_loaded's choice
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from scheduler.domain.catalog import (
    ADMISSION_TEXT,
    CEILING_NAMES,
    REFUSAL_COUNTED,
    STAMP_MARGIN_MS,
    STAMP_WINDOW_MS,
    SWEEP_BATCH,
    ceiling,
    ceiling_reason,
)
from scheduler.domain.policy import Policy
from scheduler.domain.records import Request
from scheduler.store.replies import rank_key

#: how many counted-unclaimed reservation ids a node keeps
#: (counted_unclaimed in lua/includes/bindings.lua)
COUNTED_KEEP = 16


@dataclass(frozen=True)
class NodeState:
    """What a decision reads of one node: its record in Redis, typed."""

    node_id: str
    endpoint: str = ""
    lingering: bool = False
    last_seen_ms: int | None = None
    reported_status: str = ""
    cpu_count: int = 0
    memory_total_bytes: int = 0
    allocated_cpu: int = 0
    allocated_memory_bytes: int = 0
    paused_allocated_cpu: int = 0
    paused_allocated_memory_bytes: int = 0
    sandbox_count: int = 0
    sandbox_starting_count: int = 0
    paused_sandbox_count: int = 0
    cpu_percent: int = 0
    memory_used_bytes: int = 0
    pending_count: int = 0
    pending_cpu: int = 0
    pending_memory_bytes: int = 0
    #: "" while the node accepts sandboxes, else its admission reason
    admission: str = ""

    @classmethod
    def from_record(cls, f: dict[str, str]) -> NodeState:
        def i(name: str) -> int:
            return int(f.get(name) or 0)

        return cls(
            node_id=f["node_id"],
            endpoint=f.get("endpoint", ""),
            lingering=f.get("lingering") == "1",
            last_seen_ms=int(f["last_seen_ms"]) if f.get("last_seen_ms") else None,
            reported_status=f.get("status", ""),
            cpu_count=i("cpu_count"),
            memory_total_bytes=i("memory_total_bytes"),
            allocated_cpu=i("allocated_cpu"),
            allocated_memory_bytes=i("allocated_memory_bytes"),
            paused_allocated_cpu=i("paused_allocated_cpu"),
            paused_allocated_memory_bytes=i("paused_allocated_memory_bytes"),
            sandbox_count=i("sandbox_count"),
            sandbox_starting_count=i("sandbox_starting_count"),
            paused_sandbox_count=i("paused_sandbox_count"),
            cpu_percent=i("cpu_percent"),
            memory_used_bytes=i("memory_used_bytes"),
            pending_count=i("pending_count"),
            pending_cpu=i("pending_cpu"),
            pending_memory_bytes=i("pending_memory_bytes"),
            admission=f.get("admission", ""),
        )

    def with_reservation(self, cpu: int, memory_bytes: int, sign: int = 1) -> NodeState:
        return replace(
            self,
            pending_count=self.pending_count + sign,
            pending_cpu=self.pending_cpu + sign * cpu,
            pending_memory_bytes=self.pending_memory_bytes + sign * memory_bytes,
        )


@dataclass(frozen=True)
class Demand:
    """A request resolved against the policy: what one placement adds."""

    create: bool
    count: int
    cpu: int
    memory_bytes: int

    @classmethod
    def of(cls, req: Request, policy: Policy) -> Demand:
        if not req.create:
            return cls(False, 0, 0, 0)
        cpu = policy.default_request.cpu if req.cpu is None else req.cpu
        mem = (
            policy.default_request.memory_mb * 1024 * 1024
            if req.memory_bytes is None
            else req.memory_bytes
        )
        return cls(True, 1, cpu, mem)


@dataclass(frozen=True)
class ModelVerdict:
    node_id: str
    status: str
    reason: str | None
    pressure: float
    known: bool
    starting: int
    running: int
    paused: int
    projected_cpu: int
    projected_memory_bytes: int


def derive_status(n: NodeState, policy: Policy, now_ms: int) -> str:
    if n.last_seen_ms is None:
        return "LINGERING" if n.lingering else "CONNECTING"
    if now_ms - n.last_seen_ms > policy.report_ttl_ms:
        return "UNHEALTHY"
    if n.lingering or n.reported_status == "LINGERING":
        return "LINGERING"
    if n.reported_status in ("", "UNSPECIFIED"):
        return "CONNECTING"
    return n.reported_status


def ceiling_use(n: NodeState, name: str, d: Demand) -> int | None:
    # a count's current is running + starting (a roster lists a sandbox still being created)
    if name == "max_sandbox_count":
        return n.sandbox_count + n.sandbox_starting_count + n.pending_count + d.count
    if name == "max_sandbox_starting_count":
        return n.sandbox_starting_count + n.pending_count + d.count
    if name == "max_sandbox_count_including_paused":
        return (
            n.sandbox_count
            + n.sandbox_starting_count
            + n.paused_sandbox_count
            + n.pending_count
            + d.count
        )
    if name == "max_allocated_cpu_including_paused":
        return n.allocated_cpu + n.paused_allocated_cpu + n.pending_cpu + d.cpu
    if name == "max_allocated_memory_bytes_including_paused":
        return (
            n.allocated_memory_bytes
            + n.paused_allocated_memory_bytes
            + n.pending_memory_bytes
            + d.memory_bytes
        )
    if name == "max_cpu_allocated_percent":
        return n.allocated_cpu + n.pending_cpu + d.cpu if n.cpu_count > 0 else None
    if name == "max_memory_allocated_percent":
        if n.memory_total_bytes <= 0:
            return None
        return n.allocated_memory_bytes + n.pending_memory_bytes + d.memory_bytes
    if name == "max_cpu_used_percent":
        return n.cpu_percent
    if name == "max_memory_used_percent":
        return n.memory_used_bytes if n.memory_total_bytes > 0 else None
    raise ValueError(name)


def ceiling_holds(n: NodeState, name: str, limit: int, used: int) -> bool:
    capacity = ceiling(name).capacity  # a percent of it: compared in whole numbers
    if capacity == "cpu":
        return used * 100 <= limit * n.cpu_count
    if capacity == "memory":
        return used * 100 <= limit * n.memory_total_bytes
    return used <= limit


def settling(n: NodeState, policy: Policy, now_ms: int, settle_ms: int | None) -> bool:
    """Must the node heartbeat again before it takes a placement?  (Redis may
    have lost placements made up to settle_ms; for one report TTL.)"""
    return (
        settle_ms is not None
        and now_ms < settle_ms + policy.report_ttl_ms
        and (n.last_seen_ms is None or n.last_seen_ms <= settle_ms)
    )


def evaluate(
    n: NodeState, policy: Policy, d: Demand, now_ms: int, settle_ms: int | None = None
) -> ModelVerdict:
    status = derive_status(n, policy, now_ms)
    stale = n.last_seen_ms is not None and now_ms - n.last_seen_ms > policy.report_ttl_ms
    # stage "project"
    known = n.cpu_count > 0 or n.memory_total_bytes > 0
    proj_cpu = n.allocated_cpu + n.paused_allocated_cpu + n.pending_cpu + d.cpu
    proj_mem = (
        n.allocated_memory_bytes
        + n.paused_allocated_memory_bytes
        + n.pending_memory_bytes
        + d.memory_bytes
    )
    pressure = 0.0
    if n.cpu_count > 0:
        pressure = proj_cpu / n.cpu_count
    if n.memory_total_bytes > 0:
        pressure = max(pressure, proj_mem / n.memory_total_bytes)
    # stage "status"
    reason: str | None = None
    if status == "LINGERING":
        reason = "lingering"
    elif status == "UNHEALTHY":
        reason = "stale heartbeat" if stale else "unhealthy"
    elif status not in ("READY", "CONNECTING"):
        reason = "not ready"
    elif n.admission:
        reason = f"not accepting: {ADMISSION_TEXT.get(n.admission, 'unspecified')}"
    elif settling(n, policy, now_ms, settle_ms):
        reason = "awaiting heartbeat"
    elif not n.endpoint:
        reason = "no endpoint"
    # stage "ceilings"
    if reason is None:
        limits = policy.limits.active()
        for name in CEILING_NAMES:
            if name in limits:
                used = ceiling_use(n, name, d)
                if used is not None and not ceiling_holds(n, name, limits[name], used):
                    reason = ceiling_reason(name, limits[name])
                    break
    # stage "capacity"
    if reason is None and d.create:
        if n.cpu_count > 0 and proj_cpu > n.cpu_count * policy.overcommit.cpu:
            reason = "insufficient cpu"
        elif (
            n.memory_total_bytes > 0 and proj_mem > n.memory_total_bytes * policy.overcommit.memory
        ):
            reason = "insufficient memory"
    return ModelVerdict(
        node_id=n.node_id,
        status=status,
        reason=reason,
        pressure=pressure,
        known=known,
        starting=n.sandbox_starting_count + n.pending_count,
        running=n.sandbox_count,
        paused=n.paused_sandbox_count,
        projected_cpu=proj_cpu,
        projected_memory_bytes=proj_mem,
    )


def summarize(verdicts: list[ModelVerdict]) -> str:
    """The refusal: every node counted in the total, the reasons of the
    first REFUSAL_COUNTED by id (``verdicts`` are in that order)."""
    counts: dict[str, int] = {}
    for v in verdicts[:REFUSAL_COUNTED]:
        if v.reason:
            counts[v.reason] = counts.get(v.reason, 0) + 1
    parts = [f"{c} {r}" for r, c in sorted(counts.items(), key=lambda rc: (-rc[1], rc[0].encode()))]
    msg = f"no nodes available: 0/{len(verdicts)} nodes available"
    if len(verdicts) > REFUSAL_COUNTED:
        msg += f", the first {REFUSAL_COUNTED} by id counted"
    return msg + (": " + ", ".join(parts) if parts else "")


@dataclass(frozen=True)
class Decision:
    chosen: str | None
    verdicts: list[ModelVerdict]
    refusal: str | None
    #: with locality: "full", "partial" or "cold", and the bytes the chosen node pulls
    warmth: str = ""
    pull_bytes: int = 0
    #: with locality: node -> (coverage, bonus)
    scores: Mapping[str, tuple[float, float]] | None = None


@dataclass(frozen=True)
class LocalityState:
    """What locality reads (docs/design.md, "Locality"), as plain maps."""

    #: node -> the artifact keys it holds in its own cluster and backend
    held: Mapping[str, frozenset[str]]
    #: group ("template:<id>", "image:<first>", "keys:<sorted keys>": calls.locality_group)
    #: -> node -> its last start (ms)
    affinity: Mapping[str, Mapping[str, int]]
    #: node -> group -> its pending starts of the group
    pending: Mapping[str, Mapping[str, int]]


def locality(
    verdicts: list[ModelVerdict],
    chosen: ModelVerdict,
    policy: Policy,
    req: Request,
    now_ms: int,
    loc: LocalityState,
) -> Decision:
    """The locality stage, a full scan: a warm eligible node of the chosen
    one's kind of capacity, within max_pressure_gap of its pressure, wins
    when pressure - bonus is lower than the chosen one's; the least such
    (then by rank, then node id)."""
    from scheduler.store.calls import locality_group, locality_terms  # (no import cycle at load)

    terms = locality_terms(req, policy.artifact_key_max_bytes)
    group = locality_group(req, terms)
    lp = policy.locality
    total = sum(w for _, w, _ in terms)

    def coverage(node_id: str) -> tuple[float, int]:
        if terms:
            held = loc.held.get(node_id, frozenset())
            got = sum(w for k, w, _ in terms if k in held)
            pull = sum(size for k, _, size in terms if k not in held)
            return got / total, pull
        last = loc.affinity.get(group, {}).get(node_id)
        return (1.0 if last is not None and last > now_ms - lp.affinity_ttl_ms else 0.0), 0

    scores: dict[str, tuple[float, float]] = {}
    for v in verdicts:
        c, _ = coverage(v.node_id)
        same = loc.pending.get(v.node_id, {}).get(group, 0) if group and c > 0 else 0
        scores[v.node_id] = (c, lp.weight * c / (1 + lp.pending_decay * same))

    def score(v: ModelVerdict) -> float:
        return v.pressure - scores[v.node_id][1]

    margin = lp.max_pressure_gap
    if lp.headroom_share > 0:
        margin = min(margin, max(0.0, lp.headroom_share * (1 - chosen.pressure)))
    rivals = [
        v
        for v in verdicts
        if v.reason is None
        and v.node_id != chosen.node_id
        and scores[v.node_id][0] > 0
        and v.known == chosen.known
        and v.pressure <= chosen.pressure + margin
    ]
    best = chosen
    if rivals:
        w = min(
            rivals,
            key=lambda v: (
                score(v),
                rank_key(v.known, v.pressure, v.starting, v.running, v.paused),
                v.node_id.encode(),
            ),
        )
        if score(w) < score(chosen):
            best = w
    c, pull = coverage(best.node_id)
    warmth = "full" if c >= 1 else "partial" if c > 0 else "cold"
    return Decision(best.node_id, verdicts, None, warmth, pull, scores)


#: round_robin's walk and random's draws before least_loaded decides, and
#: MINSTD's modulus (lua/includes/schedule.lua SPREAD)
SPREAD_WALK = 64
SPREAD_DRAWS = 32
_M = 2147483647


def least_loaded_pick(group: list[ModelVerdict], rr_next: int) -> ModelVerdict:
    """``least_loaded``'s choice: the best ranked, exact equals in rotation."""
    best_key = min(rank_key(v.known, v.pressure, v.starting, v.running, v.paused) for v in group)
    equals = [
        v
        for v in group
        if rank_key(v.known, v.pressure, v.starting, v.running, v.paused) == best_key
    ]
    return equals[(rr_next - 1) % len(equals)]


def spread_round_robin(
    verdicts: list[ModelVerdict], group: list[ModelVerdict], after: str, rr_next: int
) -> str:
    """``round_robin``'s choice: the first eligible node of known capacity
    among the SPREAD_WALK nodes (byte order, wrapping) after ``after``, the
    node it chose last ("" before any); when none of them is,
    least_loaded's choice."""
    key = after.encode()
    start = next(
        (i for i, v in enumerate(verdicts) if key and v.node_id.encode() > key),
        len(verdicts) if key else 0,
    )
    for j in range(min(SPREAD_WALK, len(verdicts))):
        v = verdicts[(start + j) % len(verdicts)]
        if v.reason is None and v.known:
            return v.node_id
    return least_loaded_pick(group, rr_next).node_id


def spread_random(
    verdicts: list[ModelVerdict], group: list[ModelVerdict], rand: float, rr_next: int
) -> str:
    """``random``'s choice: rejection sampling over every node (byte order).

    Draw 1 is node rank ``floor(rand * N)``; draw i > 1 is ``floor(s_i * N /
    M)`` with MINSTD ``s_i = s_(i-1) * 48271 mod M``, ``s_1 = floor(rand *
    (M - 1)) + 1``.  The first draw that is an eligible node of known
    capacity is chosen, so each such node has the same chance; when all
    SPREAD_DRAWS draws miss (fewer than about one node in SPREAD_DRAWS is
    one), least_loaded's choice.
    """
    n, s = len(verdicts), math.floor(rand * (_M - 1)) + 1
    for i in range(1, SPREAD_DRAWS + 1):
        if i == 1:
            r = math.floor(rand * n)
        else:
            s = s * 48271 % _M
            r = math.floor(s * n / _M)
        x = verdicts[r]
        if x.reason is None and x.known:
            return x.node_id
    return least_loaded_pick(group, rr_next).node_id


def decide(
    nodes: list[NodeState],
    policy: Policy,
    req: Request,
    now_ms: int,
    rr_next: int,
    rand: float = 0.0,
    strategy: str | None = None,
    settle_ms: int | None = None,
    loc: LocalityState | None = None,
    rr_after: str = "",
) -> Decision:
    """One Schedule: the node chosen (or the counted refusal).

    ``rr_next`` is the round-robin counter value this decision uses (the
    stored counter plus one); ``rr_after`` the node round_robin chose last
    ("" before any); ``rand`` the uniform number for ``random``;
    ``loc`` what locality reads (on for least_loaded creations in a policy
    with locality.weight > 0 that carry requirements, a template or images).
    """
    d = Demand.of(req, policy)
    ordered = sorted(nodes, key=lambda n: n.node_id.encode())
    verdicts = [evaluate(n, policy, d, now_ms, settle_ms) for n in ordered]
    eligible = [v for v in verdicts if v.reason is None]
    group = [v for v in eligible if v.known] or [v for v in eligible if not v.known]
    if not group:
        return Decision(None, verdicts, summarize(verdicts))
    strategy = strategy or policy.strategy
    if strategy == "least_loaded":
        chosen = least_loaded_pick(group, rr_next)
        if (
            loc is not None
            and req.create
            and policy.locality.weight > 0
            and (req.group() or any(r.key.strip() for r in req.locality))
        ):
            return locality(verdicts, chosen, policy, req, now_ms, loc)
    elif strategy == "round_robin":
        return Decision(spread_round_robin(verdicts, group, rr_after, rr_next), verdicts, None)
    elif strategy == "random":
        return Decision(spread_random(verdicts, group, rand, rr_next), verdicts, None)
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    return Decision(chosen.node_id, verdicts, None)


# ---------------------------------------------------------------------------
# The lifecycle: reservations and bindings of a whole cell
# ---------------------------------------------------------------------------


@dataclass
class ResModel:
    rid: str
    node_id: str
    cpu: int
    memory_bytes: int
    seq: int
    expires_ms: int
    state: str = "pending"
    sandbox_id: str | None = None
    created_ms: int = 0
    #: the two-heartbeat rule: the create_successes a roster must reach to
    #: count (set by its assignment), the stamp of the last heartbeat counted
    #: (the node's stored one at the assignment), and the rosters counted
    absent_cs: int | None = None
    absent_rt: int = 0
    absent_beats: int = 0
    #: when its sandbox was assigned (the one-heartbeat release)
    assigned_ms: int | None = None


@dataclass
class BindModel:
    node_id: str
    endpoint: str
    listed: bool
    rid: str | None
    expires_ms: int
    deleted: bool = False


@dataclass
class NodeMeta:
    sid: str = ""
    #: the instance ``sid`` replaced (its late events change nothing)
    replaced: str = ""
    create_successes: int | None = None
    roster_mode: bool = False
    #: create_fails' baseline, as create_successes' (None: no heartbeat yet)
    create_fails: int | None = None
    #: the newest reported_at_unix_ms the instance sent (0: none)
    reported: int = 0
    #: counter-mode DELETEs that released their creation since the last
    #: heartbeat (the next heartbeat adds them to its baseline, a new
    #: instance's too)
    deletes: int = 0
    #: the client's cancels of pending reservations since the last heartbeat
    #: (added to create_fails' baseline: a failure is ended once)
    cancels: int = 0
    #: create_fails' last rise, released by the next heartbeat less the
    #: client's cancels meanwhile
    fails_owed: int = 0
    #: create_successes as the last heartbeat reported it
    reported_cs: int = 0
    #: the node has assigned reservations its rosters do not list yet
    absent_watch: bool = False
    sandboxes: set[str] | None = None  # node-sbx membership
    #: pending reservations a counter rise released before any assignment
    #: claimed them, oldest first (the newest COUNTED_KEEP)
    counted: list[str] = field(default_factory=list)
    #: the newest seq of the reservations a rise that released a pending one
    #: left live (a counter-mode DELETE of one of those ends nothing)
    unclaimed_seq: int | None = None
    #: the stamp lead of the instance: the largest stamp minus arrival in the
    #: current window (None: no stamped heartbeat of it yet), the previous
    #: window's, and when the current one began
    lead: int | None = None
    lead_was: int | None = None
    lead_at: int = 0


def stamp_lead(meta: NodeMeta, reported: int, now: int, restarted: bool) -> int | None:
    """The stamp lead a stamped heartbeat may use (None: the instance's
    first), and ``meta``'s kept as it moves (includes/base.lua stamp_lead)."""
    sample = reported - now
    if restarted or meta.lead is None:
        meta.lead, meta.lead_was, meta.lead_at = sample, None, now
        return None
    if now - meta.lead_at >= STAMP_WINDOW_MS or now < meta.lead_at:
        meta.lead, meta.lead_was, meta.lead_at = sample, meta.lead, now
    else:
        meta.lead = max(meta.lead, sample)
    return meta.lead if meta.lead_was is None else max(meta.lead, meta.lead_was)


class CellModel:
    """The reservation lifecycle of docs/design.md as plain Python: what every
    script does to reservations and bindings, given the instant it ran at.
    Nodes' own numbers are stored as NodeState with zero pending; pending
    aggregates are derived from the live reservations."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.snap: dict[str, NodeState] = {}
        self.meta: dict[str, NodeMeta] = {}
        self.res: dict[str, ResModel] = {}
        #: ended reservations, their state set to the outcome
        self.ended: dict[str, ResModel] = {}
        self.bind: dict[str, BindModel] = {}
        self.seq = 0
        self.rr = 0
        self.rr_cursor = ""  # the node round_robin chose last

    # -- derived views -----------------------------------------------------
    def states(self) -> list[NodeState]:
        out = []
        for node_id in sorted(self.snap, key=str.encode):
            n = self.snap[node_id]
            for r in self.res.values():
                if r.node_id == node_id:
                    n = n.with_reservation(r.cpu, r.memory_bytes)
            out.append(n)
        return out

    def live_of(self, node_id: str) -> list[ResModel]:
        return sorted((r for r in self.res.values() if r.node_id == node_id), key=lambda r: r.seq)

    # -- shared pieces (names as in lua/includes/common.lua and bindings.lua) --
    def end(self, rid: str, outcome: str) -> bool:
        r = self.res.pop(rid, None)
        if r is None:
            return False
        r.state = outcome
        self.ended[rid] = r
        return True

    def sweep(self, now: int) -> None:
        due = sorted(
            (r for r in self.res.values() if r.expires_ms <= now),
            key=lambda r: (r.expires_ms, r.rid.encode()),
        )[:SWEEP_BATCH]
        for r in due:
            self.end(r.rid, "expired")

    def bound_reservation(self, sb: str, node_id: str) -> str | None:
        b = self.bind.get(sb)
        if b is None or b.node_id != node_id or not b.rid:
            return None
        return b.rid if b.rid in self.res else None  # (this node's, or one that followed it)

    def end_charge(self, rid: str, node_id: str) -> bool:
        """Released: ``node_id``'s numbers include the sandbox, or it reported
        it deleted; another node's charge moves that node's counter baseline."""
        r = self.res.get(rid)
        if r is None or not self.end(rid, "released"):
            return False
        if r.node_id != node_id:
            self.counter_moves(r.node_id)
        return True

    def oldest_unclaimed(self, node_id: str) -> str | None:
        for r in self.live_of(node_id):
            if r.state == "pending":
                return r.rid
        return None

    def newest_unclaimed(self, node_id: str) -> str | None:
        """What an assignment naming no reservation is charged
        (lua/assign-5.lua): the newest pending one, so a never-created
        placement keeps its age and unassigned_reservation_ttl ends it."""
        for r in reversed(self.live_of(node_id)):
            if r.state == "pending":
                return r.rid
        return None

    def counted_claim(self, node_id: str, wanted: str, sb: str) -> str | None:
        """Takes `wanted` ("" = the oldest) off the node's counted_unclaimed
        list and charges it to `sb` (it is ended already)."""
        counted = self.meta[node_id].counted
        pick = wanted or (counted[0] if counted else None)
        if pick is None or pick not in counted:
            return None
        counted.remove(pick)
        if pick in self.ended:
            self.ended[pick].sandbox_id = sb
        return pick

    def counted_claim_or_oldest(self, node_id: str, wanted: str | None, sb: str) -> str | None:
        """counted_claim of `wanted`, else of the oldest (assign-5.lua's
        tombstone and listed-elsewhere paths try both, in that order)."""
        counted = self.counted_claim(node_id, wanted or "", sb)
        if counted is None and wanted:
            counted = self.counted_claim(node_id, "", sb)
        return counted

    def charged(self, sb: str, node_id: str) -> bool:
        """Charged before: on this node, or a live binding of another node
        carries its charge (it follows the sandbox)."""
        b = self.bind.get(sb)
        return b is not None and bool(b.rid) and (b.node_id == node_id or not b.deleted)

    def listed_on(self, sb: str, node_id: str) -> bool:
        """Listed by the node's last roster, however long ago it came."""
        b = self.bind.get(sb)
        return b is not None and b.node_id == node_id and b.listed and not b.deleted

    def listed_elsewhere(self, sb: str, node_id: str, now: int) -> bool:
        """Listed by another node's last roster: that node holds it, live or
        as a tombstone that kept ``listed`` until it expires (its DELETE may
        be a late one while the sandbox still runs there)."""
        b = self.bind.get(sb)
        return (
            b is not None
            and b.node_id != node_id
            and b.listed
            and (not b.deleted or b.expires_ms > now)
        )

    def counter_moves(self, node_id: str) -> None:
        """A counter-mode node's baseline moves on by one at its next heartbeat."""
        meta = self.meta[node_id]
        if not meta.roster_mode and meta.create_successes is not None:
            meta.deletes += 1

    def write_binding(self, sb: str, node_id: str, listed: bool, rid: str | None, now: int) -> bool:
        """Returns True when taking another node's live binding ended the
        reservation charged to the sandbox there (the sandbox's one charge
        stays on the binding)."""
        prev = self.bind.get(sb)
        ended = False
        if prev is not None and prev.node_id != node_id:
            self._sbx(prev.node_id).discard(sb)
            if not prev.deleted and prev.rid:
                if listed:  # (a roster's take: its numbers include it now)
                    ended = self.end_charge(prev.rid, node_id)
                if rid is None:
                    rid = prev.rid
        if rid is None and prev is not None and prev.node_id == node_id and not prev.deleted:
            rid = prev.rid
        self.bind[sb] = BindModel(
            node_id, self.snap[node_id].endpoint, listed, rid, now + self.policy.binding_ttl_ms
        )
        self._sbx(node_id).add(sb)
        return ended

    def drop_binding(self, sb: str, node_id: str) -> None:
        b = self.bind.get(sb)
        if b is not None and b.node_id == node_id:
            del self.bind[sb]
        self._sbx(node_id).discard(sb)

    def _sbx(self, node_id: str) -> set[str]:
        meta = self.meta.setdefault(node_id, NodeMeta())
        if meta.sandboxes is None:
            meta.sandboxes = set()
        return meta.sandboxes

    # -- operations --------------------------------------------------------
    def add_node(self, node_id: str, endpoint: str) -> None:
        self.snap[node_id] = NodeState(node_id=node_id, endpoint=endpoint)
        self.meta[node_id] = NodeMeta(sandboxes=set())

    def heartbeat(
        self,
        node_id: str,
        sid: str,
        state: NodeState,
        create_successes: int,
        roster: list[str],
        now: int,
        reported: int = 0,
        create_fails: int = 0,
        batched: bool = False,
    ) -> int:
        """``batched``: sent in a heartbeat batch (lua/heartbeat_batch-5.lua,
        as a replica sends every Heartbeat RPC), which sweeps due
        reservations before its first heartbeat, whatever that heartbeat
        turns out to be."""
        meta = self.meta[node_id]
        if reported and meta.sid == sid and reported < meta.reported:
            if batched:
                self.sweep(now)
            return 0  # older than the newest the instance sent: nothing moves
        meta.reported = reported
        self.sweep(now)
        restarted = bool(meta.sid) and meta.sid != sid
        lead = stamp_lead(meta, reported, now, restarted) if reported else None
        taken = None if lead is None else reported - lead - STAMP_MARGIN_MS
        prev_cs, prev_mode, prev_cf = meta.create_successes, meta.roster_mode, meta.create_fails
        self.snap[node_id] = replace(
            state,
            node_id=node_id,
            endpoint=self.snap[node_id].endpoint,
            last_seen_ms=now,
            pending_count=0,
            pending_cpu=0,
            pending_memory_bytes=0,
        )
        # the baseline: the highest count the instance reported (0 for a new one)
        baseline = 0 if restarted else prev_cs
        if baseline is not None:
            baseline += meta.deletes  # (the DELETEs since the last heartbeat)
        meta.deletes = 0
        fail_base = 0 if restarted else prev_cf
        if fail_base is not None:
            fail_base += meta.cancels
        meta.cancels = 0
        if restarted:
            meta.replaced = meta.sid
        meta.sid = sid
        meta.create_successes = (
            create_successes if baseline is None else max(baseline, create_successes)
        )
        meta.create_fails = create_fails if fail_base is None else max(fail_base, create_fails)
        listed = list(dict.fromkeys(sb for sb in roster if sb))
        # (roster mode is kept across a restart: an empty roster is an empty node)
        roster_mode = prev_mode or bool(listed)
        released = 0
        for sb in listed:
            rid = self.bound_reservation(sb, node_id)
            if rid and self.end_charge(rid, node_id):
                released += 1
            released += self.write_binding(sb, node_id, True, rid, now)
        for sb in list(self._sbx(node_id)):
            if sb in listed:
                continue
            b = self.bind.get(sb)
            if b is None or b.node_id != node_id:
                self._sbx(node_id).discard(sb)
            elif b.listed:
                self.drop_binding(sb, node_id)
        # create_fails rising releases as many of the oldest pending
        # reservations, one heartbeat later, less the cancels meanwhile
        f = meta.fails_owed
        meta.fails_owed = max(0, create_fails - fail_base if fail_base is not None else 0)
        for r in [r for r in self.live_of(node_id) if r.state == "pending"]:
            if f <= 0:
                break
            if self.end(r.rid, "released"):
                released += 1
                f -= 1
        switching = roster_mode and not prev_mode and not restarted
        if not roster_mode or switching:
            guessed = False
            listed_n = len(listed) if switching else 0  # (the first roster: all joined)
            k = create_successes - baseline - listed_n if baseline is not None else 0
            live = self.live_of(node_id)
            for r in (
                [r for r in live if r.state == "acked"]
                + [r for r in live if r.state == "assigned"]
                + [r for r in live if r.state not in ("acked", "assigned")]
            ):
                if k <= 0:
                    break
                was = r.state
                if self.end(r.rid, "released"):
                    released += 1
                    k -= 1
                    if was == "pending":  # (counted before its assignment came)
                        meta.counted = (meta.counted + [r.rid])[-COUNTED_KEEP:]
                        guessed = True
            left = self.live_of(node_id)
            if guessed and left:
                meta.unclaimed_seq = left[-1].seq
        if roster_mode and meta.absent_watch:
            watching = False
            for r in self.live_of(node_id):
                if r.state not in ("assigned", "acked") or r.absent_cs is None:
                    continue
                # (counts: taken after the sandbox was created, by its
                # counter; or a stamped heartbeat other than the last counted)
                fresh = bool(reported) and reported != r.absent_rt
                b = self.bind.get(r.sandbox_id or "")
                absent = b is None or b.deleted or (b.node_id == node_id and not b.listed)
                if (fresh or not restarted and create_successes >= r.absent_cs) and absent:
                    r.absent_beats += 1
                    # (two that count; or one taken STAMP_MARGIN_MS after the
                    # assignment, by its stamp and the instance's lead)
                    if r.absent_beats >= 2 or (
                        taken is not None and r.assigned_ms is not None and taken >= r.assigned_ms
                    ):
                        released += self.end(r.rid, "released")
                        continue
                    if fresh:
                        r.absent_rt = reported
                watching = True
            meta.absent_watch = watching
        meta.reported_cs = create_successes
        meta.roster_mode = roster_mode
        return released

    def schedule(self, req: Request, rid: str, now: int, rand: float) -> Decision:
        self.sweep(now)
        d = decide(self.states(), self.policy, req, now, self.rr + 1, rand, rr_after=self.rr_cursor)
        if d.chosen is None:
            return d
        self.rr += 1
        if self.policy.strategy == "round_robin":
            self.rr_cursor = d.chosen
        if req.create:
            dem = Demand.of(req, self.policy)
            self.seq += 1
            self.res[rid] = ResModel(
                rid,
                d.chosen,
                dem.cpu,
                dem.memory_bytes,
                self.seq,
                now
                + min(self.policy.reservation_ttl_ms, self.policy.unassigned_reservation_ttl_ms),
                created_ms=now,
            )
        return d

    def assign(self, sb: str, node_id: str, wanted: str | None, now: int) -> str | None:
        self.sweep(now)
        already_listed = self.listed_on(sb, node_id)
        b = self.bind.get(sb)
        if b is not None and b.deleted and b.node_id == node_id and b.expires_ms > now:
            buried = None
            if not b.rid and not self.meta[node_id].roster_mode:
                buried = self.counted_claim_or_oldest(node_id, wanted, sb)
                if buried is not None:
                    b.rid = buried
                return buried
            if not b.rid:
                r = self.res.get(wanted) if wanted else None
                if wanted:
                    buried = (
                        wanted
                        if r is not None and r.node_id == node_id and r.state == "pending"
                        else None
                    )
                else:
                    buried = self.oldest_unclaimed(node_id)
            if buried is not None:
                self.end(buried, "released")
                b.rid = buried  # (the tombstone remembers it)
            return buried
        if b is not None and self.listed_elsewhere(sb, node_id, now):
            # another node's roster lists it: that node holds it, this
            # placement's reservation ends at once, once
            taken = None
            if not b.rid:
                # (a rise of this node's counter released one for it first)
                counted = self.counted_claim_or_oldest(node_id, wanted, sb)
                if counted is not None:
                    b.rid = counted
                    return counted
                if wanted:
                    r = self.res.get(wanted)
                    if r is not None and r.node_id == node_id and r.state == "pending":
                        taken = wanted
                else:
                    taken = self.oldest_unclaimed(node_id)
            if taken is not None:
                self.res[taken].sandbox_id = sb
                if self.end(taken, "released"):
                    b.rid = taken
                    self.counter_moves(node_id)
            return taken
        rid = self.bound_reservation(sb, node_id)
        if rid is None and not self.charged(sb, node_id):
            attached = None
            if wanted:
                r = self.res.get(wanted) or self.ended.get(wanted)
                if r is not None and r.node_id == node_id and r.state == "pending":
                    attached = wanted
                elif (
                    r is not None
                    and r.node_id == node_id
                    and r.state == "released"
                    and not r.sandbox_id
                ):
                    rid = self.counted_claim(node_id, wanted, sb)
                elif (
                    r is not None
                    and r.node_id == node_id
                    and r.sandbox_id
                    and r.sandbox_id != sb
                    and r.state in ("assigned", "acked", "released")
                ):
                    rid = self.counted_claim(node_id, "", sb)
                    attached = None if rid else self.newest_unclaimed(node_id)
            else:
                rid = self.counted_claim(node_id, "", sb)
                attached = None if rid else self.newest_unclaimed(node_id)
            if attached is not None:
                got = self.res[attached]
                got.state = "assigned"
                got.sandbox_id = sb
                got.expires_ms = got.created_ms + self.policy.reservation_ttl_ms
                got.assigned_ms = now
                rid = attached
                if not already_listed:
                    meta = self.meta[node_id]
                    got.absent_cs = meta.reported_cs + len(self.live_of(node_id))
                    got.absent_rt = meta.reported
                    meta.absent_watch = meta.absent_watch or meta.roster_mode
        if rid is not None and already_listed:
            self.end_charge(rid, node_id)
        self.write_binding(sb, node_id, already_listed, rid, now)
        return rid

    def events(self, node_id: str, events: list[tuple[str, str]], now: int, sid: str = "") -> None:
        meta = self.meta[node_id]
        if sid and sid != meta.sid and sid == meta.replaced:
            return  # the replaced instance's late events change nothing
        self.sweep(now)
        for sb, kind in events:
            rid = self.bound_reservation(sb, node_id)
            if kind == "DELETE":
                meta = self.meta[node_id]
                own = rid is not None and self.res[rid].node_id == node_id
                counts = not meta.roster_mode and meta.create_successes is not None
                if (
                    rid is not None
                    and own
                    and counts
                    and meta.unclaimed_seq is not None
                    and self.res[rid].seq <= meta.unclaimed_seq
                ):
                    rid = None  # (a rise that guessed left it live: the next rise ends it)
                released = rid is not None and self.end_charge(rid, node_id)
                if released and own and not meta.roster_mode and meta.create_successes is not None:
                    meta.deletes += 1  # the baseline moves on at the next heartbeat
                prev = self.bind.get(sb)
                if prev is not None and prev.node_id != node_id and not prev.deleted:
                    self.drop_binding(sb, node_id)  # (another node holds it now: its binding stays)
                    continue
                mine = prev is not None and prev.node_id == node_id
                charged = prev.rid if prev is not None and mine else None
                # (the tombstone keeps whether the node's last roster listed it)
                was_listed = prev is not None and mine and prev.listed
                self.drop_binding(sb, node_id)
                self.bind[sb] = BindModel(
                    node_id, "", was_listed, charged, now + self.policy.binding_ttl_ms, deleted=True
                )
                continue
            if self.listed_elsewhere(sb, node_id, now):
                continue  # another node's roster lists it: that node holds it
            creation = kind in ("CREATE", "FORK")
            listed = self.listed_on(sb, node_id)
            if rid is not None and creation and listed:
                self.end_charge(rid, node_id)
            elif rid is not None and creation and self.res[rid].node_id == node_id:
                self.res[rid].state = "acked"
            self.write_binding(sb, node_id, listed, rid, now)

    def cancel(self, rid: str, now: int) -> str:
        """Returns "cancelled", "not found" or "already <outcome>"."""
        if rid not in self.res:
            return f"already {self.ended[rid].state}" if rid in self.ended else "not found"
        if self.res[rid].state == "pending":
            meta = self.meta[self.res[rid].node_id]
            if meta.fails_owed > 0:
                meta.fails_owed -= 1
            else:
                meta.cancels += 1
        self.end(rid, "cancelled")
        self.sweep(now)
        return "cancelled"

    def lookup(self, sb: str, now: int) -> str | None:
        b = self.bind.get(sb)
        if b is None or b.deleted:
            return None
        return b.node_id if b.expires_ms > now else None
