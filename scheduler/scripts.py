"""Lua scripts as package data, in an explicit registry per client.

Each ``lua/<name>-<nkeys>.lua`` may say ``-- @include <file>``; the line is
replaced by ``lua/includes/<file>.lua`` (BullMQ's convention).  Scripts run by
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
        text = entry.read_text()
        text = _INCLUDE.sub(lambda mm: (includes / f"{mm.group(1)}.lua").read_text(), text)
        out[m.group("name")] = (int(m.group("nkeys")), text)
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
