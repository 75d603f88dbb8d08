"""What every scenario shares: where Redis comes from, what the machine is,
how Redis accounts for its own time, and how results are shown (a rich table)
and kept (JSON ``{"scenario": ..., "rows": [...]}``).

Numbers that move with the machine's load (latency, throughput) are only
compared with numbers measured in the same run: a scenario reports its Redis
``PING`` beside its ``Schedule`` for that reason.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import secrets
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

from scheduler.store.keys import DEFAULT_PREFIX
from scheduler.testing.redis_server import RedisServer


@dataclass
class Result:
    """One scenario's outcome.  ``rows`` carry exactly the documented keys
    (plus ``note`` where a row could not be measured); ``columns`` is their
    order in the table."""

    scenario: str
    columns: list[str]
    rows: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "rows": self.rows,
            "params": self.params,
            "machine": self.machine,
            "notes": self.notes,
        }


# ---------------------------------------------------------------------------
# Redis: one we start ourselves, or the user's
# ---------------------------------------------------------------------------
class Target:
    """The Redis a scenario runs against.

    ``owned`` is True when we started the server: then we may reset its
    statistics (``CONFIG RESETSTAT``).  On a user's server (``--redis``) we
    only read differences of ``INFO`` counters, never reset or flush, and
    every scenario works in its own cell that it deletes afterwards.
    """

    def __init__(self, url: str, owned: bool) -> None:
        self.url = url
        self.owned = owned
        self.client = redis.Redis.from_url(url)

    def new_cell(self, scenario: str) -> str:
        return f"bench-{scenario}-{secrets.token_hex(4)}"

    def drop_cell(self, cell: str) -> int:
        """Delete every key of ``cell`` (our cells only; a few seconds at 10k nodes)."""
        pattern = f"{DEFAULT_PREFIX}:{{{cell}}}:*"
        n = 0
        batch: list[bytes] = []
        for key in self.client.scan_iter(match=pattern, count=5000):
            batch.append(key)
            if len(batch) >= 5000:
                n += int(self.client.unlink(*batch))
                batch = []
        if batch:
            n += int(self.client.unlink(*batch))
        return n

    def reset_stats(self) -> None:
        if self.owned:
            self.client.config_resetstat()

    def script_stats(self) -> tuple[int, int]:
        """(calls, usec) of FCALL and EVALSHA so far: every script of ours runs
        by one of them (FCALL where the server has functions)."""
        stats = self.client.info("commandstats")
        calls = usec = 0
        for name in ("cmdstat_fcall", "cmdstat_evalsha"):
            s = stats.get(name) or {}
            calls += int(s.get("calls", 0))
            usec += int(s.get("usec", 0))
        return calls, usec

    def script_stats_since(self, before: tuple[int, int]) -> tuple[int, int]:
        """(calls, usec) of script calls since ``before`` (a script_stats())."""
        calls, usec = self.script_stats()
        return calls - before[0], usec - before[1]

    def cpu_seconds(self) -> float:
        """CPU time the redis-server process has used (user + system)."""
        return self.cpu_times()[0]

    def cpu_times(self) -> tuple[float, float]:
        """The redis-server process's CPU time and its main thread's (the one
        that runs commands and scripts; its background threads, freeing
        what a call dropped, run beside it and hold no client), from one
        ``INFO cpu``; the process's twice where the server does not tell
        them apart (before Redis 6.2)."""
        info = self.client.info("cpu")
        process = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        if "used_cpu_user_main_thread" not in info:
            return process, process
        return process, float(info["used_cpu_user_main_thread"]) + float(
            info["used_cpu_sys_main_thread"]
        )

    def version(self) -> str:
        return str(self.client.info("server").get("redis_version", "?"))

    def close(self) -> None:
        self.client.close()


@contextmanager
def redis_target(url: str | None) -> Iterator[Target]:
    """``url`` if given, else a fresh ``redis-server`` on a free port, stopped after."""
    if url:
        target = Target(url, owned=False)
        try:
            target.client.ping()
            yield target
        finally:
            target.close()
        return
    server = RedisServer().start()
    target = Target(server.url, owned=True)
    try:
        yield target
    finally:
        target.close()
        server.close()


# ---------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine(target: Target) -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "redis_version": target.version(),
        "redis": "started by the benchmark" if target.owned else "given with --redis",
        "python": platform.python_version(),
        # other work on the machine moves timings: say how busy it was (at the start)
        "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def machine_own_servers() -> dict[str, Any]:
    """:func:`machine` for a scenario that starts its own redis-servers (one
    per setting): the version is read from a server started for the purpose."""
    with RedisServer() as rs:
        version = str(rs.client().info("server").get("redis_version", "?"))
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "redis_version": version,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "redis": "started by the benchmark",
    }


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    if not values:
        raise ValueError("percentile of an empty sample")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least 1
    return float(ordered[int(rank) - 1])


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------
def _cell(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    return str(v)


def table(result: Result) -> Table:
    t = Table(title=f"bench {result.scenario}", title_justify="left")
    for c in result.columns:
        t.add_column(c, justify="left" if c in ("system", "strategy", "path", "note") else "right")
    for row in result.rows:
        t.add_row(*(_cell(row.get(c)) for c in result.columns))
    return t


def markdown(result: Result) -> str:
    """The same table as GitHub markdown (what docs/performance.md quotes)."""
    lines = [
        "| " + " | ".join(result.columns) + " |",
        "|" + "|".join("---" for _ in result.columns) + "|",
    ]
    for row in result.rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in result.columns) + " |")
    return "\n".join(lines)


def show(result: Result, console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped: do not squeeze the table into 80 columns
            console = Console(width=140)
    console.print(table(result))
    for note in result.notes:
        console.print(f"  {note}", style="dim", highlight=False)
    m = result.machine
    if m:
        console.print(
            f"  machine: {m['nproc']} CPU, {m['cpu_model']}, redis {m['redis_version']}, "
            f"python {m['python']}, {m['date']}, load average {m['loadavg_1m']} at "
            "the start",
            style="dim",
            highlight=False,
        )


def write_json(result: Result, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result.to_json(), indent=2) + "\n")
