"""Where a replica's CPU goes per Schedule RPC: ``python -m bench.profile``.

Starts a ``redis-server``, a 1,000-node fleet and one server (``schedctl
serve`` with the given flags, or ``--bare`` for the constant-reply server of
``bench throughput``), loads it like the ``cpu`` path of ``bench throughput``
(32 Schedules in flight over 8 connections) and samples the server with
`py-spy <https://github.com/benfred/py-spy>`_ (``pip install py-spy``; a
developer's tool, not a dependency) without stopping it (``--nonblocking``),
then counts each sample by the innermost frame it can name:

- **gRPC and the loop, in C**: the sample is in C code the event loop calls
  directly: gRPC's Cython and C core (its callbacks, its sends), uvloop's own
  C and the system calls under them.  py-spy sees Python frames only, so it
  cannot split this bucket further.
- **gRPC poller thread**: gRPC's completion-queue thread.
- **event loop (Python)**: asyncio's Python code (``asyncio/``), the
  streams redis-py reads and writes through included.
- **redis client**: ``redis/`` (redis-py and its pool).
- **scheduler library**: ``scheduler/`` but the servicer: the client, the
  plans, the calls, the script registry.
- **servicer**: ``scheduler/server/service.py`` (and ``replica.py``).
- **metrics**: ``prometheus_client``.  **protobuf**: ``google/protobuf``.

Use it to compare two versions or two flag sets on the same machine; the
shares of one run move by a few points from run to run.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench import grpc_path
from bench.runner import Target
from bench.throughput import POLICY, Params, _fleet
from scheduler.testing.redis_server import RedisServer
from scheduler.testing.replicas import ServeProcess

#: innermost-frame rules, first match wins (py-spy's "function (file:line)")
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("metrics", ("(prometheus_client/",)),
    ("protobuf", ("(google/protobuf/",)),
    ("redis client", ("(redis/",)),
    ("servicer", ("(scheduler/server/service.py", "(scheduler/server/replica.py")),
    ("scheduler library", ("(scheduler/",)),
    ("gRPC poller thread", ("Thread.run (threading.py",)),
    (
        "gRPC and the loop, in C",
        ("Handle._run (asyncio/events.py", "Runner.run (asyncio/runners", "(uvloop/", "(grpc/"),
    ),
    ("event loop (Python)", ("(asyncio/", "(selectors.py", "(contextlib.py", "(inspect.py")),
)
#: frames that run nothing of their own: look further out
SKIP = ("(<frozen ", "(typing.py", "(functools.py", "(abc.py")


def category(stack: list[str]) -> str:
    for frame in reversed(stack):
        if any(s in frame for s in SKIP):
            continue
        for name, needles in RULES:
            if any(n in frame for n in needles):
                return name
    return "other"


def shares(raw: str) -> dict[str, float]:
    """Share of samples per category, from py-spy's ``--format raw``."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, n = line.rstrip().rpartition(" ")
        if stack and n.isdigit():
            counts[category(stack.split(";"))] += int(n)
    total = sum(counts.values()) or 1
    return {name: counts[name] / total for name, _ in counts.most_common()}


def py_spy() -> str:
    beside = Path(sys.executable).with_name("py-spy")  # this virtualenv's first
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    return found


def record(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            py_spy(),
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, round(seconds))),
            "--rate",
            "200",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.profile", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--bare", action="store_true", help="profile the constant-reply server")
    p.add_argument("--seconds", type=float, default=6.0, help="load time (default 6)")
    p.add_argument("serve_args", nargs="*", help="schedctl serve flags, after --")
    args = p.parse_args(argv)
    exe = py_spy()
    server = RedisServer().start()
    target = Target(server.url, owned=True)
    cell, s = _fleet(target, Params(), 1)
    out = Path(tempfile.mkdtemp(prefix="sched-profile-")) / "profile.raw"
    proc: grpc_path.BareServer | ServeProcess
    try:
        if args.bare:
            loop = "uvloop" if "uvloop" in args.serve_args else "asyncio"
            proc = grpc_path.BareServer(loop)
            proc.wait_listening()
            port, pid = proc.port, proc.pid
        else:
            proc = ServeProcess(
                grpc_path.config(POLICY),
                target.url,
                cell,
                metrics=False,
                extra_args=tuple(args.serve_args),
            )
            proc.wait_listening(120)
            port, pid = proc.port, proc.proc.pid
        spy: list[subprocess.Popen[bytes]] = []
        # skip the first second (connections warming up), stop before the load does
        timer = threading.Timer(1.0, lambda: spy.append(record(pid, args.seconds - 2, out)))
        timer.start()
        m = grpc_path.measure(
            port,
            pid,
            seconds=args.seconds,
            concurrency=32,
            channels=8,
            cpu=1,
            memory_mb=1024,
            redis_cpu=target.cpu_seconds,
        )
        timer.join()
        spy[0].wait(60)
        proc.close()
        us = m.server_cpu / m.calls * 1e6 if m.calls else 0.0
        print(
            f"{'bare grpc.aio' if args.bare else 'schedctl serve'} {' '.join(args.serve_args)}:"
            f" {m.calls / m.wall:,.0f} RPCs/s, {us:.0f} us CPU per RPC (py-spy: {exe})"
        )
        for name, share in shares(out.read_text()).items():
            print(f"  {name:26s} {100 * share:5.1f} %  ~{share * us:5.0f} us")
    finally:
        s.close()
        target.close()
        server.close()
        shutil.rmtree(out.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
