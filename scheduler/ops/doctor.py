"""Check a cell's invariants, and repair what is derived (``schedctl doctor``).

Read-only unless asked to repair.  The cell's keys are found with SCAN (a
bounded ``COUNT`` per step, never ``KEYS``) and read in pipelined chunks; the
checks compare what the scripts keep in step:

* ``type``      every key holds the type the layout says (scheduler/store/keys.py)
* ``record``    a node record's numbers are integers >= 0, and a node that
                heartbeated has every snapshot number
* ``reservation`` a reservation's state is one the scripts write, and a live
                one names its node and has whole cpu / memory_bytes
* ``binding``   a binding names its node and has a whole expires_ms
* ``policy``    the policy's TTLs and ceilings are numbers
* ``counters``  the stats counters and the rotation counter are integers
* ``registry``  the nodes zset and the node records name each other
* ``counts``    a node's pending_count / pending_cpu / pending_memory_bytes /
                acked_count against its live reservations
* ``node-res``  a node's pending set against the reservation records
* ``expiry``    the expiry set against the live reservations
* ``bindings``  node-sbx / node-roster members against the bindings
* ``index``     the placement index against the node records
* ``static``    the static set against the records marked static
* ``cpucfg``    a CPU-config round's missing count and cpucfg-missing set
                against its members without a config, and while its counts
                are exact (``counted``), cpucfg-configs against its members'
                configs

``repair`` fixes what is derived and nothing else: a dangling member of
node-res, expiry, node-sbx or node-roster is removed, a live reservation
missing from expiry is put back at its expires_ms, an expiry set of the
wrong type is built again from the live reservations, a node's pending
numbers that disagree with (or are not numbers) are counted again from its
reservations (under WATCH: a call that changes them meanwhile makes it
read again), a rotation counter that is not an integer starts over, and an
index that is
inconsistent (or of the wrong type) is rebuilt through the scripts' own
rebuild path (the repair drops the index keys, the nodes' entries and
``index_format``, then takes the bounded steps of lua/index_rebuild-5.lua
until the index is whole).
The static set, a round's cpucfg-missing set and its missing count are
rewritten from the records; a round whose counts disagree with its members
is computed again from every member (a new epoch, no result: the next
heartbeat computes it and counts the members again).  Records themselves (a corrupt node record,
reservation, binding, policy or stats counter) are reported only: a node's
next full heartbeat rewrites its record, a reservation is ended at its TTL,
a replica with ``--overwrite-policy`` writes the policy anew.

Concurrent calls may change the cell while it is read: run it against a
quiet cell for exact answers; a repair only removes members whose record is
absent or ended, which no live call re-adds.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import msgspec
import redis

from scheduler.client.sync import Scheduler
from scheduler.domain.catalog import CEILING_NAMES, LIVE_STATES, OUTCOMES
from scheduler.domain.errors import CellNotInitialised, FailedPrecondition
from scheduler.domain.records import snapshot_numbers
from scheduler.store.translate import translated

SCAN_COUNT = 500
CHUNK = 500

#: key kind (the layout's name before the id) -> Redis type
TYPES = {
    "policy": "hash",
    "nodes": "zset",
    "stats": "hash",
    "rr": "string",
    "expiry": "zset",
    "seen": "zset",
    "node": "hash",
    "node-res": "zset",
    "node-sbx": "set",
    "node-roster": "set",
    "res": "hash",
    "bind": "hash",
    "idx-shapes": "set",
    "idx-cpu": "zset",
    "idx-mem": "zset",
    "idx-bucket": "zset",
    "idx-seen": "zset",
    "cpucfg": "hash",
    "cpucfg-missing": "set",
    "cpucfg-configs": "hash",
    "census": "hash",
    "idx-rebuild": "hash",
    "static": "set",
    "p2p": "set",
    "art": "set",
    "node-art": "set",
    "art-lru": "zset",
    "art-names": "hash",
    "replica": "hash",
    "sync-pass": "hash",
    "sync-stage": "set",
}
INDEX_KINDS = ("idx-shapes", "idx-cpu", "idx-mem", "idx-bucket", "idx-seen")
PENDING_FIELDS = ("pending_count", "pending_cpu", "pending_memory_bytes", "acked_count")
#: reservation states the scripts write (catalog LIVE_STATES + OUTCOMES)
STATES = (*LIVE_STATES, *OUTCOMES)
#: a bucket id of the index (lua/includes/index_bucket.lua BUCKET_RE, loosely)
BUCKET_ID = re.compile(r"^\d{27}(:[^:]+){10}$")
SHAPE = re.compile(r"^\d+:\d+$")
RECOUNT = "count them again from the node's reservations"


class Finding(msgspec.Struct, kw_only=True):
    check: str
    key: str
    problem: str
    #: what --repair does about it ("" = nothing: reported only)
    fix: str = ""
    repaired: bool = False


class Report(msgspec.Struct, kw_only=True):
    cell: str
    keys: int
    nodes: int
    reservations: int
    findings: list[Finding]
    repaired: bool = False

    @property
    def ok(self) -> bool:
        return not self.findings


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _int(v: str | None) -> int | None:
    """An integer >= 0, or None (absent, not a number, negative)."""
    if v is None:
        return None
    try:
        x = int(v)
    except ValueError:
        return None
    return x if x >= 0 else None


def kind_of(key: str, base: str) -> tuple[str, str]:
    """(the layout's kind, the id) of one of the cell's keys."""
    rest = key[len(base) :]
    for kind in sorted(TYPES, key=len, reverse=True):  # (node-res before node)
        if rest == kind:
            return kind, ""
        if rest.startswith(kind + ":"):
            return kind, rest[len(kind) + 1 :]
    return "", rest


def _chunks(items: list[Any]) -> Iterator[list[Any]]:
    for i in range(0, len(items), CHUNK):
        yield items[i : i + CHUNK]


class Doctor:
    def __init__(self, sched: Scheduler) -> None:
        self.s = sched
        self.c = sched.client
        self.k = sched.keys
        self.findings: list[Finding] = []
        self._index_bad = False
        #: derived sets to rewrite (key -> members), missing counts to set (key -> n)
        self._rewrite: dict[str, set[str]] = {}
        self._missing: dict[str, int] = {}

    def _find(self, check: str, key: str, problem: str, fix: str = "") -> None:
        self.findings.append(Finding(check=check, key=key, problem=problem, fix=fix))
        if check == "index" or (check == "type" and fix.startswith("rebuild")):
            self._index_bad = True

    def _read(self, command: str, keys: list[str], *extra: Any) -> list[Any]:
        out: list[Any] = []
        for part in _chunks(keys):
            pipe = self.c.pipeline(transaction=False)
            for key in part:
                pipe.execute_command(command, key, *extra)
            out += pipe.execute(raise_on_error=False)
        return out

    # (#31: no read of a whole large key in one command; a zset of 100,000
    # nodes is about 40 ms of Redis in one ZRANGE.  SCAN-family pages of
    # SCAN_COUNT each: a member present throughout the read is returned)
    def _zset(self, key: str) -> list[Any]:
        return [m for m, _ in self.c.zscan_iter(key, count=SCAN_COUNT)]

    def _zsets(self, keys: list[str]) -> list[Any]:
        """Each zset's members (or the error its read met): small ones in
        pipelined ZRANGEs, larger ones paged."""
        sizes = self._read("ZCARD", keys)
        small = [k for k, n in zip(keys, sizes, strict=True) if isinstance(n, int) and n <= CHUNK]
        got = dict(zip(small, self._read("ZRANGE", small, 0, -1), strict=True))
        return [
            got[k] if k in got else self._zset(k) if isinstance(n, int) else n
            for k, n in zip(keys, sizes, strict=True)
        ]

    def run(self, repair: bool = False) -> Report:
        with translated(self.s.target):
            if not self.c.exists(self.k.policy):
                # a cell nobody initialised (a typo of its name, or one Redis
                # lost) is not "consistent": there is nothing to check
                raise CellNotInitialised()
            report = self._check()
            if repair and report.findings:
                self._repair(report)
        return report

    # -- reading -------------------------------------------------------------
    def _check(self) -> Report:
        base = self.k.base
        keys = sorted(_text(k) for k in self.c.scan_iter(match=_glob(base) + "*", count=SCAN_COUNT))
        by_kind: dict[str, list[str]] = defaultdict(list)
        for key in keys:
            kind, _ = kind_of(key, base)
            by_kind[kind].append(key)
        types = dict(zip(keys, (_text(t) for t in self._read("TYPE", keys)), strict=True))
        wrong: set[str] = set()
        for key in keys:
            kind, _ = kind_of(key, base)
            want = TYPES.get(kind)
            if want is None:
                self._find("type", key, "is not a key of the cell's layout")
            elif types[key] != want:
                wrong.add(key)
                derived = kind in INDEX_KINDS
                fix = "rebuild the placement index" if derived else ""
                if kind == "expiry":
                    fix = "build it again from the live reservations"
                self._find("type", key, f"holds a {types[key]}, not a {want}", fix)

        def ids(kind: str) -> list[str]:
            return [kind_of(k, base)[1] for k in by_kind[kind] if k not in wrong]

        registered = (
            set() if self.k.nodes in wrong else {_text(m) for m in self._zset(self.k.nodes)}
        )
        node_ids = ids("node")
        records = {
            n: {_text(a): _text(b) for a, b in (h or {}).items()}
            for n, h in zip(
                node_ids, self._read("HGETALL", [self.k.node(n) for n in node_ids]), strict=True
            )
            if isinstance(h, dict)
        }
        res_ids = ids("res")
        reservations = {
            r: {_text(a): _text(b) for a, b in (h or {}).items()}
            for r, h in zip(
                res_ids, self._read("HGETALL", [self.k.res(r) for r in res_ids]), strict=True
            )
            if isinstance(h, dict)
        }
        live = {r: f for r, f in reservations.items() if f.get("state") in LIVE_STATES}
        self._records(records, registered)
        self._reservations(reservations)
        self._counts(records, live, reservations, ids("node-res"))
        self._expiry(live, reservations, wrong)
        self._bindings(ids("node-sbx"), ids("node-roster"), ids("bind"))
        self._binding_records(ids("bind"))
        self._policy(wrong)
        self._counters(wrong)
        self._index(records, registered, by_kind, wrong)
        self._static(records, registered, wrong)
        self._cpucfg(ids("cpucfg"), wrong)
        return Report(
            cell=self.k.cell,
            keys=len(keys),
            nodes=len(registered),
            reservations=len(live),
            findings=self.findings,
        )

    def _records(self, records: dict[str, dict[str, str]], registered: set[str]) -> None:
        for node_id, f in records.items():
            key = self.k.node(node_id)
            heard = f.get("last_seen_ms")
            if heard is not None and _int(heard) is None:
                self._find("record", key, f"field last_seen_ms is {heard!r}, not an integer >= 0")
            for name in (*snapshot_numbers(), *PENDING_FIELDS):
                v = f.get(name)
                derived = name in PENDING_FIELDS
                if v is not None and _int(v) is None:
                    self._find(
                        "record",
                        key,
                        f"field {name} is {v!r}, not an integer >= 0",
                        RECOUNT if derived else "",
                    )
                elif v is None and heard is not None and not derived:
                    # (every full heartbeat writes it: the scripts exclude the node)
                    self._find("record", key, f"field {name} is missing")
            if f.get("node_id") and node_id not in registered:
                self._find("registry", key, "names its node, which the nodes zset lacks")
        for node_id in sorted(registered - set(records)):
            self._find("registry", self.k.nodes, f"member {node_id!r} has no node record")

    def _reservations(self, reservations: dict[str, dict[str, str]]) -> None:
        for rid, f in reservations.items():
            key = self.k.res(rid)
            state = f.get("state")
            if state not in STATES:
                self._find(
                    "reservation",
                    key,
                    f"field state is {state!r}, not one of {', '.join(STATES)}"
                    if state is not None
                    else "field state is missing",
                )
            if state in OUTCOMES:
                continue
            if not f.get("node_id"):
                self._find("reservation", key, "field node_id is missing")
            for name in ("cpu", "memory_bytes", "expires_ms"):
                if _int(f.get(name)) is None:
                    self._find(
                        "reservation", key, f"field {name} is {f.get(name)!r}, not an integer >= 0"
                    )

    def _binding_records(self, bound: list[str]) -> None:
        rows = self._read("HMGET", [self.k.bind(b) for b in bound], "node_id", "expires_ms")
        for sandbox_id, row in zip(bound, rows, strict=True):
            if not isinstance(row, list):
                continue
            key = self.k.bind(sandbox_id)
            if row[0] is None or _text(row[0]) == "":
                self._find("binding", key, "field node_id is missing")
            expires = None if row[1] is None else _text(row[1])
            if _int(expires) is None:
                self._find("binding", key, f"field expires_ms is {expires!r}, not an integer >= 0")

    def _policy(self, wrong: set[str]) -> None:
        if self.k.policy in wrong:
            return
        f = {_text(a): _text(b) for a, b in self.c.hgetall(self.k.policy).items()}
        for name in ("report_ttl_ms", "binding_ttl_ms", "reservation_ttl_ms"):
            x = _int(f.get(name))
            if x is None or x == 0:
                self._find(
                    "policy", self.k.policy, f"field {name} is {f.get(name)!r}, not a number > 0"
                )
        for name in CEILING_NAMES:
            v = f.get(name)
            if v not in (None, "") and _int(v) is None:
                self._find("policy", self.k.policy, f"field {name} is {v!r}, not an integer >= 0")

    def _counters(self, wrong: set[str]) -> None:
        if self.k.stats not in wrong:
            for name, v in self.c.hgetall(self.k.stats).items():
                if _int(_text(v)) is None:
                    self._find(
                        "counters",
                        self.k.stats,
                        f"field {_text(name)} is {_text(v)!r}, not an integer >= 0",
                    )
        rr = self.c.get(self.k.rr) if self.k.rr not in wrong else None
        if rr is not None and _int(_text(rr)) is None:
            self._find(
                "counters",
                self.k.rr,
                f"is {_text(rr)!r}, not an integer",
                "reset the rotation counter",
            )

    def _counts(
        self,
        records: dict[str, dict[str, str]],
        live: dict[str, dict[str, str]],
        reservations: dict[str, dict[str, str]],
        pending_sets: list[str],
    ) -> None:
        members = dict(
            zip(
                pending_sets,
                self._zsets([self.k.node_res(n) for n in pending_sets]),
                strict=True,
            )
        )
        by_node: dict[str, list[dict[str, str]]] = defaultdict(list)
        for rid, f in live.items():
            by_node[f.get("node_id", "")].append(f)
            held = {_text(m) for m in members.get(f.get("node_id", ""), [])}
            if rid not in held:
                self._find(
                    "node-res",
                    self.k.node_res(f.get("node_id", "")),
                    f"lacks live reservation {rid}",
                )
        for node_id, got in members.items():
            for m in got if isinstance(got, list) else []:
                rid = _text(m)
                rec = reservations.get(rid, {})
                if rid not in live and rec and rec.get("state") not in OUTCOMES:
                    # a reservation whose state is corrupt: it holds its place until
                    # the scripts end it (reported by the reservation check)
                    by_node[node_id].append(rec)
                    continue
                if rid not in live or live[rid].get("node_id") != node_id:
                    self._find(
                        "node-res",
                        self.k.node_res(node_id),
                        f"member {rid} is not a live reservation of the node",
                        "remove the member",
                    )
        for node_id, f in records.items():
            mine = by_node.get(node_id, [])
            want = {
                "pending_count": len(mine),
                "pending_cpu": sum(_int(r.get("cpu")) or 0 for r in mine),
                "pending_memory_bytes": sum(_int(r.get("memory_bytes")) or 0 for r in mine),
                "acked_count": sum(1 for r in mine if r.get("state") == "acked"),
            }
            if "pending_count" not in f and not mine:
                continue  # (a bare record: a static node not heard from yet)
            for name, expected in want.items():
                got_v = _int(f.get(name)) if f.get(name) is not None else 0
                if got_v != expected:
                    self._find(
                        "counts",
                        self.k.node(node_id),
                        f"field {name} is {f.get(name)!r}, its live reservations make {expected}",
                        RECOUNT,
                    )

    def _expiry(
        self,
        live: dict[str, dict[str, str]],
        reservations: dict[str, dict[str, str]],
        wrong: set[str],
    ) -> None:
        if self.k.expiry in wrong:
            return
        due = {_text(m) for m in self._zset(self.k.expiry)}
        for rid in sorted(due - set(live)):
            state = reservations.get(rid, {}).get("state")
            if reservations.get(rid) and state not in OUTCOMES:
                # a reservation whose state is corrupt: it stays due, so it ends at
                # its TTL (reported by the reservation check)
                continue
            self._find(
                "expiry",
                self.k.expiry,
                f"member {rid} is "
                + (f"a reservation in state {state!r}" if state else "no reservation"),
                "remove the member",
            )
        for rid in sorted(set(live) - due):
            expires = _int(live[rid].get("expires_ms"))
            self._find(
                "expiry",
                self.k.res(rid),
                "is live but not in the expiry set: it would never expire",
                f"add it at its expires_ms {expires}" if expires is not None else "",
            )

    def _bindings(self, sbx_nodes: list[str], roster_nodes: list[str], bound: list[str]) -> None:
        bindings = dict(
            zip(
                bound,
                self._read("HMGET", [self.k.bind(b) for b in bound], "node_id", "deleted"),
                strict=True,
            )
        )
        for kind, nodes, key_of in (
            ("node-sbx", sbx_nodes, self.k.node_sbx),
            ("node-roster", roster_nodes, self.k.node_roster),
        ):
            sets = self._read("SMEMBERS", [key_of(n) for n in nodes])
            for node_id, got in zip(nodes, sets, strict=True):
                for m in sorted(_text(x) for x in got) if isinstance(got, (set, list)) else []:
                    b = bindings.get(m)
                    holder = _text(b[0]) if isinstance(b, list) and b[0] is not None else None
                    if holder != node_id and kind == "node-sbx":
                        self._find(
                            "bindings",
                            key_of(node_id),
                            f"member {m} is not bound to the node"
                            + (f" (bound to {holder})" if holder else " (no binding)"),
                            "remove the member",
                        )
                    elif holder is not None and holder != node_id:
                        # a roster lists what the node runs; a binding elsewhere is the
                        # other node's (c148e98): reported, the next roster decides
                        self._find(
                            "bindings",
                            key_of(node_id),
                            f"member {m} is bound to {holder}",
                        )

    def _index(
        self,
        records: dict[str, dict[str, str]],
        registered: set[str],
        by_kind: dict[str, list[str]],
        wrong: set[str],
    ) -> None:
        entry = {n: f.get("idx", "") for n, f in records.items() if f.get("idx")}
        buckets = [k for k in by_kind["idx-bucket"] if k not in wrong]
        bucket_ids = [kind_of(k, self.k.base)[1] for k in buckets]
        for key, bucket, got in zip(buckets, bucket_ids, self._zsets(buckets), strict=True):
            for m in (_text(x) for x in got) if isinstance(got, list) else []:
                if m not in registered or entry.get(m) != bucket:
                    self._find(
                        "index",
                        key,
                        f"member {m!r} is not a node indexed in this bucket",
                        "rebuild the placement index",
                    )
        seen_key = self.k.base + "idx-seen"
        if seen_key in by_kind["idx-seen"] and seen_key not in wrong:
            for m in (_text(x) for x in self._zset(seen_key)):
                if m not in registered:
                    self._find(
                        "index",
                        seen_key,
                        f"member {m!r} is not a registered node",
                        "rebuild the placement index",
                    )
        present = set(bucket_ids)
        shapes_key = self.k.base + "idx-shapes"
        if shapes_key in by_kind["idx-shapes"] and shapes_key not in wrong:
            for m in sorted(_text(x) for x in self.c.sscan_iter(shapes_key, count=SCAN_COUNT)):
                if not SHAPE.match(m):
                    self._find(
                        "index",
                        shapes_key,
                        f"member {m!r} is not a shape",
                        "rebuild the placement index",
                    )
        streams = [k for kind in ("idx-cpu", "idx-mem") for k in by_kind[kind] if k not in wrong]
        for key, got in zip(streams, self._zsets(streams), strict=True):
            for m in (_text(x) for x in got) if isinstance(got, list) else []:
                if not BUCKET_ID.match(m) or m not in present:
                    self._find(
                        "index",
                        key,
                        f"member {m!r} is not a bucket that holds a node",
                        "rebuild the placement index",
                    )
        for node_id, bucket in sorted(entry.items()):
            if node_id in registered and bucket not in present:
                self._find(
                    "index",
                    self.k.node(node_id),
                    f"is indexed in bucket {bucket!r}, which does not exist",
                    "rebuild the placement index",
                )

    def _members(self, key: str) -> set[str]:
        return {_text(m) for m in self.c.sscan_iter(key, count=SCAN_COUNT)}

    def _set_differs(self, check: str, key: str, have: set[str], want: set[str], what: str) -> None:
        if have == want:
            return
        extra, lacking = sorted(have - want), sorted(want - have)
        self._rewrite[key] = want
        self._find(
            check,
            key,
            f"holds {len(extra)} member(s) that are not {what} ({', '.join(extra[:3])}) and "
            f"lacks {len(lacking)} ({', '.join(lacking[:3])})",
            "rewrite the set from the records",
        )

    def _static(
        self, records: dict[str, dict[str, str]], registered: set[str], wrong: set[str]
    ) -> None:
        key = self.k.base + "static"
        if key in wrong or _text(self.c.hget(self.k.stats, "static_set") or "") != "1":
            return  # (not whole yet: the next sync_nodes builds it)
        want = {n for n in registered if records.get(n, {}).get("static") == "1"}
        self._set_differs("static", key, self._members(key), want, "static nodes")

    def _cpucfg(self, clusters: list[str], wrong: set[str]) -> None:
        for cluster in clusters:
            key, mkey = self.k.cpucfg(cluster), self.k.base + "cpucfg-missing:" + cluster
            if mkey in wrong:
                continue
            round_ = {_text(a): _text(b) for a, b in self.c.hscan_iter(key, count=SCAN_COUNT)}
            want = {f[2:] for f, v in round_.items() if f.startswith("m:") and v == ""}
            self._set_differs("cpucfg", mkey, self._members(mkey), want, "members without a config")
            if (_int(round_.get("missing", "0")) or 0) != len(want):
                self._missing[key] = len(want)
                self._find(
                    "cpucfg",
                    key,
                    f"missing is {round_.get('missing')!r}, {len(want)} member(s) have no config",
                    "set missing to the count",
                )
            self._cpucfg_counts(cluster, key, round_)

    def _cpucfg_counts(self, cluster: str, key: str, round_: dict[str, str]) -> None:
        """While the round says its counts are exact, they are its members'."""
        if round_.get("counted") is None or round_["counted"] != round_.get("epoch", "0"):
            return  # (not exact: its next computation counts the members again)
        want: dict[str, int] = defaultdict(int)
        for f, v in round_.items():
            if f.startswith("m:") and v not in ("", "stored"):
                want[v] += 1
        ckey = self.k.base + "cpucfg-configs:" + cluster
        kept = {_text(a): _text(b) for a, b in self.c.hscan_iter(ckey, count=SCAN_COUNT)}
        have = {f[2:]: _int(v) for f, v in kept.items() if f.startswith("n:")}
        if have != dict(want) or {f[2:] for f in kept if f.startswith("c:")} != set(want):
            wrong = sorted(d for d in set(have) | set(want) if have.get(d) != want.get(d))
            self._find(
                "cpucfg",
                key,
                f"counts {len(wrong)} config(s) not as its members have them "
                f"({', '.join(d[:12] for d in wrong[:3])})",
                "compute the round again",
            )

    # -- repairing -----------------------------------------------------------
    def _repair(self, report: Report) -> None:
        for f in report.findings:
            if f.fix == "remove the member":
                member = f.problem.split()[1]
                cmd = "ZREM" if f.check in ("node-res", "expiry") else "SREM"
                self.c.execute_command(cmd, f.key, member)
                f.repaired = True
            elif f.fix == "rewrite the set from the records":
                members = sorted(self._rewrite[f.key])
                self.c.delete(f.key)
                for part in _chunks(members):
                    self.c.sadd(f.key, *part)
                f.repaired = True
            elif f.fix == "set missing to the count":
                self.c.hset(f.key, "missing", self._missing[f.key])
                f.repaired = True
            elif f.fix == "compute the round again":
                # (a new epoch: every member gets the next result, and the
                # counts left behind are not read until made again)
                self.c.hincrby(f.key, "epoch", 1)
                self.c.hdel(f.key, "result", "result_epoch", "counted")
                f.repaired = True
            elif f.fix.startswith("add it at its expires_ms"):
                rid = f.key[len(self.k.res("")) :]
                self.c.zadd(self.k.expiry, {rid: int(f.fix.rsplit(" ", 1)[1])})
                f.repaired = True
            elif f.fix == "reset the rotation counter":
                self.c.set(self.k.rr, "0")
                f.repaired = True
            elif f.fix == "build it again from the live reservations":
                self._rebuild_expiry()
                f.repaired = True
        recount = sorted({f.key for f in report.findings if f.fix == RECOUNT})
        for key in recount:
            self._recount(key[len(self.k.node("")) :])
        for f in report.findings:
            if f.fix == RECOUNT:
                f.repaired = True
        if self._index_bad:
            self._rebuild_index()
            for f in report.findings:
                if f.fix == "rebuild the placement index":
                    f.repaired = True
        report.repaired = True

    def _recount(self, node_id: str) -> None:
        """The node's pending numbers counted again from its reservations (as
        recount_pending in lua/includes/common.lua), written under WATCH of
        its record and its pending set: any call that changes them meanwhile
        makes this read again."""
        nkey, rkey = self.k.node(node_id), self.k.node_res(node_id)
        for _ in range(10):
            with self.c.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(nkey, rkey)
                    totals = [0, 0, 0, 0]
                    for m in pipe.zrange(rkey, 0, -1):
                        rid = _text(m)
                        pipe.watch(self.k.res(rid))
                        r = {_text(a): _text(b) for a, b in pipe.hgetall(self.k.res(rid)).items()}
                        if not r or r.get("state") in OUTCOMES:
                            continue
                        if r.get("node_id", node_id) != node_id:
                            continue
                        cpu, mem = _int(r.get("cpu")), _int(r.get("memory_bytes"))
                        if cpu is None or mem is None:
                            raise FailedPrecondition(
                                f"cannot count node {node_id}'s pending numbers again: "
                                f"reservation {rid} is corrupt (see its finding)"
                            )
                        totals[0] += 1
                        totals[1] += cpu
                        totals[2] += mem
                        totals[3] += r.get("state") == "acked"
                    pipe.multi()
                    pipe.hset(
                        nkey,
                        mapping=dict(zip(PENDING_FIELDS, (str(x) for x in totals), strict=True)),
                    )
                    pipe.execute()
                    return
                except redis.WatchError:
                    continue
        raise FailedPrecondition(f"node {node_id}'s pending numbers kept changing: run it again")

    def _rebuild_expiry(self) -> None:
        """The expiry set of the wrong type replaced by one of every live
        reservation at its expires_ms."""
        base = self.k.base
        expiry: dict[str, int] = {}
        for key in self.c.scan_iter(match=_glob(base) + "res:*", count=SCAN_COUNT):
            k = _text(key)
            if self.c.type(k) != b"hash":
                continue
            state, expires = self.c.hmget(k, "state", "expires_ms")
            at = _int(None if expires is None else _text(expires))
            if state is not None and _text(state) in LIVE_STATES and at is not None:
                expiry[k[len(self.k.res("")) :]] = at
        pipe = self.c.pipeline(transaction=True)
        pipe.delete(self.k.expiry)
        if expiry:
            pipe.zadd(self.k.expiry, expiry)
        pipe.execute()

    def _rebuild_index(self) -> None:
        """Drop the index (its keys, the nodes' entries and the policy's
        index_format), then build it anew in bounded steps."""
        policy = self.s.policy()
        if policy is None:
            raise FailedPrecondition("the cell has no policy: nothing to rebuild the index for")
        self.c.hdel(self.k.policy, "index_format")  # (Schedules stop reading the index)
        base = self.k.base
        doomed = [_text(k) for k in self.c.scan_iter(match=_glob(base) + "idx-*", count=SCAN_COUNT)]
        for part in _chunks(doomed):
            self.c.unlink(*part)  # (freed off Redis' main thread: a large bucket's DEL is long)
        for node_id in [_text(n) for n in self._zset(self.k.nodes)]:
            if self.c.type(self.k.node(node_id)) == b"hash":
                self.c.hset(self.k.node(node_id), "idx", "")
        # built again in bounded steps (lua/index_rebuild-5.lua), as a policy
        # change does: no call holds Redis for more than a step
        step = self.s.index_rebuild("fresh")
        while not step.done:
            step = self.s.index_rebuild()


def _glob(text: str) -> str:
    """``text`` with SCAN's pattern characters escaped (a cell's braces)."""
    out = []
    for ch in text:
        out.append("\\" + ch if ch in "*?[]\\" else ch)
    return "".join(out)


def doctor(sched: Scheduler, repair: bool = False) -> Report:
    return Doctor(sched).run(repair)
