"""Replicas for tests: in-process (a thread running the asyncio server) and
real ``schedctl serve`` subprocesses (free ports, bounded start, always torn down)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import msgspec
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scheduler.client import AsyncScheduler
from scheduler.config import Overrides, Settings, load
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.policy import Policy
from scheduler.replica import Replica
from tests.redis_server import free_port


def settings_for(policy: Policy | None = None, cell: str = "test",
                 nodes: list[tuple[str, str]] | None = None, **extra: Any) -> Settings:
    base = load(None, env={}, flags=Overrides(grpc_listen="127.0.0.1:0", metrics_listen=""))
    policy = policy or Policy()
    if nodes:
        policy = msgspec.structs.replace(policy, static_nodes=True)
    return replace(base, policy=policy, cell=cell, nodes=nodes or [],
                   discovery="static" if nodes else "heartbeat", **extra)


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

    def __init__(self, settings: Settings, make_client: Callable[[], Any],
                 url: str | None = None, loop: LoopThread | None = None) -> None:
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
        sched = AsyncScheduler(self.make_client(), self.settings.cell, self.settings.prefix,
                               self.url)
        self.replica = Replica(self.settings, sched, overwrite_policy=True,
                               monitor_interval_s=0.1, cell_stats_interval_s=None)
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
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""),
                                                 timeout=2)
        return int(r.status)


def hb_request(node_id: str, sid: str = "i1", cpu: int = 32, mem_gib: int = 64,
               cluster: str = "c1", roster: list[str] | None = None, count: int | None = None,
               **snap: Any) -> pb.HeartbeatRequest:
    roster = roster or []
    return pb.HeartbeatRequest(
        node_id=node_id, service_instance_id=sid, cluster_id=cluster,
        snapshot=pb.NodeSnapshot(status=pb.NODE_STATUS_READY, cpu_count=cpu,
                                 memory_total_bytes=mem_gib << 30,
                                 sandbox_count=len(roster) if count is None else count, **snap),
        sandbox_ids=roster)


def endpoint_md(endpoint: str) -> tuple[tuple[str, str], ...]:
    return (("x-node-endpoint", endpoint),)


def cold(cpu: int = 2, memory_mb: int = 4096) -> pb.ScheduleRequest:
    return pb.ScheduleRequest(hint=pb.ScheduleRequestHint(
        new_cold_sandbox=pb.NewColdSandboxHint(cpu_count=cpu, memory_mb=memory_mb)))


def snapshot_keys(client: Any) -> dict[bytes, Any]:
    """Every key and its content: to show that a refused request wrote nothing."""
    out: dict[bytes, Any] = {}
    for key in sorted(client.keys("*")):
        kind = client.type(key)
        if kind == b"hash":
            out[key] = client.hgetall(key)
        elif kind == b"set":
            out[key] = sorted(client.smembers(key))
        elif kind == b"zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"string":
            out[key] = client.get(key)
        else:
            out[key] = kind
    return out


# ---------------------------------------------------------------------------
# Real processes
# ---------------------------------------------------------------------------
class ServeProcess:
    """One ``schedctl serve`` subprocess on free ports."""

    def __init__(self, config: dict[str, Any], redis_url: str | None, cell: str = "e2e",
                 extra_args: tuple[str, ...] = ()) -> None:
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
        args = ["--config", str(self.config_path), "--grpc-listen", f"127.0.0.1:{self.port}",
                "--metrics-listen", f"127.0.0.1:{self.metrics_port}", "--cell", self.cell,
                *self.extra_args]
        if self.redis_url:
            args += ["--redis", self.redis_url]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from scheduler.cli.main import main; main()", "serve", *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.address = f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_serving(self, timeout: float = 20, port_retries: int = 3) -> ServeProcess:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address) as ch:
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
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return self
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica did not become SERVING:\n{self.log()}")
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


def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
