"""schedctl simulate with CliRunner: real Redis, the embedded default, bad arguments."""

from __future__ import annotations

import json
import re

import pytest
import redis
from click.testing import CliRunner, Result
from scheduler.cli.main import main

SMALL = [
    "--nodes",
    "3",
    "--creates",
    "30",
    "--max-sandbox-count",
    "4",
    "--rate",
    "0",
    "--heartbeat-interval",
    "0.05",
    "--heartbeat-lag",
    "0.02",
    "--create-delay",
    "0.01",
]


def invoke(*args: str) -> Result:
    return CliRunner(env={"SCHEDULER_REDIS_ADDR": None}).invoke(main, ["simulate", *args])


def test_json_on_real_redis_shows_the_ceiling_held(real_url: str) -> None:
    result = invoke(*SMALL, "--replicas", "3", "--redis", real_url, "--cell", "simcli", "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)  # stdout is only JSON
    assert (got["placed"], got["refused"], got["failed_creates"]) == (12, 18, 0)
    assert (got["max_node_count"], got["ceiling"], got["ceiling_held"]) == (4, 4, True)
    assert got["refusals"] == {
        "no nodes available: 0/3 nodes available: 3 at max_sandbox_count (4)": 18
    }
    assert got["settled"] and got["scenario"]["replicas"] == 3
    assert [n["sandbox_count"] for n in got["final_view"]] == [4, 4, 4]
    assert got["cell"] == "simcli" and got["target"] == real_url
    # the cell is kept for schedctl
    nodes = CliRunner().invoke(main, ["nodes", "--redis", real_url, "--cell", "simcli", "--json"])
    assert sorted(n["node_id"] for n in json.loads(nodes.stdout)) == [
        "node-01",
        "node-02",
        "node-03",
    ]


def test_table_output_has_the_node_table_and_the_summary(real_url: str) -> None:
    result = invoke(*SMALL, "--redis", real_url, "--node-shapes", "8x16G")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith("simulated 3 nodes (8x16G), 3 replicas, 6 gateway workers: 30 creates")
    assert "nodes of cell sim at " + real_url in out
    for node in ("node-01", "node-02", "node-03"):
        assert re.search(rf"^{node} +READY +0\.50 ", out, re.M), out
    assert "12 of 30 creates" in out
    assert "18 × no nodes available: 0/3 nodes available: 3 at max_sandbox_count (4)" in out
    assert "4 on node-01 against max_sandbox_count 4: the ceiling held" in out
    assert "0.500 on node-01" in out  # 4 cpu of 8
    # where it ran, first; and how to look at the cell it kept, with the real URL
    lines = result.stderr.splitlines()
    assert lines[0] == f"simulate: on {real_url}, cell sim"
    assert lines[-1] == f"the cell is kept: schedctl nodes --redis {real_url} --cell sim"


def test_progress_lines_when_stderr_is_not_a_terminal(
    real_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler.cli import simulate as simulate_module

    monkeypatch.setattr(simulate_module, "PROGRESS_EVERY_S", 0.0)  # a line per create
    result = invoke(*SMALL, "--redis", real_url, "--json")
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # stdout keeps its one document
    progress = [x for x in result.stderr.splitlines() if re.match(r"simulate: \d+/30 creates", x)]
    assert progress, result.stderr
    last = re.match(
        r"simulate: (\d+)/30 creates, placed (\d+), refused (\d+) \(\d+s\)$", progress[-1]
    )
    assert last is not None, progress[-1]
    done, placed, refused = map(int, last.groups())
    assert placed + refused <= done <= 30


def test_an_occupied_cell_needs_reset(real_url: str) -> None:
    assert invoke(*SMALL, "--redis", real_url).exit_code == 0
    again = invoke(*SMALL, "--redis", real_url)
    assert (again.exit_code, again.stdout) == (1, "")
    assert again.stderr.splitlines()[-1] == (
        f"Error: cell 'sim' at {real_url} already holds scheduler state; pass --reset to "
        "wipe it, or choose another cell"
    )
    assert invoke(*SMALL, "--redis", real_url, "--reset").exit_code == 0


def test_runs_on_the_embedded_store_by_default() -> None:
    result = invoke(*SMALL, "--cell", "embedded-cli", "--reset", "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["target"].startswith("embedded in-process store")
    assert (got["placed"], got["ceiling_held"]) == (12, True)


def test_counter_mode_and_round_robin(real_url: str) -> None:
    result = invoke(
        *SMALL, "--no-roster", "--strategy", "round_robin", "--redis", real_url, "--json"
    )
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["scenario"]["roster"] is False and got["scenario"]["strategy"] == "round_robin"
    assert (got["placed"], got["max_node_count"], got["settled"]) == (12, 4, True)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--node-shapes", "lots"], "Invalid value for '--node-shapes'"),
        (["--nodes", "0"], "Invalid value for '--nodes'"),
        (["--fail-rate", "2"], "Invalid value for '--fail-rate'"),
        (["--strategy", "best"], "Invalid value for '--strategy'"),
        (["--cell", "a:b"], "cell must be 1-64 of letters"),
    ],
)
def test_bad_arguments_exit_2_and_write_nothing(
    real_url: str,
    args: list[str],
    message: str,
) -> None:
    result = invoke(*SMALL, "--redis", real_url, *args)
    assert (result.exit_code, result.stdout) == (2, "")
    assert message in result.stderr
    assert redis.Redis.from_url(real_url).dbsize() == 0
