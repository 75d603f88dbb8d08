"""Scenario ``locality``: warm starts without hot spots (issue #32's replay).

A replay in simulated time against a real ``redis-server``: the cell's
clock is frozen (``advance_clock``) and moved to each event's instant, so
an hour of arrivals, heartbeats, pulls and ends takes a minute, and every
strategy sees exactly the same arrivals.

- **Fleet**: nodes of 16, 64 and 192 CPUs (4 GiB per CPU), each with an
  artifact cache of bounded bytes, LRU, that records what it pulled in the
  artifact index (RecordP2pArtifact) when the pull completes and forgets
  what it evicts (ForgetP2pArtifact), as a real node does.  Artifacts a
  running or starting sandbox uses are never evicted.
- **Templates**: 50, popularity Zipf(1.1), each 1-3 artifacts of 0.5-4 GiB
  in all.  A start on a node that holds every artifact of its template is
  warm (``warm_start_s``); otherwise the node pulls what it misses at
  ``pull_mib_s`` (a start waits for a pull of the same artifact already in
  flight on its node instead of pulling it twice).
- **Load**: Poisson arrivals on a 1 s grid at the rate that keeps the fleet
  about ``utilisation`` allocated, exponential lifetimes, sandbox sizes of
  1-4 CPU (2 GiB per CPU).  Every node heartbeats every ``heartbeat_s``
  with its roster.  The arrivals of one second are decided concurrently by
  ``replicas`` library clients (threads, each its own connection), in
  rotation.  Each placement is created on its node and recorded
  (RecordAssignment) at once, as a gateway that records on accept does.
- **Ceilings**: overcommit 1.0 (the CPU capacity test binds) and
  ``max_sandbox_count`` ``ceiling`` per node; violations are counted on the
  simulated nodes themselves (their own truth, not the scheduler's view).

Strategies (each in a cell of its own, with the same seeded arrivals):

- ``round_robin``, ``least_loaded``: the library's strategies, locality off.
- ``pr51``: AgentENV PR #51's rule: among eligible nodes, those with the
  highest count of the template's artifact keys in the index (ties in node
  order; every node when none holds any), then round robin (a cursor per
  replica, as the reference keeps it in process memory).
- ``pr68``: AgentENV PR #68's grouped round robin: a template sticks to one
  node until ``group_budget`` placements, then the next node from a global
  cursor; groups in each replica's memory.
- ``kube``: kube-scheduler's ImageLocality score (per artifact held: size x
  holders / all nodes, summed, clamped to 23 MiB .. 1000 MiB x artifacts,
  scaled to 0-100) added to its least-allocated score (mean free share of
  CPU and memory after the placement, 0-100); ties at random.
- ``ours``: ``least_loaded`` with locality on (the library's own decision,
  requests carrying the template's locality requirements) when this tree's
  library has it; otherwise the row says so.

The three alternatives that are not the library's are decided by the bench
from the same Redis state (an ``explain`` dry run for eligibility and
projections, ``LookupP2pArtifact`` for who holds what, one pipeline) and
then placed through the library with the chosen node pinned.  A Request
cannot name a node, so the pin is the round-robin cursor: in one
MULTI/EXEC the bench sets the cell's cursor (the node round_robin chose
last) to the eligible node before the chosen one, in the script's order,
and sends ``schedule(strategy=round_robin)``, which takes the first
eligible node after the cursor;
the script re-checks status, ceilings and capacity, so ceilings are exact
for every strategy.  A placement that lands elsewhere (a concurrent
decision changed the eligible set in between) is counted as ``diverted``.

What each row reports, over the arrivals after ``warmup_s`` (the caches
start empty):

- ``warm_pct``: placements whose node held every artifact of the template;
  ``gib_pulled``: bytes those placements made nodes pull;
- ``peak_pressure``: the highest max(cpu, memory) allocation over the
  nodes, sampled every simulated second; ``inflight_p99``: the p99 over
  placements of the starts in flight on the chosen node, this one included;
- ``refused``, ``violations`` (creates that took a node over the ceiling or
  its CPU), ``diverted``;
- ``redis_calls_per_decision`` (the fleet-size rows): the ``redis.call``s
  one Schedule makes, counted with MONITOR over ``scale_monitored`` of them;
- ``redis_us_per_decision``: Redis time (INFO commandstats) of the
  decisions' script calls (the alternatives' explain and lookups
  included), per decision, and ``vs_least_loaded``: its ratio to ``least_loaded``'s in the
  same run.

``Params.diagnose`` (``--diagnose``) takes an explanation with each of
ours' Schedules, in the same MULTI/EXEC, and sorts every counted placement
on a node short of its template by what kept the full holders from winning
(``cold_placements``, summed in ``diagnosis``, beside what ``kube`` did with
the same arrivals), and lists the placements that took a node to
``hot_pressure`` (``hot_placements``).  Its Redis times are not a measure.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from bench.runner import Result, Target, machine, percentile
from scheduler import Heartbeat, Overcommit, Policy, Request, Scheduler
from scheduler.domain.errors import SchedulerError
from scheduler.domain.policy import Limits
from scheduler.domain.records import MIB, Explanation, Placement, Verdict
from scheduler.ops.simnode import SimNode
from scheduler.store.calls import Call

GIB = 1024 * MIB
CLUSTER = "loc"
BACKEND = "bench"
STRATEGIES = ("round_robin", "least_loaded", "pr51", "pr68", "kube", "ours")
#: the library decides these itself; the others are decided by the bench, then pinned
LIBRARY = {"round_robin": "round_robin", "least_loaded": "least_loaded", "ours": "least_loaded"}
#: sandbox sizes: CPU, memory MiB (2 GiB per CPU)
SIZES: tuple[tuple[int, int], ...] = ((1, 2048), (2, 4096), (2, 4096), (4, 8192))
#: kube-scheduler ImageLocality's thresholds
KUBE_MIN = 23 * MIB
KUBE_MAX_PER_CONTAINER = 1000 * MIB

COLUMNS = [
    "strategy",
    "setting",
    "nodes",
    "replicas",
    "placed",
    "warm_pct",
    "gib_pulled",
    "peak_pressure",
    "inflight_p99",
    "refused",
    "violations",
    "diverted",
    "redis_us_per_decision",
    "vs_least_loaded",
    "redis_calls_per_decision",
]


@dataclass(frozen=True)
class Params:
    node_cpus: tuple[int, ...] = (16, 64, 192)
    nodes_per_shape: int = 4
    memory_gib_per_cpu: int = 4
    #: artifact cache per node shape (GiB), in node_cpus order
    cache_gib: tuple[int, ...] = (12, 24, 48)
    templates: int = 50
    zipf_s: float = 1.1
    template_gib: tuple[float, float] = (0.5, 4.0)
    artifacts_per_template: tuple[int, int] = (1, 3)
    utilisation: float = 0.7
    mean_lifetime_s: float = 300.0
    #: simulated seconds of arrivals, and the first ones not counted
    seconds: int = 3000
    warmup_s: int = 600
    heartbeat_s: float = 5.0
    warm_start_s: float = 2.0
    pull_mib_s: float = 100.0
    ceiling: int = 64
    group_budget: int = 10
    strategies: tuple[str, ...] = STRATEGIES
    replicas: int = 3
    #: strategies also run with one replica (ceilings exact with 1 and 3)
    single: tuple[str, ...] = ("least_loaded", "ours")
    #: policy overrides for ``ours``' locality settings, ("key", "value") pairs
    locality: tuple[tuple[str, str], ...] = ()
    #: more ``ours`` rows (at ``replicas``), one per set of overrides: the
    #: sensitivity of the targets to the locality settings
    sweep: tuple[tuple[tuple[str, str], ...], ...] = ()
    #: fleet sizes of the Redis-CPU-per-decision rows (ours against least_loaded)
    scale_nodes: tuple[int, ...] = (1000, 10000)
    #: decisions per strategy and fleet size, in rounds of ``scale_batch``
    scale_decisions: int = 600
    scale_batch: int = 50
    #: Schedules whose redis.calls MONITOR counts, per strategy and fleet size
    scale_monitored: int = 20
    seed: int = 1
    #: sort ours' placements short of a full holder by what an explanation
    #: taken in the same MULTI/EXEC says of the full holders (a diagnostic:
    #: it adds an explain to each of ours' decisions, so its Redis time is
    #: not a measure), and compare each arrival with kube's placement of it
    diagnose: bool = False
    #: the replicas decide a tick's arrivals one after another, in turn, not
    #: from threads at once: a seed's run is then the same every time (a
    #: measure of the settings, not of the interleaving; ceilings under
    #: concurrency need the default)
    ordered: bool = False
    #: Params.diagnose lists ours' placements that took a node to this pressure
    hot_pressure: float = 0.875

    @classmethod
    def quick(cls) -> Params:
        return cls(
            nodes_per_shape=1,
            seconds=240,
            warmup_s=60,
            mean_lifetime_s=60.0,
            replicas=3,
            scale_nodes=(30, 90),
            scale_decisions=40,
            scale_batch=20,
            scale_monitored=5,
        )


# ---------------------------------------------------------------------------
# The workload
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Template:
    name: str
    #: (artifact key, bytes)
    artifacts: tuple[tuple[str, int], ...]

    @property
    def size(self) -> int:
        return sum(b for _, b in self.artifacts)


@dataclass(frozen=True)
class Arrival:
    at: int
    sandbox_id: str
    template: int
    cpu: int
    memory_mb: int
    lifetime_s: float


def templates(p: Params, rng: random.Random) -> list[Template]:
    out = []
    for i in range(p.templates):
        total = rng.uniform(*p.template_gib) * GIB
        k = rng.randint(*p.artifacts_per_template)
        cuts = sorted(rng.random() for _ in range(k - 1))
        shares = [b - a for a, b in zip([0.0, *cuts], [*cuts, 1.0], strict=True)]
        arts = tuple(
            (f"tpl-{i:02d}/part-{j}", max(MIB, int(total * s))) for j, s in enumerate(shares)
        )
        out.append(Template(f"tpl-{i:02d}", arts))
    return out


def zipf_weights(n: int, s: float) -> list[float]:
    w = [1.0 / (i + 1) ** s for i in range(n)]
    total = sum(w)
    return [x / total for x in w]


def poisson(rng: random.Random, lam: float) -> int:
    """Knuth's method (lam is small here: a few a second)."""
    limit, k, prod = math.exp(-lam), 0, rng.random()
    while prod > limit:
        k += 1
        prod *= rng.random()
    return k


