"""The 34 corruptions (docs/operations.md, "Corrupt state"): each written
with plain Redis commands, the kind an old version or an operator's
redis-cli script leaves, into a cell where exactly one more placement fits
(n1 and n2 at max_sandbox_count, n3 one below it); then every operation is
run.  Each case fails closed with an error naming the key (and the field)
or heals: no placement beyond a ceiling, none on a node read from a number
it does not have, no traceback in a reply or in schedctl's output, and
``schedctl doctor`` finds it first."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import redis
from click.testing import CliRunner
from scheduler.cli.main import main

from scheduler import Policy, Request, Scheduler
from scheduler.domain.errors import CorruptState, NoNodesAvailable, SchedulerError
from scheduler.domain.policy import Limits
from scheduler.domain.records import SandboxEvent
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.ops.doctor import doctor
from scheduler.store.connection import async_client
from scheduler.store.keys import CellKeys
from scheduler.testing.replicas import ThreadedReplica, settings_for
from tests.helpers import cold, endpoint_md, hb, hb_request

pytestmark = pytest.mark.real_only
CELL = "corr"
K = CellKeys(CELL)
POLICY = Policy(limits=Limits(max_sandbox_count=2))
VOUCH_EVERY = 4
#: n1 runs two (at the ceiling), n2 holds two reservations (r1 assigned to
#: x1, r2 pending), n3 runs one: one placement fits, on n3
BEATS = {
    "n1": hb("n1", sandbox_count=2, roster=["a1", "a2"]),
    "n2": hb("n2"),
    "n3": hb("n3", sandbox_count=1, allocated_cpu=8, roster=["c1"]),
}


@dataclass
class Cell:
    s: Scheduler
    admin: redis.Redis
    r1: str
    r2: str
    #: what each operation answered: "ok", or the error's class and message
    outcomes: dict[str, str] = field(default_factory=dict)
    placed: list[str] = field(default_factory=list)

    def bucket(self, node_id: str) -> str:
        return str(self.admin.hget(K.node(node_id), "idx"))

    def shape(self, node_id: str) -> str:
        return ":".join(self.bucket(node_id).split(":")[1:3])


@pytest.fixture
def cell(real_url: str) -> Iterator[Cell]:
    s = Scheduler.connect(real_url, cell=CELL, policy=POLICY, overwrite_policy=True)
    for beat in BEATS.values():
        s.heartbeat(beat)
    p1 = s.schedule(Request.cold(1, 0))
    p2 = s.schedule(Request.cold(1, 0))
    assert p1.node_id == p2.node_id == "n2", (p1, p2)
    s.assign("x1", "n2", p1.endpoint, p1.reservation_id)
    admin = redis.Redis.from_url(real_url, decode_responses=True)
    c = Cell(s, admin, p1.reservation_id or "", p2.reservation_id or "")
    assert doctor(s).findings == []
    yield c
    admin.close()
    s.close()


def _wrongtype(key: str) -> Callable[[Cell], object]:
    def corrupt(c: Cell) -> object:
        c.admin.delete(key)
        return c.admin.set(key, "garbage")

    return corrupt


def _policy(name: str, value: str) -> Callable[[Cell], object]:
    # (the named field and the packed copy the scripts read, as an operator
    # who edits the hash and drops what they do not understand)
    return lambda c: (c.admin.hset(K.policy, name, value), c.admin.hdel(K.policy, "packed"))


#: what the scheduler does about a case (docs/operations.md "Corrupt state")
EXCLUDED = "n1 excluded as a corrupt record until its next full heartbeat"
HEALED = "healed by the script that meets it"
REFUSED = "refused with CORRUPT / FAILED_PRECONDITION naming the key"
ENDED = "the reservation is ended once (at its TTL, or when cancelled), its node recounted"

Case = tuple[str, Callable[[Cell], object], str, str]
CASES: list[Case] = [
    # node records: numbers a decision reads
    (
        "sandbox_count not a number",
        lambda c: c.admin.hset(K.node("n1"), "sandbox_count", "abc"),
        EXCLUDED,
        "node:n1",
    ),
    (
        "sandbox_count empty",
        lambda c: c.admin.hset(K.node("n1"), "sandbox_count", ""),
        EXCLUDED,
        "node:n1",
    ),
    (
        "sandbox_count missing",
        lambda c: c.admin.hdel(K.node("n1"), "sandbox_count"),
        EXCLUDED,
        "node:n1",
    ),
    (
        "sandbox_count negative",
        lambda c: c.admin.hset(K.node("n1"), "sandbox_count", "-5"),
        EXCLUDED,
        "node:n1",
    ),
    (
        "sandbox_count a fraction",
        lambda c: c.admin.hset(K.node("n1"), "sandbox_count", "1.5"),
        EXCLUDED,
        "node:n1",
    ),
    (
        "sandbox_count huge",
        lambda c: c.admin.hset(K.node("n1"), "sandbox_count", "1e300"),
        EXCLUDED,
        "node:n1",
    ),
    (
        "cpu_count negative",
        lambda c: c.admin.hset(K.node("n1"), "cpu_count", "-16"),
        EXCLUDED,
        "node:n1",
    ),
    (
        "memory_total_bytes not a number",
        lambda c: c.admin.hset(K.node("n1"), "memory_total_bytes", "lots"),
        EXCLUDED,
        "node:n1",
    ),
    (
        "allocated_cpu NaN",
        lambda c: c.admin.hset(K.node("n1"), "allocated_cpu", "nan"),
        EXCLUDED,
        "node:n1",
    ),
    (
        "last_seen_ms not a number",
        lambda c: c.admin.hset(K.node("n1"), "last_seen_ms", "yesterday"),
        EXCLUDED,
        "node:n1",
    ),
    # node records: derived numbers
    (
        "pending_count not a number",
        lambda c: c.admin.hset(K.node("n2"), "pending_count", "abc"),
        HEALED,
        "node:n2",
    ),
    (
        "pending_count negative",
        lambda c: c.admin.hset(K.node("n2"), "pending_count", "-1"),
        HEALED,
        "node:n2",
    ),
    (
        "pending_count missing",
        lambda c: c.admin.hdel(K.node("n2"), "pending_count"),
        HEALED,
        "node:n2",
    ),
    (
        "idx not a bucket id",
        lambda c: c.admin.hset(K.node("n1"), "idx", "garbage"),
        HEALED,
        "node:n1",
    ),
    ("node record of the wrong type", _wrongtype(K.node("n1")), REFUSED, "node:n1"),
    # reservations
    (
        "reservation state overwritten",
        lambda c: c.admin.hset(K.res(c.r2), "state", "bogus"),
        ENDED,
        "res:",
    ),
    ("reservation state missing", lambda c: c.admin.hdel(K.res(c.r2), "state"), ENDED, "res:"),
    (
        "reservation cpu not a number",
        lambda c: c.admin.hset(K.res(c.r2), "cpu", "many"),
        ENDED,
        "res:",
    ),
    ("reservation node_id missing", lambda c: c.admin.hdel(K.res(c.r2), "node_id"), ENDED, "res:"),
    ("reservation of the wrong type", lambda c: _wrongtype(K.res(c.r2))(c), REFUSED, "res:"),
    # bindings
    (
        "binding node_id missing",
        lambda c: c.admin.hdel(K.bind("x1"), "node_id"),
        REFUSED,
        "bind:x1",
    ),
    (
        "binding expires_ms not a number",
        lambda c: c.admin.hset(K.bind("x1"), "expires_ms", "soon"),
        REFUSED,
        "bind:x1",
    ),
    ("binding of the wrong type", _wrongtype(K.bind("x1")), REFUSED, "bind:x1"),
    # policy
    ("policy report_ttl_ms not a number", _policy("report_ttl_ms", "abc"), REFUSED, "policy"),
    ("policy ceiling not a number", _policy("max_sandbox_count", "ten"), REFUSED, "policy"),
    ("policy of the wrong type", _wrongtype(K.policy), REFUSED, "policy"),
    # the placement index
    (
        "idx-shapes member not a shape",
        lambda c: c.admin.sadd(K.base + "idx-shapes", "zz"),
        HEALED,
        "idx-shapes",
    ),
    (
        "idx-cpu member not a bucket id",
        lambda c: c.admin.zadd(K.base + "idx-cpu:" + c.shape("n3"), {"not-a-bucket": 0}),
        HEALED,
        "idx-cpu:",
    ),
    (
        "idx-bucket member no node",
        lambda c: c.admin.zadd(K.base + "idx-bucket:" + c.bucket("n3"), {"ghost": 0}),
        HEALED,
        "idx-bucket:",
    ),
    (
        "idx-seen member no node",
        lambda c: c.admin.zadd(K.base + "idx-seen", {"ghost": 1}),
        HEALED,
        "idx-seen",
    ),
    # expiry set
    (
        "expiry member no reservation",
        lambda c: c.admin.zadd(K.expiry, {"ghost": 1}),
        HEALED,
        "expiry",
    ),
    ("expiry of the wrong type", _wrongtype(K.expiry), REFUSED, "expiry"),
    # counters
    (
        "reserved_total not an integer",
        lambda c: c.admin.hset(K.stats, "reserved_total", "abc"),
        REFUSED,
        "stats",
    ),
    ("rotation counter not an integer", lambda c: c.admin.set(K.rr, "abc"), HEALED, "rr"),
]


def _run(c: Cell, name: str, op: Callable[[], Any]) -> Any:
    """Run one operation: it answers, or fails with one of our errors (a
    corrupt one naming what it met), never with anything else."""
    try:
        r = op()
    except SchedulerError as e:
        c.outcomes[name] = f"{type(e).__name__}: {e.message}"
        assert "Traceback" not in e.message and "\n" not in e.message, e.message
        if isinstance(e, CorruptState):
            assert (
                "corrupt record " in e.message
                or "WRONGTYPE" in e.message
                or ("not an integer" in e.message)
            ), e.message
        return None
    c.outcomes[name] = "ok"
    return r


def _operations(c: Cell) -> None:
    s = c.s
    for i in range(2):
        p = _run(c, f"schedule {i}", lambda: s.schedule(Request.cold(1, 0)))
        if p is not None:
            c.placed.append(p.node_id)
    _run(c, "explain", lambda: s.explain(Request.cold(1, 0)))
    _run(c, "lookup", lambda: s.lookup("x1"))
    # unchanged heartbeats: steady, or RESYNC then full; a steady one vouches
    # for the record's numbers one in VOUCH_EVERY (lua/includes/heartbeat_steady.lua)
    for node_id, beat in BEATS.items():
        for k in range(VOUCH_EVERY):
            _run(c, f"heartbeat {node_id} {k}", lambda beat=beat: s.heartbeat(beat))
    _run(c, "events", lambda: s.events("n2", [SandboxEvent(sandbox_id="x1", event_type="CREATE")]))
    _run(c, "assign", lambda: s.assign("x2", "n2", "n2.local:5000", c.r2))
    _run(c, "lookup again", lambda: s.lookup("x1"))
    _run(c, "reservations", s.reservations)
    _run(c, "nodes", s.nodes)
    _run(c, "observed", s.observed_nodes)
    _run(c, "stats", s.stats)
    _run(c, "cancel", lambda: s.cancel(c.r2))


def _cli(c: Cell, *args: str) -> None:
    url = c.s.url or ""
    cell = [] if args[0] == "cells" else ["--cell", CELL]
    result = CliRunner().invoke(main, [*args, "--redis", url, *cell])
    out = result.output
    assert "Traceback" not in out, out
    assert result.exit_code in (0, 1), (result.exit_code, out, result.exception)
    if result.exit_code == 1 and args[0] != "doctor":
        assert out.count("\n") == 1, out  # (one line)


@pytest.mark.parametrize(
    ("case", "corrupt", "handling", "key"), CASES, ids=[case[0] for case in CASES]
)
def test_a_corruption_fails_closed_or_heals(
    cell: Cell, case: str, corrupt: Callable[[Cell], object], handling: str, key: str
) -> None:
    c = cell
    corrupt(c)
    found = doctor(c.s).findings
    assert any(key in f.key or key in f.problem for f in found), found
    _operations(c)
    # no placement beyond the ceiling: the one that fits is n3's
    assert set(c.placed) <= {"n3"} and len(c.placed) <= 1, (c.placed, c.outcomes)
    for what in (("nodes",), ("reservations",), ("explain",), ("bindings", "lookup", "x1")):
        _cli(c, *what)
    _cli(c, "cells")
    _cli(c, "doctor")
    if handling in (HEALED, EXCLUDED):
        # placement goes on with the other nodes, and counts why not the rest
        assert c.placed == ["n3"], c.outcomes
        refusal = c.outcomes["schedule 1"]
        assert refusal.startswith(NoNodesAvailable.__name__), c.outcomes
        if handling == EXCLUDED:
            assert "1 corrupt record" in refusal, refusal
    if handling == EXCLUDED:
        # the node's own heartbeats rewrote its record: every read works again
        assert c.outcomes["nodes"] == "ok", c.outcomes
        assert not [f for f in doctor(c.s).findings if f.check == "record"]
    if handling == REFUSED:
        # (WRONGTYPE names the script and its command: Redis does not say the
        # key, which doctor names, above)
        assert any(
            v.startswith("CorruptState") and (key.rstrip(":") in v or "WRONGTYPE" in v)
            for v in c.outcomes.values()
        ), c.outcomes


@pytest.mark.parametrize(
    ("case", "corrupt"),
    [(case[0], case[1]) for case in CASES if case[2] == HEALED],
    ids=[case[0] for case in CASES if case[2] == HEALED],
)
def test_doctor_repairs_what_is_derived(
    cell: Cell, case: str, corrupt: Callable[[Cell], object]
) -> None:
    corrupt(cell)
    report = doctor(cell.s, repair=True)
    assert report.findings and all(f.repaired for f in report.findings if f.fix), report
    assert doctor(cell.s).findings == [], case


def test_a_reservation_whose_state_was_overwritten_ends_once_at_its_ttl(cell: Cell) -> None:
    """Not held for good: the sweep at its TTL ends it, its node's pending
    count drops by one, and it is counted once."""
    c = cell
    c.admin.hset(K.res(c.r2), "state", "bogus")
    doctor(c.s, repair=True)  # (keeps it due: a repair never makes it be held for good)
    assert c.admin.zscore(K.expiry, c.r2) is not None
    before = c.s.stats()
    c.s.advance_clock(POLICY.reservation_ttl_ms + 1)
    c.s.sweep()
    c.s.sweep()
    assert c.admin.hget(K.res(c.r2), "state") == "expired"
    assert c.admin.hget(K.res(c.r1), "state") == "expired"  # (its TTL too)
    assert c.admin.hget(K.node("n2"), "pending_count") == "0"
    assert c.s.stats().expired_total == before.expired_total + 2
    assert doctor(c.s).findings == []


def test_a_corrupt_node_is_counted_in_explain_and_placement_goes_on(cell: Cell) -> None:
    """The index places from the numbers a node last reported (its bucket);
    the first script that reads the corrupt record takes the node out, and
    from then on it is a counted refusal until its next full heartbeat."""
    c = cell
    p = c.s.schedule(Request.cold(1, 0))
    assert p.node_id == "n3"
    c.admin.hset(K.node("n3"), "sandbox_count", "-5")  # (read as 0 it would take two)
    verdicts = {v.node_id: v.reason for v in c.s.explain(Request.cold(1, 0)).verdicts}
    assert verdicts["n3"] == "corrupt record", verdicts
    c.s.cancel(p.reservation_id or "")  # (reads the record: out of the index)
    assert c.admin.hget(K.node("n3"), "idx") == ""
    for _ in range(2):
        with pytest.raises(NoNodesAvailable, match=r"1 corrupt record"):
            c.s.schedule(Request.cold(1, 0))
    # its steady heartbeat is a RESYNC (out of the index), the full one
    # rewrites the record: placeable again, once
    c.s.heartbeat(BEATS["n3"])
    assert c.admin.hget(K.node("n3"), "sandbox_count") == "1"
    assert c.s.schedule(Request.cold(1, 0)).node_id == "n3"
    with pytest.raises(NoNodesAvailable):
        c.s.schedule(Request.cold(1, 0))


def test_a_steady_heartbeat_vouches_for_the_record_it_keeps(cell: Cell) -> None:
    """A corrupt number in a record still in the index: within VOUCH_EVERY
    steady heartbeats one answers RESYNC and the full one rewrites it."""
    c = cell
    c.admin.hset(K.node("n3"), "sandbox_count", "abc")
    for _ in range(VOUCH_EVERY):
        c.s.heartbeat(BEATS["n3"])
    assert c.admin.hget(K.node("n3"), "sandbox_count") == "1"
    assert doctor(c.s).findings == []


@pytest.mark.parametrize(
    ("case", "corrupt"),
    [(case[0], case[1]) for case in CASES[::3]],
    ids=[case[0] for case in CASES[::3]],
)
def test_through_a_replica_no_case_is_internal_or_a_logged_traceback(
    cell: Cell,
    real_url: str,
    caplog: pytest.LogCaptureFixture,
    case: str,
    corrupt: Callable[[Cell], object],
) -> None:
    """Every third case through a replica's gRPC: answered with a code a
    client can act on (never INTERNAL or UNKNOWN), and no traceback logged."""
    corrupt(cell)
    settings = settings_for(POLICY, cell=CELL)
    calls: list[Callable[[ThreadedReplica], object]] = [
        lambda r: r.stub.Schedule(cold(1, 0), timeout=5),
        lambda r: r.stub.Heartbeat(
            hb_request("n1", count=2, roster=["a1", "a2"]),
            metadata=endpoint_md("n1:5000"),
            timeout=5,
        ),
        lambda r: r.stub.LookupNode(pb.LookupNodeRequest(sandbox_id="x1"), timeout=5),
        lambda r: r.stub.ListObservedNodes(pb.ListObservedNodesRequest(), timeout=5),
        lambda r: r.stub.GetNode(pb.GetNodeRequest(node_id="n2"), timeout=5),
    ]
    with (
        caplog.at_level(logging.INFO),
        ThreadedReplica(settings, lambda: async_client(real_url), real_url) as r,
    ):
        for call in calls:
            try:
                call(r)
            except grpc.RpcError as e:
                assert e.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (
                    case,
                    e.details(),
                )
                assert "Traceback" not in (e.details() or "")
    assert not [x for x in caplog.records if x.exc_info], "a traceback was logged"
