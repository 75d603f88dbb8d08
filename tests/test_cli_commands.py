"""schedctl nodes / reservations / bindings / explain / policy with CliRunner on real Redis.

One fleet (built below, clock frozen so ages are exact) covers every verdict:

    node   shape        reported                        state
    stale  16 cpu 64G   -                               last heartbeat 40 s ago (ttl 30 s)
    full   16 cpu 64G   3 running, 3 cpu, 3 GiB         at max_sandbox_count (3)
    busy    4 cpu 16G   1 running, 2 cpu, 2 GiB         cpu-allocated ceiling 80 % is near
    idle   16 cpu 64G   -                               reservation res-idle
    drain  16 cpu 64G   -                               lingering
    two    16 cpu 64G   1 running                       reservation res-two, assigned sbx-1
    near   64 cpu 256G  2 running                       reservation res-near
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner, Result
from scheduler.cli import explain as explain_module
from scheduler.cli import nodes as nodes_module
from scheduler.cli.main import main

from scheduler import Limits, NoNodesAvailable, Policy, Request, Scheduler
from tests.helpers import hb, snapshot_keys

GIB = 1024**3
CELL = "cli"
REQUEST = Request.cold(1, 1024)


class Fleet:
    def __init__(self, url: str, s: Scheduler) -> None:
        self.url = url
        self.s = s

    def run(self, *args: str, env: dict[str, str | None] | None = None) -> Result:
        runner = CliRunner(env={"SCHEDULER_REDIS_ADDR": None, **(env or {})})
        return runner.invoke(main, [*args[:1], "--redis", self.url, "--cell", CELL, *args[1:]])

    def json(self, *args: str) -> Any:
        result = self.run(*args, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def dump(self) -> dict[bytes, Any]:
        """Every key with its content (to prove nothing was written; not DUMP,
        whose bytes follow a hash's internal order, which reads may rehash)."""
        return snapshot_keys(self.s.client)


@pytest.fixture
def fleet(real_url: str) -> Iterator[Fleet]:
    s = Scheduler.connect(real_url, cell=CELL)
    s.sync_policy(Policy(limits=Limits(max_sandbox_count=3, max_cpu_allocated_percent=80)))
    s.advance_clock(0, "freeze")
    s.heartbeat(hb("stale"))
    s.advance_clock(40_000)
    s.heartbeat(hb("full", sandbox_count=3, allocated_cpu=3, allocated_memory_bytes=3 * GIB))
    s.heartbeat(
        hb(
            "busy",
            cpu=4,
            mem_gib=16,
            sandbox_count=1,
            allocated_cpu=2,
            allocated_memory_bytes=2 * GIB,
        )
    )
    s.heartbeat(hb("idle"))
    s.heartbeat(hb("drain"))
    s.set_lingering("drain", True)
    s.heartbeat(hb("two", sandbox_count=1))
    s.heartbeat(hb("near", cpu=64, mem_gib=256, sandbox_count=2))
    # least_loaded picks the lowest pressure, then fewer running.
    assert s.schedule(REQUEST, reservation_id="res-near").node_id == "near"
    assert s.schedule(REQUEST, reservation_id="res-idle").node_id == "idle"
    placed = s.schedule(REQUEST, reservation_id="res-two")
    assert placed.node_id == "two"
    s.assign("sbx-1", "two", placed.endpoint, "res-two")
    yield Fleet(real_url, s)
    s.close()


def row(output: str, first_cell: str) -> str:
    """The table line whose first cell is ``first_cell``."""
    return next(
        line
        for line in output.splitlines()
        if line.startswith("│") and line.split("│")[1].strip() == first_cell
    )


# -- nodes -------------------------------------------------------------------
def test_nodes_json_lists_every_node_most_pressed_first(fleet: Fleet) -> None:
    got = fleet.json("nodes")
    assert {n["node_id"] for n in got} == {"stale", "full", "busy", "idle", "drain", "two", "near"}
    pressures = [n["pressure"] for n in got]
    assert pressures == sorted(pressures, reverse=True)
    by_id = {n["node_id"]: n for n in got}
    busy = by_id["busy"]
    assert (busy["status"], busy["cpu_capacity"], busy["cpu_projected"]) == ("READY", 4, 2)
    assert busy["memory_capacity_bytes"] == 16 * GIB
    assert busy["memory_projected_bytes"] == 2 * GIB
    assert busy["pressure"] == 0.5
    assert (busy["sandbox_count"], busy["pending_reservations"]) == (1, 0)
    idle = by_id["idle"]
    assert (idle["pending_reservations"], idle["cpu_projected"]) == (1, 1)
    assert idle["memory_projected_bytes"] == GIB
    assert by_id["stale"]["status"] == "UNHEALTHY"
    assert by_id["stale"]["heartbeat_age_ms"] == 40_000
    assert by_id["drain"]["status"] == "LINGERING"
    assert by_id["full"]["heartbeat_age_ms"] == 0
    rooms = {c["name"]: c["headroom"] for c in by_id["full"]["ceilings"]}
    assert rooms["max_sandbox_count"] == 0
    # the same numbers the client API gives
    assert got == [
        msgspec.to_builtins(v)
        for v in sorted(fleet.s.nodes(), key=lambda v: (-v.pressure, v.node_id))
    ]


def test_nodes_table_shows_usage_headroom_and_heartbeat_age(fleet: Fleet) -> None:
    result = fleet.run("nodes", "-o", "wide")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "room sbx" in out and "(≤3)" in out and "(≤80%)" in out
    busy = row(out, "busy").split("│")
    assert [c.strip() for c in busy[1:7]] == ["busy", "READY", "2+0+0/4", "2+0+0/16", "1/0/0", "0"]
    assert busy[7].strip() == "0.50" and busy[8].strip() == "█████░░░░░"
    # room: 3 - 1 sandboxes; 80 % - 2/4 cpu = 30 points
    assert [c.strip() for c in busy[9:12]] == ["2", "30%", "0.0s ago"]
    idle = [c.strip() for c in row(out, "idle").split("│")]
    assert idle[3:7] == ["0+0+1/16", "0+0+1/64", "0/0/0", "1"]
    assert "UNHEALTHY (stale heartbeat)" in row(out, "stale")
    assert "40s ago" in row(out, "stale")
    assert "LINGERING" in row(out, "drain")
    assert [c.strip() for c in row(out, "full").split("│")][9] == "0"
    assert "7 nodes, 3 pending reservations" in out
    lines = [line for line in out.splitlines() if line.startswith("│")]
    order = [line.split("│")[1].strip() for line in lines]
    assert order.index("busy") < order.index("full") < order.index("idle")


def test_nodes_watch_refreshes_until_ctrl_c(
    fleet: Fleet,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 1:  # the fleet changes between two frames
            fleet.s.heartbeat(hb("idle", sandbox_count=2))
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(nodes_module, "_pause", pause)
    result = fleet.run("nodes", "--watch", "--interval", "0.5", "--json")
    assert result.exit_code == 0, result.output
    frames = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(frames) == 2 and pauses == [0.5, 0.5]
    counts = [{n["node_id"]: n["sandbox_count"] for n in f}["idle"] for f in frames]
    assert counts == [0, 2]

    pauses.clear()
    result = fleet.run("nodes", "--watch")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("nodes of cell cli") == 2


def test_nodes_watch_keeps_going_through_an_outage(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler.domain.errors import StoreUnavailable

    real_read = nodes_module.read_nodes
    reads: list[int] = []

    def read(target: Any) -> Any:
        reads.append(1)
        if len(reads) == 2:
            raise StoreUnavailable("Redis at somewhere is unreachable: boom")
        return real_read(target)

    def pause(seconds: float) -> None:
        if len(reads) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(nodes_module, "read_nodes", read)
    monkeypatch.setattr(nodes_module, "_pause", pause)
    result = fleet.run("nodes", "--watch")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("nodes of cell cli") == 3
    # the frame that could not be refreshed says so, and since when
    assert "NOT REFRESHED: nodes of cell cli" in result.stdout
    assert re.search(
        r"NOT REFRESHED since \d\d:\d\d:\d\d \([\d.]+s\): Redis at somewhere is "
        r"unreachable: boom \(retrying every 1s\)",
        result.stdout,
    ), result.stdout
    assert result.stdout.count("NOT REFRESHED since") == 1
    assert result.stdout.count("refreshed ") == 2  # the two frames that were


# -- explain -----------------------------------------------------------------
def test_explain_gives_every_node_its_verdict_with_the_exact_reason(fleet: Fleet) -> None:
    got = fleet.json("explain", "--cpu", "2", "--memory-mb", "2048")
    assert (got["cpu"], got["memory_bytes"], got["refusal"]) == (2, 2 * GIB, None)
    v = {x["node_id"]: x for x in got["verdicts"]}
    assert got["chosen"] == "idle" and v["idle"]["verdict"] == "chosen"
    assert v["idle"]["rank"] == 1 and v["two"]["rank"] == 2 and v["two"]["verdict"] == "eligible"
    # same pressure (3/16 cpu) and starting (1 pending each); idle runs fewer
    assert v["idle"]["pressure"] == v["two"]["pressure"] == 3 / 16
    assert (v["idle"]["starting"], v["idle"]["running"]) == (1, 0)
    assert (v["two"]["starting"], v["two"]["running"]) == (1, 1)
    assert v["near"]["ceiling"] == {
        "name": "max_sandbox_count",
        "limit": 3,
        "current": 2,
        "pending": 1,
        "request": 1,
        "total": 4,
        "capacity": None,
        "percent": None,
    }
    assert v["near"]["detail"] == ("max_sandbox_count: 2 current + 1 pending + 1 requested = 4 > 3")
    assert v["full"]["ceiling"]["current"] == 3 and v["full"]["ceiling"]["pending"] == 0
    assert v["busy"]["ceiling"] == {
        "name": "max_cpu_allocated_percent",
        "limit": 80,
        "current": 2,
        "pending": 0,
        "request": 2,
        "total": 4,
        "capacity": 4,
        "percent": 100.0,
    }
    assert v["busy"]["reason"] == "at max_cpu_allocated_percent (80)"
    assert v["stale"]["reason"] == "stale heartbeat"
    assert v["stale"]["heartbeat_age_ms"] == 40_000
    assert v["stale"]["detail"] == "stale heartbeat: last seen 40s ago, report_ttl 30s"
    assert v["drain"]["reason"] == "lingering"
    assert [x["node_id"] for x in got["verdicts"]][:2] == ["idle", "two"]

    table = fleet.run("explain", "--cpu", "2", "--memory-mb", "2048")
    assert table.exit_code == 0, table.output
    assert "would place on idle" in table.stdout
    assert "max_sandbox_count: 2 current + 1 pending + 1 requested = 4 > 3" in table.stdout
    assert (
        "max_cpu_allocated_percent: 2 current + 0 pending + 2 requested = 4 of 4 cpu = 100% > 80%"
    ) in table.stdout


def test_explain_shows_capacity_and_reserves_nothing(fleet: Fleet) -> None:
    before = fleet.dump()
    got = fleet.json("explain", "--memory-mb", str(62 * 1024))
    assert fleet.dump() == before
    busy = next(x for x in got["verdicts"] if x["node_id"] == "busy")
    assert busy["reason"] == "insufficient memory"
    assert busy["detail"] == "insufficient memory: 64 GiB projected > 16 GiB × 1 overcommit"


def test_explain_agrees_with_schedule(fleet: Fleet) -> None:
    for strategy in ("least_loaded", "round_robin"):
        got = fleet.json("explain", "--cpu", "1", "--memory-mb", "1024", "--strategy", strategy)
        assert got["strategy"] == strategy
        assert got["chosen"] == fleet.s.schedule(REQUEST, strategy=strategy).node_id
    # (the table says what round_robin picks from, and when least_loaded decides)
    words = " ".join(fleet.run("explain", "--cpu", "1", "--strategy", "round_robin").stdout.split())
    assert "round_robin takes the first eligible of the 64 nodes after the one it chose" in words
    assert "least_loaded's choice when none of them is eligible" in words
    got = fleet.json("explain", "--cpu", "100")
    assert got["chosen"] is None
    assert all(v["verdict"] == "excluded" for v in got["verdicts"])
    with pytest.raises(NoNodesAvailable) as refused:
        fleet.s.schedule(Request.cold(100, None))
    assert got["refusal"] == refused.value.message
    table = fleet.run("explain", "--cpu", "100")
    assert f"would refuse: {refused.value.message}" in table.stdout


# -- reservations and bindings -------------------------------------------------
def test_reservations_list_and_filter(fleet: Fleet) -> None:
    got = fleet.json("reservations")
    assert {r["reservation_id"]: (r["node_id"], r["state"], r["sandbox_id"]) for r in got} == {
        "res-near": ("near", "pending", None),
        "res-idle": ("idle", "pending", None),
        "res-two": ("two", "assigned", "sbx-1"),
    }
    assert [r["reservation_id"] for r in fleet.json("reservations", "--node", "idle")] == [
        "res-idle"
    ]
    table = fleet.run("reservations")
    assert table.exit_code == 0
    two = [c.strip() for c in row(table.stdout, "res-two").split("│")]
    assert two[2:9] == ["two", "assigned", "1", "1 GiB", "sbx-1", "0.0s ago", "in 10m00s"]
    unknown = fleet.run("reservations", "--node", "ghost")
    assert unknown.exit_code == 1
    assert unknown.stderr == "Error: node ghost is not known in cell cli at " + fleet.url + "\n"


def test_reservation_show_and_cancel(fleet: Fleet) -> None:
    shown = fleet.json("reservations", "show", "res-two")
    assert shown["key"] == "sched:{cli}:res:res-two"
    assert shown["reservation"]["sandbox_id"] == "sbx-1"
    assert shown["reservation"]["memory_bytes"] == GIB
    table = fleet.run("reservations", "show", "res-idle")
    assert "redis-cli HGETALL 'sched:{cli}:res:res-idle'" in table.stdout
    assert "in 90s" in row(table.stdout, "expires")  # unassigned_reservation_ttl: unassigned

    done = fleet.run("reservations", "cancel", "res-idle")
    assert done.exit_code == 0, done.output
    assert "cancelled reservation res-idle on node idle" in done.stdout
    assert next(n for n in fleet.s.nodes() if n.node_id == "idle").pending_reservations == 0
    ended = fleet.json("reservations", "show", "res-idle")["reservation"]
    assert ended["state"] == "cancelled" and ended["ended_ms"] is not None
    # idempotent: a second cancel exits 0 and says how it ended
    again = fleet.run("reservations", "cancel", "res-idle")
    assert (again.exit_code, again.stderr) == (0, ""), again.output
    assert "reservation res-idle on node idle was already cancelled" in again.stdout
    assert fleet.json("reservations", "cancel", "res-idle")["state"] == "already cancelled"
    assert fleet.json("reservations", "cancel", "res-near") == {
        "reservation_id": "res-near",
        "node_id": "near",
        "state": "cancelled",
    }


def test_group_options_reach_the_subcommand(fleet: Fleet) -> None:
    runner = CliRunner(env={"SCHEDULER_REDIS_ADDR": None})
    before = runner.invoke(
        main, ["reservations", "--redis", fleet.url, "--cell", CELL, "--json", "show", "res-two"]
    )
    after = runner.invoke(
        main, ["reservations", "show", "res-two", "--redis", fleet.url, "--cell", CELL, "--json"]
    )
    assert before.exit_code == after.exit_code == 0, before.output + after.output
    assert json.loads(before.stdout) == json.loads(after.stdout)


@pytest.mark.parametrize("command", [["show"], ["cancel"]])
def test_unknown_reservation(fleet: Fleet, command: list[str]) -> None:
    result = fleet.run("reservations", *command, "nope")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: reservation nope not found")
    assert result.stderr.count("\n") == 1 and result.stdout == ""


def test_bindings_lookup(fleet: Fleet) -> None:
    got = fleet.json("bindings", "lookup", "sbx-1")
    assert got["key"] == "sched:{cli}:bind:sbx-1"
    b = got["binding"]
    assert (b["node_id"], b["endpoint"], b["reservation_id"], b["listed"]) == (
        "two",
        "two.local:5000",
        "res-two",
        False,
    )
    assert b["expires_ms"] - got["now_ms"] == 30_000
    table = fleet.run("bindings", "lookup", "sbx-1")
    assert "two.local:5000" in row(table.stdout, "endpoint")
    assert "in 30s" in row(table.stdout, "expires")
    missing = fleet.run("bindings", "lookup", "sbx-404", "--json")
    assert missing.exit_code == 1
    assert json.loads(missing.stdout)["state"] == "missing"
    assert missing.stderr == (
        f"Error: sandbox sbx-404 has no binding in cell cli at {fleet.url} "
        "(never assigned, or its record is gone)\n"
    )


# -- policy ------------------------------------------------------------------
def test_policy_show(fleet: Fleet) -> None:
    stored = fleet.s.policy()
    assert fleet.json("policy", "show") == msgspec.to_builtins(stored)
    out = fleet.run("policy", "show").stdout
    assert "80%" in row(out, "max_cpu_allocated_percent")
    assert "3" in row(out, "max_sandbox_count")
    assert "no ceiling" in row(out, "max_sandbox_starting_count")
    assert "30s" in row(out, "report_ttl")


def test_policy_set_changes_only_what_is_given(fleet: Fleet) -> None:
    before = fleet.s.policy()
    assert before is not None
    result = fleet.run(
        "policy",
        "set",
        "--limit",
        "max_sandbox_count=5",
        "--limit",
        "max_cpu_allocated_percent=0",
        "--report-ttl",
        "1m",
        "--json",
    )
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["outcome"] == "overwritten"
    assert got["changed"] == {
        "max_sandbox_count": ["3", "5"],
        "max_cpu_allocated_percent": ["80", ""],
        "report_ttl_ms": ["30000", "60000"],
    }
    after = fleet.s.policy()
    assert after == msgspec.structs.replace(
        before, report_ttl_ms=60_000, limits=Limits(max_sandbox_count=5)
    )
    assert got["policy"] == msgspec.to_builtins(after)
    assert "restarted replica refuses to start" in result.stderr
    # the frozen drill clock survived the overwrite: ages are still exact
    assert next(n for n in fleet.s.nodes() if n.node_id == "stale").heartbeat_age_ms == 40_000
    # and the new ceiling decides at once: near (2 running + 1 pending) takes one more
    assert fleet.json("explain", "--cpu", "1")["chosen"] == "near"


def test_policy_set_initialises_an_empty_cell(real_url: str) -> None:
    result = CliRunner().invoke(
        main,
        [
            "policy",
            "set",
            "--redis",
            real_url,
            "--cell",
            "fresh",
            "--strategy",
            "round_robin",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["outcome"] == "created"
    assert Scheduler.connect(real_url, cell="fresh").policy() == Policy(strategy="round_robin")


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "nothing to set"),
        (["--limit", "bogus=1"], "'bogus=1' is not NAME=VALUE"),
        (["--limit", "max_sandbox_count"], "is not NAME=VALUE"),
        (["--report-ttl", "5x"], "'5x' is not a duration"),
        (["--reservation-ttl", "0s"], "'0s' is shorter than 1ms"),
        (["--overcommit-cpu", "0"], "--overcommit-cpu"),
        (["--strategy", "fastest"], "'fastest' is not one of"),
    ],
)
def test_policy_set_bad_arguments_change_nothing(
    fleet: Fleet,
    args: list[str],
    message: str,
) -> None:
    before = fleet.dump()
    result = fleet.run("policy", "set", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert fleet.dump() == before


# Node "x": 8 cpu, 16 GiB; 2 running + 1 paused + 1 starting (reported), 4 cpu / 8 GiB
# allocated, 2 cpu / 2 GiB paused, 70 % cpu and 12 GiB memory used; plus one pending
# reservation of 1 cpu / 1 GiB.  The request is 1 cpu / 1 GiB again.
@pytest.mark.parametrize(
    "name, limit, parts, percent, text",
    [
        (
            "max_sandbox_starting_count",
            2,
            (1, 1, 1, 3),
            None,
            "max_sandbox_starting_count: 1 current + 1 pending + 1 requested = 3 > 2",
        ),
        # current = 2 running + 1 starting + 1 paused: a starting sandbox counts
        (
            "max_sandbox_count_including_paused",
            5,
            (4, 1, 1, 6),
            None,
            "max_sandbox_count_including_paused: 4 current + 1 pending + 1 requested = 6 > 5",
        ),
        (
            "max_sandbox_count",
            4,
            (3, 1, 1, 5),
            None,
            "max_sandbox_count: 3 current + 1 pending + 1 requested = 5 > 4",
        ),
        (
            "max_allocated_cpu_including_paused",
            7,
            (6, 1, 1, 8),
            None,
            "max_allocated_cpu_including_paused: 6 current + 1 pending + 1 requested = 8 > 7",
        ),
        (
            "max_allocated_memory_bytes_including_paused",
            11 * GIB,
            (10 * GIB, GIB, GIB, 12 * GIB),
            None,
            "max_allocated_memory_bytes_including_paused: 10 GiB current + 1 GiB pending + "
            "1 GiB requested = 12 GiB > 11 GiB",
        ),
        (
            "max_memory_allocated_percent",
            60,
            (8 * GIB, GIB, GIB, 10 * GIB),
            62.5,
            "max_memory_allocated_percent: 8 current + 1 pending + 1 requested = 10 of 16 GiB = "
            "62.5% > 60%",
        ),
        (
            "max_cpu_used_percent",
            50,
            (70, 0, 0, 70),
            70.0,
            "max_cpu_used_percent: observed 70% > 50% (latest snapshot)",
        ),
        (
            "max_memory_used_percent",
            50,
            (12 * GIB, 0, 0, 12 * GIB),
            75.0,
            "max_memory_used_percent: observed 75% > 50% (latest snapshot)",
        ),
    ],
)
def test_explain_breaks_every_kind_of_ceiling_down(
    real_url: str,
    name: str,
    limit: int,
    parts: tuple[int, int, int, int],
    percent: float | None,
    text: str,
) -> None:
    s = Scheduler.connect(real_url, cell="ceil")
    s.sync_policy(Policy())
    s.heartbeat(
        hb(
            "x",
            cpu=8,
            mem_gib=16,
            sandbox_count=2,
            sandbox_starting_count=1,
            paused_sandbox_count=1,
            allocated_cpu=4,
            allocated_memory_bytes=8 * GIB,
            paused_allocated_cpu=2,
            paused_allocated_memory_bytes=2 * GIB,
            cpu_percent=70,
            memory_used_bytes=12 * GIB,
        )
    )
    s.schedule(REQUEST)
    s.sync_policy(Policy(limits=Limits(**{name: limit})), overwrite=True)
    result = CliRunner().invoke(
        main,
        [
            "explain",
            "--redis",
            real_url,
            "--cell",
            "ceil",
            "--cpu",
            "1",
            "--memory-mb",
            "1024",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    (x,) = json.loads(result.stdout)["verdicts"]
    assert x["reason"] == f"at {name} ({limit})"
    c = x["ceiling"]
    assert (c["name"], c["limit"], c["percent"]) == (name, limit, percent)
    assert (c["current"], c["pending"], c["request"], c["total"]) == parts
    assert x["detail"] == text
    s.close()


def test_linger_drains_a_node_and_off_undoes_it(fleet: Fleet) -> None:
    done = fleet.json("linger", "idle")
    assert done == {"node_id": "idle", "lingering": True, "was_lingering": False}
    by_id = {n["node_id"]: n for n in fleet.json("nodes")}
    assert by_id["idle"]["status"] == "LINGERING"
    verdicts = {
        v["node_id"]: v
        for v in fleet.json("explain", "--cpu", "1", "--memory-mb", "1024")["verdicts"]
    }
    assert verdicts["idle"]["reason"] == "lingering"
    assert fleet.json("linger", "idle", "--off")["was_lingering"] is True
    assert {n["node_id"]: n for n in fleet.json("nodes")}["idle"]["status"] == "READY"
    missing = fleet.run("linger", "ghost")
    assert missing.exit_code == 1 and "node is not in scheduler node list" in missing.stderr


def test_explain_on_a_large_cell_runs_only_when_asked_to(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """explain reads every node in one Redis call: above EXPLAIN_FLEET_MAX
    nodes it says what that would hold and runs only with --whole-fleet."""
    monkeypatch.setattr(explain_module, "EXPLAIN_FLEET_MAX", 5)  # (the fleet has 7)
    refused = fleet.run("explain", "--cpu", "1", "--json")
    assert refused.exit_code != 0
    error = json.loads(refused.stdout)["error"]
    assert "reads all 7 nodes of the cell in one Redis call" in error
    assert "--whole-fleet" in error
    got = fleet.json("explain", "--cpu", "1", "--whole-fleet")
    assert len(got["verdicts"]) == 7
    monkeypatch.setattr(explain_module, "EXPLAIN_FLEET_MAX", 7)
    assert len(fleet.json("explain", "--cpu", "1")["verdicts"]) == 7
