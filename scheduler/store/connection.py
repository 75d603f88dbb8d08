"""Clients that keep finding Redis: one server, the primary Sentinel names
(:mod:`scheduler.store.sentinel`) or a Redis Cluster
(:mod:`scheduler.store.cluster`), for every address
:mod:`scheduler.store.address` parses.

Every client made here retries a call once, at once, after a connection
error (a pooled socket that died with a restart, a primary that became a
replica): the scripts are written so that sending the same call twice cannot
place twice (a Schedule carries its reservation id).  Timeouts are not
retried: a Redis that does not answer fails the call within ``timeout``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from scheduler.store import embedded
from scheduler.store.address import DEFAULT_TIMEOUT_S, parse_address
from scheduler.store.cluster import _AsyncCluster, _cluster_options, _SyncCluster
from scheduler.store.sentinel import _AsyncSentinel, _SyncSentinel

_SYNC_SENTINEL: Any = _SyncSentinel
_ASYNC_SENTINEL: Any = _AsyncSentinel
_SYNC_CLUSTER: Any = _SyncCluster
_SYNC_CLUSTER_NODE: Any = redis.cluster.ClusterNode
_ASYNC_CLUSTER: Any = _AsyncCluster

#: A pooled connection idle this long is PINGed before it carries a call: the
#: pool hands out sockets the server closed (a restart) as if they were alive.
HEALTH_CHECK_S = 1


def _common(timeout_s: float, socket_timeout: bool = True) -> dict[str, Any]:
    return {
        "socket_connect_timeout": min(timeout_s, 2.0),
        "socket_timeout": timeout_s if socket_timeout else None,
        "health_check_interval": HEALTH_CHECK_S,
    }


def _sentinel_common(timeout_s: float) -> dict[str, Any]:
    # a sentinel that does not answer is skipped quickly: the next one may
    return {"socket_connect_timeout": min(timeout_s, 0.5), "socket_timeout": min(timeout_s, 1.0)}


def sync_client(text: str | None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    addr = parse_address(text)
    retry = Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))
    if addr.kind == "embedded":
        return embedded.sync_client()
    if addr.kind == "cluster":
        return _SYNC_CLUSTER(
            startup_nodes=[_SYNC_CLUSTER_NODE(h, p) for h, p in addr.sentinels],
            retry=retry,
            **_common(timeout_s),
            **_cluster_options(addr),
        )
    if addr.kind == "sentinel":
        sentinel = _SYNC_SENTINEL(
            list(addr.sentinels),
            sentinel_kwargs={**_sentinel_common(timeout_s), **addr.sentinel_options},
        )
        return sentinel.master_for(addr.service, retry=retry, **_common(timeout_s), **addr.options)
    return redis.Redis.from_url(addr.url, retry=retry, **_common(timeout_s))


def async_client(
    text: str | None, timeout_s: float = DEFAULT_TIMEOUT_S, *, caller_bounds: bool = False
) -> Any:
    """An asyncio client.  ``caller_bounds``: every call made with it is
    bounded by its caller (an :class:`~scheduler.client.aio.AsyncScheduler` bounds
    each one by ``timeout_s`` or a shorter deadline), so its connections get
    no socket timeout of their own: redis-py runs every send under a socket
    timeout as a task of its own (``asyncio.wait_for``), which cost a replica
    about 8 % of its CPU per Schedule RPC (docs/performance.md)."""
    addr = parse_address(text)
    # The asyncio client needs the asyncio Retry: given the synchronous one it
    # never awaits the retried call, so the "one quick retry" silently failed.
    retry = AsyncRetry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))
    if addr.kind == "embedded":
        return embedded.async_client()
    common = _common(timeout_s, socket_timeout=not caller_bounds)
    if addr.kind == "cluster":
        return _ASYNC_CLUSTER(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in addr.sentinels],
            retry=retry,
            **common,
            **_cluster_options(addr),
        )
    guard = RestartGuard()
    if addr.kind == "sentinel":
        sentinel = _ASYNC_SENTINEL(
            list(addr.sentinels),
            sentinel_kwargs={**_sentinel_common(timeout_s), **addr.sentinel_options},
        )
        client = sentinel.master_for(
            addr.service, retry=retry, redis_connect_func=guard.connect, **common, **addr.options
        )
    else:
        client = redis.asyncio.Redis.from_url(
            addr.url, retry=retry, redis_connect_func=guard.connect, **common
        )
    client.restart_guard = guard
    return client


class RestartGuard:
    """Checks every new connection of an asyncio client (one Redis, or the
    primary Sentinel names) against the server a replica last checked the
    data of (``INFO server`` ``run_id``, :attr:`verified`).  A connection
    to another server (Redis restarted, maybe from an old snapshot, or a new
    primary) is refused: ``on_other`` holds the writes until the replica has
    compared that server's data with what it saw (scheduler/domain/history.py).
    Without it, redis-py's one quick retry after the connection error sends
    the call to the restarted server before any check.  The replica's own
    checks pass (``bypass``).  Off (``verified`` None) until a replica sets it."""

    def __init__(self) -> None:
        self.verified: str | None = None
        self.on_other: Callable[[str], None] | None = None
        self.bypass: Callable[[], bool] = lambda: False

    async def connect(self, conn: Any) -> None:
        await conn.on_connect()
        if self.verified is None or self.bypass():
            return
        await conn.send_command("INFO", "server")
        run_id = server_run_id(await conn.read_response())
        if run_id != self.verified:
            if self.on_other is not None:
                self.on_other(run_id)
            raise redis.exceptions.ConnectionError(
                "another Redis server answers (restarted or replaced: run_id "
                f"{run_id[:12]}): writes wait until this replica has checked its data"
            )


def server_run_id(info: Any) -> str:
    """``run_id`` of an ``INFO server`` reply (raw text, or redis-py's dict)."""
    if isinstance(info, dict):
        return str(info.get("run_id", ""))
    text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith("run_id:"):
            return line[len("run_id:") :].strip()
    return ""
