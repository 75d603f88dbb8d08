"""Scenario ``instructions``: machine instructions Redis executes per call,
counted by ``valgrind --tool=callgrind``, for this tree's scripts and another
revision's.

CPU time on this shared 2-CPU machine moves 30-50 % from one run to the next
and within a run, so a change worth a few percent cannot be seen in it.  An
instruction count can: it moves by less than half a percent between runs.
It is not time (a cache miss costs no instruction), so it judges Lua and
call-count changes, not memory layouts, and the CPU-time scenarios stay the
measure of record.

For each library and each kind of call a fresh ``redis-server`` runs under
callgrind with counting off; the fleet is built, then counting is switched on
(``callgrind_control -i on``) only around the measured pipelines, the same
bursts as ``versus`` sends (coalesced placements in batch calls of 16, then
cancelled; heartbeats of the nodes they went to, each listing its new
sandbox and dropping one; heartbeats of unchanged nodes) and ``latency``'s
floor (the bare reservation writes, one call each).  Needs valgrind
(``apt-get install valgrind``); it ignores ``--redis``.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from bench import versus
from bench.fleet import SIZES, mixed_fleet, send_heartbeats
from bench.latency import FLOOR_LIBRARY, floor_burst
from bench.runner import Result, Target, machine
from scheduler import Policy, Request, Scheduler
from scheduler.store.scripts import Library, library
from scheduler.testing.redis_server import free_port

COLUMNS = ["operation", "base_per_call", "ours_per_call", "ratio", "ours_per_floor"]
OPERATIONS = (
    "coalesced placement",
    "changed heartbeat",
    "steady heartbeat",
    "coalesced changed heartbeat",
    "coalesced steady heartbeat",
)
#: operations only a library with heartbeat batches has (else measured for ours alone)
HEARTBEAT_BATCHES = frozenset({"coalesced changed heartbeat", "coalesced steady heartbeat"})


@dataclass(frozen=True)
class Params:
    base: str = "HEAD"
    nodes: int = 300
    rounds: int = 3
    burst: int = 160
    seed: int = 1
    #: the operations measured (default every one of OPERATIONS), in that order
    ops: tuple[str, ...] = OPERATIONS

    @classmethod
    def quick(cls) -> Params:
        return cls(nodes=20, rounds=1, burst=16)


class _Counted:
    """A redis-server under callgrind: counting switched on around ``counting()``."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, out: Path) -> None:
        self.proc, self.port, self.out = proc, port, out
        self.counted: int | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _control(self, *args: str) -> None:
        subprocess.run(
            ["callgrind_control", *args, str(self.proc.pid)], capture_output=True, check=True
        )

    @contextmanager
    def counting(self) -> Iterator[None]:
        self._control("-i", "on")
        try:
            yield
        finally:
            self._control("-i", "off")

    def _read_total(self) -> int:
        for line in self.out.read_text().splitlines():
            if line.startswith("totals:"):
                return int(line.split()[1])
        raise RuntimeError(f"callgrind wrote no totals to {self.out}")

    def total(self) -> int:
        """Instructions counted (read when the server stopped, before its
        folder went)."""
        if self.counted is None:
            raise RuntimeError(f"callgrind wrote no totals to {self.out}")
        return self.counted


@contextmanager
def _counted_server() -> Iterator[_Counted]:
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if shutil.which(tool) is None:
            raise SystemExit(
                f"bench instructions needs {tool} (apt-get install valgrind redis-server)"
            )
    folder = Path(tempfile.mkdtemp(prefix="sched-callgrind-"))
    port = free_port()
    out = folder / "callgrind.out"
    proc = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = _Counted(proc, port, out)
    client = redis.Redis(port=port, socket_connect_timeout=0.5)
    try:
        deadline = time.monotonic() + 60  # (valgrind takes seconds to start)
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server under valgrind did not start") from None
                time.sleep(0.2)
        yield server
    finally:
        # (shutting down answers by closing the connection)
        with contextlib.suppress(redis.exceptions.ConnectionError):
            client.shutdown(nosave=True)
        client.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(RuntimeError, OSError):  # (no count: total() says so)
            server.counted = server._read_total()
        shutil.rmtree(folder, ignore_errors=True)


