"""``schedctl health``: one gRPC health check of a replica, for compose
healthchecks and Kubernetes exec probes: exit 0 when SERVING, 1 otherwise,
one line either way."""

from __future__ import annotations

import sys

import click
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

#: the reference system's default gRPC address (its probes use 127.0.0.1:9090)
DEFAULT_ADDR = "127.0.0.1:9090"


def check(addr: str, timeout: float, service: str = "") -> tuple[bool, str]:
    """(serving, the line to print) for the replica at ``addr``."""
    with grpc.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else None
            name = code.name if code is not None else "error"
            detail = e.details() if isinstance(e, grpc.Call) else str(e)
            return False, f"{addr}: {name}: {detail}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{addr}: {status}"


@click.command("health")
@click.option(
    "--addr",
    default=DEFAULT_ADDR,
    show_default=True,
    metavar="HOST:PORT",
    help="The replica's gRPC address (plaintext).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=3.0,
    show_default=True,
    help="Seconds to wait for the answer.",
)
@click.option(
    "--service",
    default="",
    help='Health service name ("" = the whole replica; or scheduler.v1.Scheduler).',
)
def health(addr: str, timeout: float, service: str) -> None:
    """Exit 0 when the replica at --addr answers SERVING, 1 otherwise (one line)."""
    ok, line = check(addr, timeout, service)
    click.echo(line)
    sys.exit(0 if ok else 1)
