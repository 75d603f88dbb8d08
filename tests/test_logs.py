"""Log lines with their context: a Schedule through a live ``schedctl serve``
logs JSON lines that name the cell, the RPC and the reservation; the decision
log is off unless asked for; third-party loggers stay quiet at debug level;
one call's fields never reach another's lines."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from scheduler import version
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.server import logs
from scheduler.testing.replicas import ServeProcess
from tests.helpers import cold, endpoint_md, hb_request


def records(p: ServeProcess) -> list[dict[str, Any]]:
    """The replica's JSON lines (gRPC's C core may print plain lines of its own)."""
    return [json.loads(line) for line in p.log().splitlines() if line.startswith("{")]


def schedule_twice(p: ServeProcess) -> str:
    """Register n1 (room for one sandbox), place once, be refused once; the
    placement's reservation id."""
    with grpc.insecure_channel(p.address) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"))
        resp, call = stub.Schedule.with_call(cold(1, 16))
        assert resp.node.node_id == "n1"
        with pytest.raises(grpc.RpcError):
            stub.Schedule(cold(1, 16))
    return str(dict(call.trailing_metadata())["x-reservation-id"])


@pytest.mark.slow
@pytest.mark.real_only
def test_a_schedules_json_lines_carry_cell_rpc_and_reservation(
    processes: list[ServeProcess], real_url: str
) -> None:
    p = ServeProcess(
        {
            "scheduler": {"decision_log": True, "node_resource_limit": {"max_sandbox_count": 1}},
            "log_format": "json",
            "log_level": "debug",
        },
        real_url,
        cell="logged",
    )
    processes.append(p)
    p.wait_serving()
    rid = schedule_twice(p)
    assert p.terminate() == 0
    lines = records(p)

    # every line names the replica it comes from
    assert lines
    for r in lines:
        assert (r["cell"], r["pid"], r["version"]) == ("logged", p.proc.pid, version.version())
        assert r["time"].endswith("Z") and r["level"] in ("debug", "info", "warning", "error")
    # debug level, and not one line of gRPC's, redis-py's or asyncio's internals
    assert {r["logger"].partition(".")[0] for r in lines} == {"scheduler"}

    decisions = [r for r in lines if r["logger"] == logs.DECISIONS]
    placed = [r for r in decisions if r["decision"] == "placed"]
    refused = [r for r in decisions if r["decision"] == "refused"]
    assert len(placed) == 1 and len(refused) == 1 and len(decisions) == 2
    line = placed[0]
    assert (line["rpc"], line["reservation"], line["node"]) == ("Schedule", rid, "n1")
    assert line["request"] == {"create": True, "cpu": 1, "memory_bytes": 16 << 20}
    assert line["strategy"] == "least_loaded" and line["endpoint"] == "n1:5000"
    assert line["node_status"] == "READY" and line["reserved_cpu"] == 1
    assert "on n1" in line["msg"]
    no = refused[0]
    assert no["rpc"] == "Schedule" and "reservation" not in no and "node" not in no
    assert no["reasons"] == {"at max_sandbox_count": 1}
    assert "1 at max_sandbox_count (1)" in no["msg"]


@pytest.mark.slow
@pytest.mark.real_only
def test_the_decision_log_is_off_by_default(processes: list[ServeProcess], real_url: str) -> None:
    p = ServeProcess(
        {"scheduler": {"node_resource_limit": {"max_sandbox_count": 1}}, "log_format": "json"},
        real_url,
        cell="quiet",
    )
    processes.append(p)
    p.wait_serving()
    schedule_twice(p)
    assert p.terminate() == 0
    lines = records(p)
    assert any("serving scheduler.v1.Scheduler" in r["msg"] for r in lines)
    assert not [r for r in lines if r["logger"] == logs.DECISIONS or "decision" in r]


# ---------------------------------------------------------------------------
# scheduler.server.logs in-process
# ---------------------------------------------------------------------------
@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    named = {n: logging.getLogger(n).level for n in (*logs.THIRD_PARTY, logs.DECISIONS)}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for n, lvl in named.items():
        logging.getLogger(n).setLevel(lvl)


