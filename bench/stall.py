"""Scenario ``stall``: how long a trivial call can take inside Redis on this
machine, beside 0, 2 and 4 busy processes.  The control for issue #31's
"no Redis call over 5 ms": ``bench scale`` reads single calls of 5-16 ms
among thousands whose work is bounded (p99 3-4 ms); if a script that adds
200 numbers (a few microseconds) also reads milliseconds in Redis's own
SLOWLOG, the machine's scheduler, not the work, made them.

Each row runs the script back to back on one connection for ``seconds``
against a ``redis-server`` the scenario starts (it sets
``slowlog-log-slower-than`` to 1 ms, so it never uses ``--redis``), with
``hogs`` processes spinning beside it on the same cores:

- ``us_per_call``: Redis's own mean time in the script (commandstats);
- ``slowlog_over_1ms``, ``slowlog_over_5ms``, ``longest_in_redis_ms``: the
  calls Redis itself timed over 1 and 5 ms, and the longest (SLOWLOG times
  a command from its start to its end, so time the process was not running
  inside it counts);
- ``longest_round_trip_ms``, ``round_trips_over_5ms``: the same calls seen
  from the client (its own scheduling too);
- ``steal_share``: the machine's steal time over the row (/proc/stat),
  what a hypervisor took from this guest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.runner import Result, machine_own_servers
from scheduler.testing.redis_server import RedisServer

COLUMNS = [
    "hogs",
    "calls",
    "us_per_call",
    "slowlog_over_1ms",
    "slowlog_over_5ms",
    "longest_in_redis_ms",
    "longest_round_trip_ms",
    "round_trips_over_5ms",
    "steal_share",
]

#: a few microseconds of work in Redis
SCRIPT = "local x = 0 for i = 1, 200 do x = x + i end return x"


@dataclass(frozen=True)
class Params:
    hogs: tuple[int, ...] = (0, 2, 4)
    seconds: float = 60.0

    @classmethod
    def quick(cls) -> Params:
        return cls(hogs=(0, 1), seconds=0.5)


def _steal() -> tuple[int, int]:
    """(all CPU time, steal time) of the machine so far, in ticks (0, 0 where
    /proc/stat is not there)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return 0, 0
    # cpu user nice system idle iowait irq softirq steal ...
    ticks = [int(x) for x in fields[1:9]]
    return sum(ticks), ticks[7]


def _row(rs: RedisServer, hogs: int, seconds: float) -> dict[str, Any]:
    r = rs.client()
    r.config_set("slowlog-log-slower-than", 1000)
    r.config_set("slowlog-max-len", 100_000)
    r.slowlog_reset()
    r.config_resetstat()
    sha = r.script_load(SCRIPT)
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    try:
        time.sleep(0.2 if hogs else 0)  # (each spinning before the first call)
        total0, steal0 = _steal()
        calls, longest, over5 = 0, 0.0, 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            r.evalsha(sha, 0)
            took = time.perf_counter() - t
            longest = max(longest, took)
            over5 += took > 0.005
            calls += 1
        total1, steal1 = _steal()
    finally:
        for p in spinning:
            p.kill()
            p.wait()
    slow = [e for e in r.slowlog_get(100_000) if e["command"].startswith(b"EVALSHA")]
    stats = r.info("commandstats").get("cmdstat_evalsha", {})
    return {
        "hogs": hogs,
        "calls": calls,
        "us_per_call": round(float(stats.get("usec_per_call", 0.0)), 2),
        "slowlog_over_1ms": len(slow),
        "slowlog_over_5ms": sum(e["duration"] > 5000 for e in slow),
        "longest_in_redis_ms": round(max((e["duration"] for e in slow), default=0) / 1000, 2),
        "longest_round_trip_ms": round(longest * 1000, 2),
        "round_trips_over_5ms": over5,
        "steal_share": round((steal1 - steal0) / max(1, total1 - total0), 4),
    }


def run(p: Params) -> Result:
    rows = []
    with RedisServer() as rs:
        for hogs in p.hogs:
            rows.append(_row(rs, hogs, p.seconds))
    return Result(
        scenario="stall",
        columns=COLUMNS,
        rows=rows,
        params=asdict(p),
        machine={**machine_own_servers(), "cores": os.cpu_count()},
        notes=[
            f"a script of a few microseconds ({SCRIPT!r}) back to back for {p.seconds:g} s "
            "a row on one connection, beside `hogs` processes spinning on the same cores; "
            "in Redis: SLOWLOG (over 1 ms) and commandstats; round trips: the client's",
        ],
    )
