"""Where Redis is, and clients that keep finding it.

``redis_addr`` (config, ``SCHEDULER_REDIS_ADDR``, ``schedctl --redis``) takes:

* ``host:port`` (the reference system's form), ``redis://``, ``rediss://``
  (TLS) or ``unix://`` URLs: one Redis;
* ``redis+sentinel://[user:password@]host:port[,host:port...]/MASTER[?db=N]``
  and ``rediss+sentinel://...`` (TLS to the sentinels and the primary, with
  the ``ssl_*`` query options of ``rediss://``): the primary that the
  sentinels name, followed through failovers.  ``user:password`` are the
  primary's; ``sentinel_username`` / ``sentinel_password`` query options
  authenticate to the sentinels when they need it;
* ``redis+cluster://[user:password@]host:port[,host:port...]`` and
  ``rediss+cluster://...``: a Redis Cluster, found from any of these nodes.
  Every call goes to the primary that serves its cell's hash slot (a cell's
  keys share one hash tag), following MOVED / ASK through slot moves and
  failovers.

Every client made here retries a call once, at once, after a connection
error (a pooled socket that died with a restart, a primary that became a
replica): the scripts are written so that sending the same call twice cannot
place twice (a Schedule carries its reservation id).  Timeouts are not
retried: a Redis that does not answer fails the call within ``timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from scheduler.domain.errors import FailedPrecondition, InvalidArgument
from scheduler.store import embedded
from scheduler.store.redact import redact, remember

log = logging.getLogger("scheduler.store.connection")
# redis-py leaves these untyped
_parse_url: Any = redis.connection.parse_url


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


_SYNC_SENTINEL: Any = _SyncSentinel
_ASYNC_SENTINEL: Any = _AsyncSentinel


def _where(sentinel: Any, e: Exception) -> str:
    kw = sentinel.connection_pool.connection_kwargs
    return f"sentinel {kw.get('host')}:{kw.get('port')}: {e}"


DEFAULT_TIMEOUT_S = 2.0
SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}
PLAIN_SCHEMES = ("redis://", "rediss://", "unix://")
#: query options of a sentinel address that are ours, not the primary's
_SENTINEL_AUTH = ("sentinel_username", "sentinel_password")
FORMS = (
    "host:port or a redis://, rediss://, unix://, redis+sentinel://h:p[,h:p...]/MASTER, "
    "rediss+sentinel://, redis+cluster://h:p[,h:p...] or rediss+cluster:// address"
)


@dataclass(frozen=True)
class RedisAddress:
    """A parsed ``redis_addr``.  ``text`` may hold a password: show it through
    :func:`describe_target`."""

    text: str
    kind: str  # "embedded" | "url" | "sentinel" | "cluster"
    url: str = ""  # kind "url": a redis://, rediss:// or unix:// URL
    #: kind "sentinel": the sentinels; kind "cluster": the nodes to start from
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""  # kind "sentinel": the monitored primary's name
    #: kinds "sentinel" and "cluster": keyword arguments of the data connections
    options: dict[str, Any] = field(default_factory=dict)
    #: kind "sentinel": keyword arguments of the connections to the sentinels
    sentinel_options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Durability:
    """When is a write acknowledged?  ``replicas`` > 0: only once that many
    Redis replicas have it (``WAIT replicas timeout_ms`` on the connection that
    wrote), so a failover cannot lose it."""

    replicas: int = 0
    timeout_ms: int = 200


def describe_target(url: str | None) -> str:
    """The address as logs and errors show it: never its credentials."""
    if not url:
        return "embedded in-process store (fakeredis, one replica only)"
    remember(url)
    return redact(url)


def _bad(problem: str) -> InvalidArgument:
    return InvalidArgument("redis_addr", problem)


def parse_address(text: str | None) -> RedisAddress:
    """Parse ``redis_addr``; an error names it and never echoes a password."""
    if not text or not text.strip():
        return RedisAddress(text="", kind="embedded")
    text = text.strip()
    remember(text)  # (its secrets are masked wherever they appear from now on)
    scheme, sep, rest = text.partition("://")
    if sep and scheme in SENTINEL_SCHEMES:
        return _parse_sentinel(text, SENTINEL_SCHEMES[scheme], rest)
    if sep and scheme in CLUSTER_SCHEMES:
        return _parse_cluster(text, CLUSTER_SCHEMES[scheme], rest)
    url = text if sep else f"redis://{text}"
    if not url.startswith(PLAIN_SCHEMES):
        raise _bad(f"must be {FORMS}, not {describe_target(text)!r}")
    try:
        _parse_url(url)
    except ValueError as e:
        raise _bad(f"{describe_target(text)!r} is not a usable address: {e}") from None
    return RedisAddress(text=text, kind="url", url=url)


def _hosts(hostlist: str, what: str) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for part in hostlist.split(","):
        host, colon, port = part.strip().rpartition(":")
        host = host.strip("[]")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise _bad(f"{what} {part.strip()!r} is not host:port")
        out.append((host, int(port)))
    return out


def _options(
    text: str, tls: bool, userinfo: str, first: tuple[str, int], db: str, params: dict[str, str]
) -> dict[str, Any]:
    """The data connections' options: what a redis(s):// URL to ``first`` would
    say, parsed by redis-py (credentials, db, ssl_* and socket options)."""
    if not db.isdigit():
        raise _bad(f"db must be a whole number, not {db!r}")
    probe = (
        f"{'rediss' if tls else 'redis'}://{userinfo + '@' if userinfo else ''}"
        f"{first[0]}:{first[1]}/{db}" + (f"?{urlencode(params)}" if params else "")
    )
    try:
        options: dict[str, Any] = _parse_url(probe)
    except ValueError as e:
        raise _bad(f"{describe_target(text)!r} is not a usable address: {e}") from None
    for key in ("host", "port", "path", "connection_class"):
        options.pop(key, None)
    if tls:
        options["ssl"] = True
    return options


def _parse_sentinel(text: str, tls: bool, rest: str) -> RedisAddress:
    authority, _, tail = rest.partition("/")
    userinfo, _, hostlist = authority.rpartition("@")
    service, _, query = tail.partition("?")
    service = unquote(service)
    if not service:
        raise _bad(
            f"{describe_target(text)!r} names no primary: add /MASTER_NAME after the sentinels"
        )
    sentinels = _hosts(hostlist, "sentinel")
    params = dict(parse_qsl(query, keep_blank_values=True))
    sentinel_auth = {k[len("sentinel_") :]: params.pop(k) for k in _SENTINEL_AUTH if k in params}
    options = _options(text, tls, userinfo, sentinels[0], params.pop("db", "0"), params)
    sentinel_options: dict[str, Any] = {k: v for k, v in options.items() if k.startswith("ssl")}
    sentinel_options.update(sentinel_auth)
    return RedisAddress(
        text=text,
        kind="sentinel",
        sentinels=tuple(sentinels),
        service=service,
        options=options,
        sentinel_options=sentinel_options,
    )


def _parse_cluster(text: str, tls: bool, rest: str) -> RedisAddress:
    authority, _, tail = rest.partition("/")
    userinfo, _, hostlist = authority.rpartition("@")
    path, _, query = tail.partition("?")
    if path not in ("", "0"):
        raise _bad("a Redis Cluster has database 0 only: leave the path out")
    seeds = _hosts(hostlist, "cluster node")
    params = dict(parse_qsl(query, keep_blank_values=True))
    options = _options(text, tls, userinfo, seeds[0], "0", params)
    options.pop("db", None)
    return RedisAddress(text=text, kind="cluster", sentinels=tuple(seeds), options=options)


def sentinel_url(
    sentinels: list[tuple[str, int]],
    service: str,
    *,
    user: str = "",
    password: str = "",
    tls: bool = False,
    **query: str,
) -> str:
    """The ``redis+sentinel://`` address of these sentinels (tests, benchmarks, docs)."""
    auth = f"{quote(user, safe='')}:{quote(password, safe='')}@" if user or password else ""
    hosts = ",".join(f"{h}:{p}" for h, p in sentinels)
    q = f"?{urlencode(query)}" if query else ""
    return f"{'rediss' if tls else 'redis'}+sentinel://{auth}{hosts}/{quote(service)}{q}"


