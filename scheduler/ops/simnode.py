"""A simulated runtime node: what it really runs, and the heartbeat it sends.

The one simulated node of the project: ``schedctl simulate``
(:mod:`scheduler.ops.simulate`), the benchmarks and the tests drive it, each
with its own transport (the library, pipelines, gRPC:
``scheduler.server.service.heartbeat_request`` turns its heartbeat into the wire
message).  A node is the truth the scheduler only sees through heartbeats:
its heartbeat may report a past :class:`Observed` state, which is how
heartbeats lag behind reality.  A sandbox may start for a while (listed in
the roster and counted as starting) before it runs, and end after a
lifetime.  Thread-safe: gateways and a heartbeat loop may share a node.

A node made with ``record_events`` also keeps the sandbox lifecycle events
its reporter would send (CREATE once a created sandbox is running, as the
reference runtime publishes it when the create returns; DELETE when a
sandbox ended), for a driver to take (:meth:`SimNode.take_events`) and
deliver, or lose, as the reporter's best-effort event stream does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from scheduler.domain.records import Heartbeat, NodeSnapshot


@dataclass(frozen=True)
class Sandbox:
    cpu: int
    memory_bytes: int
    #: starting until then (clock time), running after
    running_at: float
    #: gone at this time; None = it stays
    ends_at: float | None


@dataclass(frozen=True)
class Observed:
    """A node's numbers at one moment: what a heartbeat sent then would say."""

    sandboxes: tuple[str, ...]
    starting: int
    allocated_cpu: int
    allocated_memory_bytes: int
    create_successes: int
    create_fails: int


