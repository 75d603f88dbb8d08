"""Scenario ``versus``: Redis CPU per call of another revision's scripts
against this tree's, as ratios measured in one run.

This machine's run-to-run noise (PING p50 moves between 86 and 516 us from
one run to the next) is larger than most single changes, so figures from two
runs cannot be compared.  Here both versions share one Redis and one fleet:
the base revision's ``lua/`` files (read with ``git show``) are built into a
function library by this tree's builder and loaded beside this tree's (a
library's name carries a hash of its code), and every round sends the same
kinds of pipelined bursts through each in turn, alternating which goes
first.  Each burst's Redis CPU comes from ``INFO commandstats``.

This tree's client builds every call, so the base must take the same KEYS
and ARGV (a base from before a change of a script's arguments fails with that
script's own error, shown).  One exception: a base from before roster deltas
(a changed roster sent as what joined and left) gets the changed roster
whole, as its own client sent it.  Work that is not measured (cancelling the
burst's reservations, the gateway's assignments) goes through this tree's
library.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec.structs

from bench.fleet import SIZES, mixed_fleet, run_pipelined, send_heartbeats
from bench.runner import Result, Target, machine
from scheduler import Policy, Request, Scheduler
from scheduler.domain import catalog
from scheduler.domain.records import MIB, snapshot_fields
from scheduler.ops.simnode import SimNode
from scheduler.store import lua_constants
from scheduler.store.calls import Call, Resync
from scheduler.store.contracts import ROSTER_DELTA, ROSTER_FULL, HeartbeatArgv
from scheduler.store.scripts import FUNCTION, SCRIPT_NAME, Library, _files, build_library, library

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["operation", "base_us", "ours_us", "ratio", "ratio_low", "ratio_high", "rounds"]
OPERATIONS = ("schedule_busy", "coalesced_busy", "heartbeat_busy", "steady_heartbeat_busy")
#: Schedules per batch call in ``coalesced_busy`` (as in ``latency``).
COALESCED = 16


@dataclass(frozen=True)
class Params:
    base: str = "HEAD"
    nodes: int = 1000
    rounds: int = 12
    burst: int = 200
    seed: int = 1

    @classmethod
    def quick(cls) -> Params:
        return cls(nodes=40, rounds=2, burst=20)


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        raise SystemExit("bench versus needs git (it reads the base revision's lua/)") from None
    if out.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


#: a revision's lua/ files: (include name -> text, script name -> (number
#: of KEYS, text))
LuaFiles = tuple[dict[str, str], dict[str, tuple[int, str]]]


def library_at(rev: str) -> Library:
    """The function library of revision ``rev``'s lua/ files, built by this tree."""
    return library_of(lua_at(rev))


def library_of(files: LuaFiles) -> Library:
    """The function library of these lua/ files (:func:`lua_at`), built by this tree."""
    includes, scripts = files
    includes = {**includes, lua_constants.NAME: lua_constants.render() + _retired_constants()}
    return build_library(includes, scripts)


def same_lua(files: LuaFiles) -> bool:
    """Are these lua/ files (:func:`lua_at`) this tree's?  (Their libraries
    then differ only by the retired constants :func:`library_of` adds, which
    a call never reads: each call executes the same instructions.)"""
    includes, scripts = files
    ours, our_scripts = _files()
    return includes == {k: v for k, v in ours.items() if k != lua_constants.NAME} and (
        scripts == our_scripts
    )


def lua_at(rev: str) -> LuaFiles:
    """Revision ``rev``'s lua/ files (read with git)."""
    includes: dict[str, str] = {}
    scripts: dict[str, tuple[int, str]] = {}
    for path in _git("ls-tree", "-r", "--name-only", rev, "--", "lua/").split():
        folder, _, name = path.rpartition("/")
        if not name.endswith(".lua"):
            continue
        text = _git("show", f"{rev}:{path}")
        if folder == "lua/includes":
            includes[name[:-4]] = text
        elif m := SCRIPT_NAME.match(name):
            scripts[m.group("name")] = (int(m.group("nkeys")), text)
    if not scripts:
        raise SystemExit(f"revision {rev} has no lua/ scripts")
    return includes, scripts


def _retired_constants() -> str:
    """Generated constants this tree no longer has, which older revisions' Lua
    reads (their own tables, rendered the way those revisions rendered them)."""
    index_fields = [
        n for n, m in lua_constants.index_movers(snapshot_fields()).items() if m is True
    ]
    out = "local INDEX_FIELDS = { " + ", ".join(f"'{n}'" for n in index_fields) + " }\n"
    # (one pattern for the whole packed policy, before PACKED_RES split it:
    # Lua takes at most 32 captures, so only while the policy has no more)
    n = len(catalog.PACKED)
    if n <= 32:
        out += "-- @exports PACKED_RE\n"
        out += "local PACKED_RE = '^" + "\\t".join(["([^\\t]*)"] * n) + "$'\n"
    return out


def knows_roster_deltas(lib: Library) -> bool:
    """Does this library's heartbeat take a changed roster as a delta (mode 2)?"""
    return "ARGV[6] == '2'" in lib.text or "A[6] == '2'" in lib.text


