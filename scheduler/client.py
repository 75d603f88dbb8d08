"""The client API, sync (:class:`Scheduler`) and asyncio (:class:`AsyncScheduler`).

Both are thin: every operation is built once by :class:`Ops` as a
:class:`Call` (script, KEYS, ARGV, reply parser) and the two classes only
differ in how they run it.  Input is validated before anything reaches Redis
(:class:`~scheduler.errors.InvalidArgument` names the field); script error
replies map to the exceptions of :mod:`scheduler.errors`; transport failures
become :class:`~scheduler.errors.StoreUnavailable` naming Redis.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec.json
import redis
from redis.crc import key_slot

from scheduler import acl
from scheduler.connection import (
    DEFAULT_TIMEOUT_S,
    Durability,
    Fence,
    PrimaryCheck,
    async_client,
    describe_target,
    is_cluster_client,
    is_sentinel_client,
    sync_client,
)
from scheduler.errors import (
    InvalidArgument,
    NotFound,
    NotReplicated,
    PolicyConflict,
    SchedulerError,
    StoreUnavailable,
    from_reply,
)
from scheduler.keys import DEFAULT_CELL, DEFAULT_PREFIX, CellKeys, validate_id
from scheduler.limits import MAX_EVENTS, MAX_STATIC_NODES, at_most
from scheduler.model import rank_key
from scheduler.policy import LIMIT_NAMES, Policy
from scheduler.records import (
    MAX_BYTES,
    MAX_COUNT,
    MAX_CPU,
    AssignResult,
    Binding,
    CeilingUse,
    EventsResult,
    Explanation,
    Heartbeat,
    HeartbeatResult,
    NodeView,
    Placement,
    Request,
    Reservation,
    SandboxEvent,
    Stats,
    Verdict,
)
from scheduler.scripts import EVAL, AsyncScriptRegistry, ScriptRegistry

T = TypeVar("T")
log = logging.getLogger("scheduler.client")

#: Scripts that never write: no WAIT after them (min_replicas_acked).
READ_ONLY_SCRIPTS = frozenset({"lookup", "nodes_view", "observed", "peer_list", "reservations",
                               "stats"})

#: Fields the policy hash keeps beside the policy (drill clock, packed copy,
#: index layout); lua/sync_policy-5.lua leaves them out of the comparison too.
NOT_POLICY = ("time_offset_ms", "frozen_now_ms", "packed", "index_format", "settle_ms")

SNAPSHOT_INT_FIELDS: tuple[tuple[str, int], ...] = (
    ("allocated_cpu", MAX_CPU),
    ("allocated_memory_bytes", MAX_BYTES),
    ("cpu_percent", 100_000),
    ("cpu_count", MAX_CPU),
    ("memory_used_bytes", MAX_BYTES),
    ("memory_total_bytes", MAX_BYTES),
    ("sandbox_count", MAX_COUNT),
    ("sandbox_starting_count", MAX_COUNT),
    ("create_successes", 1 << 53),
    ("create_fails", 1 << 53),
    ("reported_at_unix_ms", 1 << 53),
    ("paused_sandbox_count", MAX_COUNT),
    ("paused_allocated_cpu", MAX_CPU),
    ("paused_allocated_memory_bytes", MAX_BYTES),
)
MAX_TEXT = 64 * 1024


def _text(field: str, value: str, limit: int = 1024) -> str:
    if len(value) > limit:
        raise InvalidArgument(field, f"is longer than {limit} characters")
    return value


def _whole(field: str, value: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise InvalidArgument(field, f"must be a whole number in 0..{maximum}, not {value!r}")
    return value


def _opt_int(v: Any) -> int | None:
    return None if v in (None, "", b"") else int(v)


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _pairs(flat: list[Any]) -> dict[str, str]:
    it = iter(flat)
    return {_s(k): _s(v) for k, v in zip(it, it, strict=False)}


class Resync(Exception):
    """A delta heartbeat met a record it was not based on: send it in full."""


@dataclass(frozen=True)
class Beat:
    """What a replica last wrote for a node: the base of its next delta."""

    base: str  # "<incarnation>:<generation>" of the record this replica wrote
    service_instance_id: str
    endpoint: str
    fields: dict[str, str]
    roster_digest: str


def roster_digest(roster: list[str]) -> str:
    return hashlib.blake2b("\n".join(sorted(roster)).encode(), digest_size=12).hexdigest()


@dataclass(frozen=True)
class Call(Generic[T]):
    script: str
    keys: list[str]
    args: list[str]
    parse: Callable[[Any], T]
    #: False: this call writes nothing (no WAIT after it)
    writes: bool = True

    @property
    def acked(self) -> bool:
        """Must Redis replicas have this call's writes before it is answered?"""
        return self.writes and self.script not in READ_ONLY_SCRIPTS