def arrivals(p: Params, total_cpu: int) -> list[Arrival]:
    """The same arrivals for every strategy (seeded)."""
    rng = random.Random(f"{p.seed}-arrivals")
    mean_cpu = sum(c for c, _ in SIZES) / len(SIZES)
    rate = p.utilisation * total_cpu / (mean_cpu * p.mean_lifetime_s)
    weights = zipf_weights(p.templates, p.zipf_s)
    out = []
    seq = itertools.count()
    for t in range(p.seconds):
        for _ in range(poisson(rng, rate)):
            cpu, mib = rng.choice(SIZES)
            tpl = rng.choices(range(p.templates), weights)[0]
            life = rng.expovariate(1.0 / p.mean_lifetime_s)
            out.append(Arrival(t, f"sb-{next(seq)}", tpl, cpu, mib, life))
    return out


# ---------------------------------------------------------------------------
# A node's artifact cache
# ---------------------------------------------------------------------------
class Cache:
    """Bounded bytes, LRU; what a sandbox on the node uses is never evicted."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held: OrderedDict[str, int] = OrderedDict()
        self.pulling: dict[str, float] = {}
        self.pins: dict[str, int] = {}

    def used(self) -> int:
        return sum(self.held.values())

    def start(
        self, tpl: Template, now: float, pull_bps: float
    ) -> tuple[bool, int, float, list[str]]:
        """A start of ``tpl`` now: (warm, bytes pulled, when its artifacts are
        all here, keys whose pull it began)."""
        warm = all(k in self.held for k, _ in tpl.artifacts)
        missing = [(k, b) for k, b in tpl.artifacts if k not in self.held and k not in self.pulling]
        pulled = sum(b for _, b in missing)
        ready = now
        if missing:
            done = now + pulled / pull_bps
            for k, _ in missing:
                self.pulling[k] = done
            ready = done
        for k, _ in tpl.artifacts:
            if k in self.held:
                self.held.move_to_end(k)
            elif k in self.pulling:
                ready = max(ready, self.pulling[k])
            self.pins[k] = self.pins.get(k, 0) + 1
        return warm, pulled, ready, [k for k, _ in missing]

    def arrived(self, keys: Sequence[str], sizes: dict[str, int]) -> list[str]:
        """Pulls done: the keys are held; returns the keys evicted for room."""
        for k in keys:
            self.pulling.pop(k, None)
            self.held[k] = sizes[k]
            self.held.move_to_end(k)
        evicted = []
        used = self.used()
        for k in list(self.held):
            if used <= self.capacity:
                break
            if self.pins.get(k, 0) == 0 and k not in keys:
                used -= self.held.pop(k)
                evicted.append(k)
        return evicted

    def holds(self, tpl: Template) -> bool:
        return all(k in self.held for k, _ in tpl.artifacts)

    def release(self, tpl: Template) -> None:
        for k, _ in tpl.artifacts:
            left = self.pins.get(k, 0) - 1
            if left > 0:
                self.pins[k] = left
            else:
                self.pins.pop(k, None)


# ---------------------------------------------------------------------------
# Locality in the library (the `locality` branch's API), when this tree has it
# ---------------------------------------------------------------------------
def library_locality() -> bool:
    """Does this tree's Request carry locality requirements?"""
    import scheduler.domain.records as records

    fields = getattr(Request, "__struct_fields__", ())
    return "locality" in fields and hasattr(records, "LocalityRequirement")


