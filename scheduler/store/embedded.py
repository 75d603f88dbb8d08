"""The embedded store: an in-process fakeredis server shared by every client
of this process.  For one replica (and demos, and tests) only: other
processes cannot see it."""

from __future__ import annotations

from typing import Any

# fakeredis takes most of a second to import: load it only when the embedded
# store is really used, not by every command that merely names it.
_server: Any = None

WARNING = (
    "no redis_addr configured: using the embedded in-process store (fakeredis). "
    "It serves this one replica only; other replicas cannot share its state."
)


def server() -> Any:
    global _server
    if _server is None:
        import fakeredis

        _server = fakeredis.FakeServer()
    return _server


def sync_client() -> Any:
    import fakeredis

    return fakeredis.FakeRedis(server=server())


def async_client() -> Any:
    import fakeredis

    return fakeredis.FakeAsyncRedis(server=server())
