"""``schedctl serve``: run one stateless replica of the scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time

import click
import msgspec

from scheduler import embedded
from scheduler.aio import AsyncScheduler
from scheduler.config import ConfigError, Overrides, Settings, load, summary
from scheduler.connection import async_client, describe_target
from scheduler.errors import PolicyConflict, SchedulerError, StaticNodesConflict, StoreUnavailable
from scheduler.replica import ListenError, Replica

log = logging.getLogger("scheduler.serve")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z", "level": record.levelname.lower(),
               "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return msgspec.json.encode(doc).decode()


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel({"warn": "WARNING"}.get(level, level.upper()))


class StartupError(Exception):
    pass


async def run_replica(settings: Settings, overwrite_policy: bool) -> None:
    target = describe_target(settings.redis_url)
    if settings.redis_url is None:
        log.warning(embedded.WARNING)
    for line in summary(settings, target):
        log.info("%s", line)
    sched = AsyncScheduler(async_client(settings.redis_url, settings.redis_timeout_s),
                           settings.cell, settings.prefix, settings.redis_url,
                           settings.durability, settings.redis_timeout_s)
    sched.coalescer.enabled = settings.coalesce_schedules
    replica = Replica(settings, sched, overwrite_policy=overwrite_policy)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        # Redis down at start is waited out, not a crash: serving begins once
        # the cell's policy could be checked (nothing is ever served unchecked).
        delay = 0.5
        while True:
            try:
                outcome = await replica.prepare_cell()
                break
            except (PolicyConflict, StaticNodesConflict) as e:
                raise StartupError(e.message) from None
            except StoreUnavailable as e:
                log.warning("%s; retrying in %.1fs (serving starts once the cell's policy "
                            "is checked)", e.message, delay)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    log.info("stopped before Redis could be reached")
                    return
                delay = min(2 * delay, 5.0)
            except SchedulerError as e:
                raise StartupError(f"cannot prepare cell {settings.cell!r}: {e.message}") from None
        log.info("cell policy: %s", {"created": "stored (new cell)", "same": "matches the stored "
                 "one", "overwritten": "overwrote the stored one"}.get(outcome, outcome))
        try:
            await replica.start()
        except ListenError as e:
            await replica.stop(grace_s=0)
            raise StartupError(str(e)) from None
        log.info("serving scheduler.v1.Scheduler on port %d%s", replica.port,
                 f"; /metrics on port {replica.metrics_port}" if replica.metrics_port else "")
        await stop.wait()
        log.info("stopping: draining in-flight calls (up to %.1fs)", settings.drain_timeout_s)
        await replica.stop()
        log.info("stopped")
    finally:
        await sched.close()


@click.command("serve")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              envvar="SCHEDULER_CONFIG", help="JSON config file ({\"scheduler\": {...}}).")
@click.option("--redis", help="Redis address (host:port, redis://, rediss://, unix://, "
              "redis+sentinel://h:p[,h:p...]/MASTER or rediss+sentinel://...); overrides "
              "scheduler.redis_addr and SCHEDULER_REDIS_ADDR.")
@click.option("--grpc-listen", help="gRPC listen address host:port (:port = every interface).")
@click.option("--metrics-listen", help="/metrics listen address host:port; \"\" disables it.")
@click.option("--cell", help="Scheduling domain (all of its keys share one hash tag).")
@click.option("--overwrite-policy", is_flag=True,
              help="Replace the cell's stored policy and static node list with this config's.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warn", "error"]),
              help="Overrides log_level.")
@click.option("--grpc-tls-cert", metavar="PEM", help="Server certificate (chain) file; "
              "overrides scheduler.grpc_tls.cert_file.  Re-read when it changes.")
@click.option("--grpc-tls-key", metavar="PEM", help="Its private key file; overrides "
              "scheduler.grpc_tls.key_file.")
@click.option("--grpc-tls-client-ca", metavar="PEM", help="CA that signs client "
              "certificates: clients must present one (mutual TLS); overrides "
              "scheduler.grpc_tls.client_ca_file.")
@click.option("--coalesce/--no-coalesce", default=None,
              help="Send Schedules that queue while one is on its way as one batch call "
              "(default on); overrides scheduler.coalesce_schedules.")
def serve(config_path: str | None, redis: str | None, grpc_listen: str | None,
          metrics_listen: str | None, cell: str | None, overwrite_policy: bool,
          log_level: str | None, grpc_tls_cert: str | None, grpc_tls_key: str | None,
          grpc_tls_client_ca: str | None, coalesce: bool | None) -> None:
    """Run one stateless replica: gRPC scheduler.v1.Scheduler, health, /metrics."""
    try:
        settings = load(config_path, flags=Overrides(
            redis=redis, grpc_listen=grpc_listen, metrics_listen=metrics_listen, cell=cell,
            log_level=log_level, grpc_tls_cert=grpc_tls_cert, grpc_tls_key=grpc_tls_key,
            grpc_tls_client_ca=grpc_tls_client_ca, coalesce=coalesce))
    except ConfigError as e:
        raise click.ClickException(f"configuration: {e}") from None
    configure_logging(settings.log_level, settings.log_format)
    try:
        asyncio.run(run_replica(settings, overwrite_policy))
    except StartupError as e:
        raise click.ClickException(str(e)) from None
