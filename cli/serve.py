"""``schedctl serve``: run one stateless replica of the scheduler (or, with
``--workers N``, N replica processes sharing one port: :mod:`scheduler.cli.workers`)."""

from __future__ import annotations

import dataclasses
import logging
import sys

import click

from scheduler.server import logs
from scheduler.server.config import (
    ConfigError,
    Overrides,
    load,
    resolve_log_format,
)
from scheduler.server.loops import CHOICES as LOOP_CHOICES
from scheduler.server.loops import LoopUnavailable, choose
from scheduler.version import describe

from .options import Target
from .runtime import StartupError, announce, check_kubernetes, run_replica

log = logging.getLogger("scheduler.serve")

#: the most ``--workers`` (each is a whole replica process)
MAX_WORKERS = 64


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
