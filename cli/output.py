"""One renderer for every command: a rich table for people or JSON for programs.

In JSON mode stdout holds exactly one JSON document (or, for ``--watch``, one
per line) and nothing else; notes and progress go to stderr in both modes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import click
import msgspec
from rich.console import Console, RenderableType
from rich.text import Text

GIB = 1024**3
MIB = 1024**2


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # Tables are wide; when piped, do not squeeze them to 80 columns.
    wide = not stream.isatty() and "COLUMNS" not in os.environ
    # Ids, URLs and messages are shown verbatim: styling goes through Text objects only.
    return Console(
        file=stream,
        stderr=stderr,
        width=200 if wide else None,
        highlight=False,
        markup=False,
        emoji=False,
    )


class Output:
    def __init__(self, as_json: bool) -> None:
        self.json = as_json

    def emit(self, data: Any, render: Callable[[], RenderableType]) -> None:
        """``data`` as JSON in JSON mode, else what ``render`` draws."""
        if self.json:
            click.echo(msgspec.json.format(msgspec.json.encode(data), indent=2).decode())
        else:
            console().print(render())

    def emit_line(self, data: Any) -> None:
        """One compact JSON document on one line (for streams like --watch)."""
        click.echo(msgspec.json.encode(data).decode())

    def note(self, text: str) -> None:
        console(stderr=True).print(Text(text, style="dim"))


# ---------------------------------------------------------------------------
# Formatting helpers shared by the tables
# ---------------------------------------------------------------------------
def gib(n: int) -> str:
    """Bytes as GiB, short: 0, 2, 2.5, 0.03."""
    if n == 0:
        return "0"
    v = n / GIB
    text = f"{v:.1f}" if abs(v) >= 0.1 else f"{v:.2g}"
    return text.removesuffix(".0")


def size(n: int) -> str:
    if abs(n) >= GIB:
        return f"{gib(n)} GiB"
    if abs(n) >= MIB or n == 0:
        return f"{n / MIB:.0f} MiB"
    return f"{n} B"


def age(ms: int | None) -> str:
    if ms is None:
        return "never"
    s = ms / 1000
    if s < 0:
        return f"in {duration_text(-ms)}"
    return f"{duration_text(ms)} ago"


def duration_text(ms: int) -> str:
    s = ms / 1000
    if s < 10:
        return f"{s:.1f}s"
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{s / 3600:.1f}h"


def pressure_color(p: float) -> str:
    return "green" if p < 0.6 else "yellow" if p < 0.85 else "red"


def bar(p: float, width: int = 10) -> Text:
    filled = max(0, min(width, round(p * width)))
    return Text("█" * filled + "░" * (width - filled), style=pressure_color(p))


STATUS_STYLE = {"READY": "green", "CONNECTING": "cyan", "UNHEALTHY": "red", "LINGERING": "yellow"}


def status_text(status: str, reason: str | None = None) -> Text:
    text = Text(status, style=STATUS_STYLE.get(status, ""))
    if reason and reason.lower() != status.lower():
        text.append(f" ({reason})", style="dim")
    return text
