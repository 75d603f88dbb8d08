"""Scenario ``phases`` (alias ``stages``): where a placement's and a changed
heartbeat's Redis time goes, phase by phase, on one fleet (a phase: a named
part of a script's work, docs/design.md "Words"; not a selection stage).

Redis runs Lua without a profiler or a debug library, and its only clock is
``TIME``.  So this builds this tree's function library with every
``-- @phase NAME`` comment of ``lua/`` turned into a call that reads ``TIME``
and adds the time since the previous mark to phase NAME (``-- @phase-begin``
starts the count; in the shipped library the marks are comments and cost
nothing), loads it beside the plain library, and sends through it the busy
bursts of ``latency``: placements coalesced in batch calls of 16 (then
cancelled) and heartbeats of nodes whose rosters changed (each lists a
sandbox placed and assigned since, releasing its reservation, and drops
one).  Each phase's figure is the median over rounds of its time per
placement or heartbeat, less one mark's own cost (measured in the same run: a
call making 100 marks in a row) for each time it was timed: once per
placement for a phase of the decision, once per call for the batch's own.
``outside`` is what the plain library's call costs (``INFO commandstats``,
the same bursts, interleaved; median over rounds) beyond the phases:
dispatch, arguments, the reply and whatever runs between the marks.  The
marks read wall time: on a busy machine a phase can read high and
``outside`` negative.  ``floor`` is ``latency``'s bare reservation writes,
one call each, for the ratio the placement targets use.
"""

from __future__ import annotations

import contextlib
import random
import re
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from bench.fleet import SIZES, mixed_fleet, send_heartbeats
from bench.latency import FLOOR_LIBRARY, floor_burst
from bench.runner import Result, Target, machine
from bench.versus import Params as VersusParams
from bench.versus import _Run
from scheduler import Policy, Request, Scheduler
from scheduler.store.scripts import (
    FUNCTION,
    Library,
    _files,
    build_library,
    library,
    module_table,
)

COLUMNS = ["operation", "phase", "us", "share"]
OPERATIONS = ("coalesced placement", "changed heartbeat")

_BEGIN = re.compile(r"^([ \t]*)-- @phase-begin\b.*$", re.M)
_MARK = re.compile(r"^([ \t]*)-- @phase ([a-z_]+)[ \t]*$", re.M)

#: appended to the `base` include: the marks' clock and their sums (library
#: state, kept from call to call)
PROFILER = """
-- @exports PHASE_SUMS phase_begin phase
local PHASE_SUMS = {}
local PHASE_LAST = nil
local PHASE_SEQ = 0 -- (which phase was first reached first: the report's order)
local function phase_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function phase_begin() PHASE_LAST = phase_now() end
local function phase(name)
  local t = phase_now()
  local s = PHASE_SUMS[name]
  if s == nil then PHASE_SEQ = PHASE_SEQ + 1; s = { 0, 0, PHASE_SEQ }; PHASE_SUMS[name] = s end
  if PHASE_LAST then s[1], s[2] = s[1] + t - PHASE_LAST, s[2] + 1 end
  PHASE_LAST = t
end
"""


def _marked(text: str) -> str:
    return _MARK.sub(r"\1phase('\2')", _BEGIN.sub(r"\1phase_begin()", text))


def phased_library() -> tuple[Library, list[str]]:
    """This tree's library with its phase marks live, plus two functions:
    ``<name>_phase_report`` (ARGV[1] "reset" clears) and ``<name>_phase_probe``
    (100 marks in a row); and the phase names in source order."""
    includes, scripts = _files()
    names: list[str] = []
    for text in [*includes.values(), *(t for _, t in scripts.values())]:
        names += [m.group(2) for m in _MARK.finditer(text) if m.group(2) not in names]
    includes = {k: _marked(v) for k, v in includes.items()}
    includes["base"] += PROFILER
    lib = build_library(includes, {k: (n, _marked(t)) for k, (n, t) in scripts.items()})
    # (the profiler's exports live in base's module table: bound once here)
    table = module_table("base")
    extra = (
        "do (function()\n"
        f"local PHASE_SUMS, phase_begin, phase = {table}.PHASE_SUMS, {table}.phase_begin, "
        f"{table}.phase\n"
        f"redis.register_function('{lib.name}_phase_report', function(keys, args)\n"
        "  local out = {}\n"
        "  for name, s in pairs(PHASE_SUMS) do out[#out + 1] = { name, s[1], s[2], s[3] } end\n"
        "  if args[1] == 'reset' then\n"
        "    for name in pairs(PHASE_SUMS) do PHASE_SUMS[name] = nil end\n"
        "  end\n"
        "  return out\nend)\n"
        f"redis.register_function('{lib.name}_phase_probe', function(keys, args)\n"
        "  phase_begin()\n  for _ = 1, 100 do phase('probe') end\n  return 1\nend)\n"
        "end)() end\n"
    )
    return Library(lib.name, lib.text + extra, lib.functions), names


@dataclass(frozen=True)
class Params:
    nodes: int = 1000
    rounds: int = 10
    burst: int = 200
    seed: int = 1

    @classmethod
    def quick(cls) -> Params:
        return cls(nodes=40, rounds=2, burst=32)


