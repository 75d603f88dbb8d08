"""The embedded store: an in-process fakeredis server shared by every client
of this process.  For one replica (and demos, and tests) only: other
processes cannot see it."""

from __future__ import annotations

from typing import Any

import fakeredis

_server: fakeredis.FakeServer | None = None

WARNING = (
    "no redis_addr configured: using the embedded in-process store (fakeredis). "
    "It serves this one replica only; other replicas cannot share its state."
)


def server() -> fakeredis.FakeServer:
    global _server
    if _server is None:
        _server = fakeredis.FakeServer()
    return _server


def sync_client() -> Any:
    return fakeredis.FakeRedis(server=server())


def async_client() -> Any:
    return fakeredis.FakeAsyncRedis(server=server())
