"""Which event loop a replica runs on: uvloop where it is installed (the
``fast`` extra, Linux), the standard asyncio loop otherwise.

uvloop makes the same replica cheaper per RPC (its transports carry the
Redis connection, its scheduler runs gRPC's callbacks); the measured
difference is in docs/performance.md.  ``auto`` never fails: it falls back
to asyncio and says so; asking for ``uvloop`` where it cannot be imported is
an error.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

#: what ``schedctl serve --loop`` accepts
CHOICES = ("auto", "asyncio", "uvloop")


class LoopUnavailable(Exception):
    """The event loop asked for cannot be used here."""


@dataclass(frozen=True)
class Loop:
    """The loop chosen: its name, and why (for the start-up log)."""

    name: str  # "asyncio" or "uvloop"
    why: str

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run ``main`` to completion on a new loop of this kind."""
        if self.name == "uvloop":
            import uvloop

            return uvloop.run(main)
        return asyncio.run(main)


def _uvloop() -> tuple[str | None, str]:
    """(uvloop's version, "") when it imports, else (None, why not)."""
    try:
        module = importlib.import_module("uvloop")
    except ImportError as e:
        return None, f"uvloop cannot be imported ({e})"
    return str(getattr(module, "__version__", "?")), ""


def choose(name: str) -> Loop:
    """The loop for ``name`` (one of :data:`CHOICES`)."""
    if name not in CHOICES:
        raise LoopUnavailable(f"unknown event loop {name!r}; choose from {', '.join(CHOICES)}")
    if name == "asyncio":
        return Loop("asyncio", "asked for (--loop asyncio)")
    version, why_not = _uvloop()
    if version is not None:
        return Loop(
            "uvloop", f"uvloop {version}" + (" (--loop uvloop)" if name == "uvloop" else "")
        )
    if name == "uvloop":
        raise LoopUnavailable(
            f"--loop uvloop: {why_not}; install it with "
            "pip install 'redis-placement-scheduler[fast]' (Linux)"
        )
    return Loop("asyncio", f"{why_not}; pip install 'redis-placement-scheduler[fast]' for it")
