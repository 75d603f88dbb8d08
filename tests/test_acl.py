"""The least-privilege Redis user (docs/operations.md, "A least-privilege Redis user"):
the documented ACL line is enough for every operation of a replica and of
schedctl, with the function library and with the EVALSHA fallback; each of
its commands is needed; and a refusal is one line naming the command."""

from __future__ import annotations

import asyncio
import re
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
from click.testing import CliRunner
from scheduler.cli.main import main

from scheduler import (
    Heartbeat,
    Limits,
    NodeSnapshot,
    NoNodesAvailable,
    Policy,
    Request,
    Scheduler,
)
from scheduler.client.aio import AsyncScheduler
from scheduler.domain.policy import Locality
from scheduler.domain.records import LocalityRequirement, Placement, SandboxEvent
from scheduler.store.acl import (
    CLIENT_COMMANDS,
    COMMANDS,
    FUNCTION_COMMANDS,
    SCRIPT_COMMANDS,
    SCRIPTED_COMMANDS,
    PermissionDenied,
    setuser,
)
from scheduler.store.connection import async_client
from scheduler.store.cpuconfig import CpuConfigOps
from scheduler.store.p2p import PeerOps
from scheduler.store.scripts import EVAL, FUNCTION, library, sources
from scheduler.testing.redis_server import RedisServer
from scheduler.testing.replicas import ThreadedReplica, settings_for
from tests.helpers import cold, endpoint_md, hb_request

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
        url,
        cell="acl",
        policy=Policy(limits=Limits(max_sandbox_count=3), locality=Locality(weight=0.1)),
        overwrite_policy=True,
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
        # a batch, as a replica's coalescer sends one (it stores the rotation
        # with SET at its end); the replica workload below may or may not
        # batch, depending on how its calls meet
        (b,) = s.run(s.ops.schedule_batch([s.ops.schedule(Request.cold(1, 0))]))
        assert isinstance(b, Placement), b
        s.cancel(b.reservation_id or "")
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
        # equal buckets too large to read whole (over 64 nodes each): a pick
        # bisects them in Redis (ZLEXCOUNT); route requests rank empty nodes all alike
        for i in range(65):
            s.heartbeat(node(f"w{i:02d}", 16, 0, []))
            s.heartbeat(node(f"v{i:02d}", 8, 0, []))
        s.schedule(Request.route())
        peers = PeerOps(s.keys)
        # locality: a key held by more nodes than a decision reads (a sample,
        # then the chosen node's own holding asked: SISMEMBER), and a
        # template's recent starters (read by score, trimmed by score and rank)
        for i in range(65):
            s.run(peers.record("c1", "bt", "big", f"v{i:02d}"))
        s.schedule(Request(cpu=1, locality=(LocalityRequirement(key="big"),)))
        s.schedule(Request(cpu=1, template_id="t"))
        s.run(peers.record("c1", "bt", "k1", "a", capacity=1))
        s.run(peers.record("c1", "bt", "k2", "b", capacity=1))  # evicts k1
        s.run(peers.lookup("c1", "bt", "k2"))
        s.run(peers.peers("c1", "bt", ""))
        s.run(peers.forget("c1", "bt", "k2", "b"))
        s.set_lingering("b", True)
        s.nodes()
        s.list_nodes()  # (paged: ZRANGEBYLEX)
        s.observed_nodes()
        s.census()
        s.reservations()
        s.stats()
        s.policy()
        s.unregister("b", "i1")
        s.advance_clock(2 * 3_600_000)
        s.sweep()  # forgets "a": its bindings, roster, cpu config round
        for args in (
            ["nodes", "--cell", "acl"],
            ["reservations", "--cell", "acl"],
            ["explain", "--cpu", "1", "--cell", "acl"],
            ["cells"],
        ):
            result = CliRunner().invoke(main, [*args, "--redis", url])
            if result.exit_code != 0:
                raise PermissionDenied(result.output)
        replica_workload(url)
        return str(s.scripts.mode)
    finally:
        s.close()


