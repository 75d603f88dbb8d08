"""The gRPC path of ``throughput``: replicas as ``schedctl serve`` processes,
load from separate processes through the generated ``scheduler.v1`` stubs.

Each replica gets a config file that says the same policy the benchmark
stored in the cell, so a replica that disagreed would refuse to start (the
product's own check).  Load processes are spawned, not forked, and this
module never opens a gRPC channel in the driver: gRPC's core does not
survive a fork of a process that has used it.

The floor the replica's CPU per RPC is judged against is a bare
``grpc.aio`` server that answers every Schedule (and every Heartbeat) with a constant
(:func:`bare_main`, run as ``python -m bench.grpc_path bare PORT LOOP``): what
gRPC in Python costs before any work of ours.  A server's CPU is read from
``/proc`` (user + system time of the process and its children), so it counts
every thread gRPC runs, and the workers of ``--workers``.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from scheduler import Policy
from scheduler.server.loops import LoopUnavailable, choose
from scheduler.testing.redis_server import free_port
from scheduler.testing.replicas import (
    SCHEDCTL,
    ServeProcess,
    close_all,
    expect,
    family,
    sees_children,
)

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def unavailable() -> str | None:
    """Why the gRPC path cannot run here, or None when it can (asked once a process)."""
    try:
        import scheduler.grpc.scheduler_pb2_grpc  # noqa: F401
    except ImportError as e:
        return f"generated stubs scheduler/grpc/scheduler_pb2_grpc.py cannot be imported ({e})"
    try:
        r = subprocess.run(
            [*SCHEDCTL, "serve", "--help"], capture_output=True, text=True, timeout=60, check=False
        )
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
            "default_request": {
                "cpu": policy.default_request.cpu,
                "memory_mb": policy.default_request.memory_mb,
            },
        },
    }


def _load(port: int, cpu: int, memory_mb: int, seconds: float, conn: Connection, go: Any) -> None:
    """One gateway-like load process: Schedule RPCs back to back on one channel."""
    import grpc

    from scheduler.grpc import scheduler_pb2 as pb
    from scheduler.grpc import scheduler_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=60)
        stub = pb_grpc.SchedulerStub(channel)
        req = pb.ScheduleRequest(
            hint=pb.ScheduleRequestHint(
                new_cold_sandbox=pb.NewColdSandboxHint(cpu_count=cpu, memory_mb=memory_mb)
            )
        )
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

    def load(
        self, seconds: float, cpu: int, memory_mb: int, meter: Callable[[], float]
    ) -> tuple[int, int, float, float]:
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
                p = ctx.Process(
                    target=_load, args=(port, cpu, memory_mb, seconds, child, go), daemon=True
                )
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
        close_all(self.procs)

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------
# CPU per RPC: a server process, many calls in flight
# ---------------------------------------------------------------------------
def _stat_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its live
    descendants, every thread included (Linux ``/proc``)."""
    total = 0.0
    for p in family(pid):
        try:
            total += _stat_cpu(p)
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
    return total


def cpu_unmeasurable() -> str | None:
    """Why process CPU cannot be read here (None: it can)."""
    if not sees_children():
        return "needs Linux /proc (with /proc/PID/task/TID/children)"
    return None


#: what a bare server does per Schedule before it answers: nothing (the
#: floor), one Redis round trip, or the library's Schedule: layers of the replica
LAYERS = ("constant", "redis", "library")
#: the RPCs the load sends (``schedule``: creations; ``heartbeat``: steady
#: heartbeats of the fleet's nodes, each node in turn)
RPCS = ("schedule", "heartbeat")


#: the CPU config every node of a Heartbeat load reports (as bench heartbeats:
#: a cluster where some member reports none costs Redis O(cluster) per
#: heartbeat, issue #31, which is Redis' work, not the replica's)
CPU_CONFIG = '{"kvm_capabilities": ["171", "56"]}'


def heartbeat_requests(nodes: int, seed: int) -> list[tuple[Any, tuple[tuple[str, str], ...]]]:
    """The Heartbeat requests (and their ``x-node-endpoint`` metadata) of the
    fleet ``throughput`` builds with ``seed``: each node as it stands, with
    CPU_CONFIG."""
    import random

    import msgspec

    from bench.fleet import mixed_fleet
    from scheduler.domain.records import MachineInfo
    from scheduler.server.service import ENDPOINT_METADATA, heartbeat_request

    fleet = mixed_fleet(nodes, random.Random(seed), load=(0.3, 0.6))
    out = []
    for node in fleet:
        hb = msgspec.structs.replace(
            node.heartbeat(), machine_info=MachineInfo(cpu_config_json=CPU_CONFIG)
        )
        out.append((heartbeat_request(hb), ((ENDPOINT_METADATA, hb.endpoint),)))
    return out


