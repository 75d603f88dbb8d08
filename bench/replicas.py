"""Replicas as real processes: each its own interpreter, its own Redis
connection, no shared memory with the driver but a pipe for jobs.

A :class:`ReplicaPool` starts its processes once and runs jobs on the first
``k`` of them, all released at the same instant, so one pool serves every
replica count of a scenario.  A job names the cell it works in; a replica
keeps one :class:`~scheduler.Scheduler` per cell on its single connection,
exactly like a stateless replica that could serve any cell.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from scheduler import NoNodesAvailable, Request, Scheduler
from scheduler.client import sync_client


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


class ReplicaPool:
    """``size`` replica processes against ``url``."""

    def __init__(self, url: str, size: int) -> None:
        # fork: a replica is up in milliseconds instead of re-importing everything;
        # each one opens its own connection after the fork.
        ctx = (mp.get_context("fork") if "fork" in mp.get_all_start_methods()
               else mp.get_context("spawn"))
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
        conns = self.conns[:len(jobs)]
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

    def __enter__(self) -> ReplicaPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
