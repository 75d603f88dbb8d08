"""Is the cell's data still the history this replica saw?  A Redis restarted
from an old snapshot, or a failover to a replica that was behind, serves a
dataset from the past; a Redis whose clock jumped ages or freshens everything
at once.  Each replica's health probe (``lua/probe-5.lua``) reads three
things, and :class:`HistoryWatch` compares them with what the same replica
saw at its previous probe:

- the cell's *sequence*: the sum of the stats counters that only grow
  (reservations made, ended and refused, node incarnations, probes; every
  probe adds one).  In one history it never goes down, and since this
  replica's last probe it rose by at least the placements this replica sent
  after that probe's answer and saw answered before the new probe was sent
  (fresh reservation ids only: a replayed id adds nothing; one answered
  while the probe was on its way may have run after it).  Lower than that,
  the data is from before.
- Redis ``TIME`` without the cell's drill offset, against this replica's own
  monotonic clock: between two probes both advance alike, whatever the
  load or a pause.  A difference beyond :data:`CLOCK_BOUND_MS`, whatever
  the probes' round trips (the least move they allow), is a clock that
  jumped (a failover to a server whose clock is off, a stepped clock).
- the *generation* (stats ``rewinds``): rises each time a replica settles
  the cell for a rewind or a jump, so the other replicas, which see the same
  change, take the new history instead of settling it again.

A replica that just started has nothing to compare with: its first probe is
its baseline (the other replicas, which have one, detect what happened
meanwhile).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

#: Redis time may move this far (ms) against a replica's monotonic clock
#: between two of its probes (one second apart) before it counts as a jump.
#: The cost of the bound: a jump within it is not corrected, so a forward one
#: ages every heartbeat and reservation by up to 5 s (a node 25 s silent reads
#: stale against report_ttl 30 s; a reservation ends 5 s before its 10 min)
#: and a backward one keeps a dead node READY up to 5 s longer.  What it
#: must exceed: the difference of two probes' round trips on a loaded host.
CLOCK_BOUND_MS = 5_000

#: Reservations that came back from the past end when they were made this
#: long before the rewind was settled: a creation answered earlier than that
#: is in its node's roster by now (the reference node lists a sandbox from the
#: moment its VM starts, about 3 s after the create), or it ended.  Younger
#: ones stay and end by the usual rules.
REWOUND_GRACE_MS = 10_000

#: Reservations one reconcile call ends at most (bounded work per call).
RECONCILE_BATCH = 200

#: A replica writes again the assignments it answered this long (s) before a
#: failover settle or a rewind (:class:`AssignmentMemo`): what a promoted
#: replica that was behind, or an old snapshot, may lack.  It covers the
#: placements written back pending (those made within REWOUND_GRACE_MS of
#: the settle, :class:`PlacementMemo`) for 10 s more: another replica sees
#: the settle at its next probe and writes its placements back then, and
#: the assignments that name them go again in the later passes.  Within the
#: bindings' 30 s: a replayed one restores what the gateway was answered.
REPLAY_WINDOW_S = 20.0
#: ... and at most this many (about 20 s of 2,000 assignments a second per replica)
REPLAY_MOST = 40_000

#: A replica writes back the placements it answered this long (s) before a
#: rewind or failover settle that the cell's data lacks (:class:`PlacementMemo`).
#: It must cover the oldest snapshot a restart may load: Redis's default
#: ``save 3600 1 300 100 60 10000`` (Debian's) snapshots at least every 300 s
#: while the cell writes 100 keys in 5 min (a cell under any load: one
#: placement writes four), every 60 s under 10,000; a cell that writes less
#: makes fewer placements to lose.  300 s also stays within the tombstone
#: TTL (10 min): what is older than that would be gone in its own history too.
REPLAY_PLACEMENTS_WINDOW_S = 300.0
#: ... and at most this many (300 s of about 330 placements a second per
#: replica; an entry is about 240 bytes with uuid4 ids, measured with
#: tracemalloc: 24 MB at the bound)
REPLAY_PLACEMENTS_MOST = 100_000


@dataclass(frozen=True)
class Probe:
    """What one health probe read (``lua/probe-5.lua``)."""

    #: the cell's time (Redis TIME + the drill offset), ms
    now_ms: int
    has_policy: bool
    #: Redis TIME alone, ms
    raw_ms: int
    sequence: int
    generation: int
    #: this replica's monotonic clock when the answer came, s
    at: float = 0.0
    #: ... and when the call was made (0: not known): which of two probes
    #: is the older one; one sent before a failover may be answered by the
    #: old primary after one sent to the new primary
    sent: float = 0.0


@dataclass(frozen=True)
class Verdict:
    """Why the cell must settle, with the figures for the log line."""

    #: "rewound" (the data is older than what this replica saw) or "clock"
    reason: str
    #: the sequence this replica expected at least, and what Redis showed
    expected_sequence: int
    sequence: int
    #: Redis time's move against this replica's clock since its last probe
    #: (ms), the least the two probes' round trips allow (:func:`_least_skew`)
    skew_ms: int
    #: the cell time this replica expected now (ms): where a jumped clock goes back to
    expected_now_ms: int
    #: the generation this replica saw (the settle's compare-and-set)
    generation: int


def _least_skew(last: Probe, probe: Probe) -> int:
    """How far Redis time moved against this replica's clock between two
    probes (ms), the least the round trips allow: Redis ran each probe
    somewhere between its send and its answer, so a probe answered late on
    a loaded host (or after a reconnect) reads as a jump of its round trip.
    The move is within [raw - (probe.at - last.sent), raw - (probe.sent -
    last.at)]; this is the end nearest 0 (0 when the range holds it).  A
    probe whose send time is not known counts its answer time."""
    raw = probe.raw_ms - last.raw_ms
    longest = round((probe.at - (last.sent or last.at)) * 1000)
    shortest = round(((probe.sent or probe.at) - last.at) * 1000)
    low, high = raw - longest, raw - shortest
    if low > 0:
        return low
    if high < 0:
        return high
    return 0


class HistoryWatch:
    """One replica's memory of the cell's history (see the module docstring)."""

    def __init__(self, clock_bound_ms: int = CLOCK_BOUND_MS) -> None:
        self.clock_bound_ms = clock_bound_ms
        self.last: Probe | None = None
        #: when each placement this replica made (a fresh id) sent after the
        #: last probe's answer was answered (monotonic, in answer order)
        #: (at most REPLAY_PLACEMENTS_MOST: with probes failing for long, the
        #: oldest go, which only lowers the floor)
        self.answered: deque[float] = deque(maxlen=REPLAY_PLACEMENTS_MOST)

    def placement(self, sent_at: float, answered_at: float) -> None:
        """A Schedule with a fresh reservation id, sent at ``sent_at`` and
        answered OK at ``answered_at`` (monotonic): it raised the sequence by
        one after the last probe."""
        if self.last is not None and sent_at >= self.last.at:
            self.answered.append(answered_at)

    def forget(self) -> None:
        """Start again from the next probe (Redis came back empty: restored)."""
        self.last = None
        self.answered.clear()

    def placed_before(self, probe: Probe) -> int:
        """The placements Redis ran before ``probe`` for sure: those answered
        before it was sent (none when its send time is not known)."""
        return sum(1 for t in self.answered if t <= probe.sent) if probe.sent else 0

    def observe(self, probe: Probe) -> Verdict | None:
        """Compare ``probe`` with the last one; the new baseline is ``probe``
        unless a verdict is returned (then :meth:`settled` takes it)."""
        last, placed = self.last, self.placed_before(probe)
        if last is None or not probe.has_policy or probe.generation > last.generation:
            self._take(probe)  # a baseline, or another replica already settled
            return None
        elapsed_ms = round((probe.at - last.at) * 1000)
        skew = _least_skew(last, probe)
        # before this probe's own +1, the sequence was at least last + placed
        floor = last.sequence + placed
        rewound = probe.sequence - 1 < floor or probe.generation < last.generation
        if rewound or abs(skew) > self.clock_bound_ms:
            return Verdict(
                reason="rewound" if rewound else "clock",
                expected_sequence=floor + 1,
                sequence=probe.sequence,
                skew_ms=skew,
                expected_now_ms=last.now_ms + elapsed_ms,
                generation=last.generation,
            )
        self._take(probe)
        return None

    def settled(self, probe: Probe, generation: int, now_ms: int) -> None:
        """The cell settled (by this replica or another): the new baseline."""
        self._take(
            Probe(
                now_ms=now_ms,
                has_policy=True,
                raw_ms=probe.raw_ms,
                sequence=probe.sequence,
                generation=generation,
                at=probe.at,
                sent=probe.sent,
            )
        )

    def _take(self, probe: Probe) -> None:
        self.last = probe
        self.answered.clear()


class _Answered(Protocol):
    @property
    def at(self) -> float: ...


A = TypeVar("A", bound=_Answered)


class _Window(Generic[A]):
    """What this replica answered within the last ``window_s`` (its own
    monotonic clock, each item's ``at``), at most ``most``, oldest first."""

    def __init__(self, window_s: float, most: int) -> None:
        self.window_s = window_s
        self._kept: deque[A] = deque(maxlen=most)

    @property
    def most(self) -> int:
        return self._kept.maxlen or 0

    def record(self, item: A) -> None:
        self._kept.append(item)
        self._drop_before(item.at - self.window_s)

    def recent(self, now: float) -> list[A]:
        """Those answered within the window before ``now``, oldest first."""
        self._drop_before(now - self.window_s)
        return list(self._kept)

    def __len__(self) -> int:
        return len(self._kept)

    def _drop_before(self, t: float) -> None:
        while self._kept and self._kept[0].at < t:
            self._kept.popleft()


@dataclass(frozen=True)
class Assigned:
    """One assignment this replica answered OK (RecordAssignment)."""

    #: this replica's monotonic clock when it was answered, s
    at: float
    sandbox_id: str
    node_id: str
    endpoint: str
    #: the reservation the assignment attached (named by the gateway, or the
    #: node's newest unclaimed one that the script chose)
    reservation_id: str


class AssignmentMemo(_Window[Assigned]):
    """The assignments this replica answered OK in the last ``window_s``.

    Redis that lost its last writes (a failover at ``min_replicas_acked: 0``
    to a replica that had not received them, a restart from an old snapshot)
    may hold a placement's reservation without the assignment the gateway was
    answered for: nothing then ends it (no roster names its sandbox's
    reservation, and the gateway does not send it again) before
    ``unassigned_reservation_ttl``.  After the settle the replica writes them
    again (``lua/assign-5.lua`` naming the reservation it attached): the
    normal rules follow, a roster that lists the sandbox releases it and one
    that no longer does releases it after two heartbeats.  An assignment the
    new primary has already is charged once (the script keeps the charge it
    has), so writing one again changes nothing."""

    def __init__(self, window_s: float = REPLAY_WINDOW_S, most: int = REPLAY_MOST) -> None:
        super().__init__(window_s, most)


@dataclass(frozen=True, slots=True)
class Placed:
    """One placement this replica answered OK (a Schedule that reserved)."""

    #: this replica's monotonic clock when it was answered, s
    at: float
    reservation_id: str
    node_id: str
    #: what it charged the node
    cpu: int
    memory_bytes: int
    #: the cell's time of its Schedule (ms): its TTLs count from here
    created_ms: int
    pressure: float


class PlacementMemo(_Window[Placed]):
    """The placements this replica answered OK in the last ``window_s``, at
    most ``most`` (the oldest go first).

    A Redis that lost its last writes (a restart from an old snapshot, a
    failover to a replica that was behind) lacks their reservations: a
    creation in flight whose reservation went is counted by no one until its
    node lists it, and the gateway was told it is kept.  After the settle the
    replica writes back those the cell lacks (``lua/replay-5.lua``): one the
    cell has (live or ended) is left as it is; one made more than the
    rewind grace before the settle, or whose sandbox its node already lists,
    comes back ended; the others pending, with their original TTLs."""

    def __init__(
        self, window_s: float = REPLAY_PLACEMENTS_WINDOW_S, most: int = REPLAY_PLACEMENTS_MOST
    ) -> None:
        super().__init__(window_s, most)