def bare_main(port: int, loop: str, layer: str = "constant", url: str = "", cell: str = "") -> None:
    """A minimal ``grpc.aio`` server of ``Schedule`` on ``127.0.0.1:port``
    until SIGTERM.  ``constant`` answers a constant: the floor of what one
    gRPC call costs in Python.  ``redis`` first sends one ``PING`` the way
    the replica sends its script calls (``url``: over the lean connection of
    scheduler/store/wire.py, through redis-py until it is up); ``library`` places through
    ``AsyncScheduler.schedule`` in ``cell`` (coalescing on) and answers with
    the node: the replica without its servicer, metrics and deadline."""
    import grpc

    from scheduler.client.aio import AsyncScheduler
    from scheduler.domain.records import Request
    from scheduler.grpc import scheduler_pb2 as pb
    from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
    from scheduler.store.connection import async_client
    from scheduler.store.wire import ScriptWire, WireDown

    reply = pb.ScheduleResponse(node=pb.Node(node_id="node-0001", endpoint="10.0.0.1:5000"))
    beat_reply = pb.HeartbeatResponse()

    async def main() -> None:
        client = async_client(url, caller_bounds=True) if layer != "constant" else None
        sched = AsyncScheduler(client, cell) if layer == "library" else None
        wire = ScriptWire(client) if layer == "redis" else None
        request = Request.cold(1, 1024)

        class Bare(pb_grpc.SchedulerServicer):  # type: ignore[misc]
            async def Schedule(self, req: Any, context: Any) -> Any:
                if sched is not None:
                    placed = await sched.schedule(request)
                    return pb.ScheduleResponse(
                        node=pb.Node(node_id=placed.node_id, endpoint=placed.endpoint)
                    )
                if wire is not None:
                    try:
                        await wire.call(["PING"])
                    except WireDown:  # (not connected yet)
                        assert client is not None
                        await client.ping()
                return reply

            async def Heartbeat(self, req: Any, context: Any) -> Any:
                return beat_reply  # (the floor of a Heartbeat: every layer answers a constant)

        server = grpc.aio.server()
        pb_grpc.add_SchedulerServicer_to_server(Bare(), server)
        if server.add_insecure_port(f"127.0.0.1:{port}") == 0:
            raise SystemExit(f"cannot listen on {port}")
        await server.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop(0)
        if sched is not None:
            await sched.close()
        elif client is not None:
            if wire is not None:
                await wire.close()
            await client.aclose()

    choose(loop).run(main())


