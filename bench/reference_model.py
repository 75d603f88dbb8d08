"""A model of the reference design (AgentENV's Go scheduler) for the ceiling
scenario: how its replicas decide, re-implemented in Python from its
documented behaviour, with every piece of state in each replica's memory.

What makes it the reference design, piece by piece:

- Each runtime node heartbeats to exactly one replica (pinned).  A replica
  holds snapshots of its pinned nodes only.
- Every node of the static list is a candidate on every replica.  A node the
  replica has no snapshot for is kept: its limits "cannot be evaluated".
- The ceiling filter reads the snapshot alone and excludes a node when
  ``current > limit``, so a node at exactly the limit gets one more, and
  placements made since that snapshot are not counted against the ceiling.
- ``least_loaded`` keeps the replica's own placements since the last
  heartbeat as in-memory reservations: they raise the node's projected load
  and count as starting; a heartbeat whose ``create_successes`` /
  ``allocated_*`` moved past them acknowledges them, oldest first.  Nodes with
  a snapshot (known capacity) rank before nodes without; ties rotate on a
  per-replica counter.
- Locality (its PR #51, unmerged): with ``coverage`` given, of the nodes that
  pass the limit filter only those holding the most requirement keys (at
  least one) stay, in input order, and the strategy picks among them (its
  capacity fit included: a full warm node is a refusal, not a fallback);
  nobody holding any keeps them all.  No pressure margin, no spread.
- A creation must fit the projected capacity of a node with a snapshot; a
  node without one always fits.  The model takes the same overcommit factor
  as our policy in the run, so both systems face the same capacity rule (the
  reference has no overcommit setting; 1.0 is its behaviour).

No Redis, no clock: the scenario drives it with the same workload as ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RefSnapshot:
    """What a heartbeat tells the replica it reaches."""

    cpu_count: int
    memory_total_bytes: int
    allocated_cpu: int
    allocated_memory_bytes: int
    sandbox_count: int
    sandbox_starting_count: int
    create_successes: int


@dataclass
class _Pending:
    cpu: int
    memory_bytes: int
    count_acked: bool = False
    cpu_acked: bool = False
    memory_acked: bool = False


@dataclass
class _NodePending:
    items: list[_Pending] = field(default_factory=list)
    observed_generation: int = 0
    observed_successes: int = 0
    observed_cpu: int = 0
    observed_memory: int = 0

    def totals(self) -> tuple[int, int, int]:
        cpu = sum(p.cpu for p in self.items if not p.cpu_acked)
        mem = sum(p.memory_bytes for p in self.items if not p.memory_acked)
        count = sum(1 for p in self.items if not p.count_acked)
        return cpu, mem, count


class ReferenceReplica:
    """One replica of the reference design."""

    def __init__(
        self,
        node_ids: list[str],
        max_sandbox_count: int,
        overcommit_cpu: float = 1.0,
        overcommit_memory: float = 1.0,
    ) -> None:
        self.node_ids = list(node_ids)  # the static node list, in configuration order
        self.limit = max_sandbox_count
        self.overcommit_cpu = overcommit_cpu
        self.overcommit_memory = overcommit_memory
        self.snapshots: dict[str, tuple[int, RefSnapshot]] = {}  # node -> (generation, snap)
        self.pending: dict[str, _NodePending] = {}
        self.rotation = 0

    # -- heartbeat ---------------------------------------------------------
    def heartbeat(self, node_id: str, snap: RefSnapshot) -> None:
        gen = self.snapshots.get(node_id, (0, snap))[0] + 1
        self.snapshots[node_id] = (gen, snap)

    # -- schedule ----------------------------------------------------------
    def _reserved(self, node_id: str) -> tuple[int, int, int]:
        state = self.pending.get(node_id)
        if state is None:
            return 0, 0, 0
        seen = self.snapshots.get(node_id)
        if seen is not None and seen[0] > state.observed_generation:
            gen, snap = seen
            credit = max(0, snap.create_successes - state.observed_successes)
            for p in state.items:
                if credit == 0:
                    break
                if not p.count_acked:
                    p.count_acked = True
                    credit -= 1
            cpu_credit = max(0, snap.allocated_cpu - state.observed_cpu)
            mem_credit = max(0, snap.allocated_memory_bytes - state.observed_memory)
            for p in state.items:
                if not p.count_acked:
                    continue
                if not p.cpu_acked and p.cpu <= cpu_credit:
                    p.cpu_acked = True
                    cpu_credit -= p.cpu
                if not p.memory_acked and p.memory_bytes <= mem_credit:
                    p.memory_acked = True
                    mem_credit -= p.memory_bytes
            state.items = [
                p for p in state.items if not (p.count_acked and p.cpu_acked and p.memory_acked)
            ]
            state.observed_generation = gen
            state.observed_successes = snap.create_successes
            state.observed_cpu = snap.allocated_cpu
            state.observed_memory = snap.allocated_memory_bytes
        return state.totals()

    def _within_limit(self, node_id: str) -> bool:
        seen = self.snapshots.get(node_id)
        if seen is None:
            return True  # no heartbeat yet: nothing to evaluate, the node is kept
        return not seen[1].sandbox_count > self.limit

    def _fits(self, snap: RefSnapshot | None, cpu: int, mem: int) -> bool:
        if snap is None:
            return True
        if snap.cpu_count > 0 and snap.allocated_cpu + cpu > snap.cpu_count * self.overcommit_cpu:
            return False
        return not (
            snap.memory_total_bytes > 0
            and snap.allocated_memory_bytes + mem > snap.memory_total_bytes * self.overcommit_memory
        )

    def _load(
        self, snap: RefSnapshot | None, cpu: int, mem: int, pending_count: int
    ) -> tuple[int, float, int, int]:
        """Rank key, smaller first: known capacity, pressure, starting, running."""
        if snap is None:
            return (1, 0.0, pending_count, 0)
        pressure = 0.0
        if snap.cpu_count > 0:
            pressure = (snap.allocated_cpu + cpu) / snap.cpu_count
        if snap.memory_total_bytes > 0:
            pressure = max(pressure, (snap.allocated_memory_bytes + mem) / snap.memory_total_bytes)
        return (0, pressure, snap.sandbox_starting_count + pending_count, snap.sandbox_count)

    def schedule(
        self, cpu: int, memory_bytes: int, coverage: Mapping[str, int] | None = None
    ) -> str | None:
        """The node chosen for a creation (now reserved in memory), or None.
        ``coverage``: node -> requirement keys it holds (PR #51's preference)."""
        candidates = [n for n in self.node_ids if self._within_limit(n)]
        if coverage:  # PR #51: after the limit filter, before the strategy's fit
            top = max((coverage.get(n, 0) for n in candidates), default=0)
            if top > 0:
                candidates = [n for n in candidates if coverage.get(n, 0) == top]
        scored: list[tuple[tuple[int, float, int, int], str]] = []
        for n in candidates:
            r_cpu, r_mem, r_count = self._reserved(n)
            seen = self.snapshots.get(n)
            snap = seen[1] if seen else None
            if not self._fits(snap, cpu + r_cpu, memory_bytes + r_mem):
                continue
            scored.append((self._load(snap, cpu + r_cpu, memory_bytes + r_mem, r_count), n))
        if not scored:
            return None
        best = min(key for key, _ in scored)
        equals = [n for key, n in scored if key == best]
        chosen = equals[self.rotation % len(equals)]
        self.rotation += 1
        self._reserve(chosen, cpu, memory_bytes)
        return chosen

    def _reserve(self, node_id: str, cpu: int, memory_bytes: int) -> None:
        state = self.pending.get(node_id)
        if state is None:
            state = self.pending[node_id] = _NodePending()
            seen = self.snapshots.get(node_id)
            if seen is not None:
                gen, snap = seen
                state.observed_generation = gen
                state.observed_successes = snap.create_successes
                state.observed_cpu = snap.allocated_cpu
                state.observed_memory = snap.allocated_memory_bytes
        state.items.append(
            _Pending(cpu, memory_bytes, cpu_acked=cpu == 0, memory_acked=memory_bytes == 0)
        )


class ReferenceCluster:
    """``replicas`` reference replicas over one static node list; node ``i``
    heartbeats to replica ``i % replicas``."""

    def __init__(
        self,
        node_ids: list[str],
        replicas: int,
        max_sandbox_count: int,
        overcommit_cpu: float = 1.0,
        overcommit_memory: float = 1.0,
    ) -> None:
        self.node_ids = list(node_ids)
        self.replicas = [
            ReferenceReplica(node_ids, max_sandbox_count, overcommit_cpu, overcommit_memory)
            for _ in range(replicas)
        ]
        self.pinned = {n: self.replicas[i % replicas] for i, n in enumerate(node_ids)}

    def heartbeat(self, node_id: str, snap: RefSnapshot) -> None:
        self.pinned[node_id].heartbeat(node_id, snap)

    def schedule(
        self,
        replica: int,
        cpu: int,
        memory_bytes: int,
        coverage: Mapping[str, int] | None = None,
    ) -> str | None:
        return self.replicas[replica].schedule(cpu, memory_bytes, coverage)
