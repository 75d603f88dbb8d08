"""Every operation as a :class:`Call`: script, KEYS, ARGV and the parser of its
reply.  No I/O here: the clients (:mod:`scheduler.client.sync`) run calls, and so
do pipelines (``schedctl``'s one-instant reads, the benchmarks).

Input is validated before anything reaches Redis
(:class:`~scheduler.domain.errors.InvalidArgument` names the field).
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import re
import secrets
import socket
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec.json

from scheduler.domain.catalog import (
    ADMISSION_REASONS,
    BESIDE_POLICY,
    EVENT_TYPES,
    NODE_STATUSES,
    STRATEGIES,
)
from scheduler.domain.errors import InvalidArgument, PolicyConflict, SchedulerError, from_reply
from scheduler.domain.history import Placed, Probe
from scheduler.domain.limits import (
    MAX_CPU_CONFIG,
    MAX_EVENTS,
    MAX_IMAGES,
    MAX_STATIC_NODES,
    at_most,
    text,
)
from scheduler.domain.policy import Policy
from scheduler.domain.records import (
    MAX_BYTES,
    MAX_CPU,
    MAX_LOCALITY_REQUIREMENTS,
    TOO_MANY_LOCALITY,
    AssignResult,
    Binding,
    Census,
    EventsResult,
    Explanation,
    Heartbeat,
    HeartbeatResult,
    ListedNode,
    NodeView,
    ObservedNode,
    Placement,
    RebuildStep,
    Request,
    Reservation,
    SandboxEvent,
    Stats,
    snapshot_numbers,
)
from scheduler.store import contracts as c
from scheduler.store.contracts import Argv, BatchItem, head, tagged, whole_reply
from scheduler.store.keys import CellKeys, validate_id
from scheduler.store.replies import (
    pairs,
    parse_explanation,
    parse_listed,
    parse_nodes_view,
    parse_observed,
    parse_reservation,
    s,
    whole,
)

T = TypeVar("T")
U = TypeVar("U")

#: Scripts that never write: no WAIT after them (min_replicas_acked).
READ_ONLY_SCRIPTS = frozenset(
    {"lookup", "nodes_view", "observed", "peer_list", "peer_members", "reservations", "stats"}
)


#: How long a replica's roster entry lives unless its monitor loop refreshes it.
REPLICA_TTL_MS = 15_000

#: Nodes one page of ListNodes / ListObservedNodes reads (lua/observed-5.lua):
#: about 4 ms of Redis CPU on a busy host in the full form (256 took 7.5-8.4,
#: past the 5 ms every call must stay under); the client stitches the pages.
LIST_PAGE = 128
#: ... and one page of a cluster's P2P peers (ListP2pPeers): ids sent, each
#: row one HMGET of six fields, 6-12 us (bench scale: 256 a call took 3.1 ms
#: on average, 8.1 at most, at 10,000 nodes; a 10,000-member cluster read
#: whole was one call of 54-100 ms)
PEER_PAGE = 128
#: ... and one page of ListObservedNodes, whose rows are whole records: 128
#: took 3.5-5.1 ms of Redis CPU at 100,000 nodes on a busy host (bench scale).
OBSERVED_PAGE = 64
#: ... and one page of the nodes' view (schedctl nodes, Scheduler.nodes):
#: each row evaluates the node as Schedule does besides its whole record.
NODES_PAGE = 64

#: A page of a list: the ``after`` of the next page ("" when this is the last), its rows.
Page = tuple[str, list[T]]

#: Nodes one step of an index rebuild reindexes (lua/index_rebuild-5.lua;
#: its REBUILD.STEP, tests/test_index_rebuild.py holds them equal): steps of
#: 128 took up to 6.1 ms of Redis CPU at 100,000 nodes on a busy host, these
#: about half; a replica's monitor takes steps until the rebuild ends.
REBUILD_STEP = 64
MAX_REBUILD_STEP = 10_000
#: What a rebuild step may be asked to do first (lua/index_rebuild-5.lua ARGV[1]).
REBUILD_MODES = ("step", "start", "fresh")

#: Nodes of the list one chunk of a node-list sync stages (lua/sync_stage-5.lua,
#: at most its STAGE_MAX), and nodes one step of its removal walk reads
#: (lua/sync_walk-5.lua, which removes at most 16 a step): see
#: docs/performance.md for what each costs at 10,000 and 100,000 nodes.
SYNC_CHUNK = 64
MAX_SYNC_CHUNK = 1000
SYNC_WALK_STEP = 256
MAX_SYNC_WALK_STEP = 10_000


@dataclass(frozen=True)
class SyncList:
    """A node list a sync pass makes the cell's (Ops.static_list,
    Ops.discovered_list): its kind, its nodes as (id, endpoint, lingering)
    with lingering "" for a static list, and discovery's positions."""

    kind: str
    nodes: tuple[tuple[str, str, str], ...]
    positions: tuple[str, ...]

    def digest(self) -> str:
        """The same for the same list (a pass of it is joined), another for any other."""
        h = hashlib.sha256(self.kind.encode())
        for node in self.nodes:
            for x in node:
                h.update(b"\0" + x.encode())
            h.update(b"\1")
        return h.hexdigest()

    def chunks(self, size: int = SYNC_CHUNK) -> list[tuple[tuple[str, str, str], ...]]:
        return [self.nodes[i : i + size] for i in range(0, len(self.nodes), size)]


#: Nodes one census step reads (lua/census-5.lua), about 1-2 ms of Redis (512
#: took up to 4.5 ms of CPU on a busy host, close to the 5 ms no call may
#: pass); each replica's monitor takes one step a tick, all replicas sharing
#: the pass.
CENSUS_STEP = 256
MAX_CENSUS_STEP = 10_000


class ReplicaEntry(msgspec.Struct, kw_only=True):
    """One replica in the cell's roster (``<base>replica:<id>``, expires)."""

    replica_id: str
    version: str
    commit: str
    host: str
    pid: int
    #: the gRPC address it listens on
    grpc: str
    started_ms: int
    #: Redis time of its last refresh (0 until written)
    seen_ms: int = 0


_STARTED_MS = int(time.time() * 1000)


def this_replica(listen: str, port: int) -> ReplicaEntry:
    """This process as a roster entry (id ``host/pid``), listening for gRPC on
    ``listen`` (host:port; ``port`` is the one it really got)."""
    from scheduler import version

    host = socket.gethostname() or "localhost"
    safe = re.sub(r"[^A-Za-z0-9._@+=~-]", "-", host)[:200]
    return ReplicaEntry(
        replica_id=f"{safe}/{os.getpid()}",
        version=version.version(),
        commit=version.commit(),
        host=host,
        pid=os.getpid(),
        grpc=f"{listen.rpartition(':')[0] or '[::]'}:{port}",
        started_ms=_STARTED_MS,
    )