class SimNode:
    """One runtime node of ``cpu`` CPUs and ``memory_bytes`` of memory.

    ``busy_percent``: reported ``cpu_percent`` per allocated share of the CPUs
    (50: a node whose CPUs are all allocated reports 50 %);
    ``memory_used_percent``: reported ``memory_used_bytes`` as a percent of
    the allocated memory.  ``starting_s`` / ``lifetime_s``: how long a sandbox
    starts, then runs (0: it runs at once / stays).
    """

    def __init__(
        self,
        node_id: str,
        cpu: int,
        memory_bytes: int,
        *,
        endpoint: str = "",
        instance: str = "boot-1",
        cluster_id: str = "",
        busy_percent: int = 50,
        memory_used_percent: int = 50,
        starting_s: float = 0.0,
        lifetime_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        record_events: bool = False,
    ) -> None:
        self.node_id = node_id
        self.cpu = cpu
        self.memory_bytes = memory_bytes
        self.endpoint = endpoint or f"http://{node_id}.bench:8000"
        self.instance = instance
        self.cluster_id = cluster_id
        self.busy_percent = busy_percent
        self.memory_used_percent = memory_used_percent
        self.starting_s = starting_s
        self.lifetime_s = lifetime_s
        self.clock = clock
        self.lock = threading.Lock()
        #: sandbox id -> what it holds, in creation order
        self.sandboxes: dict[str, Sandbox] = {}
        self.create_successes = 0
        self.create_fails = 0
        #: the most sandboxes it ever held at once (the number a ceiling is about)
        self.peak_sandboxes = 0
        #: the highest max(cpu, memory) allocation / capacity it ever held
        self.peak_pressure = 0.0
        self.record_events = record_events
        #: (when, sandbox id, CREATE | DELETE) not yet taken (record_events only)
        self.events: list[tuple[float, str, str]] = []

    # -- what it holds -------------------------------------------------------
    @property
    def allocated_cpu(self) -> int:
        return sum(s.cpu for s in self.sandboxes.values())

    @property
    def allocated_memory_bytes(self) -> int:
        return sum(s.memory_bytes for s in self.sandboxes.values())

    def pressure(self) -> float:
        return max(self.allocated_cpu / self.cpu, self.allocated_memory_bytes / self.memory_bytes)

    def count(self) -> int:
        with self.lock:
            return len(self.sandboxes)

    def _expire(self, now: float) -> None:
        for sid in [
            s for s, sb in self.sandboxes.items() if sb.ends_at is not None and sb.ends_at <= now
        ]:
            del self.sandboxes[sid]
            if self.record_events:
                self.events.append((now, sid, "DELETE"))

    # -- what happens to it ----------------------------------------------------
    def create(
        self, sandbox_id: str, cpu: int, memory_bytes: int, lifetime_s: float | None = None
    ) -> None:
        """A create was forwarded to the node: the sandbox exists (starting) now.
        ``lifetime_s``: how long this one runs (default: the node's)."""
        with self.lock:
            now = self.clock()
            self._expire(now)
            running_at = now + self.starting_s
            lifetime = self.lifetime_s if lifetime_s is None else lifetime_s
            self.sandboxes[sandbox_id] = Sandbox(
                cpu,
                memory_bytes,
                running_at,
                running_at + lifetime if lifetime > 0 else None,
            )
            self.create_successes += 1
            if self.record_events:
                self.events.append((running_at, sandbox_id, "CREATE"))
            self.peak_sandboxes = max(self.peak_sandboxes, len(self.sandboxes))
            self.peak_pressure = max(self.peak_pressure, self.pressure())

    def fail_create(self) -> None:
        """A create was forwarded and failed on the node."""
        with self.lock:
            self.create_fails += 1

    def delete(self, sandbox_id: str) -> None:
        with self.lock:
            del self.sandboxes[sandbox_id]
            if self.record_events:
                self.events.append((self.clock(), sandbox_id, "DELETE"))

    def take_events(self) -> list[tuple[str, str]]:
        """The lifecycle events due by now and not taken yet (sandboxes that
        ended by now included), oldest first, as (sandbox id, type)."""
        with self.lock:
            now = self.clock()
            self._expire(now)
            due = sorted(e for e in self.events if e[0] <= now)
            self.events = [e for e in self.events if e[0] > now]
            return [(sid, kind) for _, sid, kind in due]

    # -- what it reports -------------------------------------------------------
    def observe(self) -> Observed:
        with self.lock:
            now = self.clock()
            self._expire(now)
            starting = sum(1 for s in self.sandboxes.values() if s.running_at > now)
            return Observed(
                tuple(self.sandboxes),
                starting,
                self.allocated_cpu,
                self.allocated_memory_bytes,
                self.create_successes,
                self.create_fails,
            )

    def heartbeat(
        self, seen: Observed | None = None, roster: bool = True, reported_at_unix_ms: int = 0
    ) -> Heartbeat:
        """The heartbeat this node sends, reporting ``seen`` (default: now);
        ``roster`` False: a node in counter mode (no roster);
        ``reported_at_unix_ms``: its stamp (0: none), as the reference
        reporter stamps each heartbeat once its snapshot is taken."""
        o = seen or self.observe()
        return Heartbeat(
            node_id=self.node_id,
            service_instance_id=self.instance,
            cluster_id=self.cluster_id,
            endpoint=self.endpoint,
            snapshot=NodeSnapshot(
                status="READY",
                cpu_count=self.cpu,
                memory_total_bytes=self.memory_bytes,
                allocated_cpu=o.allocated_cpu,
                allocated_memory_bytes=o.allocated_memory_bytes,
                cpu_percent=min(100, o.allocated_cpu * self.busy_percent // max(1, self.cpu)),
                memory_used_bytes=o.allocated_memory_bytes * self.memory_used_percent // 100,
                sandbox_count=len(o.sandboxes) - o.starting,
                sandbox_starting_count=o.starting,
                create_successes=o.create_successes,
                create_fails=o.create_fails,
                reported_at_unix_ms=reported_at_unix_ms,
            ),
            sandbox_ids=list(o.sandboxes) if roster else [],
        )
