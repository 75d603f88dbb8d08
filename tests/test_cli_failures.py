"""schedctl never lies or crashes (#29): every failure is one line, also for
a server that is not Redis, a Redis that restarted empty and corrupt data;
``--watch`` goes on through them; ``--json`` output of every command is one
JSON document, in success and in failure."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from scheduler.cli import nodes as nodes_module
from scheduler.cli.main import main

from scheduler import Policy, Scheduler
from tests.helpers import hb
from tests.test_cli_commands import CELL, Fleet, fleet  # noqa: F401 (the fixture)
from tests.test_cli_errors import EVERY_COMMAND


def invoke(args: list[str], input: str | None = None) -> Result:
    result = CliRunner(env={"SCHEDULER_REDIS_ADDR": None}).invoke(main, args, input=input)
    assert isinstance(result.exception, SystemExit | None), repr(result.exception)
    return result


def one_line(result: Result) -> str:
    lines = [x for x in result.stderr.splitlines() if not x.startswith("simulate: on ")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ") and "Traceback" not in result.output
    return lines[0]


# -- a server that is not Redis ---------------------------------------------------
@pytest.fixture
def not_redis() -> Iterator[str]:
    """A TCP server that answers every connection like a web server."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    t.join()
    listener.close()


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=" ".join)
def test_a_server_that_is_not_redis_is_one_line(not_redis: str, command: list[str]) -> None:
    result = invoke([*command, "--redis", not_redis])
    assert result.exit_code == 1 and result.stdout == ""
    line = one_line(result)
    assert not_redis in line
    assert "does not answer as Redis" in line or "unreachable" in line, line


# -- a Redis that restarted empty -------------------------------------------------
def restart_empty(client: Any) -> None:
    """What a restart without persistence leaves: no keys, no function library."""
    client.function_flush()
    client.flushall()


def test_a_redis_restarted_empty_is_one_line(fleet: Fleet) -> None:  # noqa: F811
    fleet.json("nodes")  # the library is loaded
    restart_empty(fleet.s.client)
    for command in (["nodes"], ["explain"], ["reservations"], ["policy", "show"]):
        result = fleet.run(*command)
        assert result.exit_code == 1, result.output
        assert one_line(result) == (
            "Error: cell policy is not initialised: start a replica or run `schedctl policy set`"
        )