def _whole(field: str, value: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise InvalidArgument(field, f"must be a whole number in 0..{maximum}, not {value!r}")
    return value


class Resync(Exception):
    """A delta heartbeat met a record it was not based on: send it in full."""


#: The scripts a heartbeat batch holds, by the kind it names them: heartbeats,
#: and the step of the CPU config exchange a heartbeat RPC makes next.
HEARTBEAT_SCRIPTS = {
    "heartbeat": c.BATCH_FULL,
    "heartbeat_steady": c.BATCH_STEADY,
    "cpu_config": c.BATCH_CPUCFG,
}


_ITEM_HEAD = len(BatchItem.__struct_fields__)


def _each_answer(parses: list[Callable[[Any], Any]], replies: list[Any]) -> list[Any]:
    """A batch script's replies ({"ok", reply...} or {"err", "<CODE> message"}),
    each parsed by its own call's parser: its answer, or its own error (a
    Resync among them)."""
    return [_answer(parse_one, item) for parse_one, item in zip(parses, replies, strict=True)]


def _batch_answers(
    parses: list[tuple[Callable[[Any], Any], Callable[[Any], Any] | None]], replies: list[Any]
) -> list[Any]:
    """A heartbeat batch's replies, a call and its follower's two by two."""
    out: list[Any] = []
    at = 0
    for parse, follow in parses:
        if follow is None:
            out.append(_answer(parse, replies[at]))
            at += 1
        else:
            out.append(_followed(parse, follow, replies[at], replies[at + 1]))
            at += 2
    if at != len(replies):
        raise ValueError(f"a heartbeat batch of {at} items answered {len(replies)}")
    return out


def _answer(parse: Callable[[Any], Any], item: Any) -> Any:
    answer, reply = BatchItem(*item[:_ITEM_HEAD]), item[_ITEM_HEAD:]  # (head, inline)
    outcome = s(answer.outcome)
    if outcome == c.BATCH_ERR:
        (message,) = reply
        text = s(message)
        return from_reply(text) or SchedulerError(text)
    if outcome == c.BATCH_SKIPPED:  # (never met: the call before it answers for both)
        return SchedulerError("a batch skipped a call whose call before it did not apply")
    try:
        return parse(reply)
    except Resync as e:
        return e


@dataclass(frozen=True)
class Followed(Generic[T, U]):
    """The answers of a call and of the call :meth:`Call.then` put after it,
    run in one trip."""

    first: T
    #: None: the follower failed (the caller runs it again by itself)
    then: U | None


def _followed(
    parse: Callable[[Any], Any], follow: Callable[[Any], Any], reply: Any, after: Any
) -> Any:
    """A call's answer and its follower's, as :func:`_answer` reads each: the
    call's own error (a Resync among them) stands for both (its follower was
    skipped); a follower's error leaves it to the caller to run again."""
    first = _answer(parse, reply)
    if isinstance(first, BaseException):
        return first
    second = _answer(follow, after)
    return Followed(first, None if isinstance(second, BaseException) else second)


@dataclass(frozen=True)
class Beat:
    """What a replica last wrote for a node: the base of its next delta."""

    base: str  # "<incarnation>:<generation>" of the record this replica wrote
    service_instance_id: str
    endpoint: str
    fields: dict[str, str]
    roster_digest: str
    #: the roster it wrote, valid and without repeats, in the order the node
    #: listed it: a heartbeat that lists exactly these ids again (most do)
    #: reuses roster, digest and validation; a later roster is sent as what
    #: joined and left.  (Kept once, as a tuple: a set of it beside took 40 %
    #: of an entry, 2.3 of 5.7 KB with 30 ids, and is only needed when the
    #: roster changed: :meth:`roster`.)
    ids: tuple[str, ...] = ()

    def roster(self) -> frozenset[str]:
        """The roster as a set (made on each call: for a changed roster only)."""
        return frozenset(self.ids)


def roster_digest(roster: list[str]) -> str:
    return hashlib.blake2b("\n".join(sorted(roster)).encode(), digest_size=12).hexdigest()


@dataclass(frozen=True, init=False)
class Call(Generic[T]):
    script: str
    keys: list[str]
    #: the ARGV as sent (``argv.wire()`` when the call was built from one)
    args: list[str]
    parse: Callable[[Any], T]
    #: False: this call writes nothing (no WAIT after it)
    writes: bool = True
    #: the same ARGV by name (scheduler/store/contracts.py); read it, never ``args[n]``
    argv: Argv | None = None
    #: a call a batch may run right after this one, in the same trip, told
    #: this one's answer (:meth:`then`); alone, this call runs by itself
    follow: Call[Any] | None = None

    def __init__(
        self,
        script: str,
        keys: list[str],
        args: list[str],
        parse: Callable[[Any], T],
        writes: bool = True,
        argv: Argv | None = None,
        follow: Call[Any] | None = None,
    ) -> None:
        # (the fields in one write: a frozen dataclass's own __init__ sets
        # each through object.__setattr__, a third of a placement's Python)
        self.__dict__.update(
            script=script,
            keys=keys,
            args=args,
            parse=parse,
            writes=writes,
            argv=argv,
            follow=follow,
        )

    @classmethod
    def of(
        cls,
        script: str,
        keys: list[str],
        argv: Argv,
        parse: Callable[[Any], T],
        writes: bool = True,
    ) -> Call[T]:
        """The call of ``script`` with this named ARGV."""
        return cls(script, keys, argv.wire(), parse, writes, argv)

    def with_argv(self, argv: Argv) -> Call[T]:
        """This call with another ARGV (``msgspec.structs.replace`` of its own)."""
        return Call(self.script, self.keys, argv.wire(), self.parse, self.writes, argv, self.follow)

    def then(self, follow: Call[Any] | None) -> Call[T]:
        """This call, and ``follow`` after it in the same trip where a batch
        runs it (a heartbeat and its CPU config ingest,
        lua/heartbeat_batch-5.lua): its answer is then :class:`Followed`.  A
        client that runs it alone answers this call's own result, and the
        caller runs ``follow`` itself."""
        if follow is None and self.follow is None:
            return self
        return Call(self.script, self.keys, self.args, self.parse, self.writes, self.argv, follow)

    @property
    def acked(self) -> bool:
        """Must Redis replicas have this call's writes before it is answered?"""
        return self.writes and self.script not in READ_ONLY_SCRIPTS


#: An operation of several calls: a generator that yields each call and is sent
#: its result (or thrown its error); its return value is the operation's.  The
#: clients drive plans (scheduler/client/plans.py), so each is written once for both.
Plan = Generator[Call[Any], Any, T]


@functools.cache
def _number_checks() -> tuple[tuple[str, str, int], ...]:
    """(name, field named in an error, maximum) of each snapshot number, made
    once: every heartbeat checks them all."""
    return tuple((name, f"snapshot.{name}", f.maximum) for name, f in snapshot_numbers().items())


def heartbeat_fields(hb: Heartbeat) -> list[str]:
    """The node-record fields a full heartbeat writes, as field, value pairs in
    the order it sends them (validated)."""
    snap = hb.snapshot
    fields: list[str] = []
    for name, field, maximum in _number_checks():
        value = getattr(snap, name)
        if type(value) is not int or not 0 <= value <= maximum:
            _whole(field, value, maximum)  # (raises, naming the field)
        fields += (name, str(value))
    if snap.status not in NODE_STATUSES:
        raise InvalidArgument("snapshot.status", f"is not a node status: {snap.status!r}")
    if snap.admission_reason not in ADMISSION_REASONS:
        raise InvalidArgument(
            "snapshot.admission_reason", f"is not an admission reason: {snap.admission_reason!r}"
        )
    cluster = validate_id("cluster_id", hb.cluster_id) if hb.cluster_id.strip() else ""
    mi = hb.machine_info
    fields += [
        "status",
        snap.status,
        "cluster_id",
        cluster,
        "version",
        text("version", hb.version),
        "commit",
        text("commit", hb.commit),
        "disks",
        msgspec.json.encode(snap.disks).decode(),
        "cpu_family",
        text("machine_info.cpu_family", mi.cpu_family),
        "cpu_model",
        text("machine_info.cpu_model", mi.cpu_model),
        "cpu_model_name",
        text("machine_info.cpu_model_name", mi.cpu_model_name),
        "cpu_architecture",
        text("machine_info.cpu_architecture", mi.cpu_architecture),
        "cpu_config_json",
        text("machine_info.cpu_config_json", mi.cpu_config_json, MAX_CPU_CONFIG),
        "p2p_backend",
        text("p2p_endpoint.backend", hb.p2p_backend),
        "p2p_address",
        text("p2p_endpoint.address", hb.p2p_address),
        "admission",
        snap.admission(),
    ]
    return fields


#: A requirement's size_bytes at most: 32 of them sum below 2**53, exact in Lua.
MAX_LOCALITY_BYTES = 1 << 47


def _sha1(text_: str) -> str:
    return hashlib.sha1(text_.encode()).hexdigest()


def locality_terms(req: Request, key_limit: int) -> list[tuple[str, int, int]]:
    """The request's distinct requirements as (key, weight, size_bytes),
    validated (before Redis).  A key's weight is its size or, when unknown
    (0), the mean of the request's known sizes (1 when none is known)."""
    if len(req.locality) > MAX_LOCALITY_REQUIREMENTS:
        raise InvalidArgument("", TOO_MANY_LOCALITY)
    keys: dict[str, int] = {}
    for i, lr in enumerate(req.locality):
        field = f"locality_requirements[{i}]"
        key = lr.key.strip()
        if len(key.encode()) > key_limit:
            raise InvalidArgument(
                f"{field}.key", f"is longer than {key_limit} bytes (artifact_key_max_bytes)"
            )
        if "\n" in key or "\r" in key:
            raise InvalidArgument(f"{field}.key", "contains a line break")
        size = lr.size_bytes
        if (
            isinstance(size, bool)
            or not isinstance(size, int)
            or not 0 <= size <= MAX_LOCALITY_BYTES
        ):
            raise InvalidArgument(f"{field}.size_bytes", f"must be 0..{MAX_LOCALITY_BYTES}")
        if key and key not in keys:  # (upstream: empty keys skipped, repeats once)
            keys[key] = size
    known = [v for v in keys.values() if v > 0]
    unknown_weight = sum(known) // len(known) if known else 1
    return [(key, size or unknown_weight, size) for key, size in keys.items()]


def locality_group(req: Request, terms: list[tuple[str, int, int]]) -> str:
    """What the same-group decay (and affinity) groups by: the request's
    template or first image (:meth:`Request.group`), else its keys
    (``keys:`` and the sorted keys, one a line), else "" (none)."""
    group = req.group()
    if group or not terms:
        return group
    return "keys:" + "\n".join(sorted(k for k, _, _ in terms))


def locality_arg(req: Request, key_limit: int) -> str:
    """Schedule's ARGV[8] (lua/includes/locality.lua): "" when the request
    carries nothing locality can use, else the group's sha1 (or "") and one
    line per distinct requirement, ``weight\tsize\tsha1(key)`` (the key's
    sha1 as scheduler/store/p2p.py key_digest spells it)."""
    terms = locality_terms(req, key_limit)
    at_most("images", req.images, MAX_IMAGES)
    if req.group():
        text("template_id" if req.template_id.strip() else "images", req.group())
    group = locality_group(req, terms)
    if not req.create or (not terms and not group):
        return ""
    lines = [_sha1(group) if group else ""]
    lines += [f"{weight}\t{size}\t{_sha1(key)}" for key, weight, size in terms]
    return "\n".join(lines) + "\n"


#: What a heartbeat may write to a node record (lua/heartbeat-5.lua refuses
#: any other field): the names heartbeat_fields sends.
HEARTBEAT_FIELDS: tuple[str, ...] = tuple(
    heartbeat_fields(Heartbeat(node_id="n", service_instance_id="s"))[::2]
)


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

    def _call(
        self,
        script: str,
        argv: Argv,
        parse: Callable[[Any], T],
        extra_keys: tuple[str, ...] = (),
    ) -> Call[T]:
        return Call(script, [*self.k.fixed(), *extra_keys], argv.wire(), parse, True, argv)

    # -- heartbeat ---------------------------------------------------------
    def heartbeat(
        self, hb: Heartbeat, memo: dict[str, Beat] | None = None, full: bool = False
    ) -> Call[HeartbeatResult]:
        """The heartbeat in full, or, given the ``memo`` of what this replica
        last wrote, as a delta: only changed fields, the roster only if its
        digest changed.  The script applies a delta only to the record it was
        based on (same generation); otherwise the parser raises Resync and
        the caller sends it again in full.  A changed roster goes as what
        joined and what left since the base (the script checks that the
        roster it holds is still the base's: same generation and digest).
        Either way the memo learns the result.  ``full``: in full whatever the
        memo holds (it cannot meet RESYNC)."""
        at_most(
            "sandbox_ids",
            hb.sandbox_ids,
            self.bounds.max_roster_ids,
            f"max_roster_ids ({self.bounds.max_roster_ids})",
        )
        node_id = validate_id("node_id", hb.node_id)
        sid = validate_id("service_instance_id", hb.service_instance_id)
        fields = heartbeat_fields(hb)
        base = memo.get(node_id) if memo is not None and not full else None
        ids = tuple(hb.sandbox_ids)
        roster: list[str] | tuple[str, ...]
        seen: set[str] | frozenset[str]
        if base is not None and ids == base.ids:
            # the roster this replica last wrote for the node, listed the same:
            # valid, without blanks or repeats, and of that digest
            # (so the roster is the same: seen, for what left, is not needed)
            roster, seen, digest = base.ids, frozenset(), base.roster_digest
        else:
            roster, seen = [], set()
            for i, sb in enumerate(ids):
                if not sb.strip():
                    continue  # blanks are ignored, as by the reference
                sb = validate_id(f"sandbox_ids[{i}]", sb)
                if sb not in seen:
                    seen.add(sb)
                    roster.append(sb)
            digest = roster_digest(roster)
        endpoint = text("endpoint", hb.endpoint.strip())
        values = dict(zip(fields[::2], fields[1::2], strict=True))
        if (
            memo is not None
            and base is not None
            and (base.service_instance_id, base.endpoint) == (sid, endpoint)
        ):
            # reported_at 0 is stamped with the receive time: always send it
            changed = [
                x
                for k, v in values.items()
                if base.fields.get(k) != v or (k == "reported_at_unix_ms" and v == "0")
                for x in (k, v)
            ]
            same_roster = base.roster_digest == digest
            if same_roster and set(changed[::2]) <= {"reported_at_unix_ms"}:
                return self._steady_heartbeat(
                    node_id,
                    sid,
                    endpoint,
                    base,
                    values,
                    changed[1] if changed else "",
                    memo,
                    tuple(roster),
                )
            tail: list[str] = []
            if not same_roster:
                was = base.roster()
                joined = [sb for sb in roster if sb not in was]
                left = sorted(was.difference(seen))
                tail = [base.roster_digest, str(len(joined)), *joined, *left]
            argv = c.HeartbeatArgv(
                node_id=node_id,
                service_instance_id=sid,
                endpoint=endpoint,
                base=base.base,
                roster_digest=digest,
                roster_form=c.ROSTER_SAME if same_roster else c.ROSTER_DELTA,
                field_count=str(len(changed) // 2),
                fields=changed,
                roster=tail,
            )
        else:
            argv = c.HeartbeatArgv(
                node_id=node_id,
                service_instance_id=sid,
                endpoint=endpoint,
                base="",
                roster_digest=digest,
                roster_form=c.ROSTER_FULL,
                field_count=str(len(fields) // 2),
                fields=fields,
                roster=list(roster),
            )

        def parse(r: list[Any]) -> HeartbeatResult:
            if tagged(c.ResyncReply, r):
                if memo is not None:
                    memo.pop(node_id, None)
                raise Resync(node_id)
            a = c.HeartbeatReply(*r)  # (whole_reply, inline)
            result = HeartbeatResult(
                generation=int(a.generation),
                restarted=a.restarted == 1,
                released=int(a.released),
                roster_mode=a.roster_mode == 1,
                now_ms=int(a.now_ms),
            )
            if memo is not None:
                memo[node_id] = Beat(
                    f"{s(a.incarnation)}:{result.generation}",
                    sid,
                    endpoint,
                    values,
                    digest,
                    tuple(roster),
                )
            return result

        return self._call("heartbeat", argv, parse)

    def _steady_heartbeat(
        self,
        node_id: str,
        sid: str,
        endpoint: str,
        base: Beat,
        values: dict[str, str],
        reported: str,
        memo: dict[str, Beat],
        ids: tuple[str, ...],
    ) -> Call[HeartbeatResult]:
        """Nothing changed since this replica's last write: only the clock moves
        (lua/heartbeat_steady-5.lua), or RESYNC sends it in full."""

        def parse(r: list[Any]) -> HeartbeatResult:
            if tagged(c.ResyncReply, r):
                memo.pop(node_id, None)
                raise Resync(node_id)
            a = c.SteadyReply(*r)  # (whole_reply, inline)
            result = HeartbeatResult(
                generation=int(a.generation),
                restarted=False,
                released=0,
                roster_mode=a.roster_mode == 1,
                now_ms=int(a.now_ms),
            )
            memo[node_id] = Beat(
                f"{s(a.incarnation)}:{result.generation}",
                sid,
                endpoint,
                values,
                base.roster_digest,
                ids,  # (the same roster, as this heartbeat listed it)
            )
            return result

        argv = c.SteadyArgv(
            node_id=node_id, service_instance_id=sid, base=base.base, reported_at=reported
        )
        return self._call("heartbeat_steady", argv, parse)

    def heartbeat_batch(self, calls: Sequence[Call[Any]]) -> Call[list[Any]]:
        """Several :meth:`heartbeat` calls (full, delta or steady), and steps of
        the CPU config exchange, as one (lua/heartbeat_batch-5.lua), applied
        in order; each gets its result or its own error (:class:`Resync`
        among them)."""
        args: list[str] = []
        items = 0
        #: (each call's parse, and its follower's: the ingest after it)
        parses: list[tuple[Callable[[Any], Any], Callable[[Any], Any] | None]] = []
        for call in calls:
            if call.script not in HEARTBEAT_SCRIPTS:
                raise ValueError(f"a heartbeat batch holds heartbeats, not {call.script}")
            args += [HEARTBEAT_SCRIPTS[call.script], str(len(call.args)), *call.args]
            items += 1
            then = call.follow
            if then is not None:
                if call.script == "cpu_config" or then.script != "cpu_config":
                    raise ValueError("a heartbeat batch runs a CPU config ingest after a heartbeat")
                args += [c.BATCH_INGEST, str(len(then.args)), *then.args]
                items += 1
            parses.append((call.parse, None if then is None else then.parse))
        argv = c.HeartbeatBatchArgv(count=str(items), heartbeats=args)
        return self._call("heartbeat_batch", argv, lambda r: _batch_answers(parses, r))

    # -- schedule / explain ------------------------------------------------
    def _request_argv(
        self,
        req: Request,
        strategy: str | None,
        dry_run: str,
        reservation_id: str | None = None,
    ) -> c.ScheduleArgv:
        """lua/schedule-5.lua's ARGV for ``req``: a decision (DECIDE) takes the
        given reservation id or a fresh one when it creates; an explanation
        (EXPLAIN) reserves nothing and takes none."""
        cpu = "" if req.cpu is None else str(_whole("cpu", req.cpu, MAX_CPU))
        mem = (
            ""
            if req.memory_bytes is None
            else str(_whole("memory_bytes", req.memory_bytes, MAX_BYTES))
        )
        if strategy is not None and strategy not in STRATEGIES:
            raise InvalidArgument(
                "strategy",
                f"must be {', '.join(STRATEGIES[:-1])} or {STRATEGIES[-1]}, not {strategy!r}",
            )
        rid = ""
        if dry_run == c.DECIDE:
            rid = (
                validate_id("reservation_id", reservation_id)
                if reservation_id
                else (secrets.token_hex(12) if req.create else "")
            )
        return c.ScheduleArgv(
            kind=c.KIND_CREATE if req.create else c.KIND_ROUTE,
            dry_run=dry_run,
            strategy=strategy or "",
            cpu=cpu,
            memory_bytes=mem,
            reservation_id=rid,
            random=repr(random.random()),
            # (absent without locality: the call main's scripts take)
            locality=self._locality(req) or None,
        )

    def _locality(self, req: Request) -> str:
        return locality_arg(req, self.bounds.artifact_key_max_bytes)

    def schedule(
        self, req: Request, strategy: str | None = None, reservation_id: str | None = None
    ) -> Call[Placement]:
        argv = self._request_argv(req, strategy, c.DECIDE, reservation_id)

        def parse(r: list[Any]) -> Placement:
            d = c.ScheduleDecision(*r)  # (as whole_reply: inline, every placement reads one)
            return Placement(
                node_id=s(d.node_id),
                endpoint=s(d.endpoint),
                reservation_id=s(d.reservation_id) or None,
                pressure=float(d.pressure),
                cpu=int(d.cpu),
                memory_bytes=int(d.memory_bytes),
                status=s(d.status),
                now_ms=int(d.now_ms),
                warmth=s(d.warmth),
                pull_bytes=int(d.pull_bytes),
            )

        return self._call("schedule", argv, parse, (self.k.rr,))

    def schedule_batch(
        self,
        calls: Sequence[Call[Placement]],
    ) -> Call[list[Placement | SchedulerError]]:
        """Several :meth:`schedule` calls as one (lua/schedule_batch-5.lua),
        decided in order; each gets its placement or its own error."""
        argvs = [schedule_argv(call) for call in calls]
        # each request without locality, or each with it ("" = none) when one carries it
        wide = any(a.locality is not None for a in argvs)
        args: list[str] = []
        for call, a in zip(calls, argvs, strict=True):
            args += call.args  # (its argv's wire)
            if wide and a.locality is None:
                args.append("")
        parses = [call.parse for call in calls]
        argv = c.ScheduleBatchArgv(count=str(len(calls)), requests=args)
        return self._call("schedule_batch", argv, lambda r: _each_answer(parses, r), (self.k.rr,))

    def explain(self, req: Request, strategy: str | None = None) -> Call[Explanation]:
        argv = self._request_argv(req, strategy, c.EXPLAIN)
        return Call.of(
            "schedule", [*self.k.fixed(), self.k.rr], argv, parse_explanation, writes=False
        )

    # -- lifecycle ---------------------------------------------------------
    def assign(
        self, sandbox_id: str, node_id: str, endpoint: str, reservation_id: str | None = None
    ) -> Call[AssignResult]:
        sb = validate_id("sandbox_id", sandbox_id)
        if not node_id.strip() or not endpoint.strip():
            raise InvalidArgument("", "node_id and endpoint are required")
        nid = validate_id("node_id", node_id)
        rid = validate_id("reservation_id", reservation_id) if reservation_id else ""
        argv = c.AssignArgv(
            sandbox_id=sb,
            node_id=nid,
            endpoint=text("endpoint", endpoint.strip()),
            reservation_id=rid,
        )

        def parse(r: list[Any]) -> AssignResult:
            a = whole_reply(c.AssignReply, r)
            return AssignResult(
                reservation_id=s(a.reservation_id) or None, released=a.released == 1
            )

        return self._call("assign", argv, parse)

    def cancel(self, reservation_id: str) -> Call[str]:
        rid = validate_id("reservation_id", reservation_id)
        return self._call("cancel", c.CancelArgv(reservation_id=rid, mode=c.CANCEL), _cancelled)

    def abandon(self, reservation_id: str) -> Call[str]:
        """Cancel a placement whose caller gave up (an abandoned placement),
        whether or not its Schedule reached Redis yet (lua/cancel-5.lua,
        abandon mode)."""
        rid = validate_id("reservation_id", reservation_id)
        return self._call("cancel", c.CancelArgv(reservation_id=rid, mode=c.ABANDON), _cancelled)

    def probe(self, write: bool = False) -> Call[Probe]:
        """A call that Redis refuses wherever it would refuse a write (health);
        it writes (the probe count), so it is refused by EVALSHA too.  What it
        read of the cell's history (:mod:`scheduler.domain.history`); ``at`` is when
        the answer came, ``sent`` when the call was made (this process's
        monotonic clock)."""
        sent = time.monotonic()

        def parse(r: list[Any]) -> Probe:
            a = whole_reply(c.ProbeReply, r)
            return Probe(
                now_ms=int(a.now_ms),
                has_policy=s(a.has_policy) == c.YES,
                raw_ms=int(a.raw_ms),
                sequence=int(a.sequence),
                generation=int(a.generation),
                at=time.monotonic(),
                sent=sent,
            )

        return self._call("probe", c.ProbeArgv(write=c.flag(write)), parse)

    def rewound(
        self,
        generation: int,
        expected_now_ms: int | None,
        bound_ms: int,
        probed: int | None = None,
    ) -> Call[tuple[bool, int, int, int, int]]:
        """Settle a cell whose data went back in time or whose clock jumped
        (lua/rewound-5.lua): (settled here, generation, now_ms, clock moved
        by ms, ms since the cell's last recorded probe).  ``probed``: the
        lower generation the caller's probe read, if that is the verdict's
        cause: a server that has ``generation`` is not settled then (the
        probe was another server's)."""
        argv = c.RewoundSettleArgv(
            mode=c.REWOUND_SETTLE,
            generation=str(generation),
            expected_ms="" if expected_now_ms is None else str(expected_now_ms),
            bound_ms=str(bound_ms),
            probed=None if probed is None else str(probed),
        )

        def parse(r: list[Any]) -> tuple[bool, int, int, int, int]:
            a = whole_reply(c.RewoundSettled, r)
            return (
                s(a.outcome) == c.REWOUND_SETTLED,
                int(a.generation),
                int(a.now_ms),
                int(a.moved_ms),
                int(a.age_ms),
            )

        return self._call("rewound", argv, parse)

    def reconcile_rewound(self, before_ms: int, most: int) -> Call[tuple[int, bool]]:
        """End live reservations made before ``before_ms`` (cell time), at most
        ``most``: (how many ended, more may be due)."""
        argv = c.RewoundReconcileArgv(
            mode=c.REWOUND_RECONCILE, before_ms=str(before_ms), most=str(most)
        )

        def parse(r: list[Any]) -> tuple[int, bool]:
            a = whole_reply(c.RewoundReconciled, r)
            return int(a.ended), s(a.more) == c.YES

        return self._call("rewound", argv, parse)

    def replay(
        self, placements: Sequence[tuple[Placed, str]], grace_ms: int
    ) -> Call[tuple[int, int, int, int]]:
        """Write back the placements (each with its sandbox id, "" = not
        known) the cell lacks (lua/replay-5.lua): (written pending, written
        ended, left as they were, not written)."""
        flat: list[str] = []
        for p, sandbox_id in placements:
            flat += [
                validate_id("reservation_id", p.reservation_id),
                validate_id("node_id", p.node_id),
                str(p.cpu),
                str(p.memory_bytes),
                str(p.created_ms),
                repr(float(p.pressure)),
                validate_id("sandbox_id", sandbox_id) if sandbox_id else "",
            ]
        argv = c.ReplayArgv(grace_ms=str(grace_ms), count=str(len(placements)), placements=flat)

        def parse(r: list[Any]) -> tuple[int, int, int, int]:
            a = whole_reply(c.ReplayReply, r)
            return int(a.live), int(a.ended), int(a.kept), int(a.unknown)

        return self._call("replay", argv, parse)

    def events(
        self, node_id: str, events: list[SandboxEvent], service_instance_id: str = ""
    ) -> Call[EventsResult]:
        """``service_instance_id``: the node agent instance that sent them
        ("" = not said); another instance's than the node's stored one change
        nothing (a late event of its previous instance)."""
        nid = validate_id("node_id", node_id)
        at_most("events", events, MAX_EVENTS)
        sid = validate_id("service_instance_id", service_instance_id) if service_instance_id else ""
        flat: list[str] = []
        for i, ev in enumerate(events):
            if ev.event_type not in EVENT_TYPES:
                raise InvalidArgument(f"events[{i}].event_type", f"is not known: {ev.event_type!r}")
            flat += [validate_id(f"events[{i}].sandbox_id", ev.sandbox_id), ev.event_type]

        def parse(r: list[Any]) -> EventsResult:
            a = whole_reply(c.EventsReply, r)
            return EventsResult(acked=int(a.acked), released=int(a.released))

        return self._call(
            "events", c.EventsArgv(node_id=nid, service_instance_id=sid, events=flat), parse
        )

    def lookup(self, sandbox_id: str) -> Call[Binding]:
        sb = validate_id("sandbox_id", sandbox_id)

        def parse(r: list[Any]) -> Binding:
            b = whole_reply(c.LookupReply, r)
            return Binding(
                sandbox_id=sb,
                node_id=s(b.node_id),
                endpoint=s(b.endpoint),
                expires_ms=int(b.expires_ms),
                reservation_id=s(b.reservation_id) or None,
                listed=s(b.listed) == c.YES,
            )

        return self._call("lookup", c.LookupArgv(sandbox_id=sb), parse)

    def unregister(self, node_id: str, service_instance_id: str) -> Call[bool]:
        if not node_id.strip() or not service_instance_id.strip():
            raise InvalidArgument("", "node_id and service_instance_id are required")
        argv = c.UnregisterArgv(
            node_id=validate_id("node_id", node_id),
            service_instance_id=validate_id("service_instance_id", service_instance_id),
        )
        return self._call(
            "unregister", argv, lambda r: whole_reply(c.UnregisterReply, r).removed == 1
        )

    # -- fleet and policy --------------------------------------------------
    def static_list(self, nodes: Sequence[tuple[str, str]]) -> SyncList:
        """A static node list (id, endpoint), checked whole before a pass
        begins (a bad entry: nothing written)."""
        at_most("nodes", nodes, MAX_STATIC_NODES)
        out: list[tuple[str, str, str]] = []
        for i, (nid, endpoint) in enumerate(nodes):
            if not endpoint.strip():
                raise InvalidArgument(f"nodes[{i}].endpoint", "is required")
            out.append((validate_id(f"nodes[{i}].id", nid), text("endpoint", endpoint.strip()), ""))
        return SyncList(c.SYNC_STATIC, tuple(out), ())

    def discovered_list(
        self, positions: Sequence[int], nodes: Sequence[tuple[str, str, bool]]
    ) -> SyncList:
        """A discovered node list (id, endpoint, lingering) computed from
        watches at ``positions`` (3 resourceVersions as integers), checked
        whole before a pass begins."""
        if len(positions) != 3 or any(
            not isinstance(p, int) or isinstance(p, bool) or p < 0 for p in positions
        ):
            raise InvalidArgument("positions", "must be 3 whole numbers (resourceVersions)")
        at_most("nodes", nodes, MAX_STATIC_NODES)
        out: list[tuple[str, str, str]] = []
        for i, (nid, endpoint, lingering) in enumerate(nodes):
            if not endpoint.strip():
                raise InvalidArgument(f"nodes[{i}].endpoint", "is required")
            out.append(
                (
                    validate_id(f"nodes[{i}].id", nid),
                    text("endpoint", endpoint.strip()),
                    c.flag(lingering),
                )
            )
        return SyncList(c.SYNC_DISCOVERED, tuple(out), tuple(str(p) for p in positions))

    def sync_begin(self, token: str, lst: SyncList) -> Call[tuple[str, str]]:
        """Begin (or join) a pass that makes the node list ``lst``
        (lua/sync_begin-5.lua): (outcome, the pass's token)."""
        argv = c.SyncBeginArgv(
            token=token,
            kind=lst.kind,
            digest=lst.digest(),
            listed=c.flag(bool(lst.nodes) or lst.kind == c.SYNC_DISCOVERED),
            positions=list(lst.positions),
        )

        def parse(r: list[Any]) -> tuple[str, str]:
            a, _stored_positions = head(c.SyncBeginReply, r)
            return s(a.outcome), s(a.token)

        return self._call("sync_begin", argv, parse)

    def sync_stage(self, token: str, chunk: Sequence[tuple[str, str, str]]) -> Call[int]:
        """One chunk of a pass's list (lua/sync_stage-5.lua): nodes added or changed."""
        if len(chunk) > MAX_SYNC_CHUNK:
            raise InvalidArgument("nodes", f"has {len(chunk)} entries, more than {MAX_SYNC_CHUNK}")
        argv = c.SyncStageArgv(token=token, nodes=[x for n in chunk for x in n])
        return self._call(
            "sync_stage", argv, lambda r: int(whole_reply(c.SyncStageReply, r).changed)
        )

    def sync_walk(self, token: str, step: int = SYNC_WALK_STEP) -> Call[tuple[bool, int, int]]:
        """One step of a pass's removal walk (lua/sync_walk-5.lua): (done,
        nodes added or changed, nodes removed: the pass's so far)."""
        if not 1 <= step <= MAX_SYNC_WALK_STEP:
            raise InvalidArgument(
                "step", f"must be a whole number in 1..{MAX_SYNC_WALK_STEP}, not {step!r}"
            )

        def parse(r: list[Any]) -> tuple[bool, int, int]:
            a = whole_reply(c.SyncWalkReply, r)
            return s(a.done) == c.YES, int(a.changed), int(a.removed)

        return self._call("sync_walk", c.SyncWalkArgv(token=token, step=str(step)), parse)

    def set_lingering(self, node_id: str, lingering: bool) -> Call[bool]:
        argv = c.SetLingeringArgv(
            node_id=validate_id("node_id", node_id), lingering=c.flag(lingering)
        )
        return self._call(
            "set_lingering",
            argv,
            lambda r: s(whole_reply(c.SetLingeringReply, r).previous) == c.YES,
        )

    def sync_policy(
        self, policy: Policy, overwrite: bool = False, restore: bool = False
    ) -> Call[str]:
        """Store or check the policy.  ``restore``: a replica puts back a policy
        Redis lost; the cell then settles in the same step (see settle)."""
        wanted = policy.validate().to_fields()
        flat = [x for kv in wanted.items() for x in kv]

        def parse(r: list[Any]) -> str:
            a, rest = head(c.SyncPolicyReply, r)
            outcome = s(a.outcome)
            if outcome == c.POLICY_CONFLICT:
                stored = pairs(rest)
                for name in BESIDE_POLICY:
                    stored.pop(name, None)
                raise PolicyConflict(policy_conflict_message(stored, wanted), stored, wanted)
            self.known_policy = policy
            return outcome

        mode = c.POLICY_OVERWRITE if overwrite else c.POLICY_RESTORE if restore else c.POLICY_CHECK
        return self._call("sync_policy", c.SyncPolicyArgv(mode=mode, fields=flat), parse)

    def settle(self) -> Call[int]:
        """Redis may have lost placements just made (a failover): nodes not heard
        from since must heartbeat again before placements go to them."""
        return self._call("settle", c.NoArgv(), int)

    def nodes(self, node_id: str = "", page: int | None = None) -> Call[tuple[int, list[NodeView]]]:
        """Nodes as Schedule sees them, with the cell's clock (lua/nodes_view-5.lua):
        every node in one call (a read of the whole cell: a large one reads
        through :meth:`nodes_page`), only ``node_id`` when given, or the first
        ``page``."""
        one = validate_id("node_id", node_id) if node_id else ""
        argv = c.NodesViewArgv(node_id=one, after="", page="" if page is None else str(page))

        def parse(r: list[Any]) -> tuple[int, list[NodeView]]:
            now, _, views = parse_nodes_view(r)
            return now, views

        return self._call("nodes_view", argv, parse)

    def nodes_page(self, after: str = "", page: int = NODES_PAGE) -> Call[Page[NodeView]]:
        """One page of :meth:`nodes`: at most ``page`` nodes after node id
        ``after``, and the next page's ``after`` ("" after the last)."""
        argv = c.NodesViewArgv(node_id="", after=after, page=str(page))

        def parse(r: list[Any]) -> Page[NodeView]:
            _, following, views = parse_nodes_view(r)
            return following, views

        return self._call("nodes_view", argv, parse)

    def reservations(
        self,
        node_id: str | None = None,
        reservation_id: str | None = None,
    ) -> Call[list[Reservation]]:
        argv = c.ReservationsArgv(
            node_id=validate_id("node_id", node_id) if node_id else "",
            reservation_id=validate_id("reservation_id", reservation_id) if reservation_id else "",
            after="",
            page="",
        )
        return self._call("reservations", argv, lambda r: _reservations_page(r)[1])

    def reservations_page(self, after: str = "", page: int = NODES_PAGE) -> Call[Page[Reservation]]:
        """One page of every live reservation: those of at most ``page`` nodes
        after node id ``after``, and the next page's ``after`` ("" after the
        last)."""
        argv = c.ReservationsArgv(node_id="", reservation_id="", after=after, page=str(page))
        return self._call("reservations", argv, _reservations_page)

    def stats(self) -> Call[Stats]:
        def parse(r: list[Any]) -> Stats:
            a, rest = head(c.StatsCounters, r)
            f = pairs(rest)
            return Stats(
                pending=int(a.pending),
                **{
                    name: whole(f, name, "stats")
                    for name in (
                        "reserved_total",
                        "assigned_total",
                        "released_total",
                        "cancelled_total",
                        "expired_total",
                        "refused_total",
                        "forgotten_total",
                    )
                },
            )

        return self._call("stats", c.StatsArgv(part=c.STATS_COUNTERS), parse)

    def census(self, step: int = CENSUS_STEP) -> Call[Census]:
        """One bounded step of the cell's node census (lua/census-5.lua): at
        most ``step`` nodes read; the last finished pass's counts back."""
        if not 1 <= step <= MAX_CENSUS_STEP:
            raise InvalidArgument(
                "step", f"must be a whole number in 1..{MAX_CENSUS_STEP}, not {step!r}"
            )

        def parse(r: list[Any]) -> Census:
            a, counts = head(c.CensusReply, r)
            done = s(a.done_ms)
            return Census(
                done_ms=int(done) if done else None,
                passes=int(a.passes),
                nodes={k: int(v) for k, v in pairs(counts).items()},
            )

        # (no WAIT after it: a census step lost in a failover is taken again)
        return Call.of("census", self.k.fixed(), c.CensusArgv(step=str(step)), parse, writes=False)

    def index_rebuild(self, mode: str = "step", step: int = REBUILD_STEP) -> Call[RebuildStep]:
        """One bounded step of the placement index's rebuild
        (lua/index_rebuild-5.lua): at most ``step`` nodes reindexed; with
        ``mode`` "start" a new rebuild first, "fresh" after the index keys were
        dropped (doctor's repair)."""
        if mode not in REBUILD_MODES:
            raise InvalidArgument(
                "mode", f"must be one of {', '.join(REBUILD_MODES)}, not {mode!r}"
            )
        if not 1 <= step <= MAX_REBUILD_STEP:
            raise InvalidArgument(
                "step", f"must be a whole number in 1..{MAX_REBUILD_STEP}, not {step!r}"
            )

        def parse(r: list[Any]) -> RebuildStep:
            a = whole_reply(c.RebuildReply, r)
            return RebuildStep(
                done=int(a.done) == 1,
                reindexed=int(a.reindexed),
                epoch=s(a.epoch),
                cursor=s(a.cursor),
            )

        # (no WAIT after it: a step lost in a failover is taken again)
        argv = c.RebuildArgv(mode=mode, step=str(step))
        return Call.of("index_rebuild", self.k.fixed(), argv, parse, writes=False)

    def policy(self) -> Call[Policy | None]:
        def parse(r: list[Any]) -> Policy | None:
            if not r:
                return None
            self.known_policy = Policy.from_fields(pairs(r))
            return self.known_policy

        return self._call("stats", c.StatsArgv(part=c.STATS_POLICY), parse)

    def listed(self, after: str = "", page: int = LIST_PAGE) -> Call[Page[ListedNode]]:
        """One page of every known node, lingering and never heard from
        included (ListNodes): at most ``page`` nodes after node id ``after``."""
        argv = c.ObservedArgv(
            node_id="",
            cluster_id="",
            unheard=c.WITH_UNHEARD,
            form=c.FORM_BRIEF,
            after=after,
            page=str(page),
        )
        return Call.of("observed", self.k.fixed(), argv, parse_listed, writes=False)

    def observed(
        self, node_id: str = "", cluster_id: str = "", after: str = "", page: int = OBSERVED_PAGE
    ) -> Call[Page[ObservedNode]]:
        """Nodes that have heartbeated (lua/observed-5.lua), of one cluster when
        ``cluster_id`` is given; only ``node_id`` when it is given; else one
        page: at most ``page`` nodes after node id ``after``."""
        cluster = validate_id("cluster_id", cluster_id) if cluster_id.strip() else ""
        argv = c.ObservedArgv(
            node_id=node_id,
            cluster_id=cluster,
            unheard=c.HEARD_ONLY,
            form=c.FORM_FULL,
            after=after,
            page=str(page),
        )
        return Call.of("observed", self.k.fixed(), argv, parse_observed, writes=False)

    def sweep(self) -> Call[tuple[int, int]]:
        """The cell's bounded sweeps (lua/sweep-5.lua): (nodes forgotten,
        reservations expired)."""

        def parse(r: list[Any]) -> tuple[int, int]:
            a = whole_reply(c.SweepReply, r)
            return int(a.forgotten), int(a.expired)

        return self._call("sweep", c.NoArgv(), parse)

    def replica_seen(self, entry: ReplicaEntry, interval_s: float = 1.0) -> Call[int]:
        """Refresh this replica's entry of the cell's replica roster
        (lua/replica_seen-5.lua), refreshed every ``interval_s``: it lives
        :data:`REPLICA_TTL_MS` or 5 intervals, whichever is longer.  Redis time
        back.  No WAIT after it: an entry lost in a failover is written again
        at the next refresh."""
        rid = validate_id("replica_id", entry.replica_id)
        fields: list[str] = []
        for name in ("version", "commit", "host", "pid", "grpc", "started_ms"):
            fields += [name, str(getattr(entry, name))]
        argv = c.ReplicaSeenArgv(
            replica_id=rid, ttl_ms=str(max(REPLICA_TTL_MS, int(interval_s * 5000))), fields=fields
        )
        return Call.of(
            "replica_seen",
            self.k.fixed(),
            argv,
            lambda r: int(whole_reply(c.NowReply, r).now_ms),
            writes=False,
        )

    def advance_clock(self, ms: int, mode: str = "") -> Call[int]:
        """Move the cell's clock forward; ``mode`` "freeze" stops it first, "thaw"
        lets it run again (drills and tests only)."""
        if mode not in (c.CLOCK_ADVANCE, c.CLOCK_FREEZE, c.CLOCK_THAW):
            raise InvalidArgument("mode", "must be freeze, thaw or empty")
        argv = c.AdvanceClockArgv(ms=str(_whole("ms", ms, 1 << 40)), mode=mode)
        return self._call("advance_clock", argv, int)


_DEFAULT_POLICY = Policy()


def _cancelled(r: list[Any]) -> str:
    return s(whole_reply(c.CancelReply, r).node_id)


def schedule_argv(call: Call[Any]) -> c.ScheduleArgv:
    """The named ARGV of a :meth:`Ops.schedule` call."""
    if not isinstance(call.argv, c.ScheduleArgv):
        raise ValueError(f"a schedule batch holds schedules, not {call.script}")
    return call.argv


def policy_conflict_message(stored: dict[str, str], wanted: dict[str, str]) -> str:
    lines = [
        "the cell's stored policy differs from this replica's configuration",
        f"  {'field':<44} {'stored':>16} {'configured':>16}",
    ]
    for name in sorted(set(stored) | set(wanted)):
        if stored.get(name) != wanted.get(name):
            lines.append(f"  {name:<44} {stored.get(name, '-'):>16} {wanted.get(name, '-'):>16}")
    lines.append("start with --overwrite-policy to replace the stored policy")
    return "\n".join(lines)


def _reservations_page(r: list[Any]) -> Page[Reservation]:
    a, rows = head(c.ReservationsReply, r)
    return s(a.next), [parse_reservation(pairs(row)) for row in rows]
