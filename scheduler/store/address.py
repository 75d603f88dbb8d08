"""Where Redis is: ``redis_addr`` parsed, and shown without its secrets.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

import redis

from scheduler.domain.errors import InvalidArgument
from scheduler.store.redact import redact, remember

# redis-py leaves this untyped
_parse_url: Any = redis.connection.parse_url


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