# ---------------------------------------------------------------------------
# Clients
# ---------------------------------------------------------------------------
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


def _fcall_slot(client: Any, args: tuple[Any, ...]) -> int | None:
    """The slot of ``FCALL fn numkeys key...`` from its keys, as redis-py does
    for EVALSHA: without this it asks a node (COMMAND GETKEYS) on every call."""
    keys = args[2 : 2 + int(args[1])] if len(args) > 1 else ()
    if not keys:
        return None
    slots = {client.keyslot(k) for k in keys}
    if len(slots) != 1:
        raise redis.exceptions.RedisClusterException(
            "FCALL - all keys must map to the same key slot"
        )
    return int(slots.pop())


class _SyncCluster(redis.cluster.RedisCluster):
    def determine_slot(self, *args: Any) -> int | None:
        if str(args[0]).upper() in ("FCALL", "FCALL_RO"):
            slot = _fcall_slot(self, args[1:])
            if slot is not None:
                return slot
        result: int | None = super().determine_slot(*args)
        return result


class _AsyncCluster(redis.asyncio.cluster.RedisCluster):
    async def _determine_slot(self, command: str, *args: Any) -> int:
        if command.upper() in ("FCALL", "FCALL_RO"):
            slot = _fcall_slot(self, args)
            if slot is not None:
                return slot
        result: int = await super()._determine_slot(command, *args)
        return result