def _whole_roster(call: Call[Any], roster: list[str]) -> Call[Any]:
    """A roster delta heartbeat as the same heartbeat with its roster whole."""
    argv = call.argv
    if not isinstance(argv, HeartbeatArgv) or argv.roster_form != ROSTER_DELTA:
        return call
    whole = msgspec.structs.replace(argv, roster_form=ROSTER_FULL, roster=roster)
    return call.with_argv(whole)


class _Run:
    """One fleet and the two libraries; each method sends one measured burst
    through library ``lib`` and returns its (calls, usec)."""

    def __init__(
        self,
        target: Target,
        s: Scheduler,
        nodes: list[SimNode],
        ours: Library,
        p: Params,
        whole_rosters: Library | None = None,
    ) -> None:
        self.target, self.s, self.ours, self.p = target, s, ours, p
        #: a library that takes a changed roster only whole (a base from before deltas)
        self.whole_rosters = whole_rosters
        self.by_id = {n.node_id: n for n in nodes}
        self.rng = random.Random(p.seed)
        self.seq = 0

    def _send(self, lib: Library, calls: Sequence[Call[Any]]) -> tuple[int, int, list[Any]]:
        pipe = self.s.client.pipeline(transaction=False)
        for c in calls:
            pipe.execute_command("FCALL", lib.functions[c.script], len(c.keys), *c.keys, *c.args)
        before = self.target.script_stats()
        replies = pipe.execute(raise_on_error=False)
        n, usec = self.target.script_stats_since(before)
        out: list[Any] = []
        for c, reply in zip(calls, replies, strict=True):
            try:
                if isinstance(reply, Exception):
                    raise reply
                out.append(c.parse(reply))
            except Resync as e:  # (the memo was behind: sent again in full, not measured)
                out.append(e)
            except Exception as e:
                who = "this tree's" if lib is self.ours else "the base revision's"
                raise SystemExit(f"{who} {c.script} failed on this tree's call: {e}") from None
        return n, usec, out

    def schedule(self, lib: Library) -> tuple[int, int]:
        ids = []
        for _ in range(self.p.burst):
            self.seq += 1
            ids.append(f"vs{self.seq}")
        calls = [
            self.s.ops.schedule(Request.cold(*self.rng.choice(SIZES)), reservation_id=rid)
            for rid in ids
        ]
        n, usec, _ = self._send(lib, calls)
        run_pipelined(self.s, [self.s.ops.cancel(rid) for rid in ids], errors=True)
        return n, usec

    def coalesced(self, lib: Library) -> tuple[int, int]:
        """The same burst as :meth:`schedule` in batch calls of COALESCED;
        counted per placement."""
        ids = []
        for _ in range(self.p.burst):
            self.seq += 1
            ids.append(f"vs{self.seq}")
        calls = [
            self.s.ops.schedule_batch(
                [
                    self.s.ops.schedule(Request.cold(*self.rng.choice(SIZES)), reservation_id=rid)
                    for rid in ids[i : i + COALESCED]
                ]
            )
            for i in range(0, len(ids), COALESCED)
        ]
        _, usec, out = self._send(lib, calls)
        placed = sum(1 for batch in out for p in batch if not isinstance(p, Exception))
        run_pipelined(self.s, [self.s.ops.cancel(rid) for rid in ids], errors=True)
        return placed, usec

    def _beats(
        self, lib: Library, calls: list[Call[Any]], coalesced: bool
    ) -> tuple[int, int, list[Any]]:
        """Send heartbeat calls, one each or (``coalesced``) in batch calls of
        COALESCED; (heartbeats, usec, each one's result)."""
        if not coalesced:
            return self._send(lib, calls)
        batches = [
            self.s.ops.heartbeat_batch(calls[i : i + COALESCED])
            for i in range(0, len(calls), COALESCED)
        ]
        _, usec, out = self._send(lib, batches)
        return len(calls), usec, [r for batch in out for r in batch]

    def heartbeat(self, lib: Library, coalesced: bool = False) -> tuple[int, int]:
        """Heartbeats of nodes whose rosters now list a sandbox placed and
        assigned since their last one (it releases its reservation), and drop
        one older sandbox (a binding to remove).  One new sandbox a node: a
        placement on a node the burst already placed on is cancelled, so each
        heartbeat does the same work at every fleet size (on a small fleet
        least_loaded puts several of a burst on one node)."""
        touched: dict[str, SimNode] = {}
        for _ in range(self.p.burst):
            cpu, mem = self.rng.choice(SIZES)
            placed = self.s.schedule(Request.cold(cpu, mem))
            assert placed.reservation_id is not None  # (a creation reserves)
            if placed.node_id in touched:
                self.s.cancel(placed.reservation_id)
                continue
            self.seq += 1
            sb = f"vs{self.seq}"
            self.s.assign(sb, placed.node_id, placed.endpoint, placed.reservation_id)
            node = self.by_id[placed.node_id]
            node.create(sb, cpu, mem * MIB)
            touched[node.node_id] = node
        for node in touched.values():
            node.delete(next(iter(node.sandboxes)))
        beats = [node.heartbeat() for node in touched.values()]
        calls = [self.s.ops.heartbeat(hb, self.s.beats) for hb in beats]
        if lib is self.whole_rosters:
            calls = [_whole_roster(c, hb.sandbox_ids) for c, hb in zip(calls, beats, strict=True)]
        n, usec, out = self._beats(lib, calls, coalesced)
        self._resend(touched.values(), out)
        return n, usec

    def steady(self, lib: Library, coalesced: bool = False) -> tuple[int, int]:
        sample = self.rng.sample(list(self.by_id.values()), min(self.p.burst, len(self.by_id)))
        calls = [self.s.ops.heartbeat(node.heartbeat(), self.s.beats) for node in sample]
        n, usec, out = self._beats(lib, calls, coalesced)
        self._resend(sample, out)
        return n, usec

    def coalesced_heartbeat(self, lib: Library) -> tuple[int, int]:
        """:meth:`heartbeat` in batch calls of COALESCED; counted per heartbeat."""
        return self.heartbeat(lib, coalesced=True)

    def coalesced_steady(self, lib: Library) -> tuple[int, int]:
        """:meth:`steady` in batch calls of COALESCED; counted per heartbeat."""
        return self.steady(lib, coalesced=True)

    def _resend(self, nodes: Any, out: list[Any]) -> None:
        again = [node for node, r in zip(nodes, out, strict=True) if isinstance(r, Resync)]
        send_heartbeats(self.s, [node.heartbeat() for node in again], memo=self.s.beats)