class Ops:
    """Builds every operation as a :class:`Call`.  No I/O here."""

    def __init__(self, keys: CellKeys) -> None:
        self.k = keys
        #: the cell's policy as this client last stored or read it; its input
        #: bounds are checked here, before Redis (the scripts check the stored one)
        self.known_policy: Policy | None = None

    @property
    def bounds(self) -> Policy:
        return self.known_policy or _DEFAULT_POLICY

    def _call(self, script: str, args: list[str], parse: Callable[[Any], T],
              extra_keys: tuple[str, ...] = ()) -> Call[T]:
        return Call(script, [*self.k.fixed(), *extra_keys], args, parse)

    # -- heartbeat ---------------------------------------------------------
    def heartbeat(self, hb: Heartbeat, memo: dict[str, Beat] | None = None,
                  ) -> Call[HeartbeatResult]:
        """The heartbeat in full, or, given the ``memo`` of what this replica
        last wrote, as a delta: only changed fields, the roster only if its
        digest changed.  The script applies a delta only to the record it was
        based on (same generation); otherwise the parser raises Resync and
        the caller sends it again in full.  Either way the memo learns the
        result."""
        at_most("sandbox_ids", hb.sandbox_ids, self.bounds.max_roster_ids,
                f"max_roster_ids ({self.bounds.max_roster_ids})")
        node_id = validate_id("node_id", hb.node_id)
        sid = validate_id("service_instance_id", hb.service_instance_id)
        snap = hb.snapshot
        fields: list[str] = []
        for name, maximum in SNAPSHOT_INT_FIELDS:
            fields += [name, str(_whole(f"snapshot.{name}", getattr(snap, name), maximum))]
        if snap.status not in ("UNSPECIFIED", "READY", "CONNECTING", "UNHEALTHY", "LINGERING"):
            raise InvalidArgument("snapshot.status", f"is not a node status: {snap.status!r}")
        cluster = validate_id("cluster_id", hb.cluster_id) if hb.cluster_id.strip() else ""
        mi = hb.machine_info
        fields += [
            "status", snap.status,
            "cluster_id", cluster,
            "version", _text("version", hb.version),
            "commit", _text("commit", hb.commit),
            "disks", msgspec.json.encode(snap.disks).decode(),
            "cpu_family", _text("machine_info.cpu_family", mi.cpu_family),
            "cpu_model", _text("machine_info.cpu_model", mi.cpu_model),
            "cpu_model_name", _text("machine_info.cpu_model_name", mi.cpu_model_name),
            "cpu_architecture", _text("machine_info.cpu_architecture", mi.cpu_architecture),
            "cpu_config_json", _text("machine_info.cpu_config_json", mi.cpu_config_json, MAX_TEXT),
            "p2p_backend", _text("p2p_endpoint.backend", hb.p2p_backend),
            "p2p_address", _text("p2p_endpoint.address", hb.p2p_address),
        ]
        roster: list[str] = []
        seen: set[str] = set()
        for i, sb in enumerate(hb.sandbox_ids):
            if not sb.strip():
                continue  # blanks are ignored, as by the reference
            sb = validate_id(f"sandbox_ids[{i}]", sb)
            if sb not in seen:
                seen.add(sb)
                roster.append(sb)
        endpoint = _text("endpoint", hb.endpoint.strip())
        values = dict(zip(fields[::2], fields[1::2], strict=True))
        digest = roster_digest(roster)
        base = memo.get(node_id) if memo is not None else None
        if memo is not None and base is not None and \
                (base.service_instance_id, base.endpoint) == (sid, endpoint):
            # reported_at 0 is stamped with the receive time: always send it
            changed = [x for k, v in values.items()
                       if base.fields.get(k) != v or (k == "reported_at_unix_ms" and v == "0")
                       for x in (k, v)]
            same_roster = base.roster_digest == digest
            if same_roster and set(changed[::2]) <= {"reported_at_unix_ms"}:
                return self._steady_heartbeat(node_id, sid, endpoint, base, values,
                                              changed[1] if changed else "", memo)
            args = [node_id, sid, endpoint, base.base, digest,
                    "0" if same_roster else "1", str(len(changed) // 2), *changed,
                    *([] if same_roster else roster)]
        else:
            args = [node_id, sid, endpoint, "", digest, "1", str(len(fields) // 2), *fields,
                    *roster]

        def parse(r: list[Any]) -> HeartbeatResult:
            if _s(r[0]) == "RESYNC":
                if memo is not None:
                    memo.pop(node_id, None)
                raise Resync(node_id)
            result = HeartbeatResult(generation=int(r[0]), restarted=r[1] == 1,
                                     released=int(r[2]), roster_mode=r[3] == 1,
                                     now_ms=int(r[4]))
            if memo is not None:
                memo[node_id] = Beat(f"{_s(r[5])}:{result.generation}", sid, endpoint, values,
                                     digest)
            return result

        return self._call("heartbeat", args, parse)

    def _steady_heartbeat(self, node_id: str, sid: str, endpoint: str, base: Beat,
                          values: dict[str, str], reported: str, memo: dict[str, Beat],
                          ) -> Call[HeartbeatResult]:
        """Nothing changed since this replica's last write: only the clock moves
        (lua/heartbeat_steady-5.lua), or RESYNC sends it in full."""
        def parse(r: list[Any]) -> HeartbeatResult:
            if _s(r[0]) == "RESYNC":
                memo.pop(node_id, None)
                raise Resync(node_id)
            result = HeartbeatResult(generation=int(r[0]), restarted=False, released=0,
                                     roster_mode=r[1] == 1, now_ms=int(r[2]))
            memo[node_id] = Beat(f"{_s(r[3])}:{result.generation}", sid, endpoint, values,
                                 base.roster_digest)
            return result

        return self._call("heartbeat_steady", [node_id, sid, base.base, reported], parse)

    # -- schedule / explain ------------------------------------------------
    def _request_args(self, req: Request, strategy: str | None) -> list[str]:
        cpu = "" if req.cpu is None else str(_whole("cpu", req.cpu, MAX_CPU))
        mem = "" if req.memory_bytes is None else str(
            _whole("memory_bytes", req.memory_bytes, MAX_BYTES))
        if strategy is not None and strategy not in ("least_loaded", "round_robin", "random"):
            raise InvalidArgument(
                "strategy", f"must be least_loaded, round_robin or random, not {strategy!r}")
        return ["create" if req.create else "route", strategy or "", cpu, mem]

    def schedule(self, req: Request, strategy: str | None = None,
                 reservation_id: str | None = None) -> Call[Placement]:
        base = self._request_args(req, strategy)
        rid = validate_id("reservation_id", reservation_id) if reservation_id else (
            secrets.token_hex(12) if req.create else "")
        args = [base[0], "0", base[1], base[2], base[3], rid, repr(random.random())]

        def parse(r: list[Any]) -> Placement:
            return Placement(node_id=_s(r[0]), endpoint=_s(r[1]), reservation_id=_s(r[2]) or None,
                             pressure=float(r[3]), cpu=int(r[4]), memory_bytes=int(r[5]),
                             status=_s(r[6]), now_ms=int(r[7]))

        return self._call("schedule", args, parse, (self.k.rr,))

    def explain(self, req: Request, strategy: str | None = None) -> Call[Explanation]:
        base = self._request_args(req, strategy)
        args = [base[0], "1", base[1], base[2], base[3], "", repr(random.random())]
        return Call("schedule", [*self.k.fixed(), self.k.rr], args, parse_explanation,
                    writes=False)

    # -- lifecycle ---------------------------------------------------------
    def assign(self, sandbox_id: str, node_id: str, endpoint: str,
               reservation_id: str | None = None) -> Call[AssignResult]:
        sb = validate_id("sandbox_id", sandbox_id)
        if not node_id.strip() or not endpoint.strip():
            raise InvalidArgument("", "node_id and endpoint are required")
        nid = validate_id("node_id", node_id)
        rid = validate_id("reservation_id", reservation_id) if reservation_id else ""
        args = [sb, nid, _text("endpoint", endpoint.strip()), rid]
        return self._call("assign", args, lambda r: AssignResult(
            reservation_id=_s(r[0]) or None, released=r[1] == 1))

    def cancel(self, reservation_id: str) -> Call[str]:
        rid = validate_id("reservation_id", reservation_id)
        return self._call("cancel", [rid, "0"], lambda r: _s(r[0]))

    def forget(self, reservation_id: str) -> Call[str]:
        """Cancel a placement whose caller gave up, whether or not its Schedule
        reached Redis yet (lua/cancel-5.lua, forget mode)."""
        rid = validate_id("reservation_id", reservation_id)
        return self._call("cancel", [rid, "1"], lambda r: _s(r[0]))

    def probe(self, write: bool = False) -> Call[bool]:
        """A call that Redis refuses wherever it would refuse a write (health);
        ``write`` makes it really write (needed when scripts run by EVALSHA).
        True when the cell has its policy."""
        return self._call("probe", ["1" if write else "0"], lambda r: _s(r[1]) == "1")

    def events(self, node_id: str, events: list[SandboxEvent]) -> Call[EventsResult]:
        nid = validate_id("node_id", node_id)
        at_most("events", events, MAX_EVENTS)
        args = [nid]
        for i, ev in enumerate(events):
            if ev.event_type not in ("CREATE", "DELETE", "PAUSE", "RESUME", "FORK"):
                raise InvalidArgument(f"events[{i}].event_type", f"is not known: {ev.event_type!r}")
            args += [validate_id(f"events[{i}].sandbox_id", ev.sandbox_id), ev.event_type]
        return self._call("events", args, lambda r: EventsResult(acked=int(r[0]),
                                                                  released=int(r[1])))

    def lookup(self, sandbox_id: str) -> Call[Binding]:
        sb = validate_id("sandbox_id", sandbox_id)
        return self._call("lookup", [sb], lambda r: Binding(
            sandbox_id=sb, node_id=_s(r[0]), endpoint=_s(r[1]), expires_ms=int(r[2]),
            reservation_id=_s(r[3]) or None, listed=_s(r[4]) == "1"))

    def unregister(self, node_id: str, service_instance_id: str) -> Call[bool]:
        if not node_id.strip() or not service_instance_id.strip():
            raise InvalidArgument("", "node_id and service_instance_id are required")
        args = [validate_id("node_id", node_id),
                validate_id("service_instance_id", service_instance_id)]
        return self._call("unregister", args, lambda r: r[0] == 1)

    # -- fleet and policy --------------------------------------------------
    def sync_nodes(self, nodes: list[tuple[str, str]]) -> Call[tuple[int, int]]:
        at_most("nodes", nodes, MAX_STATIC_NODES)
        args: list[str] = []
        for i, (nid, endpoint) in enumerate(nodes):
            if not endpoint.strip():
                raise InvalidArgument(f"nodes[{i}].endpoint", "is required")
            args += [validate_id(f"nodes[{i}].id", nid), _text("endpoint", endpoint.strip())]
        return self._call("sync_nodes", args, lambda r: (int(r[0]), int(r[1])))

    def set_lingering(self, node_id: str, lingering: bool) -> Call[bool]:
        args = [validate_id("node_id", node_id), "1" if lingering else "0"]
        return self._call("set_lingering", args, lambda r: _s(r[0]) == "1")

    def sync_policy(self, policy: Policy, overwrite: bool = False,
                    restore: bool = False) -> Call[str]:
        """Store or check the policy.  ``restore``: a replica puts back a policy
        Redis lost; the cell then settles in the same step (see settle)."""
        wanted = policy.validate().to_fields()
        flat = [x for kv in wanted.items() for x in kv]

        def parse(r: list[Any]) -> str:
            outcome = _s(r[0])
            if outcome == "conflict":
                stored = _pairs(r[1:])
                for name in NOT_POLICY:
                    stored.pop(name, None)
                raise PolicyConflict(policy_conflict_message(stored, wanted), stored, wanted)
            self.known_policy = policy
            return outcome

        mode = "1" if overwrite else "r" if restore else "0"
        return self._call("sync_policy", [mode, *flat], parse)

    def settle(self) -> Call[int]:
        """Redis may have lost placements just made (a failover): nodes not heard
        from since must heartbeat again before placements go to them."""
        return self._call("settle", [], int)

    def nodes(self) -> Call[tuple[int, list[NodeView]]]:
        return self._call("nodes_view", [], parse_nodes_view)

    def reservations(self, node_id: str | None = None, reservation_id: str | None = None,
                     ) -> Call[list[Reservation]]:
        args = [validate_id("node_id", node_id) if node_id else "",
                validate_id("reservation_id", reservation_id) if reservation_id else ""]
        return self._call("reservations", args,
                          lambda r: [parse_reservation(_pairs(row)) for row in r])

    def stats(self) -> Call[Stats]:
        def parse(r: list[Any]) -> Stats:
            f = _pairs(r[1:])
            return Stats(pending=int(r[0]), **{
                name: int(f.get(name, 0)) for name in (
                    "reserved_total", "assigned_total", "released_total", "cancelled_total",
                    "expired_total", "refused_total", "forgotten_total")})

        return self._call("stats", [], parse)

    def policy(self) -> Call[Policy | None]:
        def parse(r: list[Any]) -> Policy | None:
            if not r:
                return None
            self.known_policy = Policy.from_fields(_pairs(r))
            return self.known_policy

        return self._call("stats", ["policy"], parse)

    def sweep(self) -> Call[tuple[int, int]]:
        """The cell's bounded sweeps (lua/sweep-5.lua): (nodes forgotten,
        reservations expired)."""
        return self._call("sweep", [], lambda r: (int(r[0]), int(r[1])))

    def advance_clock(self, ms: int, mode: str = "") -> Call[int]:
        """Move the cell's clock forward; ``mode`` "freeze" stops it first, "thaw"
        lets it run again (drills and tests only)."""
        if mode not in ("", "freeze", "thaw"):
            raise InvalidArgument("mode", "must be freeze, thaw or empty")
        return self._call("advance_clock", [str(_whole("ms", ms, 1 << 40)), mode], int)


_DEFAULT_POLICY = Policy()


def policy_conflict_message(stored: dict[str, str], wanted: dict[str, str]) -> str:
    lines = ["the cell's stored policy differs from this replica's configuration",
             f"  {'field':<44} {'stored':>16} {'configured':>16}"]
    for name in sorted(set(stored) | set(wanted)):
        if stored.get(name) != wanted.get(name):
            lines.append(f"  {name:<44} {stored.get(name, '-'):>16} {wanted.get(name, '-'):>16}")
    lines.append("start with --overwrite-policy to replace the stored policy")
    return "\n".join(lines)


def parse_explanation(r: list[Any]) -> Explanation:
    verdicts = []
    for row in r[7:]:
        f = [_s(x) for x in row]
        verdicts.append(Verdict(
            node_id=f[0], status=f[1], reason=f[2] or None, pressure=float(f[3]),
            known_capacity=f[4] == "1", starting=int(f[5]), running=int(f[6]), paused=int(f[7]),
            projected_cpu=int(f[8]), projected_memory_bytes=int(f[9]), cpu_capacity=int(f[10]),
            memory_capacity_bytes=int(f[11]), endpoint=f[12]))
    chosen = _s(r[2]) or None
    eligible = sorted((v for v in verdicts if v.reason is None), key=lambda v: (
        rank_key(v.known_capacity, v.pressure, v.starting, v.running, v.paused), v.node_id))
    for i, v in enumerate(eligible, 1):
        v.rank = i
    for v in verdicts:
        v.chosen = v.node_id == chosen
    return Explanation(now_ms=int(r[0]), strategy=_s(r[1]), chosen=chosen, rotation=int(r[3]),
                       cpu=int(r[4]), memory_bytes=int(r[5]), refusal=_s(r[6]) or None,
                       verdicts=verdicts)


def _headroom(name: str, limit: int, used: int, f: dict[str, str]) -> float:
    if name in ("max_cpu_allocated_percent",):
        cap = int(f.get("cpu_count", 0) or 0)
        return limit - used * 100 / cap if cap else float(limit)
    if name in ("max_memory_allocated_percent", "max_memory_used_percent"):
        cap = int(f.get("memory_total_bytes", 0) or 0)
        return limit - used * 100 / cap if cap else float(limit)
    return float(limit - used)


def parse_nodes_view(r: list[Any]) -> tuple[int, list[NodeView]]:
    now = int(r[0])
    views = []
    for row in r[1:]:
        f = _pairs(row)

        def i(name: str, f: dict[str, str] = f) -> int:
            return int(f.get(name) or 0)

        ceilings: list[CeilingUse] = []
        last_seen = _opt_int(f.get("last_seen_ms"))
        views.append(NodeView(
            node_id=f["node_id"], endpoint=f.get("endpoint", ""),
            status=f["derived_status"], reason=f.get("reason") or None,
            pressure=float(f["pressure"]), known_capacity=f["known"] == "1",
            cpu_capacity=i("cpu_count"), cpu_allocated=i("allocated_cpu"),
            cpu_paused=i("paused_allocated_cpu"), cpu_reserved=i("pending_cpu"),
            cpu_projected=i("allocated_cpu") + i("paused_allocated_cpu") + i("pending_cpu"),
            memory_capacity_bytes=i("memory_total_bytes"),
            memory_allocated_bytes=i("allocated_memory_bytes"),
            memory_paused_bytes=i("paused_allocated_memory_bytes"),
            memory_reserved_bytes=i("pending_memory_bytes"),
            memory_projected_bytes=i("allocated_memory_bytes")
            + i("paused_allocated_memory_bytes") + i("pending_memory_bytes"),
            sandbox_count=i("sandbox_count"), sandbox_starting_count=i("sandbox_starting_count"),
            paused_sandbox_count=i("paused_sandbox_count"),
            pending_reservations=i("pending_count"), cpu_percent=i("cpu_percent"),
            memory_used_bytes=i("memory_used_bytes"), lingering=f.get("lingering") == "1",
            static=f.get("static") == "1", cluster_id=f.get("cluster_id", ""),
            service_instance_id=f.get("service_instance_id", ""), generation=i("generation"),
            restarts=i("restarts"), last_seen_ms=last_seen,
            heartbeat_age_ms=None if last_seen is None else now - last_seen,
            ceilings=ceilings))
        for key, value in f.items():
            if key.startswith("use:"):
                name = key[4:]
                limit = int(f[f"limit:{name}"])
                used = int(value)
                ceilings.append(CeilingUse(name=name, limit=limit, used=used,
                                           headroom=_headroom(name, limit, used, f)))
        ceilings.sort(key=lambda c: LIMIT_NAMES.index(c.name))
    return now, views


def parse_reservation(f: dict[str, str]) -> Reservation:
    return Reservation(
        reservation_id=f["reservation_id"], node_id=f["node_id"], state=f["state"],
        cpu=int(f["cpu"]), memory_bytes=int(f["memory_bytes"]), created_ms=int(f["created_ms"]),
        expires_ms=int(f["expires_ms"]), sandbox_id=f.get("sandbox_id") or None,
        ended_ms=_opt_int(f.get("ended_ms")),
        pressure=float(f["pressure"]) if f.get("pressure") else None)


# ---------------------------------------------------------------------------
# Running calls
# ---------------------------------------------------------------------------
#: Error replies by which Redis says it cannot serve right now (not a bug of ours).
TRANSIENT_ERRORS = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError,
                    redis.exceptions.MasterDownError, redis.exceptions.ClusterDownError,
                    redis.exceptions.TryAgainError, redis.exceptions.BusyLoadingError)
TRANSIENT_REPLIES = ("NOREPLICAS", "BUSY ", "MASTERDOWN", "LOADING")


@contextmanager
def _translated(target: str) -> Iterator[None]:
    try:
        yield
    except redis.exceptions.ResponseError as e:
        mapped = from_reply(str(e)) or acl.denied(e)
        if mapped is not None:
            raise mapped from None
        if isinstance(e, TRANSIENT_ERRORS) or str(e).startswith(TRANSIENT_REPLIES):
            raise StoreUnavailable(f"Redis at {target} cannot serve: {e}") from None
        raise
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as e:
        raise StoreUnavailable(f"Redis at {target} is unreachable: {e}") from None
    except (redis.exceptions.ClusterError, redis.exceptions.RedisClusterException) as e:
        why = str(e)
        if "TTL exhausted" in why:
            why = "its slot is moving or its primary is failing over (TRYAGAIN / MOVED kept coming)"
        raise StoreUnavailable(f"Redis at {target} cannot serve: {why}") from None


#: What a Redis Cluster answers while a slot moves, a shard fails over or the
#: cluster is down: nothing ran, so the call is sent again until its deadline.
SLOT_UNSETTLED = (redis.exceptions.TryAgainError, redis.exceptions.ClusterError,
                  redis.exceptions.SlotNotCoveredError)
SLOT_RETRY_S = 0.05


if sys.version_info >= (3, 11):
    _deadline = asyncio.timeout
else:  # pragma: no cover - Python 3.10
    @asynccontextmanager
    async def _deadline(seconds: float) -> AsyncIterator[None]:
        task = asyncio.current_task()
        assert task is not None
        handle = asyncio.get_running_loop().call_later(seconds, task.cancel)
        try:
            yield
        except asyncio.CancelledError:
            if handle.cancelled() or asyncio.get_running_loop().time() < handle.when():
                raise
            raise TimeoutError from None
        finally:
            handle.cancel()


#: Placements whose callers gave up are cancelled for at most this long (their
#: reservations expire by then anyway) and at most this many are remembered.
FORGET_FOR_S = 15 * 60
FORGET_MAX = 10_000


class _Base:
    scripts: Any

    def __init__(self, client: Any, cell: str, prefix: str, url: str | None,
                 durability: Durability | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.client = client
        self.keys = CellKeys(cell, prefix)
        self.ops = Ops(self.keys)
        self.url = url
        self.target = describe_target(url)
        self.cluster = is_cluster_client(client)
        if self.cluster:  # a cell is one hash slot: name it in every error
            self.target += f" (slot {key_slot(self.keys.policy.encode())} of cell {cell})"
        self.durability = durability or Durability()
        self.timeout_s = timeout_s
        #: what this client last wrote per node (bases of delta heartbeats)
        self.beats: dict[str, Beat] = {}
        #: reservation id -> since (monotonic): placements to cancel once Redis answers
        self.forgotten: dict[str, float] = {}
        #: writes held while Sentinel fails the primary over (SentinelWatch closes it)
        self.fence = Fence()

    def _fenced(self, call: Call[Any]) -> None:
        why = self.fence.held() if call.acked else ""
        if why:
            raise StoreUnavailable(f"Redis at {self.target}: {why}")

    def _waits(self, call: Call[Any]) -> bool:
        return self.durability.replicas > 0 and call.acked

    def _check_acked(self, acked: int) -> None:
        d = self.durability
        if acked < d.replicas:
            raise NotReplicated(
                f"Redis at {self.target}: the write reached {acked} of the {d.replicas} "
                f"replica(s) min_replicas_acked asks for within {d.timeout_ms}ms")

    def _remember(self, rid: str) -> None:
        if len(self.forgotten) >= FORGET_MAX:
            self.forgotten.pop(next(iter(self.forgotten)))
        self.forgotten.setdefault(rid, time.monotonic())

    def _stale_forgotten(self) -> None:
        horizon = time.monotonic() - FORGET_FOR_S
        for rid in [r for r, since in self.forgotten.items() if since < horizon]:
            del self.forgotten[rid]


class Scheduler(_Base):
    """Synchronous client of one cell."""

    @classmethod
    def connect(cls, url: str | None = None, *, cell: str = DEFAULT_CELL,
                prefix: str = DEFAULT_PREFIX, policy: Policy | None = None,
                overwrite_policy: bool = False, durability: Durability | None = None,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> Scheduler:
        with _translated(describe_target(url)):  # (a cluster client connects at once)
            client = sync_client(url, timeout_s)
        s = cls(client, cell, prefix, url, durability, timeout_s)
        if policy is not None:
            s.sync_policy(policy, overwrite=overwrite_policy)
        return s

    def __init__(self, client: Any, cell: str = DEFAULT_CELL, prefix: str = DEFAULT_PREFIX,
                 url: str | None = None, durability: Durability | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(client, cell, prefix, url, durability, timeout_s)
        self.scripts = ScriptRegistry(client)
        self._primary_check = PrimaryCheck(client) if is_sentinel_client(client) else None

    def run(self, call: Call[T]) -> T:
        self._fenced(call)
        if self._primary_check is not None:
            with _translated(self.target):
                self._primary_check()
        if self.forgotten:
            self._cancel_forgotten()
        with _translated(self.target):
            return call.parse(self._send(call))

    def _send(self, call: Call[Any]) -> Any:
        give_up = time.monotonic() + self.timeout_s
        while True:
            try:
                if self._waits(call):
                    reply, acked = self.scripts.call_acked(
                        call.script, call.keys, call.args, self.durability.replicas,
                        self.durability.timeout_ms)
                    self._check_acked(acked)
                    return reply
                return self.scripts[call.script](keys=call.keys, args=call.args)
            except SLOT_UNSETTLED:
                if not self.cluster or time.monotonic() + SLOT_RETRY_S > give_up:
                    raise
                time.sleep(SLOT_RETRY_S)

    def _cancel_forgotten(self) -> None:
        """Cancel the placements whose callers gave up, now that Redis may answer."""
        self._stale_forgotten()
        pending, self.forgotten = self.forgotten, {}
        for rid, since in pending.items():
            try:
                self.run(self.ops.forget(rid))
            except StoreUnavailable:
                self.forgotten[rid] = since
            except SchedulerError as e:
                log.warning("could not cancel abandoned placement %s: %s", rid, e.message)

    def close(self) -> None:
        self.client.close()

    def ping(self) -> None:
        with _translated(self.target):
            self.client.ping()

    def heartbeat(self, hb: Heartbeat) -> HeartbeatResult:
        try:
            return self.run(self.ops.heartbeat(hb, self.beats))
        except Resync:
            return self.run(self.ops.heartbeat(hb, self.beats))

    def schedule(self, req: Request, strategy: str | None = None,
                 reservation_id: str | None = None) -> Placement:
        """Place (and for a creation, reserve).  When the answer is lost (Redis
        unreachable mid-call, or the placement not replicated as asked), the
        reservation is cancelled, now or on a later call, so none stays behind."""
        call = self.ops.schedule(req, strategy, reservation_id)
        try:
            return self.run(call)
        except StoreUnavailable:
            if call.args[5]:
                self._remember(call.args[5])
            raise

    def probe(self) -> bool:
        return self.run(self.ops.probe(write=self.scripts.mode == EVAL))

    def explain(self, req: Request, strategy: str | None = None) -> Explanation:
        return self.run(self.ops.explain(req, strategy))

    def assign(self, sandbox_id: str, node_id: str, endpoint: str,
               reservation_id: str | None = None) -> AssignResult:
        return self.run(self.ops.assign(sandbox_id, node_id, endpoint, reservation_id))

    def cancel(self, reservation_id: str) -> str:
        return self.run(self.ops.cancel(reservation_id))

    def events(self, node_id: str, events: list[SandboxEvent]) -> EventsResult:
        return self.run(self.ops.events(node_id, events))

    def lookup(self, sandbox_id: str) -> Binding:
        return self.run(self.ops.lookup(sandbox_id))

    def unregister(self, node_id: str, service_instance_id: str) -> bool:
        return self.run(self.ops.unregister(node_id, service_instance_id))

    def sync_nodes(self, nodes: list[tuple[str, str]]) -> tuple[int, int]:
        return self.run(self.ops.sync_nodes(nodes))

    def set_lingering(self, node_id: str, lingering: bool) -> bool:
        return self.run(self.ops.set_lingering(node_id, lingering))

    def sync_policy(self, policy: Policy, overwrite: bool = False, restore: bool = False) -> str:
        return self.run(self.ops.sync_policy(policy, overwrite, restore))

    def settle(self) -> int:
        return self.run(self.ops.settle())

    def nodes(self) -> list[NodeView]:
        return self.run(self.ops.nodes())[1]

    def reservations(self, node_id: str | None = None) -> list[Reservation]:
        return self.run(self.ops.reservations(node_id))

    def reservation(self, reservation_id: str) -> Reservation:
        found = self.run(self.ops.reservations(None, reservation_id))
        if not found:
            raise NotFound(f"reservation {reservation_id} not found")
        return found[0]

    def stats(self) -> Stats:
        return self.run(self.ops.stats())

    def policy(self) -> Policy | None:
        return self.run(self.ops.policy())

    def advance_clock(self, ms: int, mode: str = "") -> int:
        return self.run(self.ops.advance_clock(ms, mode))

    def sweep(self) -> tuple[int, int]:
        return self.run(self.ops.sweep())


class AsyncScheduler(_Base):
    """asyncio client of one cell; the same operations as :class:`Scheduler`."""

    @classmethod
    async def connect(cls, url: str | None = None, *, cell: str = DEFAULT_CELL,
                      prefix: str = DEFAULT_PREFIX, policy: Policy | None = None,
                      overwrite_policy: bool = False, durability: Durability | None = None,
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> AsyncScheduler:
        s = cls(async_client(url, timeout_s), cell, prefix, url, durability, timeout_s)
        if policy is not None:
            await s.sync_policy(policy, overwrite=overwrite_policy)
        return s

    def __init__(self, client: Any, cell: str = DEFAULT_CELL, prefix: str = DEFAULT_PREFIX,
                 url: str | None = None, durability: Durability | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(client, cell, prefix, url, durability, timeout_s)
        self.scripts = AsyncScriptRegistry(client)
        self._reaper: asyncio.Task[None] | None = None

    async def run(self, call: Call[T], timeout: float | None = None) -> T:
        """Run one call, bounded by ``timeout`` (a caller's deadline) and the
        client's own timeout, whichever is shorter."""
        limit = self.timeout_s if timeout is None else max(0.0, min(timeout, self.timeout_s))
        self._fenced(call)
        try:
            unsettled: list[Exception] = []
            async with _deadline(limit):
                with _translated(self.target):
                    reply = await self._send(call, unsettled)
        except TimeoutError:
            if unsettled:
                raise StoreUnavailable(
                    f"Redis at {self.target} cannot serve: its slot is moving or its primary is "
                    f"failing over ({type(unsettled[-1]).__name__} for {limit:.3g}s)") from None
            raise StoreUnavailable(f"Redis at {self.target} did not answer within "
                                   f"{limit:.3g}s") from None
        with _translated(self.target):
            return call.parse(reply)

    async def _send(self, call: Call[Any], unsettled: list[Exception]) -> Any:
        while True:
            try:
                if self._waits(call):
                    reply, acked = await self.scripts.call_acked(
                        call.script, call.keys, call.args, self.durability.replicas,
                        self.durability.timeout_ms)
                    self._check_acked(acked)
                    return reply
                return await self.scripts[call.script](keys=call.keys, args=call.args)
            except SLOT_UNSETTLED as e:
                if not self.cluster:
                    raise
                unsettled.append(e)
                await asyncio.sleep(SLOT_RETRY_S)  # (the caller's deadline bounds the loop)

    def forget(self, reservation_id: str) -> None:
        """Cancel this placement in the background: its caller gave up, or its
        answer was lost.  Retried until Redis answers (idempotent)."""
        self._remember(reservation_id)
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._cancel_forgotten(), name="forget")

    async def _cancel_forgotten(self) -> None:
        delay = 0.05
        while self.forgotten:
            self._stale_forgotten()
            for rid, since in list(self.forgotten.items()):
                try:
                    await self.run(self.ops.forget(rid))
                except StoreUnavailable:
                    break
                except SchedulerError as e:
                    log.warning("could not cancel abandoned placement %s: %s", rid, e.message)
                if self.forgotten.get(rid) == since:
                    del self.forgotten[rid]
            else:
                continue
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)

    async def close(self) -> None:
        if self._reaper is not None and not self._reaper.done():
            # a last chance for abandoned placements, then give up on them
            await asyncio.wait([self._reaper], timeout=1.0)
            self._reaper.cancel()
        await self.client.aclose()

    async def ping(self) -> None:
        with _translated(self.target):
            await self.client.ping()

    async def heartbeat(self, hb: Heartbeat) -> HeartbeatResult:
        try:
            return await self.run(self.ops.heartbeat(hb, self.beats))
        except Resync:
            return await self.run(self.ops.heartbeat(hb, self.beats))

    async def schedule(self, req: Request, strategy: str | None = None,
                       reservation_id: str | None = None, *,
                       timeout: float | None = None) -> Placement:
        """Place (and for a creation, reserve), within ``timeout``.  When the
        caller gives up (cancelled, deadline) or the answer is lost (Redis
        unreachable mid-call, or not replicated as asked), the reservation is
        cancelled in the background, so none stays behind."""
        call = self.ops.schedule(req, strategy, reservation_id)
        rid = call.args[5]
        try:
            return await self.run(call, timeout)
        except (StoreUnavailable, asyncio.CancelledError):
            if rid:
                self.forget(rid)
            raise

    def probe(self, timeout: float | None = None) -> Awaitable[bool]:
        return self.run(self.ops.probe(write=self.scripts.mode == EVAL), timeout)

    def explain(self, req: Request, strategy: str | None = None) -> Awaitable[Explanation]:
        return self.run(self.ops.explain(req, strategy))

    def assign(self, sandbox_id: str, node_id: str, endpoint: str,
               reservation_id: str | None = None) -> Awaitable[AssignResult]:
        return self.run(self.ops.assign(sandbox_id, node_id, endpoint, reservation_id))

    def cancel(self, reservation_id: str) -> Awaitable[str]:
        return self.run(self.ops.cancel(reservation_id))

    def events(self, node_id: str, events: list[SandboxEvent]) -> Awaitable[EventsResult]:
        return self.run(self.ops.events(node_id, events))

    def lookup(self, sandbox_id: str) -> Awaitable[Binding]:
        return self.run(self.ops.lookup(sandbox_id))

    def unregister(self, node_id: str, service_instance_id: str) -> Awaitable[bool]:
        return self.run(self.ops.unregister(node_id, service_instance_id))

    def sync_nodes(self, nodes: list[tuple[str, str]]) -> Awaitable[tuple[int, int]]:
        return self.run(self.ops.sync_nodes(nodes))

    def set_lingering(self, node_id: str, lingering: bool) -> Awaitable[bool]:
        return self.run(self.ops.set_lingering(node_id, lingering))

    def sync_policy(self, policy: Policy, overwrite: bool = False,
                    restore: bool = False) -> Awaitable[str]:
        return self.run(self.ops.sync_policy(policy, overwrite, restore))

    def settle(self) -> Awaitable[int]:
        return self.run(self.ops.settle())

    async def nodes(self) -> list[NodeView]:
        return (await self.run(self.ops.nodes()))[1]

    def reservations(self, node_id: str | None = None) -> Awaitable[list[Reservation]]:
        return self.run(self.ops.reservations(node_id))

    def stats(self) -> Awaitable[Stats]:
        return self.run(self.ops.stats())

    def policy(self) -> Awaitable[Policy | None]:
        return self.run(self.ops.policy())

    def sweep(self) -> Awaitable[tuple[int, int]]:
        return self.run(self.ops.sweep())


__all__ = ["AsyncScheduler", "Call", "Ops", "Scheduler", "SchedulerError", "async_client",
           "describe_target", "sync_client"]
