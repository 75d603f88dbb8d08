"""Lua scripts as package data, in an explicit registry per client.

Each ``lua/<name>-<nkeys>.lua`` may say ``-- @include <file>``; the line is
replaced by ``lua/includes/<file>.lua`` (BullMQ's convention).  Includes may
include others; each file is inlined once per script, dependencies first.  Scripts run by
EVALSHA through redis-py's ``Script``, which computes the SHA client-side and
reloads the source on NOSCRIPT (after a ``SCRIPT FLUSH`` or a fresh server).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

_INCLUDE = re.compile(r"^-- @include (\w+)\s*$", re.M)
_NAME = re.compile(r"^(?P<name>[a-z_]+)-(?P<nkeys>\d+)\.lua$")


@cache
def sources() -> dict[str, tuple[int, str]]:
    """name -> (number of KEYS, source with includes inlined)."""
    root = resources.files("scheduler.lua")
    includes = root / "includes"
    out: dict[str, tuple[int, str]] = {}
    for entry in root.iterdir():
        m = _NAME.match(entry.name)
        if not m:
            continue
        seen: set[str] = set()

        def inline(mm: re.Match[str], seen: set[str] = seen) -> str:
            name = mm.group(1)
            if name in seen:
                return ""
            seen.add(name)
            return _INCLUDE.sub(inline, (includes / f"{name}.lua").read_text())

        out[m.group("name")] = (int(m.group("nkeys")), _INCLUDE.sub(inline, entry.read_text()))
    return out


class ScriptRegistry:
    """The scripts registered on one client (sync or asyncio)."""

    def __init__(self, client: Any) -> None:
        self.scripts: dict[str, Any] = {}
        self.nkeys: dict[str, int] = {}
        for name, (nkeys, text) in sources().items():
            self.scripts[name] = client.register_script(text)
            self.nkeys[name] = nkeys

    def __getitem__(self, name: str) -> Any:
        return self.scripts[name]
