"""The verbs a cell needs, each against a real Redis: cells delete, nodes
forget, replicas, completion; idempotent cleanup; an expired binding that
says so."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from click.shell_completion import ShellComplete
from click.testing import CliRunner, Result
from scheduler.cli.completion import COMPLETE_VAR
from scheduler.cli.main import main

from scheduler import Policy, Request, Scheduler, version
from scheduler.ops.cells import DELETE_STEP, delete_cell
from scheduler.testing.replicas import ThreadedReplica
from tests.helpers import hb


def run(url: str, *args: str, input: str | None = None) -> Result:
    return CliRunner(env={"SCHEDULER_REDIS_ADDR": None}).invoke(
        main, ["--redis", url, *args], input=input
    )


def cell(url: str, name: str, frozen: bool = False) -> Scheduler:
    s = Scheduler.connect(url, cell=name)
    s.sync_policy(Policy())
    if frozen:  # (ages then come out exact)
        s.advance_clock(0, "freeze")
    for n in ("n1", "n2"):
        s.heartbeat(hb(n))
    placed = s.schedule(Request.cold(1, 1024), reservation_id=f"{name}-r1")
    s.assign(f"{name}-sbx", placed.node_id, placed.endpoint, f"{name}-r1")
    s.schedule(Request.cold(1, 1024), reservation_id=f"{name}-r2")
    return s


def keys_of(client: Any, name: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"sched:{{{name}}}:*"))


# -- cells delete ---------------------------------------------------------------
def test_cells_delete_removes_every_key_of_that_cell_only(real_url: str) -> None:
    doomed, kept = cell(real_url, "typo"), cell(real_url, "prod")
    before_kept = keys_of(kept.client, "prod")
    n = len(keys_of(doomed.client, "typo"))
    assert n > 5
    result = run(real_url, "cells", "delete", "typo", "--yes", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"cell": "typo", "keys": n, "live_replicas": []}
    assert keys_of(doomed.client, "typo") == []
    assert keys_of(kept.client, "prod") == before_kept
    listed = json.loads(run(real_url, "cells", "--json").stdout)
    assert [c["cell"] for c in listed] == ["prod"]
    # twice: not found, exit 1, or 0 with --ignore-not-found; nothing else touched
    again = run(real_url, "cells", "delete", "typo", "--yes")
    assert (again.exit_code, again.stderr) == (1, f"Error: cell typo not found at {real_url}\n")
    ignored = run(real_url, "cells", "delete", "typo", "--yes", "--ignore-not-found")
    assert ignored.exit_code == 0 and "nothing to delete" in ignored.stdout
    assert keys_of(kept.client, "prod") == before_kept


def test_cells_delete_asks_first(real_url: str) -> None:
    s = cell(real_url, "asked")
    before = keys_of(s.client, "asked")
    no = run(real_url, "cells", "delete", "asked", input="n\n")
    assert no.exit_code == 1 and "delete cell asked at" in no.stderr
    assert keys_of(s.client, "asked") == before
    yes = run(real_url, "cells", "delete", "asked", input="y\n")
    assert yes.exit_code == 0, yes.output
    assert f"deleted cell asked: {len(before)} keys" in yes.stdout
    assert keys_of(s.client, "asked") == []


def test_cells_delete_goes_in_bounded_steps(real_url: str) -> None:
    client = redis.Redis.from_url(real_url)
    Scheduler(client, cell="big").sync_policy(Policy())
    pipe = client.pipeline(transaction=False)
    for i in range(2 * DELETE_STEP + 7):
        pipe.hset(f"sched:{{big}}:res:r{i}", "state", "released")
    pipe.set("sched:{bigger}:policy", "x")  # a cell whose name starts the same
    pipe.execute()
    total = len(keys_of(client, "big"))
    steps: list[int] = []
    assert delete_cell(client, "big", on_step=steps.append) == total
    assert keys_of(client, "big") == [] and client.exists("sched:{bigger}:policy")
    assert len(steps) >= 2 and steps == sorted(steps)  # one UNLINK per step of keys
    assert delete_cell(client, "big") == 0


# -- nodes forget -------------------------------------------------------------
def test_nodes_forget_is_unregister_node(real_url: str) -> None:
    s = cell(real_url, "f")
    pending = [r for r in s.reservations() if r.node_id == "n1"]
    assert pending, "the fixture puts a reservation on n1"
    result = run(real_url, "--cell", "f", "nodes", "forget", "n1", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"node_id": "n1", "forgotten": True}
    assert [v.node_id for v in s.nodes()] == ["n2"]
    assert all(r.node_id != "n1" for r in s.reservations())
    assert s.client.exists(s.keys.node("n1")) == 0
    again = run(real_url, "--cell", "f", "nodes", "forget", "n1")
    assert again.exit_code == 0, again.output
    assert "node n1 is not known in cell f" in again.stdout
    # a node that heartbeats again comes back
    s.heartbeat(hb("n1", sid="boot-2"))
    assert {v.node_id for v in s.nodes()} == {"n1", "n2"}


# -- replicas -------------------------------------------------------------------
@pytest.mark.real_only
def test_replicas_lists_each_serving_replica_with_its_version(
    backend: str, make_replica: Callable[..., ThreadedReplica], redis_server: Any
) -> None:
    url = redis_server.url
    replica = make_replica(Policy())
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while not list(client.scan_iter(match="sched:{test}:replica:*")):
        assert time.monotonic() < deadline, "the monitor loop never wrote its roster entry"
        time.sleep(0.05)
    result = run(url, "--cell", "test", "replicas", "--json")
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.stdout)
    assert entry["pid"] == os.getpid()  # a threaded replica runs in this process
    assert entry["replica_id"].endswith(f"/{os.getpid()}")
    assert (entry["version"], entry["commit"]) == (version.version(), version.commit())
    assert entry["grpc"].endswith(f":{replica.replica.port}")
    assert entry["heard_ms_ago"] >= 0 and entry["seen_ms"] >= entry["started_ms"]
    (key,) = client.scan_iter(match="sched:{test}:replica:*")
    assert 0 < client.pttl(key) <= 15_000  # it expires unless refreshed
    table = run(url, "--cell", "test", "replicas")
    assert "1 replicas of cell test" in table.stdout and version.version() in table.stdout
    empty = run(url, "--cell", "other", "replicas", "--json")
    assert (empty.exit_code, json.loads(empty.stdout)) == (0, [])


# -- completion -----------------------------------------------------------------
@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_the_shell_script(shell: str) -> None:
    result = CliRunner().invoke(main, ["completion", shell])
    assert result.exit_code == 0, result.output
    assert COMPLETE_VAR in result.stdout and "schedctl" in result.stdout


def complete(args: list[str], incomplete: str, env: dict[str, str] | None = None) -> list[str]:
    old = os.environ.pop("SCHEDULER_REDIS_ADDR", None)
    os.environ.update(env or {})
    try:
        got = ShellComplete(main, {}, "schedctl", COMPLETE_VAR).get_completions(args, incomplete)
    finally:
        for k in env or {}:
            os.environ.pop(k)
        if old is not None:
            os.environ["SCHEDULER_REDIS_ADDR"] = old
    return [c.value for c in got]


def test_completion_completes_cells_nodes_and_reservations(real_url: str) -> None:
    cell(real_url, "alpha")
    cell(real_url, "beta")
    assert complete(["--redis", real_url, "--cell"], "") == ["alpha", "beta"]
    assert complete(["nodes", "--redis", real_url, "--cell"], "a") == ["alpha"]
    on_alpha = ["--redis", real_url, "--cell", "alpha"]
    assert complete([*on_alpha, "nodes", "forget"], "") == ["n1", "n2"]
    assert complete([*on_alpha, "linger"], "n") == ["n1", "n2"]
    assert complete([*on_alpha, "reservations", "cancel"], "alpha-r") == ["alpha-r1", "alpha-r2"]
    assert complete([*on_alpha, "reservations", "show"], "alpha-r2") == ["alpha-r2"]
    assert complete(["--cell", "beta", "nodes", "forget"], "", {"SCHEDULER_REDIS_ADDR": real_url})
    # no target, or one that does not answer: nothing, and no error into the shell
    assert complete(["--cell", "alpha", "nodes", "forget"], "") == []
    closed = "redis://127.0.0.1:1/0"
    assert complete(["--redis", closed, "--cell", "alpha", "nodes", "forget"], "") == []


# -- idempotent cleanup, honest answers --------------------------------------------
def test_cancel_ignore_not_found(real_url: str) -> None:
    cell(real_url, "c")
    missing = run(real_url, "--cell", "c", "reservations", "cancel", "never")
    assert missing.exit_code == 1 and "reservation never not found" in missing.stderr
    ignored = run(
        real_url, "--cell", "c", "--json", "reservations", "cancel", "never", "--ignore-not-found"
    )
    assert ignored.exit_code == 0, ignored.output
    assert json.loads(ignored.stdout) == {
        "reservation_id": "never",
        "node_id": "",
        "state": "not found",
    }


def test_an_expired_binding_says_so(real_url: str) -> None:
    s = cell(real_url, "b", frozen=True)
    s.advance_clock(31_000)  # past binding_ttl (30 s) and report_ttl: nothing heartbeated
    result = run(real_url, "--cell", "b", "bindings", "lookup", "b-sbx")
    assert result.exit_code == 1
    node = s.client.hget(s.keys.bind("b-sbx"), "node_id").decode()
    line = result.stderr
    assert line.count("\n") == 1, line
    assert line.startswith(f"Error: sandbox b-sbx: its binding to node {node} expired 1.0s ago ")
    assert "(node UNHEALTHY, last heartbeat 31s ago)" in line
    assert "no heartbeat of the node listed it within binding_ttl 30s" in line
    as_json = run(real_url, "--cell", "b", "bindings", "lookup", "b-sbx", "--json")
    doc = json.loads(as_json.stdout)
    assert as_json.exit_code == 1 and doc["error"] == line.removeprefix("Error: ").strip()
    assert (doc["state"], doc["node_id"], doc["expired_ms_ago"]) == ("expired", node, 1000)
    assert (doc["node_status"], doc["heartbeat_age_ms"]) == ("UNHEALTHY", 31_000)


# -- one duration parser ----------------------------------------------------------
@pytest.mark.parametrize(
    "text", ["30s", "1m30s", "250ms", "1500us", "2µs", "1h", "0.5s", "500us", "5x", "10", "0"]
)
def test_policy_set_reads_durations_as_the_config_does(real_url: str, text: str) -> None:
    from scheduler.server.config import ConfigError, parse_duration_ms

    try:
        expected: int | None = parse_duration_ms("scheduler.report_ttl", text)
    except ConfigError:
        expected = None
    Scheduler.connect(real_url, cell="d").sync_policy(Policy())
    result = run(real_url, "--cell", "d", "policy", "set", "--report-ttl", text, "--json")
    if expected is None:
        assert result.exit_code == 2, result.output
        assert f"Invalid value for '--report-ttl': {text!r} is" in result.stderr
    else:
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["policy"]["report_ttl_ms"] == expected
