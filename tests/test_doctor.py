"""``schedctl doctor``: each invariant check finds a corruption written with
plain Redis commands, says what a repair would do, and ``--repair`` fixes
what is derived (and only that), leaving the cell consistent; a cell the
scripts wrote is consistent."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
from click.testing import CliRunner
from scheduler.cli.main import main

from scheduler import Policy, Request, Scheduler
from scheduler.domain.records import SandboxEvent
from scheduler.ops.doctor import doctor
from tests.helpers import hb

pytestmark = pytest.mark.real_only
CELL = "doc"


@dataclass
class Cell:
    s: Scheduler
    admin: redis.Redis
    #: reservation ids: pending, assigned (x1, listed by its node), acked (x2)
    rids: list[str]
    nodes: list[str]

    def key(self, rest: str) -> str:
        return self.s.keys.base + rest


@pytest.fixture
def cell(real_url: str) -> Iterator[Cell]:
    s = Scheduler.connect(real_url, cell=CELL, policy=Policy(), overwrite_policy=True)
    for i in range(4):
        s.heartbeat(hb(f"n{i}", roster=[f"r{i}"]))
    ps = [s.schedule(Request.cold(1, 0)) for _ in range(5)]
    s.assign("x1", ps[0].node_id, ps[0].endpoint, ps[0].reservation_id)
    s.assign("x2", ps[1].node_id, ps[1].endpoint, ps[1].reservation_id)
    s.events(ps[1].node_id, [SandboxEvent(sandbox_id="x2", event_type="CREATE")])
    s.cancel(ps[2].reservation_id or "")
    s.heartbeat(hb(ps[0].node_id, roster=[f"r{ps[0].node_id[1:]}", "x1"]))
    admin = redis.Redis.from_url(real_url, decode_responses=True)
    yield Cell(s, admin, [p.reservation_id or "" for p in ps], [p.node_id for p in ps])
    admin.close()
    s.close()


def test_a_cell_the_scripts_wrote_is_consistent(cell: Cell) -> None:
    r = doctor(cell.s)
    assert r.findings == [], r.findings
    assert r.nodes == 4 and r.reservations == 3 and r.keys > 20  # (x1 released by its roster)


def _pending_rid(c: Cell) -> str:
    return c.rids[3]


# (name, corrupt, check, key found, words of the problem, repaired by --repair)
Case = tuple[str, Callable[[Cell], object], str, Callable[[Cell], str], str, bool]
CASES: list[Case] = [
    (
        "count that disagrees",
        lambda c: c.admin.hset(c.key(f"node:{c.nodes[3]}"), "pending_count", "7"),
        "counts",
        lambda c: c.key(f"node:{c.nodes[3]}"),
        "field pending_count is '7'",
        False,
    ),
    (
        "record field not a number",
        lambda c: c.admin.hset(c.key("node:n0"), "sandbox_count", "abc"),
        "record",
        lambda c: c.key("node:n0"),
        "field sandbox_count is 'abc'",
        False,
    ),
    (
        "negative record field",
        lambda c: c.admin.hset(c.key("node:n1"), "cpu_count", "-5"),
        "record",
        lambda c: c.key("node:n1"),
        "field cpu_count is '-5'",
        False,
    ),
    (
        "dangling node-res member",
        lambda c: c.admin.zadd(c.key("node-res:n0"), {"ghost": 1}),
        "node-res",
        lambda c: c.key("node-res:n0"),
        "member ghost is not a live reservation",
        True,
    ),
    (
        "dangling expiry member",
        lambda c: c.admin.zadd(c.key("expiry"), {"ghost": 1}),
        "expiry",
        lambda c: c.key("expiry"),
        "member ghost is no reservation",
        True,
    ),
    (
        "live reservation missing from expiry",
        lambda c: c.admin.zrem(c.key("expiry"), _pending_rid(c)),
        "expiry",
        lambda c: c.key(f"res:{_pending_rid(c)}"),
        "would never expire",
        True,
    ),
    (
        "dangling node-sbx member",
        lambda c: c.admin.sadd(c.key("node-sbx:n2"), "nosuch"),
        "bindings",
        lambda c: c.key("node-sbx:n2"),
        "member nosuch is not bound to the node (no binding)",
        True,
    ),
    (
        "garbage in the placement index",
        lambda c: c.admin.zadd(
            next(iter(c.admin.scan_iter(match=c.key("idx-bucket:*")))), {"garbage": 0}
        ),
        "index",
        lambda c: next(
            k
            for k in c.admin.scan_iter(match=c.key("idx-bucket:*"))
            if c.admin.zscore(k, "garbage") is not None
        ),
        "member 'garbage' is not a node indexed in this bucket",
        True,
    ),
    (
        "an index key of the wrong type",
        lambda c: (c.admin.delete(c.key("idx-seen")), c.admin.set(c.key("idx-seen"), "x")),
        "type",
        lambda c: c.key("idx-seen"),
        "holds a string, not a zset",
        True,
    ),
    (
        "a registered node without a record",
        lambda c: c.admin.zadd(c.key("nodes"), {"phantom": 0}),
        "registry",
        lambda c: c.key("nodes"),
        "member 'phantom' has no node record",
        False,
    ),
]


@pytest.mark.parametrize(
    ("name", "corrupt", "check", "key", "problem", "repairable"), CASES, ids=[c[0] for c in CASES]
)
def test_each_check_finds_its_corruption_and_repair_fixes_what_is_derived(
    cell: Cell,
    name: str,
    corrupt: Callable[[Cell], object],
    check: str,
    key: Callable[[Cell], str],
    problem: str,
    repairable: bool,
) -> None:
    corrupt(cell)
    where = key(cell)
    before = {k: cell.admin.type(k) for k in cell.admin.scan_iter(match=cell.key("*"))}
    r = doctor(cell.s)
    found = [f for f in r.findings if f.check == check and f.key == where and problem in f.problem]
    assert found, r.findings
    assert bool(found[0].fix) == repairable, found[0]
    # read-only by default: nothing written
    assert {k: cell.admin.type(k) for k in cell.admin.scan_iter(match=cell.key("*"))} == before
    fixed = doctor(cell.s, repair=True)
    assert [f for f in fixed.findings if f.fix] == [f for f in fixed.findings if f.repaired]
    again = doctor(cell.s)
    left = [
        f for f in again.findings if f.check == check and f.key == where and problem in f.problem
    ]
    assert bool(left) != repairable, (left, again.findings)
    assert all(not f.fix for f in again.findings), again.findings  # nothing derived left
    if check in ("index", "type"):  # the rebuilt index places again
        assert cell.s.schedule(Request.cold(1, 0)).node_id


def test_schedctl_doctor_says_what_it_would_fix_and_repairs(cell: Cell) -> None:
    cell.admin.zadd(cell.key("expiry"), {"ghost": 1})
    url = cell.s.url or ""
    dry = CliRunner().invoke(main, ["doctor", "--redis", url, "--cell", CELL, "--json"])
    assert dry.exit_code == 1
    report = json.loads(dry.stdout)
    assert [(f["check"], f["fix"], f["repaired"]) for f in report["findings"]] == [
        ("expiry", "remove the member", False)
    ]
    assert "run with --repair" in dry.stderr
    fix = CliRunner().invoke(main, ["doctor", "--redis", url, "--cell", CELL, "--repair"])
    assert fix.exit_code == 0, fix.output
    ok = CliRunner().invoke(main, ["doctor", "--redis", url, "--cell", CELL])
    assert ok.exit_code == 0 and "consistent" in ok.output, ok.output
