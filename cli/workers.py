"""``schedctl serve --workers N``: N replica processes on one gRPC port.

Replicas hold no state of their own, so N workers are N replicas that share
a port: each binds it with ``SO_REUSEPORT`` and the kernel spreads incoming
connections over them (a connection, and every RPC on it, stays with one
worker).  The parent process serves nothing itself; it

- checks that nothing listens on the port yet (with ``SO_REUSEPORT`` a
  second, unrelated server would otherwise join silently) and, for port 0,
  picks the port every worker then binds;
- starts the workers (spawned: gRPC does not survive a fork) and waits
  until each serves, or stops them all and exits 1 with the first one's
  reason when one cannot start (a policy conflict, a taken metrics port);
- forwards SIGTERM / SIGINT to every worker, each of which drains its own
  in-flight calls (``drain_timeout``), and exits 0 once all have;
- starts a worker again that died while serving (its connections' clients
  reconnect to the port and land on a live worker meanwhile).

Worker ``i`` (from 0) serves ``/metrics`` on the metrics port + ``i``: each is
its own scrape target (its own RPC counters; the cell-wide gauges are the same
in each).  gRPC health is per worker: a check lands on whichever worker its
connection went to, and each says whether it can write to Redis.  A worker
whose parent is gone (killed with -9) stops by itself: it watches the pipe
to the parent, which closes then.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import socket
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from types import FrameType
from typing import Any

from scheduler.server.config import Settings
from scheduler.server.loops import Loop, choose

log = logging.getLogger("scheduler.serve")

#: how long a worker may take to start (imports, Redis, the cell's policy)
START_TIMEOUT_S = 120.0
#: a worker that dies while serving is started again after this pause
RESTART_DELAY_S = 1.0


class WorkersError(Exception):
    """``--workers`` cannot run with these settings."""


def _split(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def check(settings: Settings, workers: int) -> None:
    """What ``--workers N`` (N > 1) needs, checked before anything starts."""
    if settings.redis_url is None:
        raise WorkersError(
            "--workers needs a Redis (scheduler.redis_addr or --redis): the "
            "embedded store lives inside one process, so workers would not "
            "share it"
        )
    if settings.metrics_listen:
        _, port = _split(settings.metrics_listen)
        if port and port + workers - 1 > 65535:
            raise WorkersError(
                f"--workers {workers}: worker {workers - 1} would serve /metrics "
                f"on port {port + workers - 1}, past 65535"
            )


def _reserve(listen: str) -> tuple[socket.socket, int]:
    """Check that nothing listens on ``listen`` and hold its port (a bound,
    not listening, SO_REUSEPORT socket: workers can bind beside it, no
    connection goes to it).  Port 0 picks a free port."""
    host, port = _split(listen)
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as e:
        raise WorkersError(f"gRPC cannot listen on {listen}: {e}") from None

    def bound(reuse_port: bool, at: Any) -> socket.socket:
        s = socket.socket(family, kind, proto)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no conflict
            if reuse_port:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6 and host in ("", "::"):
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # as gRPC binds [::]
            s.bind(at)
        except OSError:
            s.close()
            raise
        return s

    try:
        # without SO_REUSEPORT: fails on any listener there, also a SO_REUSEPORT one
        probe = bound(False, address)
    except OSError as e:
        raise WorkersError(f"gRPC cannot listen on {listen}: {e.strerror or e}") from None
    chosen = int(probe.getsockname()[1])
    probe.close()
    try:
        holder = bound(True, (address[0], chosen, *address[2:]))
    except OSError as e:
        raise WorkersError(f"gRPC cannot listen on {listen}: {e.strerror or e}") from None
    return holder, chosen


def _metrics_for(settings: Settings, index: int) -> str | None:
    if not settings.metrics_listen:
        return None
    host, port = settings.metrics_listen.rpartition(":")[0], _split(settings.metrics_listen)[1]
    return f"{host}:{port + index if port else 0}"


def _worker(
    settings: Settings, overwrite_policy: bool, index: int, loop_name: str, conn: Connection
) -> None:
    """One worker process: a replica on the shared port."""
    from scheduler.server import logs
    from scheduler.server.replica import Replica

    from .serve import StartupError, run_replica

    logs.from_settings(settings, worker=index)
    # SIGINT of a terminal reaches every process of the group; the parent
    # forwards a SIGTERM anyway, so the first of them starts the drain.

    def serving(replica: Replica) -> None:
        conn.send(("serving", (replica.port, replica.metrics_port)))

    try:
        choose(loop_name).run(
            run_replica(
                settings,
                overwrite_policy,
                worker=True,
                serving=serving,
                stop_when_readable=conn.fileno(),
            )
        )
    except StartupError as e:
        with contextlib.suppress(OSError):
            conn.send(("failed", str(e)))
        raise SystemExit(1) from None


@dataclass
class _Running:
    index: int
    process: Any  # multiprocessing's SpawnProcess
    conn: Connection
    serving: bool = False


class _Supervisor:
    def __init__(self, settings: Settings, overwrite_policy: bool, loop: Loop) -> None:
        self.settings = settings
        self.overwrite_policy = overwrite_policy
        self.loop = loop
        self.ctx = mp.get_context("spawn")
        self.workers: dict[int, _Running] = {}
        self.stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def start(self, index: int) -> _Running:
        parent, child = self.ctx.Pipe()
        worker_settings = replace(self.settings, metrics_listen=_metrics_for(self.settings, index))
        p = self.ctx.Process(
            target=_worker,
            name=f"schedctl-worker-{index}",
            args=(worker_settings, self.overwrite_policy, index, self.loop.name, child),
        )
        p.start()
        child.close()
        running = self.workers[index] = _Running(index, p, parent)
        return running

    def _message(self, w: _Running) -> tuple[str, Any] | None:
        try:
            kind, payload = w.conn.recv()
        except (EOFError, OSError):
            return None
        return str(kind), payload

    def wait_serving(self) -> str | None:
        """Until every worker serves; the first failure's reason otherwise."""
        deadline = time.monotonic() + START_TIMEOUT_S
        waiting = {w.conn: w for w in self.workers.values()}
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                return (
                    f"workers {sorted(w.index for w in waiting.values())} did not start "
                    f"within {START_TIMEOUT_S:g}s"
                )
            ready = wait([*waiting, self._wake_r], timeout=left)
            if self.stopping:
                return None
            for c in ready:
                w = waiting.pop(c)  # type: ignore[call-overload]
                msg = self._message(w)
                if msg is None or msg[0] != "serving":
                    w.process.join(5)
                    return (
                        msg[1]
                        if msg is not None
                        else f"worker {w.index} exited ({w.process.exitcode}) before it served"
                    )
                w.serving = True
                port, metrics_port = msg[1]
                log.info(
                    "worker %d (pid %d) serving on port %d%s",
                    w.index,
                    w.process.pid,
                    port,
                    f"; /metrics on port {metrics_port}" if metrics_port else "",
                )
        return None

    def watch(self) -> None:
        """Until a signal: start a worker again when it dies while serving."""
        while not self.stopping:
            by_sentinel = {w.process.sentinel: w for w in self.workers.values()}
            ready = wait([*by_sentinel, self._wake_r])
            if self.stopping:
                return
            for s in ready:
                w = by_sentinel.get(s)
                if w is None:
                    continue
                w.process.join()
                w.conn.close()
                log.error(
                    "worker %d (pid %d) exited with %s while serving; starting it again in %.0fs",
                    w.index,
                    w.process.pid,
                    w.process.exitcode,
                    RESTART_DELAY_S,
                )
                time.sleep(RESTART_DELAY_S)
                if self.stopping:
                    return
                self.start(w.index)
                reason = self.wait_serving_one(self.workers[w.index])
                if reason:
                    log.error("worker %d could not start again: %s", w.index, reason)

    def wait_serving_one(self, w: _Running) -> str | None:
        ready = wait([w.conn, self._wake_r], timeout=START_TIMEOUT_S)
        if w.conn not in ready:
            return None if self.stopping else "it did not start in time"
        msg = self._message(w)
        if msg is None or msg[0] != "serving":
            w.process.join(5)
            return msg[1] if msg is not None else f"it exited ({w.process.exitcode})"
        w.serving = True
        log.info("worker %d (pid %d) serving again", w.index, w.process.pid)
        return None

    def stop(self) -> None:
        """SIGTERM to every worker; each drains; kill one that outlives it by far."""
        for w in self.workers.values():
            if w.process.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(w.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.settings.drain_timeout_s + 10
        for w in self.workers.values():
            w.process.join(max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                log.error("worker %d did not stop in time: killing it", w.index)
                w.process.kill()
                w.process.join()
            w.conn.close()

    def close(self) -> None:
        os.close(self._wake_r)
        os.close(self._wake_w)


def supervise(settings: Settings, overwrite_policy: bool, workers: int, loop: Loop) -> int:
    """Run ``workers`` replica processes on one port until SIGTERM / SIGINT;
    the exit status."""
    from .serve import StartupError

    holder, port = _reserve(settings.grpc_listen)
    host = settings.grpc_listen.rpartition(":")[0]
    sup = _Supervisor(replace(settings, grpc_listen=f"{host}:{port}"), overwrite_policy, loop)
    previous = {sig: signal.signal(sig, sup._signalled) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with holder:
            for i in range(workers):
                sup.start(i)
            failed = sup.wait_serving()
        if failed is not None:
            sup.stop()
            raise StartupError(failed)
        if not sup.stopping:
            log.info(
                "%d workers serving scheduler.v1.Scheduler on port %d (pid %d supervises)",
                workers,
                port,
                os.getpid(),
            )
            sup.watch()
        log.info(
            "stopping: each worker drains its in-flight calls (up to %.1fs)",
            settings.drain_timeout_s,
        )
        sup.stop()
        log.info("stopped")
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sup.close()