def our_request(tpl: Template, cpu: int, memory_mb: int) -> Request:
    """A creation carrying ``tpl``'s artifacts as locality requirements (with
    their sizes) and its template id."""
    import scheduler.domain.records as records

    req_type: Any = getattr(records, "LocalityRequirement")  # noqa: B009 (newer trees only)
    reqs = tuple(req_type(key=k, size_bytes=b) for k, b in tpl.artifacts)
    fields: dict[str, Any] = {"cpu": cpu, "memory_bytes": memory_mb * MIB, "locality": reqs}
    if "template_id" in Request.__struct_fields__:
        fields["template_id"] = tpl.name
    return Request(**fields)


#: ``ours``' locality weight when the policy's default is 0 (off) and no
#: --locality weight=... is given: the setting docs/design.md ("Locality")
#: turns locality on with (``{"weight": 0.2}``, the other keys their defaults)
ON_WEIGHT = 0.2


def locality_policy(policy: Policy, overrides: Sequence[tuple[str, str]], on: bool) -> Policy:
    """``policy`` with locality switched ``on`` (weight ON_WEIGHT unless the
    policy's default or ``overrides`` say otherwise), ``overrides`` applied
    (``locality.`` prefix optional, JSON values); unchanged on a tree without."""
    if "locality" not in Policy.__struct_fields__ or not on:
        return policy
    raw = msgspec.to_builtins(policy)
    loc = dict(raw.get("locality") or {})
    if not loc.get("weight"):
        loc["weight"] = ON_WEIGHT
    for key, value in overrides:
        loc[key.removeprefix("locality.")] = msgspec.json.decode(value)
    raw["locality"] = loc
    out = msgspec.convert(raw, Policy)
    out.validate()
    return out


def setting_text(overrides: Sequence[tuple[str, str]]) -> str:
    return " ".join(f"{k.removeprefix('locality.')}={v}" for k, v in overrides)


# ---------------------------------------------------------------------------
# Deciding
# ---------------------------------------------------------------------------
def _pipeline(s: Scheduler, calls: Sequence[Call[Any]]) -> list[Any]:
    pipe = s.client.pipeline(transaction=False)
    for c in calls:
        s.scripts.call(c.script, c.keys, c.args, client=pipe)
    return [c.parse(r) for c, r in zip(calls, pipe.execute(), strict=True)]