def _report(s: Scheduler, lib: Library) -> dict[str, tuple[int, int]]:
    """Each phase's (microseconds, times timed) since the last report, in the
    order the calls first reached them (a phase is a function's part, and the
    functions of one operation are not in the source in the order they run)."""
    rows = s.client.execute_command("FCALL", f"{lib.name}_phase_report", 0, "reset")
    rows.sort(key=lambda r: int(r[3]))
    return {r[0].decode(): (int(r[1]), int(r[2])) for r in rows}


def run(target: Target, p: Params | None = None) -> Result:
    p = p or Params()
    facts = machine(target)
    phased, _ = phased_library()
    plain = library()
    cell = target.new_cell("phases")
    s = Scheduler.connect(
        target.url, cell=cell, policy=Policy(strategy="least_loaded", report_ttl_ms=3_600_000)
    )
    per: dict[str, dict[str, float]] = {}
    plain_us: dict[str, list[float]] = {op: [] for op in OPERATIONS}
    floor_us: list[float] = []
    try:
        s.stats()
        if s.scripts.mode != FUNCTION:
            raise SystemExit("bench phases needs a Redis with functions (FUNCTION / FCALL)")
        s.client.execute_command("FUNCTION", "LOAD", "REPLACE", phased.text)
        s.client.execute_command("FUNCTION", "LOAD", "REPLACE", FLOOR_LIBRARY)
        rng = random.Random(p.seed * 1_000_003 + p.nodes)
        nodes = mixed_fleet(p.nodes, rng)
        send_heartbeats(s, [n.heartbeat() for n in nodes], memo=s.beats)
        r = _Run(target, s, nodes, plain, VersusParams(nodes=p.nodes, burst=p.burst, seed=p.seed))
        for _ in range(max(8, p.nodes // 50)):  # some pending reservations, as in `latency`
            s.schedule(Request.cold(*rng.choice(SIZES)))
        # one mark's own cost: TIME and the bookkeeping
        _report(s, phased)
        for _ in range(20):
            s.client.execute_command("FCALL", f"{phased.name}_phase_probe", 0)
        probe = _report(s, phased)["probe"]
        mark_us = probe[0] / probe[1]
        # per round, each phase's time per placement or heartbeat
        rounds: dict[str, dict[str, list[float]]] = {op: {} for op in OPERATIONS}
        ids = list(r.by_id)
        for i in range(p.rounds):
            for op, burst in (
                ("coalesced placement", r.coalesced),
                ("changed heartbeat", r.heartbeat),
            ):
                # the plain library and the marked one, alternating which goes first
                for lib in (plain, phased) if i % 2 else (phased, plain):
                    n, usec = burst(lib)
                    if lib is plain:
                        plain_us[op].append(usec / max(1, n))
                        continue
                    # each time a phase is timed holds one mark's own cost
                    for name, (us, times) in _report(s, phased).items():
                        rounds[op].setdefault(name, []).append(
                            max(0.0, us - mark_us * times) / max(1, n)
                        )
            calls, usec = floor_burst(target, s, p.burst, f"stfloor{i}", ids, rng)
            floor_us.append(usec / max(1, calls))
        # (medians over rounds: the marks read wall time, which a busy
        # machine stretches now and then; a phase some rounds never reached
        # counts 0 there)
        for op in OPERATIONS:
            per[op] = {
                name: statistics.median(
                    rounds[op][name] + [0.0] * (p.rounds - len(rounds[op][name]))
                )
                for name in rounds[op]
            }
    finally:
        for name in (phased.name, "sched_bench_floor"):
            # (the server may be gone already: nothing to clean then)
            with contextlib.suppress(Exception):
                s.client.execute_command("FUNCTION", "DELETE", name)
        s.close()
        target.drop_cell(cell)
    rows: list[dict[str, Any]] = []
    floor = statistics.median(floor_us) if floor_us else None
    for op in OPERATIONS:
        total = statistics.median(plain_us[op]) if plain_us[op] else 0.0
        phases = per[op]  # (the marks' own cost is off already)
        for name, t in phases.items():
            rows.append(
                {
                    "operation": op,
                    "phase": name,
                    "us": round(t, 1),
                    "share": round(t / total, 3) if total else None,
                }
            )
        outside = total - sum(phases.values())
        rows.append(
            {
                "operation": op,
                "phase": "outside",
                "us": round(outside, 1),
                "share": round(outside / total, 3) if total else None,
            }
        )
        rows.append(
            {"operation": op, "phase": "total (plain library)", "us": round(total, 1), "share": 1.0}
        )
        if floor:
            rows.append(
                {
                    "operation": op,
                    "phase": "total / floor",
                    "us": round(total / floor, 2),
                    "share": None,
                }
            )
    if floor:
        rows.append(
            {
                "operation": "floor (bare reservation writes, one call each)",
                "phase": "total",
                "us": round(floor, 1),
                "share": None,
            }
        )
    params: dict[str, Any] = asdict(p)
    params["mark_us"] = round(mark_us, 2)
    notes = [
        f"{p.nodes} nodes of mixed shapes; {p.rounds} rounds, each a burst of {p.burst} "
        f"placements in batch calls of 16 and the changed heartbeats of the nodes they went "
        f"to, through the marked library and the plain one in turn",
        f"us: per placement or heartbeat, median over rounds, each phase less one mark "
        f"({mark_us:.2f} us, measured) each time it was timed; share: of the plain "
        f"library's cost per placement or heartbeat (INFO commandstats, median over rounds)",
    ]
    return Result("phases", COLUMNS, rows, params, facts, notes)
