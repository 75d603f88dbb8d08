"""A lean connection for the asyncio client's script calls (``FCALL``).

redis-py's command path (pool, retry, observability, encoder, asyncio
streams) costs several times what writing the command to the socket and
reading its reply with hiredis costs (one call at a time on uvloop: about 110
us of the process's CPU per call against 40, system calls included), and a
replica makes one such call per Schedule or coalesced batch.
:class:`ScriptWire` is that lean path: one connection, made and set up by
redis-py (TLS, AUTH, db, client name: whatever the address says), whose
socket is then read by a protocol that feeds hiredis and answers the calls
in order, so calls in flight together share it (pipelined).

It only carries calls, never decides anything: an error reply is raised as
redis-py raises it (the same exception classes), and whenever it cannot
carry a call (not connected yet, lost, its socket's buffer full) it raises
:class:`WireDown` and the caller sends the call the ordinary way, through
redis-py, which then retries, reconnects and fails as it always did.  (A call
lost with the connection may have run: sent again, it is one more retry of
the kind redis-py makes, which the scripts are written to take.)  A call
cut short (its deadline, a cancelled caller) closes the connection, as
redis-py does, so a Redis that stopped answering leaves no connection behind.
It serves one Redis server (``redis://``, ``rediss://``, ``unix://``), not
Sentinel or a Redis Cluster, whose clients route each call themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio
from redis._parsers.base import BaseParser
from redis.utils import HIREDIS_AVAILABLE

log = logging.getLogger("scheduler.store.wire")


class WireDown(Exception):
    """The lean connection cannot carry this call: send it the ordinary way."""


def usable(client: Any) -> bool:
    """Can a :class:`ScriptWire` serve this client?  One plain Redis, RESP2,
    replies as bytes, hiredis installed."""
    if not HIREDIS_AVAILABLE or type(client) is not redis.asyncio.Redis:
        return False
    pool = client.connection_pool
    if type(pool) is not redis.asyncio.ConnectionPool:  # (Sentinel's pool, a blocking one)
        return False
    kw = pool.connection_kwargs
    return kw.get("protocol") in (None, 2, "2") and not kw.get("decode_responses")


def pack(command: Sequence[str | bytes | int | float]) -> bytes:
    """``command`` in the Redis protocol (what redis-py's encoder writes: text
    as UTF-8, numbers as their repr; anything else is refused as it refuses it)."""
    parts = [b"*%d\r\n" % len(command)]
    for arg in command:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, bool) or not isinstance(arg, (int, float)):
            raise redis.exceptions.DataError(
                f"Invalid input of type: {type(arg).__name__!r}. Convert to a bytes, string, "
                f"int or float first."
            )
        else:
            data = repr(arg).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


class _Replies(asyncio.Protocol):
    """Reads a connection's replies with hiredis and answers the calls in order."""

    def __init__(self, transport: asyncio.Transport) -> None:
        import hiredis

        self.transport = transport
        self.reader = hiredis.Reader(
            protocolError=redis.exceptions.InvalidResponse, replyError=BaseParser.parse_error
        )
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.open = True
        self.paused = False

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while True:
            try:
                reply = self.reader.gets()
            except redis.exceptions.InvalidResponse as e:
                self.close(e)
                return
            if reply is False:
                return
            if not self.waiting:  # (a reply nobody asked for: this connection is lost)
                self.close(redis.exceptions.InvalidResponse("an unexpected reply"))
                return
            fut = self.waiting.popleft()
            if fut.done():  # (its caller gave up)
                continue
            if isinstance(reply, redis.exceptions.ResponseError):
                fut.set_exception(reply)
            else:
                fut.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self._fail()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def close(self, why: BaseException | None = None) -> None:
        if self.open:
            self.open = False
            if why is not None:
                log.debug("lean connection closed: %s", why)
            self.transport.close()
        self._fail()

    def _fail(self) -> None:
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_exception(WireDown())


class ScriptWire:
    """The lean connection of one asyncio client (see the module docstring).
    It connects in the background on its first use; until it is up, calls go
    the ordinary way."""

    #: after a failed connect, the ordinary path carries the calls this long
    RETRY_S = 1.0

    def __init__(self, client: Any) -> None:
        self.pool: Any = client.connection_pool
        self.replies: _Replies | None = None
        self.conn: Any = None  # redis-py's connection, kept so its streams stay referenced
        self.connecting: asyncio.Task[None] | None = None
        self.next_try = 0.0
        self.closed = False
        #: calls this connection carried (to see it work)
        self.carried = 0

    async def call(self, command: Sequence[str | bytes | int | float]) -> Any:
        """Send ``command``, return its reply (an error reply raised)."""
        replies = self.replies
        if replies is None or not replies.open:
            self._connect_soon()
            raise WireDown()
        if replies.paused:  # Redis reads slower than we write: no more buffered here
            raise WireDown()
        fut = asyncio.get_running_loop().create_future()
        replies.transport.write(pack(command))
        replies.waiting.append(fut)
        self.carried += 1
        try:
            return await fut
        except asyncio.CancelledError:
            replies.close()  # cut short mid-call: redis-py would drop its connection too
            raise

    def _connect_soon(self) -> None:
        if self.closed or (self.connecting is not None and not self.connecting.done()):
            return
        if self.replies is not None:
            self._drop()  # lost: connect again at once
        elif time.monotonic() < self.next_try:
            return
        self.connecting = asyncio.get_running_loop().create_task(
            self._connect(), name="script-wire"
        )

    async def _connect(self) -> None:
        conn = self.pool.make_connection()
        try:
            await conn.connect()  # redis-py's own: TLS, AUTH, SELECT, CLIENT SETINFO
            transport = conn._writer.transport
            if conn._reader._buffer:  # (nothing may be left unread after the handshake)
                raise redis.exceptions.ConnectionError("unexpected data after the handshake")
        except (redis.exceptions.RedisError, OSError, AttributeError) as e:
            self.next_try = time.monotonic() + self.RETRY_S
            log.debug("lean connection not made: %s", e)
            await conn.disconnect()
            return
        except BaseException:
            await conn.disconnect()
            raise
        if self.closed:
            await conn.disconnect()
            return
        replies = _Replies(transport)
        transport.set_protocol(replies)
        self.replies, self.conn = replies, conn

    def _drop(self) -> None:
        if self.replies is not None:
            self.replies.close()
        if self.conn is not None:
            # (its streams no longer read this socket: closed without waiting for them)
            self.conn._close()
        self.replies = self.conn = None

    async def close(self) -> None:
        self.closed = True
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()
            await asyncio.wait([self.connecting])
        self._drop()
