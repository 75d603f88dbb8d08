"""Fixtures: a real redis-server for the session, a client factory over
real Redis and the embedded fakeredis, a flush per test.

Backends are picked per test with the marks ``real_only`` / ``fake_only``
(read with ``get_closest_marker``), the fakeredis suite's convention.
Without redis-server installed the real cases skip locally but fail in CI.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest
import redis

from scheduler import Policy, Scheduler
from scheduler.client.sync import AsyncScheduler, async_client
from scheduler.testing.redis_server import RedisServer, in_ci
from scheduler.testing.replicas import ServeProcess, ThreadedReplica, settings_for

#: what an xdist worker's environment has that the run's own may lack: a worker
#: starts with COLUMNS=80 and LINES=24, and rich then draws the CLI's tables 80
#: columns wide where a piped run draws them whole (cli/output.py)
TERMINAL_ENV = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(xdist, in the controller) hand each worker the run's own terminal size."""
    node.workerinput["terminal_env"] = {k: os.environ.get(k) for k in TERMINAL_ENV}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker more than the cores this process may use.
    Much of the suite waits (on replica processes, Redis, scenario clocks:
    the fault scenarios use about half a core each), so a third worker on 2
    cores takes up what the others leave: 432 s against 571 s for the whole
    suite here.  PYTEST_XDIST_AUTO_NUM_WORKERS still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # (xdist's own hook reads it)
    return len(os.sched_getaffinity(0)) + 1 if hasattr(os, "sched_getaffinity") else None


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    for key, value in workerinput["terminal_env"].items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``-n``, files handed out whole: ``--dist loadfile``),
    the files holding ``slow`` tests go first, each file's tests in their
    order: a long file handed out last would leave the other workers idle
    while it runs. Every worker sorts the same way (xdist checks that)."""
    if not hasattr(config, "workerinput"):
        return
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # (stable)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    try:
        server = RedisServer().start()
    except RuntimeError as e:
        if in_ci():
            raise
        pytest.skip(str(e))
    yield server
    server.close()


@pytest.fixture(params=[pytest.param("real", id="real"), pytest.param("fake", id="fake")])
def backend(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    if kind == "fake" and request.node.get_closest_marker("real_only"):
        pytest.skip("real redis-server only")
    if kind == "real" and request.node.get_closest_marker("fake_only"):
        pytest.skip("fakeredis only")
    return kind


@pytest.fixture
def redis_client(backend: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    if backend == "real":
        server: RedisServer = request.getfixturevalue("redis_server")
        client = redis.Redis.from_url(server.url)
    else:
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    client.flushall()
    yield client
    client.flushall()
    client.close()


@pytest.fixture
def make_scheduler(redis_client: Any) -> Callable[..., Scheduler]:
    """Factory: a Scheduler on this test's backend with the given policy."""

    def make(policy: Policy | None = None, cell: str = "test", overwrite: bool = True) -> Scheduler:
        s = Scheduler(redis_client, cell=cell)
        s.sync_policy(policy or Policy(), overwrite=overwrite)
        return s

    return make


@pytest.fixture
def real_url(redis_server: RedisServer) -> Iterator[str]:
    """URL of the session's real redis-server, flushed before and after."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield redis_server.url
    client.flushall()
    client.close()


@pytest.fixture
def make_replica(
    backend: str,
    redis_client: Any,
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., ThreadedReplica]]:
    """Factory: in-process replicas (policy, settings) on this test's backend."""
    opened: list[ThreadedReplica] = []

    def make(policy: Policy | None = None, **kw: Any) -> ThreadedReplica:
        url: str | None
        if backend == "real":
            url = request.getfixturevalue("redis_server").url

            def client() -> Any:
                return async_client(url)
        else:
            url = None
            server = redis_client.connection_pool.connection_kwargs["server"]

            def client() -> Any:
                return fakeredis.FakeAsyncRedis(server=server)

        r = ThreadedReplica(settings_for(policy, **kw), client, url).__enter__()
        opened.append(r)
        return r

    yield make
    for r in reversed(opened):
        r.__exit__()


@pytest.fixture
def processes() -> Iterator[list[ServeProcess]]:
    """``schedctl serve`` processes a test starts; terminated after it."""
    started: list[ServeProcess] = []
    yield started
    for p in started:
        p.signal_stop()  # (each drains beside the others)
    for p in started:
        p.terminate()


__all__ = ["AsyncScheduler"]