_SYNC_CLUSTER: Any = _SyncCluster
_SYNC_CLUSTER_NODE: Any = redis.cluster.ClusterNode
_ASYNC_CLUSTER: Any = _AsyncCluster


def _cluster_options(addr: RedisAddress) -> dict[str, Any]:
    # a slot move or a failover inside the cluster is followed by redis-py
    # (MOVED / ASK, TRYAGAIN retried); the whole cluster being down is not hidden
    return {**addr.options, "require_full_coverage": False}


def is_cluster_client(client: Any) -> bool:
    return isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))


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
    if addr.kind == "sentinel":
        sentinel = _ASYNC_SENTINEL(
            list(addr.sentinels),
            sentinel_kwargs={**_sentinel_common(timeout_s), **addr.sentinel_options},
        )
        return sentinel.master_for(addr.service, retry=retry, **common, **addr.options)
    return redis.asyncio.Redis.from_url(addr.url, retry=retry, **common)


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


# -- a Redis that would lose state ---------------------------------------------
#: The only eviction policy under which Redis never drops a key to make room
#: (it refuses writes at maxmemory instead, which the replica reports).
SAFE_EVICTION_POLICY = "noeviction"


class EvictionRisk(FailedPrecondition):
    """Redis may drop keys to make room (``maxmemory-policy`` other than
    ``noeviction``): reservations, bindings and node records could vanish
    while health says SERVING.  ``allow_eviction`` in the config accepts it."""


@dataclass
class EvictionWatch:
    """What a replica checks at start and in every health probe: the server's
    ``maxmemory-policy`` (INFO memory) and its ``evicted_keys`` (INFO stats),
    read once per primary (every primary of a cluster).  ``allowed``: a policy
    that evicts is logged, not refused."""

    allowed: bool = False
    #: evicted_keys per server at the last check (None: not read yet)
    evicted: dict[str, int] = field(default_factory=dict)

    async def check(self, client: Any, target: str) -> int:
        """Raise :class:`EvictionRisk` for a policy that evicts (unless allowed);
        return how many keys were evicted since the last check (logged)."""
        rose = 0
        for where, memory, stats in await _infos(client):
            policy = str(memory.get("maxmemory_policy", SAFE_EVICTION_POLICY))
            if policy != SAFE_EVICTION_POLICY and not self.allowed:
                raise EvictionRisk(
                    f"Redis at {target} has maxmemory-policy {policy}: at maxmemory it "
                    f"drops keys (reservations, bindings, node records) and the cell's "
                    f"ceilings no longer hold; set it to {SAFE_EVICTION_POLICY} "
                    "(CONFIG SET maxmemory-policy noeviction), or set scheduler.allow_eviction "
                    "to accept it"
                )
            evicted = _int_field(stats, "evicted_keys")
            before = self.evicted.get(where)
            self.evicted[where] = evicted
            if before is not None and evicted > before:
                rose += evicted - before
                log.error(
                    "Redis at %s evicted %d keys since the last check (maxmemory-policy %s): "
                    "the cell may have lost reservations or bindings",
                    target,
                    evicted - before,
                    policy,
                )
        return rose

    def total(self) -> int:
        return sum(self.evicted.values())


def _int_field(info: dict[str, Any], name: str) -> int:
    try:
        return int(info.get(name, 0))
    except (TypeError, ValueError):
        return 0


async def _infos(client: Any) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(server, INFO memory, INFO stats) of each primary ``client`` writes to."""
    if is_cluster_client(client):
        await client.initialize()
        out = []
        for node in client.get_primaries():
            memory = await client.info("memory", target_nodes=node)
            stats = await client.info("stats", target_nodes=node)
            out.append((str(node.name), _one_node(memory), _one_node(stats)))
        return out
    memory = await client.info("memory")
    stats = await client.info("stats")
    return [("", memory, stats)]


def _one_node(reply: Any) -> dict[str, Any]:
    """A cluster client's reply for one node: the INFO dict itself, or
    {node: INFO dict}."""
    if isinstance(reply, dict) and len(reply) == 1:
        (value,) = reply.values()
        if isinstance(value, dict):
            return value
    return dict(reply)


async def connected_replicas(client: Any) -> int:
    """How many Redis replicas are connected to the primary (INFO replication
    ``connected_slaves``): what a write with ``min_replicas_acked`` waits for,
    so that whichever one Sentinel promotes has every acknowledged write."""
    info = await client.info("replication")
    return _int_field(info, "connected_slaves")