def _measure(lib: Library, kind: str, p: Params) -> float:
    """Instructions per call of ``kind`` through ``lib`` on a fresh counted server."""
    with _counted_server() as server:
        target = Target(server.url, owned=False)
        s = Scheduler.connect(
            server.url,
            cell="instructions",
            policy=Policy(strategy="least_loaded", report_ttl_ms=3_600_000),
            timeout_s=60.0,  # (under callgrind a call runs some 50 times slower)
        )
        try:
            s.stats()  # (loads this tree's library: the fleet is set up through it)
            rng = random.Random(p.seed)
            nodes = mixed_fleet(p.nodes, rng)
            send_heartbeats(s, [n.heartbeat() for n in nodes], memo=s.beats)
            vp = versus.Params(nodes=p.nodes, rounds=p.rounds, burst=p.burst, seed=p.seed)
            run = versus._Run(
                target,
                s,
                nodes,
                library(),
                vp,
                whole_rosters=None if versus.knows_roster_deltas(lib) else lib,
            )
            for _ in range(max(8, p.nodes // 50)):  # some pending reservations, as in `latency`
                s.schedule(Request.cold(*rng.choice(SIZES)))
            send = run._send

            def counted(lib: Library, calls: Any) -> tuple[int, int, list[Any]]:
                with server.counting():
                    return send(lib, calls)

            calls = 0
            if kind == "floor":
                s.client.execute_command("FUNCTION", "LOAD", "REPLACE", FLOOR_LIBRARY)
                ids = list(run.by_id)
                for i in range(p.rounds):
                    floor_burst(_CountedStats(server), s, p.burst, f"fl{i}", ids, rng)
                    calls += p.burst
            else:
                burst: Callable[[Library], tuple[int, int]] = {
                    "coalesced placement": run.coalesced,
                    "changed heartbeat": run.heartbeat,
                    "steady heartbeat": run.steady,
                    "coalesced changed heartbeat": run.coalesced_heartbeat,
                    "coalesced steady heartbeat": run.coalesced_steady,
                }[kind]
                # Every library is measured the same way: loaded afresh and
                # alone (the burst's own unmeasured calls, such as the cancels,
                # go through it too), then warmed by one burst not counted.  (A
                # library keeps the bucket parses and number texts its calls
                # made, and a library loaded beside the measured one made its
                # calls dearer: the one the fleet was set up through was
                # counted warm and alone against a cold one beside it, and the
                # same code read 0.965 of itself for a changed heartbeat and
                # 0.95 for a placement.)
                s.client.execute_command("FUNCTION", "FLUSH")
                s.client.execute_command("FUNCTION", "LOAD", lib.text)
                s.scripts.library = lib
                burst(lib)
                run._send = counted  # type: ignore[method-assign]
                for _ in range(p.rounds):
                    calls += burst(lib)[0]
        finally:
            s.close()
            target.close()
    return server.total() / max(1, calls)


class _CountedStats:
    """floor_burst's target: counting on at its first stats read, off at the second."""

    def __init__(self, server: _Counted) -> None:
        self.server = server

    def script_stats(self) -> tuple[int, int]:
        self.server._control("-i", "on")
        return (0, 0)

    def script_stats_since(self, before: tuple[int, int]) -> tuple[int, int]:
        self.server._control("-i", "off")
        return (0, 0)


def run(target: Target, p: Params | None = None) -> Result:
    p = p or Params()
    facts = machine(target)
    base_lua = versus.lua_at(p.base)
    base, ours = versus.library_of(base_lua), library()
    floor = _measure(ours, "floor", p)
    # (the same Lua under the same driver executes the same instructions, to
    # within the half percent runs differ by: counted once)
    same = versus.same_lua(base_lua)
    rows = []
    for op in p.ops:
        o = _measure(ours, op, p)
        b = (
            (o if same else _measure(base, op, p))
            if op not in HEARTBEAT_BATCHES or "heartbeat_batch" in base.functions
            else None
        )
        rows.append(
            {
                "operation": op,
                "base_per_call": None if b is None else round(b),
                "ours_per_call": round(o),
                "ratio": None if b is None else round(o / b, 3),
                "ours_per_floor": round(o / floor, 2),
            }
        )
    rows.append(
        {
            "operation": "floor (bare reservation writes, one call each)",
            "base_per_call": None,
            "ours_per_call": round(floor),
            "ratio": None,
            "ours_per_floor": 1.0,
        }
    )
    params: dict[str, Any] = asdict(p)
    params["base_library"], params["our_library"] = base.name, ours.name
    notes = [
        f"instructions Redis executed per placement or heartbeat (valgrind callgrind, counting "
        f"only the measured pipelines), {p.nodes} nodes of mixed shapes, {p.rounds} rounds of "
        f"{p.burst}; base: revision {p.base} ({base.name}), ours: this tree ({ours.name})",
        "an instruction count is not time (a cache miss costs none): it judges Lua and "
        "call-count changes to a fraction of a percent where CPU time cannot",
    ]
    if same:
        notes.append(
            f"the base revision's lua/ is this tree's (revision {p.base}): each call counted "
            "once, its ratio 1.0 by construction"
        )
    return Result("instructions", COLUMNS, rows, params, facts, notes)
