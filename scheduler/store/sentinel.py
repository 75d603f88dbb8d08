"""Sentinel: finding the primary the sentinels name (the one with the
newest configuration), and following a failover as they announce it: writes
held while it runs (:class:`Fence`), connections moved when it ends
(:class:`SentinelWatch`), or checked before each call where no event loop
listens (:class:`PrimaryCheck`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

log = logging.getLogger("scheduler.store.sentinel")


def _newest(
    sentinel: Any, service: str, sentinels: list[Any], answers: list[Any], errors: list[str]
) -> Any:
    """The sentinel that knows the newest configuration of ``service``
    (highest config-epoch, the primary's state usable): just after a
    failover, the others still name the old primary, which takes writes."""
    best: tuple[int, Any] | None = None
    for who, masters in zip(sentinels, answers, strict=True):
        state = masters.get(service) if masters is not None else None
        if state and sentinel.check_master_state(state, service):
            epoch = int(state.get("config-epoch", 0))
            if best is None or epoch > best[0]:
                best = (epoch, who)
    if best is None:
        more = f": {'; '.join(errors)}" if errors else ""
        raise redis.sentinel.MasterNotFoundError(f"no sentinel names a primary {service!r}{more}")
    return best[1]


def _address(reply: Any, service: str) -> tuple[str, int]:
    if not reply:
        raise redis.sentinel.MasterNotFoundError(f"no sentinel names a primary {service!r}")
    host = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    return host, int(reply[1])


#: what a sentinel may answer instead of its masters: down, slow, or no sentinel at all
_SENTINEL_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ResponseError,
)


class _SyncSentinel(redis.sentinel.Sentinel):
    """redis-py's, except that it asks every sentinel and follows the one with
    the newest configuration, takes the primary's address as that sentinel
    names it now (the promoted replica as soon as a failover promoted it),
    and skips a server that answers as no sentinel does (an error reply) like
    one that is down instead of raising it as a bug."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        answers: list[Any] = []
        errors: list[str] = []
        for sentinel in self.sentinels:
            try:
                answers.append(sentinel.sentinel_masters())
            except _SENTINEL_ERRORS as e:
                answers.append(None)
                errors.append(_where(sentinel, e))
        best = _newest(self, service_name, self.sentinels, answers, errors)
        try:
            return _address(best.sentinel_get_master_addr_by_name(service_name), service_name)
        except _SENTINEL_ERRORS as e:
            raise redis.sentinel.MasterNotFoundError(_where(best, e)) from None


class _AsyncSentinel(redis.asyncio.sentinel.Sentinel):
    """The asyncio twin of :class:`_SyncSentinel` (sentinels asked at once)."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        replies = await asyncio.gather(
            *(s.sentinel_masters() for s in self.sentinels), return_exceptions=True
        )
        answers: list[Any] = []
        errors: list[str] = []
        for sentinel, reply in zip(self.sentinels, replies, strict=True):
            if isinstance(reply, _SENTINEL_ERRORS):
                answers.append(None)
                errors.append(_where(sentinel, reply))
            elif isinstance(reply, BaseException):
                raise reply
            else:
                answers.append(reply)
        best = _newest(self, service_name, self.sentinels, answers, errors)
        try:
            reply = await best.sentinel_get_master_addr_by_name(service_name)
        except _SENTINEL_ERRORS as e:
            raise redis.sentinel.MasterNotFoundError(_where(best, e)) from None
        return _address(reply, service_name)


def _where(sentinel: Any, e: Exception) -> str:
    kw = sentinel.connection_pool.connection_kwargs
    return f"sentinel {kw.get('host')}:{kw.get('port')}: {e}"


class PrimaryCheck:
    """For a synchronous client under Sentinel (no event loop to listen with):
    ask the sentinels where the primary is before a call (at most every
    ``every_s`` seconds; 0: before every call, one sentinel round trip); a
    moved primary closes the pooled connections to the old one."""

    def __init__(self, client: Any, every_s: float = 0.0) -> None:
        self.pool: Any = client.connection_pool
        self.every_s = every_s
        self.next = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now >= self.next:
            self.next = now + self.every_s
            self.pool.get_master_address()


def is_sentinel_client(client: Any) -> bool:
    return isinstance(
        getattr(client, "connection_pool", None),
        (redis.sentinel.SentinelConnectionPool, redis.asyncio.sentinel.SentinelConnectionPool),
    )


class Fence:
    """Writes held while Sentinel fails the primary over.  From the moment a
    failover starts until the new primary is announced, the old primary still
    takes writes that the promoted replica will never see: holding them is
    what keeps that window to the calls already in flight."""

    #: longest a fence holds if its end is never announced (the monitor's own
    #: check of the primary's address catches a missed announcement anyway)
    MAX_S = 10.0

    def __init__(self) -> None:
        self.reason = ""
        self.until = 0.0

    def close(self, reason: str) -> None:
        self.reason = reason
        self.until = time.monotonic() + self.MAX_S

    def open(self) -> None:
        self.until = 0.0

    def held(self) -> str:
        """Why writes are held now ("" = they are not)."""
        return self.reason if time.monotonic() < self.until else ""


#: Sentinel events of a failover of one primary (channel -> what it means here)
_FAILOVER_STARTS = ("+try-failover", "+selected-slave", "+failover-state-send-slaveof-noone")
_FAILOVER_ENDS = ("+switch-master",)


def _event_service(data: bytes) -> str:
    """The primary's name in a Sentinel event: "<name> ..." (+switch-master),
    "master <name> ..." or "slave <addr> <ip> <port> @ <name> ..."."""
    parts = data.decode(errors="replace").split()
    if "@" in parts and parts.index("@") + 1 < len(parts):
        return parts[parts.index("@") + 1]
    if len(parts) > 1 and parts[0] in ("master", "slave", "sentinel"):
        return parts[1]
    return parts[0] if parts else ""


class SentinelWatch:
    """Follows a failover as the sentinels announce it, and checks the
    primary's address on every ``check()`` as a backstop.  When a failover
    starts, writes are held (``fence``); when the new primary is announced,
    idle connections close at once and busy ones when they are released, so
    no call keeps writing to a primary that was replaced, and writes resume."""

    def __init__(
        self,
        client: Any,
        fence: Fence | None = None,
        on_switch: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.fence = fence or Fence()
        self.on_switch = on_switch
        self.pool: Any = client.connection_pool
        self.manager: Any = self.pool.sentinel_manager
        self.service: str = self.pool.service_name
        self.primary: tuple[str, int] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def check(self) -> bool:
        """Ask the sentinels where the primary is; True when it moved."""
        address = await self.manager.discover_master(self.service)
        address = (str(address[0]), int(address[1]))
        moved = self.primary is not None and address != self.primary
        self.primary = address
        if moved:
            log.warning(
                "Sentinel names a new primary for %s: %s:%d; reconnecting", self.service, *address
            )
            await self.pool.get_master_address()  # closes idle connections of the old one
            await self.pool.update_active_connections_for_reconnect()
            self.fence.open()
        return moved

    def start(self) -> None:
        for sentinel in self.manager.sentinels:
            self._tasks.append(asyncio.create_task(self._listen(sentinel), name="sentinel-watch"))

    async def _event(self, channel: str, data: bytes) -> None:
        if _event_service(data) != self.service:
            return
        if channel in _FAILOVER_STARTS:
            if not self.fence.held():
                log.warning(
                    "Sentinel is failing over %s (%s): writes held until the new "
                    "primary is announced",
                    self.service,
                    channel,
                )
            self.fence.close(
                f"Sentinel is failing over the primary {self.service}; writes "
                "resume once the new primary is announced"
            )
        elif channel in _FAILOVER_ENDS:
            if await self.check() and self.on_switch is not None:
                await self.on_switch()
            self.fence.open()
        elif channel.startswith("-failover-abort"):
            log.warning(
                "Sentinel gave up failing over %s (%s): writes resume", self.service, channel
            )
            self.fence.open()

    async def _listen(self, sentinel: Any) -> None:
        while True:
            try:
                pubsub = sentinel.pubsub()
                await pubsub.subscribe(*_FAILOVER_STARTS, *_FAILOVER_ENDS)
                await pubsub.psubscribe("-failover-abort*")
                try:
                    async for message in pubsub.listen():
                        data = message.get("data")
                        channel = message.get("channel")
                        if isinstance(data, bytes) and isinstance(channel, bytes):
                            await self._event(channel.decode(), data)
                finally:
                    await pubsub.aclose()
            except asyncio.CancelledError:
                raise
            except Exception:  # a sentinel down or restarting: try it again
                await asyncio.sleep(1.0)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2)
        self._tasks.clear()