def test_one_calls_fields_never_reach_anothers_lines(restore_logging: None) -> None:
    out = io.StringIO()
    logs.configure("info", "json", cell="c1", worker=3, stream=out)
    log = logging.getLogger("scheduler.test")

    async def rpc(name: str, node: str, reservation: str) -> None:
        logs.call(name)
        await asyncio.sleep(0)
        logs.bind(node=node)
        await asyncio.sleep(0)  # the other call runs in between
        log.info("bound %s", name)
        logs.bind(reservation=reservation)
        await asyncio.sleep(0)
        log.info("done %s", name)

    async def both() -> None:
        await asyncio.gather(rpc("Schedule", "n1", "r-1"), rpc("Heartbeat", "n2", "r-2"))
        log.info("outside")

    asyncio.run(both())
    lines = {r["msg"]: r for r in map(json.loads, out.getvalue().splitlines())}
    assert set(lines) == {
        "bound Schedule",
        "bound Heartbeat",
        "done Schedule",
        "done Heartbeat",
        "outside",
    }
    for r in lines.values():
        assert (r["cell"], r["worker"], r["pid"]) == ("c1", 3, os.getpid())
    assert (lines["bound Schedule"]["node"], lines["bound Heartbeat"]["node"]) == ("n1", "n2")
    assert "reservation" not in lines["bound Schedule"]
    assert (lines["done Schedule"]["reservation"], lines["done Heartbeat"]["reservation"]) == (
        "r-1",
        "r-2",
    )
    assert lines["done Heartbeat"]["rpc"] == "Heartbeat"
    assert not {"rpc", "node", "reservation"} & set(lines["outside"])


def test_text_lines_carry_the_same_context(restore_logging: None) -> None:
    out = io.StringIO()
    logs.configure("info", "text", cell="c2", stream=out)
    log = logging.getLogger("scheduler.test")
    log.info("plain")

    async def call() -> None:
        logs.call("RecordAssignment")
        logs.bind(node="n9", reservation="r-9")
        log.warning("in a call")

    asyncio.run(call())
    plain, in_call = out.getvalue().splitlines()
    head = f"[cell=c2 pid={os.getpid()} v{version.version()}]"
    assert plain.endswith(f"INFO scheduler.test {head}: plain")
    assert in_call.endswith(
        f"WARNING scheduler.test {head}: in a call rpc=RecordAssignment node=n9 reservation=r-9"
    )


def test_third_party_loggers_stay_at_warning_unless_asked(
    restore_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(logs.THIRD_PARTY_ENV, raising=False)
    logs.configure("debug", "json", cell="c", stream=io.StringIO())
    assert logging.getLogger("scheduler.server.replica").isEnabledFor(logging.DEBUG)
    for name in ("grpc._cython.cygrpc", "redis.asyncio.connection", "asyncio", "urllib3"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO)
        assert logging.getLogger(name).isEnabledFor(logging.WARNING)
    # the decision log is silent when off, at any level
    assert not logging.getLogger(logs.DECISIONS).isEnabledFor(logging.CRITICAL)

    monkeypatch.setenv(logs.THIRD_PARTY_ENV, "debug")
    logs.configure("warn", "text", cell="c", decision_log=True, stream=io.StringIO())
    assert logging.getLogger("grpc._cython.cygrpc").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("scheduler.server.replica").isEnabledFor(logging.INFO)
    # on, it writes at info whatever the level of the rest
    assert logging.getLogger(logs.DECISIONS).isEnabledFor(logging.INFO)

    monkeypatch.setenv(logs.THIRD_PARTY_ENV, "loud")
    before = logging.getLogger().handlers[:]
    with pytest.raises(ValueError, match=f"{logs.THIRD_PARTY_ENV}: not a log level: 'loud'"):
        logs.configure("info", "json", cell="c", stream=io.StringIO())
    assert logging.getLogger().handlers == before  # nothing was changed
    with pytest.raises(ValueError, match="log format must be text or json, not 'auto'"):
        logs.configure("info", "auto", cell="c")


def test_a_caller_given_field_cannot_forge_a_line(restore_logging: None) -> None:
    out = io.StringIO()
    logs.configure("info", "text", cell="c", stream=out)

    async def call() -> None:
        logs.call("Heartbeat")
        logs.bind(node="n1\n2026-12-01 00:00:00,000 ERROR scheduler.server.replica [forged]: x")
        logging.getLogger("scheduler.test").warning("refused")
        logs.bind(node="n" * 1000)
        logging.getLogger("scheduler.test").warning("long")

    asyncio.run(call())
    forged, long = out.getvalue().splitlines()
    assert forged.endswith(
        "node='n1\\n2026-12-01 00:00:00,000 ERROR scheduler.server.replica [forged]: x'"
    )
    assert long.endswith(f"node='{'n' * logs.FIELD_MAX}'...")


def test_json_lines_keep_extra_fields_and_the_exception(restore_logging: None) -> None:
    out = io.StringIO()
    logs.configure("info", "json", cell="c", stream=out)
    log = logging.getLogger("scheduler.test")
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError:
        log.exception("monitor failed; retrying", extra={"attempt": 3})
    (line,) = map(json.loads, out.getvalue().splitlines())
    assert (line["level"], line["logger"], line["msg"]) == (
        "error",
        "scheduler.test",
        "monitor failed; retrying",
    )
    assert line["attempt"] == 3 and "ZeroDivisionError" in line["exc"]
    assert not {"exc_info", "args", "levelno", "_replica"} & set(line)