def _group(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """The nodes the script picks among: eligible, of known capacity if any
    (lua/includes/schedule.lua), in its order (node id bytes)."""
    eligible = [v for v in verdicts if v.reason is None]
    known = [v for v in eligible if v.known_capacity]
    return known or eligible


class Replica:
    """One library client and the in-memory state a reference strategy
    keeps per process."""

    def __init__(self, url: str, cell: str, policy: Policy, seed: str) -> None:
        self.s = Scheduler.connect(url, cell=cell, policy=policy)
        self.rng = random.Random(seed)
        self.cursor = 0  # PR #51's round robin
        self.groups: OrderedDict[str, tuple[str, int]] = OrderedDict()  # PR #68
        self.last_group_node = ""

    def close(self) -> None:
        self.s.close()


@dataclass
class Decision:
    arrival: Arrival
    placement: Placement | None
    pinned: str | None = None
    refusal: str | None = None
    #: the dry run of the same decision in its MULTI/EXEC (Params.diagnose)
    explanation: Explanation | None = None


def _refused(e: BaseException) -> str:
    text = str(e)
    if "no nodes available" not in text:
        raise e
    return text


class Decider:
    def __init__(self, p: Params, strategy: str, tpls: Sequence[Template]) -> None:
        self.p = p
        self.strategy = strategy
        self.tpls = tpls

    def request(self, a: Arrival) -> Request:
        if self.strategy == "ours":
            return our_request(self.tpls[a.template], a.cpu, a.memory_mb)
        return Request(cpu=a.cpu, memory_bytes=a.memory_mb * MIB)

    def decide(self, r: Replica, a: Arrival) -> Decision:
        req = self.request(a)
        if self.strategy == "ours" and self.p.diagnose:
            return self._explained(r, a, req)
        if self.strategy in LIBRARY:
            try:
                return Decision(a, r.s.schedule(req, strategy=LIBRARY[self.strategy]))
            except SchedulerError as e:
                return Decision(a, None, refusal=_refused(e))
        tpl = self.tpls[a.template]
        replies = _pipeline(
            r.s,
            [
                r.s.ops.explain(req, "round_robin"),
                *(r.s.peer_ops.lookup(CLUSTER, BACKEND, k) for k, _ in tpl.artifacts),
            ],
        )
        ex: Explanation = replies[0]
        holders: list[set[str]] = [set(got) for got in replies[1:]]  # (the holders' ids)
        group = _group(ex.verdicts)
        chosen = None
        if group:
            pick = {"pr51": self._pr51, "pr68": self._pr68, "kube": self._kube}[self.strategy]
            chosen = pick(r, tpl, group, holders, len(ex.verdicts))
        return self._pinned(r, a, req, group, chosen)

    # -- the reference strategies ------------------------------------------------
    def _pr51(
        self, r: Replica, tpl: Template, group: list[Verdict], holders: list[set[str]], _n: int
    ) -> str:
        cover = {v.node_id: sum(v.node_id in h for h in holders) for v in group}
        best = max(cover.values())
        preferred = [v for v in group if cover[v.node_id] == best] if best > 0 else group
        node = preferred[r.cursor % len(preferred)].node_id
        r.cursor += 1
        return node

    def _pr68(
        self, r: Replica, tpl: Template, group: list[Verdict], _h: list[set[str]], _n: int
    ) -> str:
        ids = [v.node_id for v in group]
        budget = self.p.group_budget
        held = r.groups.get(tpl.name)
        if held is not None:
            node, count = held
            if node in ids and count < budget:
                if count + 1 >= budget:
                    del r.groups[tpl.name]
                else:
                    r.groups[tpl.name] = (node, count + 1)
                    r.groups.move_to_end(tpl.name)
                return node
            del r.groups[tpl.name]
        later = [i for i in ids if i > r.last_group_node] if r.last_group_node else ids
        node = (later or ids)[0]
        r.last_group_node = node
        if budget > 1:
            r.groups[tpl.name] = (node, 1)
            if len(r.groups) > 10_000:
                r.groups.popitem(last=False)
        return node

    def _kube(
        self, r: Replica, tpl: Template, group: list[Verdict], holders: list[set[str]], n: int
    ) -> str:
        top = KUBE_MAX_PER_CONTAINER * len(tpl.artifacts)
        scores: list[tuple[float, str]] = []
        for v in group:
            raw = sum(
                size * len(h) / max(1, n)
                for (_, size), h in zip(tpl.artifacts, holders, strict=True)
                if v.node_id in h
            )
            raw = min(max(raw, KUBE_MIN), top)
            image = 100.0 * (raw - KUBE_MIN) / (top - KUBE_MIN)
            free = 0.0
            for used, cap in (
                (v.projected_cpu, v.cpu_capacity),
                (v.projected_memory_bytes, v.memory_capacity_bytes),
            ):
                free += max(0.0, (cap - used) / cap) if cap > 0 else 0.0
            scores.append((image + 100.0 * free / 2, v.node_id))
        best = max(sc for sc, _ in scores)
        return r.rng.choice([nid for sc, nid in scores if sc == best])

    def _explained(self, r: Replica, a: Arrival, req: Request) -> Decision:
        """The library's decision with its explanation, in one MULTI/EXEC (the
        dry run sees exactly the state the Schedule decides from)."""
        ex_call = r.s.ops.explain(req, LIBRARY[self.strategy])
        call = r.s.ops.schedule(req, LIBRARY[self.strategy])
        pipe = r.s.client.pipeline(transaction=True)
        r.s.scripts.call(ex_call.script, ex_call.keys, ex_call.args, client=pipe)
        r.s.scripts.call(call.script, call.keys, call.args, client=pipe)
        got, reply = pipe.execute(raise_on_error=False)
        ex = ex_call.parse(got)
        if isinstance(reply, Exception):
            return Decision(a, None, refusal=_refused(reply), explanation=ex)
        return Decision(a, call.parse(reply), explanation=ex)

    # -- placing the chosen node through the library -----------------------------
    def _pinned(
        self, r: Replica, a: Arrival, req: Request, group: list[Verdict], chosen: str | None
    ) -> Decision:
        """Place through the library's own script with ``chosen`` pinned: the
        round_robin cursor set to the group's node before it (the last one
        when it is the first: the walk wraps) and a round_robin Schedule, in
        one MULTI/EXEC."""
        call = r.s.ops.schedule(req, "round_robin")
        pos = next((i for i, v in enumerate(group) if v.node_id == chosen), None)
        pipe = r.s.client.pipeline(transaction=True)
        if pos is not None:
            pipe.set(r.s.ops.k.rr_cursor, group[pos - 1].node_id)
        r.s.scripts.call(call.script, call.keys, call.args, client=pipe)
        reply = pipe.execute(raise_on_error=False)[-1]
        if isinstance(reply, Exception):
            return Decision(a, None, pinned=chosen, refusal=_refused(reply))
        return Decision(a, call.parse(reply), pinned=chosen)


# ---------------------------------------------------------------------------
# Params.diagnose: where ours' cold starts come from
# ---------------------------------------------------------------------------
#: what kept a full holder from winning, closest to winning first
CAUSES = ("score", "decay", "gap", "capacity unknown", "index", "other", "ineligible")


def _cause(v: Verdict, weight: float) -> str:
    if v.reason is not None:
        return "ineligible"
    if " + max_pressure_gap " in v.locality or " + headroom_share " in v.locality:
        return "gap"
    if v.locality.startswith("pressure - bonus"):
        return "decay" if v.bonus < weight * v.coverage - 1e-9 else "score"
    if v.locality == "capacity unknown":
        return v.locality
    if v.coverage < 1:
        return "index"
    return "other"


def _sort_cold(
    d: Decision, tpl: Template, nodes: Sequence[SimNode], caches: Sequence[Cache], weight: float
) -> dict[str, Any]:
    """One placement of ours on a node short of ``tpl``: why no full holder
    (by the simulated caches) won, by the explanation taken with it."""
    assert d.explanation is not None and d.placement is not None
    verdicts = {v.node_id: v for v in d.explanation.verdicts}
    chosen = verdicts[d.placement.node_id]
    eligible = [v for v in verdicts.values() if v.reason is None]
    coolest = min(v.pressure for v in eligible) if eligible else chosen.pressure
    out: dict[str, Any] = {
        "sandbox": d.arrival.sandbox_id,
        "template": tpl.name,
        "chosen": chosen.node_id,
        "chosen_pressure": round(chosen.pressure, 3),
        "chosen_coverage": round(chosen.coverage, 3),
        "coolest": round(coolest, 3),
        "cause": "no full holder",
    }
    full = [verdicts[n.node_id] for n, c in zip(nodes, caches, strict=True) if c.holds(tpl)]
    if not full:
        return out
    causes = {v.node_id: _cause(v, weight) for v in full}
    best = min(full, key=lambda v: (CAUSES.index(causes[v.node_id]), v.pressure))
    cause = causes[best.node_id]
    out.update(
        cause=cause,
        detail=best.reason or best.locality,
        holders=len(full),
        holder=best.node_id,
        holder_pressure=round(best.pressure, 3),
        holder_bonus=round(best.bonus, 3),
        excess=round(best.pressure - coolest, 3),
        causes=sorted(causes.values()),
    )
    return out


def _hot(d: Decision, node: SimNode, warm: bool) -> dict[str, Any]:
    """One placement of ours that took its node to Params.hot_pressure or
    over: was it locality's doing (the node above the coolest eligible)?"""
    assert d.explanation is not None and d.placement is not None
    verdicts = {v.node_id: v for v in d.explanation.verdicts}
    chosen = verdicts[d.placement.node_id]
    eligible = [v.pressure for v in verdicts.values() if v.reason is None]
    return {
        "sandbox": d.arrival.sandbox_id,
        "node": node.node_id,
        "after": round(node.pressure(), 3),
        "chosen_pressure": round(chosen.pressure, 3),
        "coolest": round(min(eligible, default=chosen.pressure), 3),
        "coverage": round(chosen.coverage, 3),
        "warm": warm,
    }


def diagnosis(rows: list[dict[str, Any]]) -> list[str]:
    """The diagnostic rows' summary (and their private keys dropped): for
    each of ours' rows, its cold placements by cause, and what kube (same
    replicas) did with the same arrivals."""
    kube = next((r for r in rows if r.get("strategy") == "kube" and "_seen" in r), None)
    ll = next((r for r in rows if r.get("strategy") == "least_loaded" and "_seen" in r), None)
    out: list[str] = []
    for row in rows:
        cold = row.get("cold_placements")
        if row.get("strategy") != "ours" or cold is None:
            continue
        head = f"ours {row.get('setting') or 'default'} x{row.get('replicas')}"
        by: dict[str, list[dict[str, Any]]] = {}
        for c in cold:
            by.setdefault(c["cause"], []).append(c)
        summary: dict[str, Any] = {}
        out.append(f"{head}: {len(cold)} placements short of a full holder")
        for cause, items in sorted(by.items(), key=lambda kv: -len(kv[1])):
            line = f"  {cause}: {len(items)}"
            info: dict[str, Any] = {"n": len(items)}
            ex = sorted(c["excess"] for c in items if "excess" in c)
            if ex:
                info["excess"] = [ex[0], ex[len(ex) // 2], ex[-1]]
                line += f"; holder pressure over the coolest min/median/max {info['excess']}"
            if kube is not None and kube.get("replicas") == row.get("replicas"):
                ks = [kube["_seen"].get(c["sandbox"]) for c in items]
                kw = [k for k in ks if k is not None and k[0]]
                kp = sorted(k[2] for k in kw)
                info["kube_warm"] = len(kw)
                line += f"; kube warm {len(kw)}"
                if kp:
                    info["kube_pressure"] = [kp[0], kp[len(kp) // 2], kp[-1]]
                    line += f" at node pressure after min/median/max {info['kube_pressure']}"
            details: dict[str, int] = {}
            for c in items:
                key = str(c.get("detail", ""))
                key = key.split(" over ")[0] if c.get("cause") == "gap" else key[:40]
                details[key] = details.get(key, 0) + 1
            info["details"] = details
            summary[cause] = info
            out.append(line)
        if kube is not None and kube.get("replicas") == row.get("replicas"):
            mine = row["_seen"]
            theirs = kube["_seen"]
            both = set(mine) & set(theirs)
            only_kube = sum(1 for k in both if theirs[k][0] and not mine[k][0])
            only_ours = sum(1 for k in both if mine[k][0] and not theirs[k][0])
            hot = sorted(v[2] for v in theirs.values())
            out.append(
                f"  same arrivals: kube warm where ours not {only_kube}, ours warm where "
                f"kube not {only_ours}; kube's node pressure after placement p50/p90/p99/max "
                f"{[percentile(hot, q) for q in (50, 90, 99, 100)]}"
            )
        if ll is not None:
            hot = sorted(v[2] for v in row["_seen"].values())
            base = sorted(v[2] for v in ll["_seen"].values())
            out.append(
                f"  ours' node pressure after placement p50/p90/p99/max "
                f"{[percentile(hot, q) for q in (50, 90, 99, 100)]}; least_loaded's "
                f"{[percentile(base, q) for q in (50, 90, 99, 100)]}"
            )
        row["diagnosis"] = summary
    for row in rows:
        row.pop("_seen", None)
    return out


# ---------------------------------------------------------------------------
# One strategy's replay
# ---------------------------------------------------------------------------
@dataclass
class Tally:
    placed: int = 0
    warm: int = 0
    pulled: int = 0
    refused: int = 0
    violations: int = 0
    diverted: int = 0
    decisions: int = 0
    redis_us: int = 0
    peak_pressure: float = 0.0
    inflight: list[int] = field(default_factory=list)


def _busy_us(target: Target) -> int:
    """Redis time of the script calls so far (FCALL and EVALSHA; microseconds).

    Only the calls a client sends: Redis also counts each ``redis.call`` a
    script makes under its own command (``cmdstat_hget``...), inside the
    script's time already, so summing every command would count those twice.
    Left out: the pin's SET, MULTI and EXEC (EXEC's time holds its commands'),
    a microsecond or two."""
    _, usec = target.script_stats()
    return usec


def _nodes(p: Params, clock: Callable[[], float]) -> tuple[list[SimNode], list[Cache]]:
    nodes, caches = [], []
    for shape, (cpu, cache) in enumerate(zip(p.node_cpus, p.cache_gib, strict=True)):
        for i in range(p.nodes_per_shape):
            nodes.append(
                SimNode(
                    f"n{cpu:03d}-{i:02d}",
                    cpu,
                    cpu * p.memory_gib_per_cpu * GIB,
                    cluster_id=CLUSTER,
                    clock=clock,
                    busy_percent=0,
                    memory_used_percent=0,
                )
            )
            caches.append(Cache(cache * GIB))
        del shape
    return nodes, caches


def _heartbeat(node: SimNode) -> Heartbeat:
    hb = node.heartbeat()
    hb.p2p_backend = BACKEND
    hb.p2p_address = f"{node.node_id}.{CLUSTER}:7000"
    return hb


def run_one(
    p: Params,
    target: Target,
    strategy: str,
    replicas: int,
    tpls: Sequence[Template],
    stream: Sequence[Arrival],
    settings: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    now = [0.0]
    nodes, caches = _nodes(p, lambda: now[0])
    by_id = {n.node_id: i for i, n in enumerate(nodes)}
    sizes = {k: b for t in tpls for k, b in t.artifacts}
    cell = target.new_cell("locality")
    policy = Policy(
        strategy="least_loaded",
        overcommit=Overcommit(cpu=1.0, memory=1.0),
        limits=Limits(max_sandbox_count=p.ceiling),
        report_ttl_ms=int(p.heartbeat_s * 6000),
    )
    policy = locality_policy(policy, settings, strategy == "ours")
    pool = [Replica(target.url, cell, policy, f"{p.seed}-{strategy}-{k}") for k in range(replicas)]
    side = pool[0].s
    decider = Decider(p, strategy, tpls)
    tally = Tally()
    #: Params.diagnose: ours' placements short of a full holder, sorted; and
    #: every counted arrival's (warm, node, its pressure after the create)
    diag: list[dict[str, Any]] = []
    seen: dict[str, tuple[bool, str, float]] = {}
    hot: list[dict[str, Any]] = []
    weight = policy.locality.weight if "locality" in Policy.__struct_fields__ else 0.0
    events: list[tuple[float, int, str, Any]] = []
    seq = itertools.count()
    redis_now = [0.0]

    def clock_to(t: float) -> None:
        now[0] = t
        step = int(round(t * 1000)) - int(round(redis_now[0] * 1000))
        if step > 0:
            side.advance_clock(step)
            redis_now[0] = t

    rng = random.Random(f"{p.seed}-heartbeats")
    try:
        side.advance_clock(0, "freeze")
        for n in nodes:
            side.heartbeat(_heartbeat(n))
            heapq.heappush(events, (rng.uniform(0, p.heartbeat_s), next(seq), "hb", n))
        by_tick: dict[int, list[Arrival]] = {}
        for a in stream:
            by_tick.setdefault(a.at, []).append(a)
        workers = (
            ThreadPoolExecutor(max_workers=replicas) if replicas > 1 and not p.ordered else None
        )
        turn = 0
        for tick in range(p.seconds + 1):
            while events and events[0][0] <= tick:
                at, _, kind, data = heapq.heappop(events)
                clock_to(at)
                if kind == "hb":
                    side.heartbeat(_heartbeat(data))
                    heapq.heappush(events, (at + p.heartbeat_s, next(seq), "hb", data))
                elif kind == "pulled":
                    i, keys = data
                    for k in keys:
                        side.record_artifact(CLUSTER, BACKEND, k, nodes[i].node_id)
                    for k in caches[i].arrived(keys, sizes):
                        side.forget_artifact(CLUSTER, BACKEND, k, nodes[i].node_id)
                elif kind == "end":
                    i, tpl = data
                    caches[i].release(tpls[tpl])
            clock_to(float(tick))
            counted = tick >= p.warmup_s
            if counted:
                tally.peak_pressure = max(tally.peak_pressure, max(n.pressure() for n in nodes))
            batch = by_tick.get(tick, [])
            if not batch:
                continue
            shares: list[list[Arrival]] = [[] for _ in pool]
            turns = []
            for a in batch:
                shares[turn % replicas].append(a)
                turns.append(pool[turn % replicas])
                turn += 1
            before = _busy_us(target)
            if workers is None:
                decided = [decider.decide(r, a) for r, a in zip(turns, batch, strict=True)]
            else:
                futures = [
                    workers.submit(lambda r, share: [decider.decide(r, a) for a in share], r, sh)
                    for r, sh in zip(pool, shares, strict=True)
                ]
                decided = [d for f in futures for d in f.result()]
            spent = _busy_us(target) - before
            if counted:
                tally.decisions += len(batch)
                tally.redis_us += spent
            for d in sorted(decided, key=lambda d: d.arrival.sandbox_id):
                a = d.arrival
                if d.placement is None:
                    tally.refused += counted
                    continue
                i = by_id[d.placement.node_id]
                node, tpl = nodes[i], tpls[a.template]
                if counted and d.explanation is not None and not caches[i].holds(tpl):
                    diag.append(_sort_cold(d, tpl, nodes, caches, weight))
                warm, pulled, ready, began = caches[i].start(tpl, now[0], p.pull_mib_s * MIB)
                node.starting_s = ready - now[0] + p.warm_start_s
                node.create(a.sandbox_id, a.cpu, a.memory_mb * MIB, a.lifetime_s)
                if counted and p.diagnose:
                    seen[a.sandbox_id] = (warm, node.node_id, round(node.pressure(), 3))
                    if d.explanation is not None and node.pressure() >= p.hot_pressure:
                        hot.append(_hot(d, node, warm))
                side.assign(a.sandbox_id, node.node_id, node.endpoint, d.placement.reservation_id)
                if began:
                    heapq.heappush(events, (ready, next(seq), "pulled", (i, began)))
                ends = now[0] + node.starting_s + a.lifetime_s
                heapq.heappush(events, (ends, next(seq), "end", (i, a.template)))
                over = node.count() > p.ceiling or node.allocated_cpu > node.cpu
                if counted:
                    tally.placed += 1
                    tally.warm += warm
                    tally.pulled += pulled
                    tally.violations += over
                    tally.diverted += d.pinned is not None and d.pinned != node.node_id
                    tally.inflight.append(node.observe().starting)
        if workers is not None:
            workers.shutdown()
        # the index holds exactly what the caches hold (records and forgets kept up)
        agrees = True
        for key in sizes:
            holders = {peer.node_id for peer in side.lookup_artifact(CLUSTER, BACKEND, key)}
            agrees &= holders == {nodes[i].node_id for i, c in enumerate(caches) if key in c.held}
    finally:
        for r in pool:
            r.close()
        target.drop_cell(cell)
    return {
        "strategy": strategy,
        "setting": setting_text(settings) if strategy == "ours" else "",
        "nodes": len(nodes),
        "replicas": replicas,
        "placed": tally.placed,
        "warm_pct": round(100.0 * tally.warm / max(1, tally.placed), 1),
        "gib_pulled": round(tally.pulled / GIB, 1),
        "peak_pressure": round(tally.peak_pressure, 3),
        "inflight_p99": percentile(tally.inflight, 99) if tally.inflight else 0,
        "refused": tally.refused,
        "violations": tally.violations,
        "diverted": tally.diverted,
        "redis_us_per_decision": round(tally.redis_us / max(1, tally.decisions), 1),
        "vs_least_loaded": None,
        "redis_calls_per_decision": None,  # (counted in the fleet-size rows)
        "decisions": tally.decisions,
        "index_agrees": agrees,
        "per_node_peak_sandboxes": [n.peak_sandboxes for n in nodes],
        "cache_used_gib": [round(c.used() / GIB, 1) for c in caches],
        **({"cold_placements": diag, "hot_placements": hot, "_seen": seen} if p.diagnose else {}),
    }


# ---------------------------------------------------------------------------
# Redis CPU per decision by fleet size
# ---------------------------------------------------------------------------
def _scale_fleet(
    p: Params, n: int, tpls: Sequence[Template], rng: random.Random
) -> tuple[list[SimNode], list[list[str]]]:
    """``n`` nodes of the replay's shapes, 30-70 % allocated, each cache
    filled with templates drawn by popularity: (nodes, artifact keys held)."""
    weights = zipf_weights(len(tpls), p.zipf_s)
    nodes, held = [], []
    for i in range(n):
        shape = i % len(p.node_cpus)
        cpu = p.node_cpus[shape]
        node = SimNode(
            f"n{i:05d}",
            cpu,
            cpu * p.memory_gib_per_cpu * GIB,
            cluster_id=CLUSTER,
            busy_percent=0,
            memory_used_percent=0,
        )
        target_cpu = rng.uniform(0.3, 0.7) * cpu
        k = 0
        while True:
            c, mib = rng.choice(SIZES)
            if node.allocated_cpu + c > target_cpu:
                break
            node.create(f"{node.node_id}-sb{k}", c, mib * MIB)
            k += 1
        room, keys, seen = p.cache_gib[shape] * GIB, [], set()
        for _ in range(4 * len(tpls)):
            t = rng.choices(range(len(tpls)), weights)[0]
            if t in seen or tpls[t].size > room:
                continue
            seen.add(t)
            room -= tpls[t].size
            keys += [key for key, _ in tpls[t].artifacts]
        nodes.append(node)
        held.append(keys)
    return nodes, held


def calls_per_decision(target: Target, s: Scheduler, calls: Sequence[Call[Placement]]) -> float:
    """The ``redis.call``s one Schedule makes, on average over ``calls``,
    counted with MONITOR (which lists each command a script runs); the
    placements are cancelled after.  Nothing else may run meanwhile."""
    import threading

    seen: list[str] = []
    stop = threading.Event()
    ready = threading.Event()

    def listen() -> None:
        with target.client.monitor() as m:
            ready.set()
            for line in m.listen():
                if stop.is_set():
                    return
                seen.append(str(line["command"]))

    watcher = threading.Thread(target=listen, daemon=True)
    watcher.start()
    ready.wait(10)
    target.client.ping()  # (MONITOR is on once its first line arrives)
    while not seen:
        target.client.ping()
    seen.clear()
    placed = []
    for c in calls:
        try:
            placed.append(s.run(c))
        except SchedulerError as e:
            _refused(e)
    stop.set()
    target.client.ping()  # wakes the watcher
    watcher.join(10)
    for pl in placed:
        if pl.reservation_id:
            s.cancel(pl.reservation_id)
    top = [x for x in seen if x.startswith(("FCALL", "EVALSHA"))]
    inner = [x for x in seen if not x.startswith(("FCALL", "EVALSHA", "PING"))]
    return round(len(inner) / max(1, len(top)), 1)


def scale_rows(p: Params, target: Target, tpls: Sequence[Template]) -> list[dict[str, Any]]:
    """Redis time per Schedule of ``ours`` and ``least_loaded`` on fleets of
    ``scale_nodes``: the same fleet, caches and request stream in two cells,
    decided in alternating rounds (one client, nothing else running), every
    round's reservations cancelled after it is measured."""
    from bench.fleet import run_pipelined, send_heartbeats

    strategies = ["least_loaded"] + (["ours"] if library_locality() else [])
    rows: list[dict[str, Any]] = []
    for n in p.scale_nodes:
        rng = random.Random(f"{p.seed}-scale-{n}")
        nodes, held = _scale_fleet(p, n, tpls, rng)
        stream_rng = random.Random(f"{p.seed}-scale-stream-{n}")
        weights = zipf_weights(len(tpls), p.zipf_s)
        stream = [
            (stream_rng.choices(range(len(tpls)), weights)[0], *stream_rng.choice(SIZES))
            for _ in range(p.scale_decisions)
        ]
        cells: dict[str, tuple[str, Scheduler, Decider]] = {}
        try:
            for strategy in strategies:
                cell = target.new_cell("locality-scale")
                policy = Policy(
                    strategy="least_loaded",
                    overcommit=Overcommit(cpu=1.0, memory=1.0),
                    limits=Limits(max_sandbox_count=p.ceiling),
                    report_ttl_ms=3_600_000,
                )
                policy = locality_policy(policy, p.locality, strategy == "ours")
                s = Scheduler.connect(target.url, cell=cell, policy=policy)
                cells[strategy] = (cell, s, Decider(p, strategy, tpls))
                send_heartbeats(s, [_heartbeat(node) for node in nodes])
                run_pipelined(
                    s,
                    [
                        s.peer_ops.record(CLUSTER, BACKEND, key, node.node_id)
                        for node, keys in zip(nodes, held, strict=True)
                        for key in keys
                    ],
                    batch=2000,
                )
            spent = dict.fromkeys(strategies, 0)
            placed = dict.fromkeys(strategies, 0)
            for start in range(0, len(stream), p.scale_batch):
                chunk = stream[start : start + p.scale_batch]
                for strategy in strategies:
                    _, s, decider = cells[strategy]
                    reqs = [
                        decider.request(Arrival(0, "", tpl, cpu, mib, 0.0))
                        for tpl, cpu, mib in chunk
                    ]
                    calls = [s.ops.schedule(req, LIBRARY[strategy]) for req in reqs]
                    before = _busy_us(target)
                    got = []
                    for c in calls:
                        try:
                            got.append(s.run(c))
                        except SchedulerError as e:
                            _refused(e)
                    spent[strategy] += _busy_us(target) - before
                    placed[strategy] += len(got)
                    for pl in got:
                        if pl.reservation_id:
                            s.cancel(pl.reservation_id)
            for strategy in strategies:
                _, s, decider = cells[strategy]
                sample = [
                    s.ops.schedule(
                        decider.request(Arrival(0, "", tpl, cpu, mib, 0.0)), LIBRARY[strategy]
                    )
                    for tpl, cpu, mib in stream[: p.scale_monitored]
                ]
                rows.append(
                    {
                        "strategy": strategy,
                        "nodes": n,
                        "placed": placed[strategy],
                        "decisions": len(stream),
                        "redis_us_per_decision": round(spent[strategy] / len(stream), 1),
                        "vs_least_loaded": None,
                        "redis_calls_per_decision": calls_per_decision(target, s, sample),
                    }
                )
        finally:
            for cell, s, _ in cells.values():
                s.close()
                target.drop_cell(cell)
    if not library_locality() and p.scale_nodes:
        rows.append(
            {
                "strategy": "ours",
                "nodes": p.scale_nodes[-1] if p.scale_nodes else None,
                "note": "this tree's library has no locality requirements "
                "(the `locality` branch is not merged)",
            }
        )
    return rows


def run(target: Target, p: Params | None = None) -> Result:
    p = p or Params()
    facts = machine(target)
    rng = random.Random(f"{p.seed}-templates")
    tpls = templates(p, rng)
    total_cpu = p.nodes_per_shape * sum(p.node_cpus)
    total_nodes = p.nodes_per_shape * len(p.node_cpus)
    stream = arrivals(p, total_cpu)
    have_ours = library_locality()
    rows: list[dict[str, Any]] = []
    plan = [(s, p.replicas) for s in p.strategies]
    plan += [(s, 1) for s in p.single if s in p.strategies and p.replicas != 1]
    for strategy, replicas in plan:
        if strategy == "ours" and not have_ours:
            rows.append(
                {
                    "strategy": strategy,
                    "nodes": total_nodes,
                    "replicas": replicas,
                    "note": "this tree's library has no locality requirements "
                    "(the `locality` branch is not merged)",
                }
            )
            continue
        rows.append(run_one(p, target, strategy, replicas, tpls, stream, p.locality))
    if have_ours:
        for settings in p.sweep:
            rows.append(run_one(p, target, "ours", p.replicas, tpls, stream, settings))
    rows += scale_rows(p, target, tpls)
    for row in rows:
        base = next(
            (
                r
                for r in rows
                if r["strategy"] == "least_loaded"
                and r.get("replicas") == row.get("replicas")
                and r.get("nodes") == row.get("nodes")
            ),
            None,
        )
        if base and "redis_us_per_decision" in row and base["redis_us_per_decision"]:
            row["vs_least_loaded"] = round(
                row["redis_us_per_decision"] / base["redis_us_per_decision"], 2
            )
    found = diagnosis(rows)
    for line in found:
        print(line, file=sys.stderr, flush=True)
    mean_cpu = sum(c for c, _ in SIZES) / len(SIZES)
    rate = p.utilisation * total_cpu / (mean_cpu * p.mean_lifetime_s)
    notes = [
        f"{p.nodes_per_shape} nodes each of {', '.join(map(str, p.node_cpus))} CPU "
        f"({p.memory_gib_per_cpu} GiB per CPU; caches of {', '.join(map(str, p.cache_gib))} GiB); "
        f"{p.templates} templates, Zipf({p.zipf_s:g}), {p.template_gib[0]:g}-"
        f"{p.template_gib[1]:g} GiB in {p.artifacts_per_template[0]}-"
        f"{p.artifacts_per_template[1]} artifacts",
        f"{len(stream)} arrivals over {p.seconds} simulated s ({rate:.2f}/s, "
        f"{p.utilisation:.0%} of the CPUs at a mean lifetime of {p.mean_lifetime_s:g} s); "
        f"counted after {p.warmup_s} s; heartbeats every {p.heartbeat_s:g} s with rosters; "
        f"{p.replicas} library replicas"
        + (" deciding each tick's arrivals in turn (--ordered)" if p.ordered else "")
        + f"; max_sandbox_count {p.ceiling}, overcommit 1.0",
        f"warm start {p.warm_start_s:g} s; pulls at {p.pull_mib_s:g} MiB/s; "
        f"pr68's budget {p.group_budget}",
    ]
    params = asdict(p)
    params["arrivals"] = len(stream)
    params["library_locality"] = have_ours
    return Result("locality", COLUMNS, rows, params=params, machine=facts, notes=notes)