def run(target: Target, p: Params | None = None) -> Result:
    p = p or Params()
    facts = machine(target)
    base, ours = library_at(p.base), library()
    cell = target.new_cell("versus")
    s = Scheduler.connect(
        target.url, cell=cell, policy=Policy(strategy="least_loaded", report_ttl_ms=3_600_000)
    )
    per_call: dict[str, dict[str, list[float]]] = {
        op: {"base": [], "ours": []} for op in OPERATIONS
    }
    try:
        s.stats()  # (loads this tree's library, or finds the server has no functions)
        if s.scripts.mode != FUNCTION:
            raise SystemExit("bench versus needs a Redis with functions (FUNCTION / FCALL)")
        s.client.execute_command("FUNCTION", "LOAD", "REPLACE", base.text)
        rng = random.Random(p.seed * 1_000_003 + p.nodes)
        nodes = mixed_fleet(p.nodes, rng)
        send_heartbeats(s, [node.heartbeat() for node in nodes], memo=s.beats)
        r = _Run(
            target, s, nodes, ours, p, whole_rosters=None if knows_roster_deltas(base) else base
        )
        for _ in range(max(8, p.nodes // 50)):  # some pending reservations, as in `latency`
            s.schedule(Request.cold(*rng.choice(SIZES)))
        measure: dict[str, Callable[[Library], tuple[int, int]]] = {
            "schedule_busy": r.schedule,
            "coalesced_busy": r.coalesced,
            "heartbeat_busy": r.heartbeat,
            "steady_heartbeat_busy": r.steady,
        }
        for i in range(p.rounds):
            order = [("base", base), ("ours", ours)]
            if i % 2:
                order.reverse()
            for op, burst in measure.items():
                for who, lib in order:
                    n, usec = burst(lib)
                    per_call[op][who].append(usec / max(1, n))
    finally:
        if base.name != ours.name:
            # (the server may be gone already: nothing to clean then)
            with contextlib.suppress(Exception):
                s.client.execute_command("FUNCTION", "DELETE", base.name)
        s.close()
        target.drop_cell(cell)
    rows = []
    for op in OPERATIONS:
        b, o = per_call[op]["base"], per_call[op]["ours"]
        ratios = [y / x for x, y in zip(b, o, strict=True) if x > 0]
        rows.append(
            {
                "operation": op,
                "base_us": round(statistics.median(b), 1),
                "ours_us": round(statistics.median(o), 1),
                "ratio": round(statistics.median(ratios), 3) if ratios else None,
                "ratio_low": round(min(ratios), 3) if ratios else None,
                "ratio_high": round(max(ratios), 3) if ratios else None,
                "rounds": len(ratios),
            }
        )
    params: dict[str, Any] = asdict(p)
    params["base_library"], params["our_library"] = base.name, ours.name
    notes = [
        f"base: revision {p.base} ({base.name}); ours: this tree ({ours.name}); "
        f"{p.nodes} nodes of mixed shapes, one Redis",
        f"each round sends, through each library in turn (alternating which goes first), "
        f"{p.burst} pipelined Schedules (cancelled after), the same in batch calls of "
        f"{COALESCED} (coalesced_busy, per placement), heartbeats of the nodes those "
        f"placements went to once assigned (each lists its new sandboxes, releasing their "
        f"reservations, and drops one), and {p.burst} heartbeats of unchanged nodes",
        "*_us: median over rounds of INFO commandstats fcall usec per call; ratio: median of "
        "the per-round ours/base ratios, with their lowest and highest",
    ]
    return Result("versus", COLUMNS, rows, params, facts, notes)
