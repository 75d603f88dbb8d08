"""``schedctl serve``: run one stateless replica of the scheduler (or, with
``--workers N``, N replica processes sharing one port: :mod:`scheduler.cli.workers`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

import click

from scheduler.client.aio import AsyncScheduler
from scheduler.domain.errors import (
    PolicyConflict,
    SchedulerError,
    StaticNodesConflict,
    StoreUnavailable,
)
from scheduler.server import logs
from scheduler.server.config import (
    ConfigError,
    Overrides,
    Settings,
    load,
    resolve_log_format,
    summary,
)
from scheduler.server.loops import CHOICES as LOOP_CHOICES
from scheduler.server.loops import LoopUnavailable, choose
from scheduler.server.replica import ListenError, Replica
from scheduler.store import embedded
from scheduler.store.connection import async_client, describe_target
from scheduler.version import describe

from .options import Target

log = logging.getLogger("scheduler.serve")

#: the most ``--workers`` (each is a whole replica process)
MAX_WORKERS = 64


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
    # (every call of the replica goes through AsyncScheduler.run, which bounds it)
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


@click.command("serve")
@click.option(
    "-config",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="SCHEDULER_CONFIG",
    help='JSON config file ({"scheduler": {...}}, or the reference system\'s shared '
    "file); -config (Go's single dash) works too.",
)
@click.option(
    "-query-only",
    "--query-only",
    "query_only",
    is_flag=True,
    help="Serve LookupNode alone, from the bindings in Redis (every other call "
    "UNAVAILABLE, naming the mode); needs scheduler.redis_addr.  Writes nothing.",
)
@click.option(
    "--redis",
    help="Redis address (host:port, redis://, rediss://, unix://, "
    "redis+sentinel://h:p[,h:p...]/MASTER or rediss+sentinel://...); overrides "
    "scheduler.redis_addr and SCHEDULER_REDIS_ADDR.",
)
@click.option("--grpc-listen", help="gRPC listen address host:port (:port = every interface).")
@click.option("--metrics-listen", help='/metrics listen address host:port; "" disables it.')
@click.option("--cell", help="Scheduling domain (all of its keys share one hash tag).")
@click.option(
    "--overwrite-policy",
    is_flag=True,
    help="Replace the cell's stored policy and static node list with this config's.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warn", "error"]),
    help="Overrides log_level.",
)
@click.option(
    "--grpc-tls-cert",
    metavar="PEM",
    help="Server certificate (chain) file; "
    "overrides scheduler.grpc_tls.cert_file.  Re-read when it changes.",
)
@click.option(
    "--grpc-tls-key",
    metavar="PEM",
    help="Its private key file; overrides scheduler.grpc_tls.key_file.",
)
@click.option(
    "--grpc-tls-client-ca",
    metavar="PEM",
    help="CA that signs client "
    "certificates: clients must present one (mutual TLS); overrides "
    "scheduler.grpc_tls.client_ca_file.",
)
@click.option(
    "--coalesce/--no-coalesce",
    default=None,
    help="Send Schedules, and heartbeats, that queue while one is on its way as "
    "one batch call (default on); overrides scheduler.coalesce_schedules and "
    "scheduler.coalesce_heartbeats.",
)
@click.option(
    "--reflection/--no-reflection",
    default=None,
    help="Serve gRPC reflection (grpcurl list) (default on); overrides scheduler.grpc_reflection.",
)
@click.option(
    "--loop",
    "loop_name",
    type=click.Choice(LOOP_CHOICES),
    default="auto",
    show_default=True,
    help="Event loop: auto = uvloop when it is installed (the 'fast' extra, Linux), else asyncio.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, MAX_WORKERS),
    default=1,
    show_default=True,
    help="Replica processes sharing the gRPC port (SO_REUSEPORT); worker i serves "
    "/metrics on the metrics port + i.  Needs a Redis (not the embedded store).",
)
def serve(
    config_path: str | None,
    redis: str | None,
    grpc_listen: str | None,
    metrics_listen: str | None,
    cell: str | None,
    overwrite_policy: bool,
    log_level: str | None,
    grpc_tls_cert: str | None,
    grpc_tls_key: str | None,
    grpc_tls_client_ca: str | None,
    coalesce: bool | None,
    reflection: bool | None,
    loop_name: str,
    workers: int,
    query_only: bool,
) -> None:
    """Run one stateless replica: gRPC scheduler.v1.Scheduler, health, /metrics."""
    # `schedctl --redis URL --cell C serve`: the group's options typed on the
    # command line count as serve's own flags (the environment is the loader's)
    target = click.get_current_context().find_object(Target)
    if target is not None:
        if redis is None and "redis" in target.typed:
            redis = target.redis
        if cell is None and "cell" in target.typed:
            cell = target.cell
    try:
        settings = load(
            config_path,
            flags=Overrides(
                redis=redis,
                grpc_listen=grpc_listen,
                metrics_listen=metrics_listen,
                cell=cell,
                log_level=log_level,
                grpc_tls_cert=grpc_tls_cert,
                grpc_tls_key=grpc_tls_key,
                grpc_tls_client_ca=grpc_tls_client_ca,
                coalesce=coalesce,
                query_only=query_only,
            ),
        )
        check_kubernetes(settings)
    except ConfigError as e:
        raise click.ClickException(f"configuration: {e}") from None
    if reflection is not None:
        settings = dataclasses.replace(settings, grpc_reflection=reflection)
    # auto: JSON unless stderr is a terminal; console: text (workers inherit the choice)
    settings = dataclasses.replace(settings, log_format=resolve_log_format(settings.log_format))
    try:
        loop = choose(loop_name)
    except LoopUnavailable as e:
        raise click.ClickException(str(e)) from None
    if workers > 1:
        from .workers import WorkersError, check, supervise

        try:
            check(settings, workers)
        except WorkersError as e:
            raise click.ClickException(str(e)) from None
    try:
        logs.from_settings(settings)
    except ValueError as e:
        raise click.ClickException(f"logging: {e}") from None
    store = "" if settings.redis_url else "; store: embedded (in-process, one replica only)"
    log.info("schedctl serve %s%s; event loop: %s (%s)", describe(), store, loop.name, loop.why)
    try:
        if workers > 1:
            announce(settings)
            sys.exit(supervise(settings, overwrite_policy, workers, loop))
        loop.run(run_replica(settings, overwrite_policy))
    except StartupError as e:
        raise click.ClickException(str(e)) from None
