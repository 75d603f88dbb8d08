"""The gRPC path of ``throughput``: replicas as ``schedctl serve`` processes,
load from separate processes through the generated ``scheduler.v1`` stubs."""

from __future__ import annotations

import subprocess
import sys

from scheduler import Policy

SCHEDCTL = [sys.executable, "-c", "from scheduler.cli.main import main; main()"]


def unavailable() -> str | None:
    """Why the gRPC path cannot run here, or None when it can."""
    try:
        import scheduler.grpc.scheduler_pb2_grpc  # noqa: F401
    except ImportError as e:
        return f"generated stubs scheduler/grpc/scheduler_pb2_grpc.py cannot be imported ({e})"
    try:
        r = subprocess.run([*SCHEDCTL, "serve", "--help"], capture_output=True, text=True,
                           timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`schedctl serve --help` could not run ({e})"
    if r.returncode != 0:
        return "`schedctl serve` does not exist yet (`schedctl serve --help` fails)"
    return None


class Replicas:
    """``count`` ``schedctl serve`` processes on one cell."""

    def __init__(self, url: str, cell: str, policy: Policy, count: int) -> None:
        raise RuntimeError("the gRPC replica (`schedctl serve`) is not available")

    def load(self, seconds: float, cpu: int, memory_mb: int) -> tuple[int, int]:
        raise NotImplementedError

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
