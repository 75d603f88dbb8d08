"""The least-privilege Redis user (docs/operations.md, "A least-privilege Redis user"):
the documented ACL line is enough for every operation of a replica and of
schedctl, with the function library and with the EVALSHA fallback; each of
its commands is needed; and a refusal is one line naming the command."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from scheduler.cli.main import main

from scheduler import Heartbeat, Limits, NodeSnapshot, NoNodesAvailable, Policy, Request, Scheduler
from scheduler.acl import (
    CLIENT_COMMANDS,
    COMMANDS,
    FUNCTION_COMMANDS,
    SCRIPT_COMMANDS,
    SCRIPTED_COMMANDS,
    PermissionDenied,
    setuser,
)
from scheduler.cpuconfig import CpuConfigOps
from scheduler.p2p import PeerOps
from scheduler.records import SandboxEvent
from scheduler.scripts import EVAL, FUNCTION
from scheduler.testing.redis_server import RedisServer

pytestmark = pytest.mark.real_only
OPERATIONS = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
GIB = 1 << 30


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A server of its own: these tests make and drop users and flush functions."""
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    client.flushall()
    client.execute_command("FUNCTION", "FLUSH")
    client.script_flush()
    yield client
    client.flushall()
    client.close()


def make_user(admin: redis.Redis, server: RedisServer, commands: tuple[str, ...]) -> str:
    args = setuser("sched-test", "pw")
    base = args[: args.index("-@all") + 1]
    admin.execute_command(*base, *(f"+{c}" for c in commands))
    return f"redis://sched-test:pw@127.0.0.1:{server.port}/0"


def node(
    node_id: str,
    cpu: int,
    allocated: int,
    roster: list[str],
    cluster: str = "c1",
) -> Heartbeat:
    return Heartbeat(
        node_id=node_id,
        service_instance_id="i1",
        cluster_id=cluster,
        endpoint=f"{node_id}.local:5000",
        p2p_backend="bt",
        p2p_address=f"{node_id}:7000",
        snapshot=NodeSnapshot(
            cpu_count=cpu,
            memory_total_bytes=64 * GIB,
            allocated_cpu=allocated,
            sandbox_count=len(roster),
        ),
        sandbox_ids=roster,
    )


def workload(url: str) -> str:
    """Every kind of call a replica and schedctl make; returns the scripts' mode."""
    s = Scheduler.connect(
        url, cell="acl", policy=Policy(limits=Limits(max_sandbox_count=3)), overwrite_policy=True
    )
    try:
        s.ping()
        # two nodes of different shapes at equal pressure and counts: two equal
        # buckets, which a pick merges (small ones in Lua)
        s.heartbeat(node("a", 16, 8, ["a1"]))
        s.heartbeat(node("b", 32, 17, ["b1"]))
        cpu = CpuConfigOps(s.keys)
        for n in ("a", "b"):
            s.run(cpu.ingest(n, "c1", '{"kvm_capabilities": []}', False))
        p = s.schedule(Request.cold(1, 0))
        s.explain(Request.cold(1, 0))
        s.assign("x1", p.node_id, p.endpoint, p.reservation_id)
        roster = ["a1", "x1"] if p.node_id == "a" else ["b1", "x1"]
        s.heartbeat(
            node(p.node_id, 16 if p.node_id == "a" else 32, 9 if p.node_id == "a" else 18, roster)
        )  # lists x1: persisted
        q = s.schedule(Request.cold(1, 0))
        s.cancel(q.reservation_id or "")
        for _ in range(6):
            try:
                s.schedule(Request.cold(1, 0))
            except NoNodesAvailable:  # the ceiling: a refusal gives the rotation back
                break
        s.events(
            "a",
            [
                SandboxEvent(sandbox_id="a1", event_type="DELETE"),
                SandboxEvent(sandbox_id="a2", event_type="CREATE"),
            ],
        )
        s.lookup("x1")
        # equal buckets too large to read whole (over 64 nodes each): a pick unions
        # them in Redis (ZUNIONSTORE); route requests rank empty nodes all alike
        for i in range(65):
            s.heartbeat(node(f"w{i:02d}", 16, 0, []))
            s.heartbeat(node(f"v{i:02d}", 8, 0, []))
        s.schedule(Request.route())
        peers = PeerOps(s.keys)
        s.run(peers.record("c1", "bt", "k1", "a", capacity=1))
        s.run(peers.record("c1", "bt", "k2", "b", capacity=1))  # evicts k1
        s.run(peers.lookup("c1", "bt", "k2"))
        s.run(peers.peers("c1", "bt", ""))
        s.run(peers.forget("c1", "bt", "k2", "b"))
        s.set_lingering("b", True)
        s.nodes()
        s.reservations()
        s.stats()
        s.policy()
        s.unregister("b", "i1")
        s.advance_clock(2 * 3_600_000)
        s.sweep()  # forgets "a": its bindings, roster, cpu config round
        for args in (["nodes"], ["reservations"], ["explain", "--cpu", "1"]):
            result = CliRunner().invoke(main, [*args, "--redis", url, "--cell", "acl"])
            if result.exit_code != 0:
                raise PermissionDenied(result.output)
        return str(s.scripts.mode)
    finally:
        s.close()