class BareServer:
    """``bare_main`` in its own process."""

    def __init__(self, loop: str, layer: str = "constant", url: str = "", cell: str = "") -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.grpc_path",
                "bare",
                str(self.port),
                loop,
                layer,
                url,
                cell,
            ],
            cwd=ROOT,
        )
        self.pid = self.proc.pid

    def wait_listening(self, timeout: float = 60) -> BareServer:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bare gRPC server exited ({self.proc.returncode})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("bare gRPC server did not listen") from None
                time.sleep(0.05)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> BareServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _load_concurrent(
    port: int,
    cpu: int,
    memory_mb: int,
    seconds: float,
    concurrency: int,
    channels: int,
    conn: Connection,
    go: Any,
    rate: float = 0.0,
    rpc: str = "schedule",
    nodes: int = 0,
    seed: int = 0,
) -> None:
    """A gateway-like load process: ``concurrency`` Schedule RPCs in flight at
    all times over ``channels`` connections (each its own TCP connection, so
    the kernel can spread them over the workers of one port).  ``rpc``
    "heartbeat": the fleet's nodes (``nodes``, ``seed``) heartbeat instead,
    one after the other, each once before the load (so that the measured ones
    are steady: what most heartbeats of a fleet are)."""
    import grpc

    from scheduler.grpc import scheduler_pb2 as pb
    from scheduler.grpc import scheduler_pb2_grpc as pb_grpc

    async def main() -> tuple[int, int]:
        req = pb.ScheduleRequest(
            hint=pb.ScheduleRequestHint(
                new_cold_sandbox=pb.NewColdSandboxHint(cpu_count=cpu, memory_mb=memory_mb)
            )
        )
        opened = [
            grpc.aio.insecure_channel(
                f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
            )
            for _ in range(channels)
        ]
        beats = heartbeat_requests(nodes, seed) if rpc == "heartbeat" else []
        turn = 0
        try:
            stubs = [pb_grpc.SchedulerStub(ch) for ch in opened]

            async def one(stub: Any) -> None:
                nonlocal turn
                if beats:
                    beat, metadata = beats[turn % len(beats)]
                    turn += 1
                    await stub.Heartbeat(beat, metadata=metadata, timeout=60)
                else:
                    await stub.Schedule(req, timeout=60)

            for stub in stubs:
                await one(stub)  # warm: connection set-up

            async def first(stub: Any) -> None:  # and every node's first heartbeat
                while turn < len(beats):
                    await one(stub)

            # (one at a time: each first one brings its node's CPU config,
            # which costs Redis O(cluster) while members lack one, issue #31;
            # four in flight met the replica's 2 s Redis deadline on a busy host)
            await first(stubs[0])
            conn.send(("ready", None))
            await asyncio.get_running_loop().run_in_executor(None, go.wait)
            n = refused = 0
            deadline = time.perf_counter() + seconds
            next_at = time.perf_counter()

            async def caller(stub: Any) -> None:
                nonlocal n, refused, next_at
                while time.perf_counter() < deadline:
                    if rate:  # paced: calls start 1/rate apart (at most `concurrency` in flight)
                        now = time.perf_counter()
                        at, next_at = max(next_at, now), max(next_at, now) + 1 / rate
                        if at > now:
                            await asyncio.sleep(at - now)
                    try:
                        await one(stub)
                        n += 1
                    except grpc.aio.AioRpcError as e:
                        if e.code() != grpc.StatusCode.UNAVAILABLE or "no nodes" not in str(
                            e.details()
                        ):
                            raise
                        refused += 1

            await asyncio.gather(*(caller(stubs[i % channels]) for i in range(concurrency)))
            return n, refused
        finally:
            for ch in opened:
                await ch.close()

    try:
        try:
            loop = choose("auto")  # the cheapest load: it shares the machine with the server
        except LoopUnavailable:
            loop = choose("asyncio")
        conn.send(("done", loop.run(main())))
    except Exception as e:  # reported to the driver, which raises it
        conn.send(("error", f"{type(e).__name__}: {e}"))


@dataclass(frozen=True)
class Measured:
    calls: int
    refused: int
    wall: float
    server_cpu: float
    redis_cpu: float


def measure(
    port: int,
    server_pid: int,
    *,
    seconds: float,
    concurrency: int,
    channels: int,
    cpu: int,
    memory_mb: int,
    redis_cpu: Callable[[], float],
    rate: float = 0.0,
    rpc: str = "schedule",
    nodes: int = 0,
    seed: int = 0,
    started: Callable[[], None] | None = None,
) -> Measured:
    """Load ``port`` with ``concurrency`` calls in flight for ``seconds``
    (``rate`` > 0: paced to that many calls a second); the server's and
    Redis' CPU over the same window."""
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    parent, child = ctx.Pipe()
    p = ctx.Process(
        target=_load_concurrent,
        args=(
            port,
            cpu,
            memory_mb,
            seconds,
            concurrency,
            channels,
            child,
            go,
            rate,
            rpc,
            nodes,
            seed,
        ),
        daemon=True,
    )
    p.start()
    child.close()
    try:
        expect(parent, "ready", "gRPC load", 180)
        c0, r0 = process_cpu(server_pid), redis_cpu()
        start = time.perf_counter()
        go.set()
        if started is not None:
            started()  # (the load is warm: what a profiler should see)
        calls, refused = expect(parent, "done", "gRPC load", 180)
        wall = time.perf_counter() - start
        server, redis_used = process_cpu(server_pid) - c0, redis_cpu() - r0
    finally:
        p.join(30)
        if p.is_alive():
            p.terminate()
            p.join()
        parent.close()
    return Measured(calls, refused, wall, server, redis_used)


def wait_workers(proc: ServeProcess, workers: int, timeout: float = 120) -> None:
    """Until every worker of ``schedctl serve --workers`` serves (its log says so)."""
    deadline = time.monotonic() + timeout
    while f"{workers} workers serving" not in proc.log():
        if proc.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"schedctl serve --workers {workers} did not serve:\n{proc.log()}")
        time.sleep(0.05)


def serve_args(loop: str, workers: int, extra: Sequence[str] = ()) -> tuple[str, ...]:
    # (info: wait_workers reads the supervisor's "N workers serving")
    logs = ("--log-level", "info") if workers > 1 else ()
    return ("--loop", loop, "--workers", str(workers), *logs, *extra)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 7) or sys.argv[1] != "bare":
        raise SystemExit("usage: python -m bench.grpc_path bare PORT LOOP [LAYER URL CELL]")
    bare_main(int(sys.argv[2]), *sys.argv[3:])