def replica_workload(url: str, cell: str = "acl-replica") -> None:
    """A replica started as this user (its start-up checks, the library, the
    coalescers) answering concurrent Schedules that go as batches."""
    settings = settings_for(Policy(limits=Limits(max_sandbox_count=3)), cell=cell)
    r = ThreadedReplica(settings, lambda: async_client(url), url)
    try:
        r.__enter__()
    except BaseException:
        if r.replica is not None:  # (refused at start: close what it opened)
            r.call(r.replica.sched.close())
        r.loop_thread.close()
        raise
    with r:
        r.stub.Heartbeat(hb_request("r1"), metadata=endpoint_md("r1:5000"))
        calls = [r.stub.Schedule.future(cold(1, 16), timeout=10) for _ in range(8)]
        for c in calls:
            try:
                c.result()
            except grpc.RpcError as e:
                if not (e.details() or "").startswith("no nodes available"):  # (the ceiling)
                    raise PermissionDenied(f"{e.code().name}: {e.details()}") from None


_CALL_ANY = re.compile(r"redis\.p?call\(\s*([^,)]*)")
_LITERAL = re.compile(r"^'([A-Za-z|]+)'$")


def commands_in(text: str) -> set[str]:
    """Every command a Lua text can run: the first argument of each
    redis.call / redis.pcall, which must be a literal (a name passed in a
    variable would escape this count, so none is)."""
    out = set()
    for arg in _CALL_ANY.findall(text):
        m = _LITERAL.match(arg.strip())
        assert m is not None, f"redis.call with a command name that is not a literal: {arg!r}"
        out.add(m.group(1).lower())
    return out


def test_every_command_a_script_can_run_is_granted() -> None:
    """Derived from the built library and from every EVAL script, not from a
    list kept by hand: finish_batch's SET was missing from the documented line."""
    texts = {"library": library().text} | {name: text for name, (_, text) in sources().items()}
    used: set[str] = set()
    for name, text in texts.items():
        found = commands_in(text)
        assert found, name
        missing = found - set(SCRIPTED_COMMANDS)
        assert not missing, f"{name} runs {sorted(missing)}, which acl.COMMANDS lacks"
        used |= found
    assert used == set(SCRIPTED_COMMANDS), sorted(set(SCRIPTED_COMMANDS) - used)
    assert "set" in used  # (finish_batch stores the rotation counter once a batch)


def test_commands_in_refuses_a_name_it_cannot_read() -> None:
    assert commands_in("redis.call('HSET', k, 'a', 1) redis.pcall( 'ZADD', k)") == {"hset", "zadd"}
    with pytest.raises(AssertionError, match="not a literal"):
        commands_in("local cmd = 'SET'; redis.call(cmd, k, v)")


def live_reservations(admin_url: str, cell: str) -> list[str]:
    s = Scheduler.connect(admin_url, cell=cell)
    try:
        return sorted(r.reservation_id for r in s.reservations() if r.state == "pending")
    finally:
        s.close()


