"""Replicas for tests and benchmarks, the one harness:

* :class:`ThreadedReplica`: a gRPC replica in this process (an event loop in
  a background thread);
* :class:`ServeProcess`: a real ``schedctl serve`` subprocess on free ports
  (bounded start, always torn down);
* :class:`LibraryReplicas`: replicas that use the library directly, each an
  OS process with its own connection, jobs released at one instant.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
import msgspec
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scheduler.client.aio import AsyncScheduler
from scheduler.client.sync import Scheduler
from scheduler.domain.errors import NoNodesAvailable
from scheduler.domain.policy import Policy
from scheduler.domain.records import Request
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.server.config import Overrides, Settings, load
from scheduler.server.replica import Replica
from scheduler.store.connection import sync_client
from scheduler.testing.redis_server import free_port

#: ``schedctl`` in a fresh interpreter of this one
SCHEDCTL = [sys.executable, "-c", "from scheduler.cli.main import main; main()"]

#: options for a channel that polls a server still starting: gRPC's default
#: reconnect backoff (1 s, then x1.6 with jitter) would see a port that began
#: listening at 1.1 s only at about 2.6 s; these retry every 50-100 ms
QUICK_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 100),
]


def settings_for(
    policy: Policy | None = None,
    cell: str = "test",
    nodes: list[tuple[str, str]] | None = None,
    **extra: Any,
) -> Settings:
    base = load(None, env={}, flags=Overrides(grpc_listen="127.0.0.1:0", metrics_listen=""))
    policy = policy or Policy()
    if nodes:
        policy = msgspec.structs.replace(policy, static_nodes=True)
    return replace(
        base,
        policy=policy,
        cell=cell,
        nodes=nodes or [],
        discovery="static" if nodes else "heartbeat",
        **extra,
    )


class LoopThread:
    """An event loop in a background thread.  Replicas sharing one fakeredis
    server must share one loop: fakeredis runs every script of a server in
    one Lua runtime, which must not be entered from two threads at once."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class ThreadedReplica:
    """A Replica served by an event loop in a background thread.  Its monitor
    only pings Redis (cell metrics are refreshed by the tests that read them)."""

    def __init__(
        self,
        settings: Settings,
        make_client: Callable[[], Any],
        url: str | None = None,
        loop: LoopThread | None = None,
    ) -> None:
        self.settings = settings
        self.make_client = make_client
        self.url = url
        self.own_loop = loop is None
        self.loop_thread = loop or LoopThread()
        self.loop = self.loop_thread.loop
        self.replica: Replica | None = None
        self.channel: grpc.Channel | None = None

    def __enter__(self) -> ThreadedReplica:
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(15)
        assert self.replica is not None
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.replica.port}")
        return self

    async def _start(self) -> None:
        sched = AsyncScheduler(
            self.make_client(), self.settings.cell, self.settings.prefix, self.url
        )
        self.replica = Replica(
            self.settings,
            sched,
            overwrite_policy=True,
            monitor_interval_s=0.1,
            cell_stats_interval_s=None,
        )
        await self.replica.prepare_cell()
        await self.replica.start()

    def call(self, coro: Any, timeout: float = 15) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def stub(self) -> pb_grpc.SchedulerStub:
        assert self.channel is not None
        return pb_grpc.SchedulerStub(self.channel)

    def __exit__(self, *exc: object) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.replica is not None:
            replica = self.replica
            self.call(replica.stop(grace_s=1))
            self.call(replica.sched.close())
        if self.own_loop:
            self.loop_thread.close()


def health_status(address: str) -> int:
    """What the replica's gRPC health service says for the whole server."""
    with grpc.insecure_channel(address) as ch:
        r = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=2
        )
        return int(r.status)


