"""The gRPC path of ``throughput``: replicas as ``schedctl serve`` processes,
load from separate processes through the generated ``scheduler.v1`` stubs.

Each replica gets a config file that says the same policy the benchmark
stored in the cell, so a replica that disagreed would refuse to start (the
product's own check).  Load processes are spawned, not forked, and this
module never opens a gRPC channel in the driver: gRPC's core does not
survive a fork of a process that has used it.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import subprocess
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from scheduler import Policy
from scheduler.testing.replicas import SCHEDCTL, ServeProcess, expect


@functools.cache
def unavailable() -> str | None:
    """Why the gRPC path cannot run here, or None when it can (asked once a process)."""
    try:
        import scheduler.grpc.scheduler_pb2_grpc  # noqa: F401
    except ImportError as e:
        return f"generated stubs scheduler/grpc/scheduler_pb2_grpc.py cannot be imported ({e})"
    try:
        r = subprocess.run([*SCHEDCTL, "serve", "--help"], capture_output=True, text=True,
                           timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`schedctl serve --help` could not run ({e})"
    if r.returncode != 0:
        return "`schedctl serve` does not exist yet (`schedctl serve --help` fails)"
    return None


def config(policy: Policy) -> dict[str, Any]:
    """A ``schedctl serve`` config that states ``policy`` (Redis and the cell
    are the process's flags)."""
    return {
        "log_level": "warn",
        "scheduler": {
            "discovery": "heartbeat",
            "strategy": policy.strategy,
            "report_ttl": f"{policy.report_ttl_ms}ms",
            "binding_ttl": f"{policy.binding_ttl_ms}ms",
            "placement_reservation_ttl": f"{policy.reservation_ttl_ms}ms",
            "node_resource_limit": {k: v for k, v in policy.limits.active().items()},
            "overcommit": {"cpu": policy.overcommit.cpu, "memory": policy.overcommit.memory},
            "default_request": {"cpu": policy.default_request.cpu,
                                "memory_mb": policy.default_request.memory_mb},
        },
    }


def _load(port: int, cpu: int, memory_mb: int, seconds: float, conn: Connection,
          go: Any) -> None:
    """One gateway-like load process: Schedule RPCs back to back on one channel."""
    import grpc

    from scheduler.grpc import scheduler_pb2 as pb
    from scheduler.grpc import scheduler_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=60)
        stub = pb_grpc.SchedulerStub(channel)
        req = pb.ScheduleRequest(hint=pb.ScheduleRequestHint(
            new_cold_sandbox=pb.NewColdSandboxHint(cpu_count=cpu, memory_mb=memory_mb)))
        stub.Schedule(req, timeout=60)  # warm: first call pays for connection set-up
        conn.send(("ready", None))
        go.wait()
        n = refused = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            try:
                stub.Schedule(req, timeout=60)
                n += 1
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or "no nodes" not in str(e.details()):
                    raise
                refused += 1
        conn.send(("done", (n, refused)))
    except Exception as e:  # reported to the driver, which raises it
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        channel.close()


class Replicas:
    """``count`` ``schedctl serve`` processes on one cell, each on its own port."""

    def __init__(self, url: str, cell: str, policy: Policy, count: int) -> None:
        self.procs: list[ServeProcess] = []
        try:
            for _ in range(count):
                self.procs.append(ServeProcess(config(policy), url, cell, metrics=False))
            for p in self.procs:
                p.wait_listening(120)
        except BaseException:
            self.close()
            raise
        self.ports = [p.port for p in self.procs]

    def load(self, seconds: float, cpu: int, memory_mb: int,
             meter: Callable[[], float]) -> tuple[int, int, float, float]:
        """One load process per replica, all released together.  Returns
        (schedules, refusals, wall seconds from the release to the last finish,
        increase of ``meter()`` over that same window)."""
        ctx = mp.get_context("spawn")
        go = ctx.Event()
        conns: list[Connection] = []
        procs = []
        try:
            for port in self.ports:
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_load, args=(port, cpu, memory_mb, seconds, child, go),
                                daemon=True)
                p.start()
                child.close()
                conns.append(parent)
                procs.append(p)
            for c in conns:
                expect(c, "ready", "gRPC load", 180)
            m0 = meter()
            start = time.perf_counter()
            go.set()
            results = [expect(c, "done", "gRPC load", 180) for c in conns]
            wall = time.perf_counter() - start
            metered = meter() - m0
        finally:
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.terminate()
                    p.join()
            for c in conns:
                c.close()
        return sum(r[0] for r in results), sum(r[1] for r in results), wall, metered

    def close(self) -> None:
        for p in self.procs:
            p.close()

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