def test_watch_reloads_the_library_and_goes_on(
    fleet: Fleet,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 1:
            restart_empty(fleet.s.client)
        elif len(pauses) == 2:  # a replica puts the cell back; a node heartbeats
            back = Scheduler.connect(fleet.url, cell=CELL)
            back.sync_policy(Policy())
            back.heartbeat(hb("again"))
            back.close()
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(nodes_module, "_pause", pause)
    result = fleet.run("nodes", "--watch")
    assert result.exit_code == 0, result.output
    frames = result.stdout.split("nodes of cell cli")
    assert len(frames) == 4, result.stdout  # (text before the first frame, then 3)
    assert "refreshed" in frames[1] and "busy" in frames[1]
    assert "NOT REFRESHED since" in frames[2]
    assert "cell policy is not initialised" in frames[2]
    assert "refreshed" in frames[3] and "NOT REFRESHED" not in frames[3]
    assert "again" in frames[3] and "busy" not in frames[3]


# -- corrupt data ---------------------------------------------------------------
def test_a_key_of_the_wrong_type_is_one_line(fleet: Fleet) -> None:  # noqa: F811
    fleet.s.client.delete(fleet.s.keys.nodes)
    fleet.s.client.set(fleet.s.keys.nodes, "not a zset")
    for command in (["nodes"], ["explain"], ["nodes", "--json"]):
        result = fleet.run(*command)
        assert result.exit_code == 1, result.output
        assert "WRONGTYPE" in one_line(result)


@pytest.mark.parametrize(
    "key, field, value, command",
    [
        ("res", "cpu", "lots", ["reservations", "show", "res-idle"]),
        ("res", "cpu", "lots", ["reservations"]),
        ("node", "sandbox_count", "abc", ["nodes"]),
    ],
)
def test_a_corrupt_record_field_is_one_line(
    fleet: Fleet,  # noqa: F811
    key: str,
    field: str,
    value: str,
    command: list[str],
) -> None:
    name = fleet.s.keys.res("res-idle") if key == "res" else fleet.s.keys.node("full")
    fleet.s.client.hset(name, field, value)
    for as_json in (False, True):
        result = fleet.run(*command, *(["--json"] * as_json))
        assert result.exit_code == 1, result.output
        line = one_line(result)
        # the key and the field named (issue #29), one line, no traceback
        record = "res:res-idle" if key == "res" else "node:full"
        assert line.startswith(f"Error: corrupt record {record}: field {field} is "), line
        assert repr(value) in line
        if as_json:
            assert json.loads(result.stdout) == {"error": line.removeprefix("Error: ")}


# -- --json of every command, in success and in failure ---------------------------
JSON_COMMANDS: list[tuple[list[str], list[str]]] = [
    # (succeeds on the fleet, fails)
    (["nodes"], ["nodes", "--cell", "empty"]),
    (["nodes", "-o", "wide"], ["nodes", "-o", "wide", "--cell", "empty"]),
    (["nodes", "forget", "stale"], ["nodes", "forget", "a:b"]),
    (["reservations"], ["reservations", "--node", "nobody"]),
    (["reservations", "show", "res-two"], ["reservations", "show", "nope"]),
    (["reservations", "cancel", "res-idle"], ["reservations", "cancel", "nope"]),
    (["bindings", "lookup", "sbx-1"], ["bindings", "lookup", "sbx-404"]),
    (["explain", "--cpu", "1"], ["explain", "--cpu", "-1"]),
    (["policy", "show"], ["policy", "show", "--cell", "empty"]),
    (["policy", "set", "--strategy", "random"], ["policy", "set", "--report-ttl", "5x"]),
    (["linger", "drain", "--off"], ["linger", "nobody"]),
    (["cells"], ["cells", "--bogus"]),
    (["cells", "delete", "scratch", "--yes"], ["cells", "delete", "nope", "--yes"]),
    (["replicas"], ["replicas", "--cell", "a{b}"]),
    (["doctor"], ["doctor", "--cell", "a{b}"]),
    (
        ["simulate", "--nodes", "1", "--creates", "2", "--cell", "sim-json"],
        ["simulate", "--cell", CELL],  # it holds state: --reset or another cell
    ),
]


@pytest.mark.parametrize("ok, bad", JSON_COMMANDS, ids=[" ".join(c[0]) for c in JSON_COMMANDS])
def test_json_is_one_document_in_success_and_in_failure(
    fleet: Fleet,  # noqa: F811
    ok: list[str],
    bad: list[str],
) -> None:
    Scheduler.connect(fleet.url, cell="scratch").sync_policy(Policy())
    for args, succeeds in ((ok, True), (bad, False)):
        result = invoke(["--redis", fleet.url, "--cell", CELL, *args, "--json"])
        doc = json.loads(result.stdout)  # exactly one document (json.loads refuses two)
        if succeeds:
            assert result.exit_code == 0, result.output
            assert not (isinstance(doc, dict) and "error" in doc), doc
        else:
            assert result.exit_code in (1, 2), result.output
            assert isinstance(doc, dict) and doc["error"], doc
            assert result.stderr.splitlines()[-1] == f"Error: {doc['error']}"


def test_json_watch_is_one_document_per_line(
    fleet: Fleet,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(nodes_module, "_pause", pause)
    result = fleet.run("nodes", "--watch", "-o", "json")
    assert result.exit_code == 0, result.output
    frames = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(frames) == 3 and all(len(f) == 7 for f in frames)
    client = redis.Redis.from_url(fleet.url)
    assert client.ping()
