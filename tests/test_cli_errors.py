"""schedctl failure paths: one line on stderr, exit 1 (failure) or 2 (bad argument);
stdout empty, or with --json one document ``{"error": ...}``; where Redis comes from
(flag, environment, an explicit ``--redis embedded``; no target is an error)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from scheduler.cli.main import main

from scheduler import Policy, Scheduler
from scheduler.testing.redis_server import free_port
from tests.helpers import hb

EVERY_COMMAND = [
    ["nodes"],
    ["nodes", "--watch"],
    ["reservations"],
    ["reservations", "show", "r1"],
    ["reservations", "cancel", "r1"],
    ["bindings", "lookup", "s1"],
    ["explain", "--cpu", "1", "--memory-mb", "512"],
    ["policy", "show"],
    ["policy", "set", "--strategy", "random"],
    ["cells"],
    ["cells", "delete", "c1", "--yes"],
    ["nodes", "forget", "n1"],
    ["replicas"],
    ["linger", "n1"],
    ["doctor"],
    ["simulate", "--nodes", "1", "--creates", "1"],
]
#: Commands that read one cell's policy (the others list cells, or write one).
CELL_READS = [
    c
    for c in EVERY_COMMAND
    if c[0] not in ("simulate", "cells", "replicas", "linger") and c[:2] != ["policy", "set"]
]


def invoke(args: list[str], env: dict[str, str | None] | None = None) -> tuple[int, str, str]:
    result = CliRunner(env={"SCHEDULER_REDIS_ADDR": None, **(env or {})}).invoke(main, args)
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), repr(result.exception)
    return result.exit_code, result.stdout, result.stderr


def with_options(command: list[str], *options: str) -> list[str]:
    """Options after the leaf command (subcommands take them as well as their groups)."""
    return [*command, *options]


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=" ".join)
@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_redis_down_is_one_line_and_exit_1(command: list[str], as_json: bool) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    code, out, err = invoke(with_options(command, "--redis", url, *(["--json"] * as_json)))
    assert code == 1
    lines = err.splitlines()
    if command[0] == "simulate":  # it says where it runs first
        assert lines.pop(0) == f"simulate: on {url}, cell sim"
    assert len(lines) == 1, err
    assert lines[0].startswith(f"Error: Redis at {url} is unreachable: ")
    if as_json:
        assert json.loads(out) == {"error": lines[0].removeprefix("Error: ")}
    else:
        assert out == ""


@pytest.mark.parametrize(
    "command", CELL_READS + [["policy", "set", "--strategy", "random"]], ids=" ".join
)
def test_cell_without_policy_says_how_to_initialise_it(real_url: str, command: list[str]) -> None:
    code, out, err = invoke(with_options(command, "--redis", real_url, "--cell", "empty"))
    if command[:2] in (["policy", "set"],):
        assert code == 0  # setting a policy is how a cell is initialised
        return
    assert (code, out) == (1, "")
    assert err == (
        "Error: cell policy is not initialised: start a replica or run `schedctl policy set`\n"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["nodes", "--redis", "http://example.com"], "redis_addr must be host:port or a redis://"),
        (["nodes", "--cell", "a{b}"], "cell must be 1-64 of letters"),
        (["reservations", "show", "a:b"], "reservation_id contains ':'"),
        (["reservations", "cancel", " "], "reservation_id is required"),
        (["reservations", "--node", "x/../{y}"], "node_id contains '{'"),
        (["bindings", "lookup", "a b"], "sandbox_id contains ' '"),
    ],
)
def test_bad_ids_and_urls_exit_2_naming_the_field(
    real_url: str,
    args: list[str],
    message: str,
) -> None:
    if "--redis" not in args:
        args = [*args, "--redis", real_url]
    Scheduler.connect(real_url).sync_policy(Policy())
    code, out, err = invoke(args)
    assert (code, out) == (2, "")
    assert err.startswith(f"Error: {message}"), err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["explain", "--cpu", "-1"], "Invalid value for '--cpu'"),
        (["explain", "--strategy", "best"], "Invalid value for '--strategy'"),
        (["nodes", "--interval", "0"], "Invalid value for '--interval'"),
        (["reservations", "show"], "Missing argument 'ID'"),
        (["bindings", "lookup"], "Missing argument 'SANDBOX'"),
        (["nodes", "--bogus"], "--bogus"),
    ],
)
def test_usage_errors_exit_2_without_touching_redis(args: list[str], message: str) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"  # never reached: arguments fail first
    code, out, err = invoke([*args, "--redis", closed])
    assert (code, out) == (2, "")
    assert message in err


def test_help_needs_no_redis() -> None:
    code, out, _ = invoke(["nodes", "--help", "--redis", f"127.0.0.1:{free_port()}"])
    assert code == 0 and "--watch" in out and "SCHEDULER_REDIS_ADDR" in out


def test_redis_comes_from_the_environment_in_host_port_form(real_url: str) -> None:
    s = Scheduler.connect(real_url, cell="env")
    s.sync_policy(Policy())
    s.heartbeat(hb("n1"))
    host_port = real_url.removeprefix("redis://").removesuffix("/0")
    code, out, err = invoke(
        ["nodes", "--cell", "env", "--json"], env={"SCHEDULER_REDIS_ADDR": host_port}
    )
    assert code == 0, err
    assert [n["node_id"] for n in json.loads(out)] == ["n1"]
    # a flag wins over the environment
    code, _, err = invoke(
        ["nodes", "--cell", "env", "--redis", f"127.0.0.1:{free_port()}"],
        env={"SCHEDULER_REDIS_ADDR": host_port},
    )
    assert code == 1 and "unreachable" in err


@pytest.mark.parametrize("command", EVERY_COMMAND[:-1], ids=" ".join)
@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_an_operator_command_without_a_target_writes_nothing_anywhere(
    command: list[str], as_json: bool
) -> None:
    """No --redis, no SCHEDULER_REDIS_ADDR: refused, not run on a throwaway store."""
    from scheduler.store import embedded

    before = embedded.sync_client().keys("*")
    code, out, err = invoke([*command, *(["--json"] * as_json)])
    assert code == 2
    message = (
        "no Redis to operate on: give --redis URL or set SCHEDULER_REDIS_ADDR "
        "(--redis embedded: this process's own in-process store)"
    )
    assert err == f"Error: {message}\n"
    assert (json.loads(out) if as_json else out) == ({"error": message} if as_json else "")
    assert embedded.sync_client().keys("*") == before


def test_embedded_by_name_and_simulate_by_default_say_so() -> None:
    code, out, err = invoke(["policy", "show", "--cell", "nothing-here", "--redis", "embedded"])
    assert (code, out) == (1, "")
    assert "embedded in-process store" in err.splitlines()[0]
    assert err.splitlines()[-1].startswith("Error: cell policy is not initialised")
    code, out, err = invoke(["simulate", "--nodes", "1", "--creates", "1", "--cell", "emb"])
    assert code == 0, err
    assert err.splitlines()[0] == (
        "simulate: on embedded in-process store (fakeredis, one replica only), cell emb "
        "(no --redis given; other processes cannot see it)"
    )


def test_global_options_before_the_command(real_url: str) -> None:
    s = Scheduler.connect(real_url, cell="g")
    s.sync_policy(Policy())
    s.heartbeat(hb("n1"))
    code, out, err = invoke(["--redis", real_url, "--cell", "g", "--json", "nodes"])
    assert code == 0, err
    assert [n["node_id"] for n in json.loads(out)] == ["n1"]
    # the one after the command wins over the one before
    code, out, err = invoke(["--cell", "other", "nodes", "--cell", "g", "--redis", real_url])
    assert code == 0, err
    assert "nodes of cell g at" in out


def test_version() -> None:
    from scheduler import version

    code, out, _ = invoke(["--version"])
    assert code == 0
    assert out == f"schedctl {version.version()} (commit {version.commit()})\n"
    assert version.commit() != ""
