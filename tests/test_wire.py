"""The lean connection of the asyncio client's FCALLs (scheduler/store/wire.py):
it carries the calls once the library is known, answers and fails exactly as
redis-py does, and whenever it cannot carry a call, redis-py does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from scheduler import Policy, Request
from scheduler.client.aio import AsyncScheduler
from scheduler.domain.errors import NoNodesAvailable, NotFound, StoreUnavailable
from scheduler.store.wire import ScriptWire, pack, usable
from scheduler.testing.redis_server import RedisServer, free_port
from tests.certs import Authority
from tests.helpers import hb

pytestmark = pytest.mark.real_only

REQ = Request.cold(1, 1024)


def test_pack_writes_what_redis_py_writes() -> None:
    command: list[str | bytes | int | float] = [
        "FCALL",
        "sched_x_schedule",
        1,
        "sched:{c}:rr",
        "create",
        "ünï",
        "",
        b"\x00raw",
        0.37,
        -12,
        1e-7,
    ]
    conn = redis.connection.Connection()
    assert pack(command) == b"".join(conn.pack_command(*command))
    for bad in (True, None, [1]):
        with pytest.raises(redis.exceptions.DataError):
            pack(["FCALL", bad])  # type: ignore[list-item]
        with pytest.raises(redis.exceptions.DataError):
            conn.pack_command("FCALL", bad)


def _with(scenario: Callable[[AsyncScheduler, RedisServer], Awaitable[None]]) -> None:
    with RedisServer() as rs:

        async def run() -> None:
            a = await AsyncScheduler.connect(rs.url, cell="wire", policy=Policy())
            try:
                await a.heartbeat(hb("n1", cpu=64, mem_gib=256))
                await scenario(a, rs)
            finally:
                await a.close()

        asyncio.run(run())


async def _up(a: AsyncScheduler) -> ScriptWire:
    """The wire, once it connected (it does in the background after a call)."""
    wire = a.scripts.wire
    assert wire is not None
    for _ in range(200):
        if wire.replies is not None and wire.replies.open:
            return wire
        await a.schedule(REQ)
        await asyncio.sleep(0.01)
    raise AssertionError("the lean connection never came up")


def test_script_calls_go_through_the_wire_once_it_is_up() -> None:
    async def scenario(a: AsyncScheduler, rs: RedisServer) -> None:
        wire = await _up(a)
        before, pending = wire.carried, (await a.stats()).pending
        placed = await asyncio.gather(*(a.schedule(REQ) for _ in range(20)))
        assert len({p.reservation_id for p in placed}) == 20
        assert wire.carried > before
        # an error reply is raised as redis-py raises it, then translated as ever
        with pytest.raises(NotFound, match="reservation no-such-reservation not found"):
            await a.cancel("no-such-reservation")
        with pytest.raises(NoNodesAvailable, match="insufficient cpu"):
            await a.schedule(Request.cold(1000, 1024))
        assert (await a.stats()).pending == pending + 20

    _with(scenario)


def test_a_flushed_library_is_loaded_again_through_the_ordinary_path() -> None:
    async def scenario(a: AsyncScheduler, rs: RedisServer) -> None:
        await _up(a)
        admin = rs.client()
        try:
            admin.function_flush()
            placed = await a.schedule(REQ)
            assert placed.node_id == "n1"
            assert admin.function_list()  # loaded again
        finally:
            admin.close()

    _with(scenario)


def test_a_killed_connection_is_replaced_and_the_call_still_answers() -> None:
    async def scenario(a: AsyncScheduler, rs: RedisServer) -> None:
        wire = await _up(a)
        admin = rs.client()
        try:
            admin.client_kill_filter(_type="normal", skipme=True)  # every client connection
        finally:
            admin.close()
        await asyncio.sleep(0.05)
        placed = await a.schedule(REQ)  # (redis-py's pool reconnects; the wire is down)
        assert placed.node_id == "n1"
        await _up(a)  # and the wire connects again
        assert wire.replies is not None and wire.replies.open

    _with(scenario)


def test_redis_down_is_store_unavailable_naming_redis() -> None:
    async def scenario(a: AsyncScheduler, rs: RedisServer) -> None:
        await _up(a)
        rs.kill()
        with pytest.raises(StoreUnavailable, match="Redis at .* is unreachable"):
            await a.schedule(REQ, timeout=1.0)

    _with(scenario)


def test_a_call_cut_short_by_its_deadline_closes_the_wire() -> None:
    async def scenario(a: AsyncScheduler, rs: RedisServer) -> None:
        wire = await _up(a)
        replies = wire.replies
        rs.pause()
        try:
            with pytest.raises(StoreUnavailable, match="did not answer within"):
                await a.run(a.ops.stats(), timeout=0.2)
        finally:
            rs.resume()
        assert replies is not None and not replies.open
        assert (await a.schedule(REQ)).node_id == "n1"

    _with(scenario)


@pytest.mark.parametrize("form", ["rediss", "unix"])
def test_the_wire_connects_as_redis_py_does(form: str, tmp_path: Path) -> None:
    """TLS, a password and a database, or a unix socket: redis-py makes and
    sets up the wire's connection, so it speaks to Redis as the pool does."""
    ca = Authority()
    ca_path = ca.write(tmp_path)
    cert, key = ca.issue("127.0.0.1", server=True).write(tmp_path, "server")
    tls_port = free_port()
    args = (
        [
            "--tls-port",
            str(tls_port),
            "--tls-cert-file",
            str(cert),
            "--tls-key-file",
            str(key),
            "--tls-ca-cert-file",
            str(ca_path),
            "--tls-auth-clients",
            "no",
        ]
        if form == "rediss"
        else []
    )
    with RedisServer(unix_socket=form == "unix", extra_args=args) as rs:
        admin = rs.client()
        admin.config_set("requirepass", "s3cret")  # (set once the server answered a PING)
        admin.close()
        url = (
            f"rediss://:s3cret@127.0.0.1:{tls_port}/3?ssl_ca_certs={ca_path}"
            if form == "rediss"
            else f"unix://:s3cret@{rs.socket}?db=3"
        )

        async def run() -> None:
            a = await AsyncScheduler.connect(url, cell="wire", policy=Policy())
            try:
                await a.heartbeat(hb("n1", cpu=64, mem_gib=256))
                wire = await _up(a)
                before = wire.carried
                await asyncio.gather(*(a.schedule(REQ) for _ in range(10)))
                assert wire.carried > before
            finally:
                await a.close()

        asyncio.run(run())
        admin = rs.client(password="s3cret", db=3)
        try:
            assert admin.keys("sched:{wire}:*")  # (the cell is in database 3)
        finally:
            admin.close()


def test_only_one_plain_redis_gets_a_wire() -> None:
    def client(url: str, **kw: Any) -> Any:
        return redis.asyncio.Redis.from_url(url, **kw)

    assert usable(client("redis://localhost:6379/0"))
    assert not usable(client("redis://localhost:6379/0", protocol=3))
    assert not usable(client("redis://localhost:6379/0", decode_responses=True))
    assert not usable(redis.Redis.from_url("redis://localhost:6379/0"))
