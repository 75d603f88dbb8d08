"""What this build is: the package version and the commit it was built from.

The version is the installed distribution's (pyproject.toml). The commit comes
from ``SCHEDULER_BUILD_COMMIT`` (an image bakes it in at build time), else from
git when the package runs from a checkout, else ``unknown``.
"""

from __future__ import annotations

import functools
import os
import subprocess
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "redis-placement-scheduler"


@functools.cache
def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


@functools.cache
def commit() -> str:
    baked = os.environ.get("SCHEDULER_BUILD_COMMIT", "").strip()
    if baked:
        return baked
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and sha else "unknown"


def describe() -> str:
    """One line for logs and ``--version``: ``0.1.0 (commit 1a2b3c4d5e6f)``."""
    return f"{version()} (commit {commit()})"