# ---------------------------------------------------------------------------
# Real processes
# ---------------------------------------------------------------------------
def family(pid: int) -> list[int]:
    """``pid`` and its live descendants, every thread's children (Linux's
    /proc/PID/task/TID/children; :func:`sees_children` says whether it is
    there)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue  # (exited meanwhile)
        for task in tasks:
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return out


def sees_children() -> bool:
    """Does this machine's /proc list each process's children (:func:`family`)?"""
    return Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists()


def _listening_tables() -> list[Path]:
    return [Path(f"/proc/net/{name}") for name in ("tcp", "tcp6")]


def sees_listeners() -> bool:
    """Can :func:`listens` tell which process holds a port here (Linux's /proc)?"""
    return sees_children() and all(table.exists() for table in _listening_tables())


def listens(pid: int, port: int) -> bool:
    """Does process ``pid``, or one it started (``--workers``), hold the
    socket listening on TCP ``port`` (where :func:`sees_listeners`;
    elsewhere, assumed)?"""
    if not sees_listeners():
        return True
    inodes = set()
    for table in _listening_tables():
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            # (local address "hex-ip:hex-port", state 0A: LISTEN; inode the 10th)
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                inodes.add(f"socket:[{fields[9]}]")
    for member in family(pid):
        try:
            fds = list(Path(f"/proc/{member}/fd").iterdir())
        except OSError:  # (it exited)
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in inodes:
                    return True
            except OSError:
                continue
    return False


class ServeProcess:
    """One ``schedctl serve`` subprocess on free ports (``metrics``: also
    serve /metrics; ``env``: added to its environment; ``wait_serving`` or
    ``wait_listening`` until it is up)."""

    def __init__(
        self,
        config: dict[str, Any],
        redis_url: str | None,
        cell: str = "e2e",
        extra_args: tuple[str, ...] = (),
        metrics: bool = True,
        env: dict[str, str] | None = None,
        before: tuple[str, ...] = (),
    ) -> None:
        self.metrics = metrics
        #: schedctl's own options, before the command (``schedctl --redis URL serve``)
        self.before = before
        self.extra_env = env or {}
        self.dir = Path(tempfile.mkdtemp(prefix="sched-replica-"))
        self.config_path = self.dir / "config.json"
        self.config_path.write_text(json.dumps(config))
        self.log_path = self.dir / "replica.log"
        self.redis_url = redis_url
        self.cell = cell
        self.extra_args = extra_args
        self._signalled = False
        self._spawn()

    def _spawn(self) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        metrics = f"127.0.0.1:{self.metrics_port}" if self.metrics else ""
        args = [
            "--config",
            str(self.config_path),
            "--grpc-listen",
            f"127.0.0.1:{self.port}",
            "--metrics-listen",
            metrics,
            "--cell",
            self.cell,
            *self.extra_args,
        ]
        if self.redis_url:
            args += ["--redis", self.redis_url]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
        env.update(self.extra_env)
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [*SCHEDCTL, *self.before, "serve", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.address = f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_serving(self, timeout: float = 20, port_retries: int = 3) -> ServeProcess:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address, options=QUICK_RECONNECT) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                if self.proc.poll() is not None:
                    if port_retries > 0 and "Address already in use" in self.log():
                        # another process took a free port between its choice and our bind
                        self._log.close()
                        self._spawn()
                        return self.wait_serving(timeout, port_retries - 1)
                    raise RuntimeError(f"replica exited with {self.proc.returncode}:\n{self.log()}")
                try:
                    r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=0.5)
                    # (SERVING from this process: a process that took its port
                    # between its choice and its bind answers too, and this one
                    # then exits on the bind, for the retry above)
                    if r.status == health_pb2.HealthCheckResponse.SERVING and listens(
                        self.proc.pid, self.port
                    ):
                        return self
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica did not become SERVING:\n{self.log()}")
                time.sleep(0.05)

    def wait_listening(self, timeout: float = 120) -> ServeProcess:
        """Until the gRPC port takes connections.  Opens no gRPC channel: a
        driver that forks later (LibraryReplicas) must not have used gRPC."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"schedctl serve exited ({self.proc.returncode}): {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"schedctl serve did not listen on {self.port}:\n{self.log()}"
                    ) from None
                time.sleep(0.05)

    def signal_stop(self) -> None:
        """One SIGTERM (a second one, after the drain, would kill it outright)."""
        if self.proc.poll() is None and not self._signalled:
            self._signalled = True
            self.proc.send_signal(signal.SIGTERM)

    def terminate(self, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.signal_stop()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def close(self, timeout: float = 15) -> None:
        """Terminate it and remove its files (config, log)."""
        self.terminate(timeout)
        shutil.rmtree(self.dir, ignore_errors=True)


def close_all(procs: Iterable[ServeProcess], timeout: float = 15) -> None:
    """Close them all, each drain under way beside the others (one SIGTERM
    each first): three replicas stop in the time of one."""
    procs = list(procs)
    for p in procs:
        p.signal_stop()
    for p in procs:
        p.close(timeout)


# ---------------------------------------------------------------------------
# Library replicas: processes that call the library, jobs released together
# ---------------------------------------------------------------------------
def expect(conn: Connection, kind: str, who: str, timeout: float) -> Any:
    """The next message of a worker process, which must be ``kind``."""
    if not conn.poll(timeout):
        raise RuntimeError(f"a {who} process did not answer within {timeout:g} s")
    got, payload = conn.recv()
    if got == "error":
        raise RuntimeError(f"{who} process failed: {payload}")
    if got != kind:
        raise RuntimeError(f"{who} protocol: expected {kind}, got {got}")
    return payload


@dataclass(frozen=True)
class Creates:
    """Place each (sandbox id, cpu, memory MiB) and, when placed, record the
    assignment the way a gateway does after the node answered the create."""

    cell: str
    items: Sequence[tuple[str, int, int]]
    strategy: str | None = None


@dataclass(frozen=True)
class Outcome:
    sandbox_id: str
    node_id: str | None
    refusal: str | None = None


@dataclass(frozen=True)
class Stream:
    """Schedule ``cpu`` / ``memory_mb`` creations back to back for ``seconds``."""

    cell: str
    seconds: float
    cpu: int
    memory_mb: int


@dataclass(frozen=True)
class StreamResult:
    schedules: int
    refused: int
    seconds: float


Job = Creates | Stream


@dataclass
class _Replica:
    client: Any
    cells: dict[str, Scheduler] = field(default_factory=dict)

    def scheduler(self, cell: str) -> Scheduler:
        s = self.cells.get(cell)
        if s is None:
            s = self.cells[cell] = Scheduler(self.client, cell=cell)
        return s

    def run(self, job: Job) -> Any:
        s = self.scheduler(job.cell)
        if isinstance(job, Creates):
            out = []
            for sandbox_id, cpu, memory_mb in job.items:
                try:
                    p = s.schedule(Request.cold(cpu, memory_mb), strategy=job.strategy)
                except NoNodesAvailable as e:
                    out.append(Outcome(sandbox_id, None, e.message))
                    continue
                s.assign(sandbox_id, p.node_id, p.endpoint, p.reservation_id)
                out.append(Outcome(sandbox_id, p.node_id))
            return out
        req = Request.cold(job.cpu, job.memory_mb)
        n = refused = 0
        start = time.perf_counter()
        deadline = start + job.seconds
        while time.perf_counter() < deadline:
            try:
                s.schedule(req)
                n += 1
            except NoNodesAvailable:
                refused += 1
        return StreamResult(n, refused, time.perf_counter() - start)


def _main(url: str, conn: Connection, go: Any) -> None:
    random.seed()  # a forked child starts with its parent's state; `random` must differ
    replica = _Replica(sync_client(url))
    conn.send(("up", None))
    while True:
        job = conn.recv()
        if job is None:
            break
        conn.send(("ready", None))
        go.wait()
        try:
            conn.send(("done", replica.run(job)))
        except Exception as e:  # reported to the driver, which raises it
            conn.send(("error", f"{type(e).__name__}: {e}"))
    replica.client.close()


class LibraryReplicas:
    """``size`` replica processes against ``url``."""

    def __init__(self, url: str, size: int) -> None:
        # fork: a replica is up in milliseconds instead of re-importing everything;
        # each one opens its own connection after the fork.
        ctx = (
            mp.get_context("fork")
            if "fork" in mp.get_all_start_methods()
            else mp.get_context("spawn")
        )
        self.go = ctx.Event()
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for _ in range(size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_main, args=(url, child, self.go), daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        for c in self.conns:
            expect(c, "up", "replica", 120)

    @property
    def size(self) -> int:
        return len(self.procs)

    def run(self, jobs: Sequence[Job]) -> tuple[list[Any], float]:
        """Run ``jobs[i]`` on replica ``i``, all starting together.  Returns the
        results and the wall time from the common start to the last finish."""
        if len(jobs) > self.size:
            raise ValueError(f"{len(jobs)} jobs for {self.size} replicas")
        conns = self.conns[: len(jobs)]
        for conn, job in zip(conns, jobs, strict=True):
            conn.send(job)
        for conn in conns:
            expect(conn, "ready", "replica", 120)
        start = time.perf_counter()
        self.go.set()
        try:
            results = [expect(conn, "done", "replica", 120) for conn in conns]
        finally:
            self.go.clear()
        return results, time.perf_counter() - start

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):  # already gone
                conn.send(None)
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
                p.join()
        for conn in self.conns:
            conn.close()

    def __enter__(self) -> LibraryReplicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
