"""schedctl failure paths: one line on stderr, nothing on stdout, exit 1 (failure) or 2
(bad argument); where Redis comes from (flag, environment, embedded store)."""

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
    ["simulate", "--nodes", "1", "--creates", "1"],
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
    assert out == ""
    assert err.startswith(f"Error: Redis at {url} is unreachable: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("command", EVERY_COMMAND[:-1], ids=" ".join)
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


def test_without_redis_it_says_it_uses_the_embedded_store() -> None:
    code, out, err = invoke(["policy", "show", "--cell", "nothing-here", "--json"])
    assert (code, out) == (1, "")
    assert "embedded in-process store" in err
    assert err.splitlines()[-1].startswith("Error: cell policy is not initialised")