def test_the_documented_user_serves_coalesced_load_through_a_replica(
    admin: redis.Redis, server: RedisServer
) -> None:
    """The report's case: 8 gateway threads, 60 Schedules, batches that rotate
    the round-robin counter, through a real replica as the documented user.
    Before SET was granted, 29-48 of 60 answered INTERNAL and each left a
    reservation behind."""
    url = make_user(admin, server, COMMANDS)
    settings = settings_for(Policy(limits=Limits(max_sandbox_count=100)), cell="load")
    codes: list[str] = []
    lock = threading.Lock()
    with ThreadedReplica(settings, lambda: async_client(url), url) as r:
        for i in range(6):
            r.stub.Heartbeat(hb_request(f"n{i}"), metadata=endpoint_md(f"n{i}:5000"))

        def gateway() -> None:
            for _ in range(60 // 8 + 1):
                try:
                    r.stub.Schedule(cold(1, 16), timeout=10)
                    with lock:
                        codes.append("OK")
                except grpc.RpcError as e:
                    with lock:
                        codes.append(e.code().name)

        threads = [threading.Thread(target=gateway) for _ in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert r.replica is not None
        coalescer = r.replica.sched.coalescer
        batches, largest = coalescer.batches, coalescer.largest
    assert codes.count("OK") == len(codes) == 64, sorted(set(codes))
    assert batches > 0 and largest > 1, (batches, largest)
    # each placement answered holds one reservation (none assigned yet), nothing else
    assert len(live_reservations(server.url, "load")) == 64


def test_a_batch_that_fails_mid_way_leaves_no_reservation(
    admin: redis.Redis, server: RedisServer
) -> None:
    """Redis keeps what a script wrote before its error: a user without SET
    runs a whole batch of Schedules (each reserving) up to finish_batch, which
    SET fails.  Every Schedule answered anything but a placement must leave
    no reservation (the replica cancels the ids the failed batch carried)."""
    url = make_user(admin, server, tuple(c for c in COMMANDS if c != "set"))
    setup = Scheduler.connect(
        server.url,
        cell="mid",
        policy=Policy(limits=Limits(max_sandbox_count=100)),
        overwrite_policy=True,
    )
    for i in range(4):
        setup.heartbeat(node(f"m{i}", 32, 0, []))
    setup.close()

    async def burst() -> tuple[list[str], list[BaseException]]:
        s = await AsyncScheduler.connect(url, cell="mid")
        try:
            results = await asyncio.gather(
                *(s.schedule(Request.cold(1, 0)) for _ in range(12)), return_exceptions=True
            )
            batches = s.coalescer.batches
            assert batches >= 1, batches
            for _ in range(100):  # the cancels go in the background
                if not s.abandoned:
                    break
                await asyncio.sleep(0.05)
            assert not s.abandoned
        finally:
            await s.close()
        ok = [r.reservation_id or "" for r in results if not isinstance(r, BaseException)]
        failed = [r for r in results if isinstance(r, BaseException)]
        return ok, failed

    ok, failed = asyncio.run(burst())
    assert failed, "no batch failed: the test did not reach finish_batch's SET"
    assert all(isinstance(e, PermissionDenied) and "'set'" in str(e) for e in failed), failed
    assert live_reservations(server.url, "mid") == sorted(ok)


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
    commands the scripts call.  Today's code crashed with a traceback.  (With
    INFO too: without it the start-up's eviction check is what is refused.)"""
    admin.execute_command(
        "ACL",
        "SETUSER",
        "narrow",
        "on",
        ">pw",
        "~sched:*",
        "+fcall",
        "+function|load",
        "+ping",
        "+info",
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
    from scheduler.domain.errors import NotReplicated
    from scheduler.store.durability import Durability

    acked = Durability(replicas=1, timeout_ms=50)
    url = make_user(admin, server, COMMANDS)
    with pytest.raises(PermissionDenied, match="Redis refused the command 'wait'"):
        Scheduler.connect(url, cell="acl", policy=Policy(), durability=acked)
    make_user(admin, server, (*COMMANDS, "wait"))
    # WAIT runs now; this server has no replicas to acknowledge anything
    with pytest.raises(NotReplicated, match="reached 0 of the 1 replica"):
        Scheduler.connect(url, cell="acl", policy=Policy(), durability=acked)


def test_simulate_runs_as_the_documented_user(admin: redis.Redis, server: RedisServer) -> None:
    """simulate finds (and with --reset deletes) its demo cell's keys with SCAN
    and DEL, both in the line now."""
    url = make_user(admin, server, COMMANDS)
    for extra in ([], ["--reset"]):
        result = CliRunner().invoke(
            main, ["simulate", "--nodes", "1", "--creates", "1", "--redis", url, *extra]
        )
        assert result.exit_code == 0, result.output