def test_the_docs_spell_the_acl_line() -> None:
    text = OPERATIONS.read_text()
    section = text[text.index("### A least-privilege Redis user") :]
    line = re.search(r"^\s+redis-cli (ACL SETUSER .+)$", section, re.M)
    assert line is not None
    assert shlex.split(line.group(1)) == setuser()
    assert set(COMMANDS) == set(
        CLIENT_COMMANDS + FUNCTION_COMMANDS + SCRIPT_COMMANDS + SCRIPTED_COMMANDS
    )


def test_the_documented_user_runs_everything_with_functions(
    admin: redis.Redis, server: RedisServer
) -> None:
    url = make_user(admin, server, COMMANDS)
    assert workload(url) == FUNCTION
    admin.execute_command("FUNCTION", "FLUSH")  # the replica loads the library again
    assert workload(url) == FUNCTION


def test_the_documented_user_runs_everything_with_evalsha(
    admin: redis.Redis, server: RedisServer
) -> None:
    url = make_user(admin, server, CLIENT_COMMANDS + SCRIPT_COMMANDS + SCRIPTED_COMMANDS)
    assert workload(url) == EVAL
    admin.script_flush()  # NOSCRIPT: loaded again
    assert workload(url) == EVAL


@pytest.mark.parametrize(
    ("mode", "missing"),
    [
        *((FUNCTION, c) for c in CLIENT_COMMANDS + FUNCTION_COMMANDS + SCRIPTED_COMMANDS),
        *((EVAL, c) for c in SCRIPT_COMMANDS),
    ],
)
def test_every_command_is_needed_and_named_when_refused(
    admin: redis.Redis, server: RedisServer, mode: str, missing: str
) -> None:
    granted = (
        CLIENT_COMMANDS
        + SCRIPTED_COMMANDS
        + (FUNCTION_COMMANDS if mode == FUNCTION else SCRIPT_COMMANDS)
    )
    url = make_user(admin, server, tuple(c for c in granted if c != missing))
    with pytest.raises(PermissionDenied) as e:
        workload(url)
    message = str(e.value)
    assert f"'{missing}'" in message, message
    assert 'docs/operations.md "Security", "A least-privilege Redis user"' in message
    assert "\n" not in message.strip()


def test_the_reported_acl_fails_at_start_with_one_line(
    admin: redis.Redis, server: RedisServer, tmp_path: Path
) -> None:
    """The ACL of the problem report: FCALL and FUNCTION LOAD but none of the
    commands the scripts call.  Today's code crashed with a traceback."""
    admin.execute_command(
        "ACL", "SETUSER", "narrow", "on", ">pw", "~sched:*", "+fcall", "+function|load", "+ping"
    )
    url = f"redis://narrow:pw@127.0.0.1:{server.port}/0"
    config = tmp_path / "c.json"
    config.write_text('{"scheduler": {"metrics_listen_addr": ""}}')
    result = CliRunner().invoke(
        main, ["serve", "--config", str(config), "--redis", url, "--grpc-listen", "127.0.0.1:0"]
    )
    assert result.exit_code == 1
    err = result.output.strip().splitlines()[-1]
    assert err.startswith("Error: cannot prepare cell 'default': Redis refused the command "), err
    assert "in a script to this replica's user (ACL)" in err
    assert (
        "Traceback" not in result.output
        and result.exception is None
        or isinstance(result.exception, SystemExit)
    )
    for args in (["nodes"], ["policy", "show"], ["bindings", "lookup", "s1"]):
        r = CliRunner().invoke(main, [*args, "--redis", url])
        assert r.exit_code == 1, r.output
        assert r.output.startswith("Error: Redis refused the command "), r.output
        assert r.output.count("\n") == 1


def test_min_replicas_acked_also_needs_wait(admin: redis.Redis, server: RedisServer) -> None:
    """WAIT follows each write only with min_replicas_acked > 0: the documented
    line leaves it out, and a user without it is told so in one line."""
    from scheduler.connection import Durability
    from scheduler.errors import NotReplicated

    acked = Durability(replicas=1, timeout_ms=50)
    url = make_user(admin, server, COMMANDS)
    with pytest.raises(PermissionDenied, match="Redis refused the command 'wait'"):
        Scheduler.connect(url, cell="acl", policy=Policy(), durability=acked)
    make_user(admin, server, (*COMMANDS, "wait"))
    # WAIT runs now; this server has no replicas to acknowledge anything
    with pytest.raises(NotReplicated, match="reached 0 of the 1 replica"):
        Scheduler.connect(url, cell="acl", policy=Policy(), durability=acked)


def test_simulate_needs_scan_and_says_so(admin: redis.Redis, server: RedisServer) -> None:
    url = make_user(admin, server, COMMANDS)
    result = CliRunner().invoke(
        main, ["simulate", "--nodes", "1", "--creates", "1", "--redis", url]
    )
    assert result.exit_code == 1
    first, error = result.output.splitlines()  # where it runs, then the one-line error
    assert first.startswith("simulate: on redis://")
    assert error.startswith("Error: Redis refused the command 'scan' to this replica's user (ACL)")
