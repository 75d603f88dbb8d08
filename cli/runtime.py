"""What running a replica means, shared by ``schedctl serve`` and each of its
``--workers`` processes: the start-up summary, the Kubernetes check, and
:func:`run_replica` (listen, wait out Redis, prepare the cell, serve, drain).

:mod:`scheduler.cli.serve` (the command) and :mod:`scheduler.cli.workers`
(the supervisor) both import this module, and neither imports the other's
internals, so the two no longer import each other."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import signal
from collections.abc import Callable
from typing import Any

from scheduler.client.aio import AsyncScheduler
from scheduler.domain.errors import (
    PolicyConflict,
    SchedulerError,
    StaticNodesConflict,
    StoreUnavailable,
)
from scheduler.server.config import (
    ConfigError,
    Settings,
    summary,
)
from scheduler.server.replica import ListenError, Replica
from scheduler.store import embedded
from scheduler.store.address import describe_target
from scheduler.store.connection import async_client

log = logging.getLogger("scheduler.serve")


class StartupError(Exception):
    pass


KUBERNETES_UNAVAILABLE = (
    "scheduler.discovery.mode: kubernetes discovery is not available in this build"
)


def check_kubernetes(settings: Settings) -> None:
    """discovery kubernetes needs scheduler.server.kubernetes (ConfigError without it)."""
    if settings.kubernetes is None or settings.query_only:
        return
    try:
        importlib.import_module("scheduler.server.kubernetes")
    except ImportError:
        raise ConfigError(KUBERNETES_UNAVAILABLE) from None


def announce(settings: Settings) -> None:
    """The start-up summary: Redis target, limits, TTLs, listen addresses, and
    what the loader noted (ignored sections, unknown variables)."""
    for level, text in settings.notes:
        log.log(logging.WARNING if level == "warning" else logging.INFO, "%s", text)
    if settings.redis_url is None:
        log.warning(embedded.WARNING)
    for line in summary(settings, describe_target(settings.redis_url)):
        log.info("%s", line)


async def run_replica(
    settings: Settings,
    overwrite_policy: bool,
    *,
    worker: bool = False,
    serving: Callable[[Replica], None] | None = None,
    stop_when_readable: int | None = None,
) -> None:
    """Serve until SIGTERM / SIGINT.  ``worker``: one of ``--workers`` (shares
    the port, the parent announced the settings); ``serving`` is told once
    the replica serves; a readable ``stop_when_readable`` fd (the parent's
    pipe: closed when the parent is gone) stops it like a signal."""
    if not worker:
        announce(settings)
    # (every call of the replica goes through AsyncScheduler.run, which bounds it;
    # the health check's INFO reads are bounded by Replica._bounded)
    sched = AsyncScheduler(
        async_client(settings.redis_url, settings.redis_timeout_s, caller_bounds=True),
        settings.cell,
        settings.prefix,
        settings.redis_url,
        settings.durability,
        settings.redis_timeout_s,
    )
    sched.coalescer.enabled = settings.coalesce_schedules
    sched.beat_coalescer.enabled = settings.coalesce_heartbeats
    replica = Replica(settings, sched, overwrite_policy=overwrite_policy, reuse_port=worker)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if stop_when_readable is not None:
        fd = stop_when_readable

        def parent_gone() -> None:
            loop.remove_reader(fd)  # (it stays readable: once is enough)
            stop.set()

        loop.add_reader(fd, parent_gone)
    watcher: Any = None
    watching: asyncio.Task[None] | None = None
    try:
        # The ports listen at once (health NOT_SERVING, calls UNAVAILABLE), so a
        # liveness probe sees a live process while Redis is down.
        try:
            await replica.listen()
        except ListenError as e:
            raise StartupError(str(e)) from None
        log.info(
            "listening: gRPC on port %d%s; NOT_SERVING until %s",
            replica.port,
            f", /metrics /healthz /readyz on port {replica.metrics_port}"
            if replica.metrics_port
            else "",
            "Redis answers" if settings.query_only else "the cell's policy is checked",
        )
        # Redis down at start is waited out, not a crash: serving begins once
        # the cell's policy could be checked (nothing is ever served unchecked).
        delay = 0.5
        while not settings.query_only:
            try:
                outcome = await replica.prepare_cell()
                break
            except (PolicyConflict, StaticNodesConflict) as e:
                raise StartupError(e.message) from None
            except StoreUnavailable as e:
                log.warning(
                    "%s; retrying in %.1fs (serving starts once the cell's policy is checked)",
                    e.message,
                    delay,
                )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    log.info("stopped before Redis could be reached")
                    return
                delay = min(2 * delay, 5.0)
            except SchedulerError as e:
                raise StartupError(f"cannot prepare cell {settings.cell!r}: {e.message}") from None
        if not settings.query_only:
            log.info(
                "cell policy: %s",
                {
                    "created": "stored (new cell)",
                    "same": "matches the stored one",
                    "overwritten": "overwrote the stored one",
                }.get(outcome, outcome),
            )
        await replica.open()
        if settings.kubernetes is not None and not settings.query_only:
            try:
                from scheduler.server.kubernetes import KubernetesWatcher  # type: ignore[import-not-found,unused-ignore]
            except ImportError:
                raise StartupError(f"configuration: {KUBERNETES_UNAVAILABLE}") from None
            watcher = KubernetesWatcher(settings.kubernetes, sched)
            watching = asyncio.create_task(watcher.run(), name="kubernetes-discovery")
        log.info(
            "serving scheduler.v1.Scheduler on port %d%s",
            replica.port,
            f"; /metrics on port {replica.metrics_port}" if replica.metrics_port else "",
        )
        if serving is not None:
            serving(replica)
        await stop.wait()
        log.info("stopping: draining in-flight calls (up to %.1fs)", settings.drain_timeout_s)
        if watcher is not None:
            await watcher.stop()
        await replica.stop()
        log.info("stopped")
    finally:
        if watching is not None and not watching.done():
            watching.cancel()
        if not replica.stopped:  # start-up ended early: close what listens
            await replica.stop(grace_s=0)
        if stop_when_readable is not None:
            loop.remove_reader(stop_when_readable)
        await sched.close()
