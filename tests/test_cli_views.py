"""schedctl's views at 80, 120 and 200 columns (rich renders into a string).

The fleet of tests/test_cli_commands.py, plus a node with a long id: at every
width each node is one line with its id whole, no line is wider than the
terminal, and explain shows every reason whole under its table.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator

import pytest
from rich.console import Console, RenderableType
from scheduler.cli.explain import explain_report, report_table
from scheduler.cli.nodes import compact_table, nodes_table, read_nodes, watch_frame
from scheduler.cli.options import Target

from scheduler import Request, Scheduler
from tests.helpers import hb
from tests.test_cli_commands import CELL, Fleet, fleet  # noqa: F401 (the fixture)

WIDTHS = [80, 120, 200]
LONG_ID = "rack-17.gpu-node-0042.eu-west"


def render(thing: RenderableType, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(thing)
    return console.export_text()


@pytest.fixture
def target(fleet: Fleet) -> Iterator[Target]:  # noqa: F811
    fleet.s.heartbeat(hb(LONG_ID, sandbox_count=1))
    t = Target()
    t.redis, t.cell = fleet.url, CELL
    t._scheduler = Scheduler.connect(fleet.url, cell=CELL)
    yield t
    t._scheduler.close()


def node_lines(text: str, ids: list[str]) -> dict[str, list[str]]:
    lines = text.splitlines()
    return {i: [line for line in lines if re.match(rf"{re.escape(i)}\s", line)] for i in ids}


@pytest.mark.parametrize("width", WIDTHS)
def test_nodes_fits_the_terminal_one_line_per_node_id_whole(target: Target, width: int) -> None:
    views, policy = read_nodes(target)
    text = render(compact_table(views, policy, target.where, width), width)
    assert max(len(line) for line in text.splitlines()) <= width
    ids = [v.node_id for v in views]
    assert LONG_ID in ids and len(ids) == 8
    rows = node_lines(text, ids)
    assert all(len(found) == 1 for found in rows.values()), rows
    assert "…" not in text
    header = next(line for line in text.splitlines() if line.startswith("NODE"))
    assert header.split() == ["NODE", "STATUS", "PRESSURE", "SANDBOXES", "ROOM", "HEARTBEAT"]
    # status, pressure (and its bar where it fits), sandboxes against
    # max_sandbox_count, room under the tightest ceiling, heartbeat age
    row = r"^{} +{} +{}(?: [█░]{{5}})? +{} +{} +{}$"
    named = width > 80  # at 80 the long id leaves no room for the bar or the names
    full = row.format("full", "READY", r"0\.19", "3/3", "sbx 0" if named else "0", r"0\.0s ago")
    assert re.search(full, text, re.M), text
    idle = row.format("idle", "READY", r"0\.06", "1/3", "[^ ]+ [^ ]+" if named else ".+", ".+")
    assert re.search(idle, text, re.M), text  # the pending reservation counts
    stale = row.format("stale", "UNHEALTHY", r"0\.00", "0/3", ".+", "40s ago")
    assert re.search(stale, text, re.M), text
    busy_room = "cpu alloc 30%" if named else "30%"  # 2 of 4 cpu against 80 %
    busy = row.format("busy", "READY", r"0\.50", "1/3", busy_room, r"0\.0s ago")
    assert re.search(busy, text, re.M), text
    assert (" █" in text) == named


@pytest.mark.parametrize("width", WIDTHS)
def test_watch_says_when_it_refreshed_and_marks_a_stale_view(target: Target, width: int) -> None:
    views, policy = read_nodes(target)
    fresh = render(
        watch_frame(compact_table(views, policy, "x", width), 3600.0, 1.0, None, 3600.5), width
    )
    assert re.search(r"^refreshed \d\d:\d\d:\d\d, every 1s$", fresh, re.M), fresh
    assert "NOT REFRESHED" not in fresh
    stale = render(
        watch_frame(
            compact_table(views, policy, "x", width), 3600.0, 1.0, "Redis at r is down", 3612.0
        ),
        width,
    )
    assert stale.startswith("NOT REFRESHED: nodes of x")
    flat = " ".join(stale.split())
    assert re.search(
        r"NOT REFRESHED since \d\d:\d\d:\d\d \(12s\): Redis at r is down \(retrying every 1s\)",
        flat,
    ), stale
    assert max(len(line) for line in stale.splitlines()) <= width


def test_wide_has_every_column_with_a_header(target: Target) -> None:
    views, policy = read_nodes(target)
    text = render(nodes_table(views, policy, target.where), 200)
    for header in ("alloc+paused+resv/cap", "run/start/paused", "load", "room sbx", "(≤80%)"):
        assert header in text
    assert max(len(line) for line in text.splitlines()) <= 200


@pytest.mark.parametrize("width", WIDTHS)
def test_explain_shows_every_reason_whole(target: Target, width: int) -> None:
    report = explain_report(target.scheduler, Request.cold(1, 1024))
    text = render(report_table(report, "x", width), width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text
    why = text[text.index("\nwhy:") :]
    flat = " ".join(why.split())
    for v in report.verdicts:
        assert f"{v.node_id} {' '.join(v.detail.split())}" in flat, (v.node_id, v.detail, why)
        # in the table, one line per node with its id whole
        assert len(node_lines(text[: text.index("\nwhy:")], [v.node_id])[v.node_id]) == 1
    reasons = {v.node_id: v.detail for v in report.verdicts}
    assert reasons["full"] == "max_sandbox_count: 3 current + 0 pending + 1 requested = 4 > 3"
    assert reasons["stale"] == "stale heartbeat: last seen 40s ago, report_ttl 30s"
    header = next(line for line in text.splitlines() if line.startswith("node "))
    counts = ["starting", "running", "paused"] if width >= 120 else []
    assert header.split() == ["node", "verdict", "status", "pressure", *counts, "cpu", "mem", "GiB"]


def test_a_watch_screen_shows_the_most_pressed_that_fit_and_says_so(target: Target) -> None:
    views, policy = read_nodes(target)
    text = render(compact_table(views, policy, "x", 80, max_rows=3), 80)
    ids = [v.node_id for v in views]  # most pressed first
    shown = [i for i in ids if node_lines(text, [i])[i]]
    assert shown == ids[:3]
    assert "the 3 most pressed of 8 shown (fit the screen)" in " ".join(text.split())
    everything = render(compact_table(views, policy, "x", 80, max_rows=8), 80)
    assert "most pressed of" not in everything
