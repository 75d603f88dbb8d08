"""Build and use ``clockshift.c``: an LD_PRELOAD shim that shifts one
process's wall clock (not its monotonic clock) by an offset, for a
redis-server whose clock is off (the ``clock-skew`` fault, tests/test_rewind.py).

Debian's libfaketime does not start a jemalloc build of redis-server (it
gives up on a recursive clock_gettime while the allocator initialises), so
the shim is our own and is built here with the system ``cc``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).with_name("clockshift.c")
#: the variable the shim reads its offset from (milliseconds, signed)
OFFSET_VAR = "SCHED_CLOCK_OFFSET_MS"


class ShimUnavailable(RuntimeError):
    """No C compiler here to build the shim with."""


@cache
def library() -> Path:
    """The built shim (once per process, in a temp dir)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise ShimUnavailable("no C compiler (cc): apt-get install gcc")
    out = Path(tempfile.mkdtemp(prefix="sched-clockshift-")) / "clockshift.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out), str(SOURCE)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def environment(offset_ms: int) -> dict[str, str]:
    """The environment of a process whose wall clock runs ``offset_ms`` off."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = str(library())
    env[OFFSET_VAR] = str(offset_ms)
    return env
