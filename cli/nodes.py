"""``schedctl nodes``: node pressure, one row per node, most pressed first."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import click
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from scheduler.catalog import CEILINGS, ceiling
from scheduler.errors import SchedulerError
from scheduler.policy import Policy
from scheduler.records import NodeView

from .options import Target, cell_options, pass_target
from .output import age, bar, console, gib, pressure_color, size, status_text
from .snapshot import atomically


def ceiling_amount(name: str, value: float) -> str:
    """A limit or headroom in the ceiling's unit."""
    unit = ceiling(name).unit
    if unit == "percent":
        return f"{value:.0f}%"
    if unit == "bytes":
        return size(int(value))
    return f"{value:g}"


def by_pressure(views: list[NodeView]) -> list[NodeView]:
    return sorted(views, key=lambda v: (-v.pressure, v.node_id))


def nodes_table(views: list[NodeView], policy: Policy | None, where: str) -> Table:
    limits = policy.limits.active() if policy else {}
    ceilings = [c for c in CEILINGS if c.name in limits]
    table = Table(title=f"nodes of {where}", title_justify="left", caption_justify="left")
    table.add_column("node")
    table.add_column("status")
    table.add_column("cpu\nalloc+paused+resv/cap", justify="right")
    table.add_column("memory GiB\nalloc+paused+resv/cap", justify="right")
    table.add_column("sandboxes\nrun/start/paused", justify="right")
    table.add_column("pending\nresv", justify="right")
    table.add_column("pressure", justify="right")
    table.add_column("")
    for c in ceilings:
        table.add_column(
            f"room {c.alias}\n(≤{ceiling_amount(c.name, limits[c.name])})", justify="right"
        )
    table.add_column("heartbeat", justify="right")
    for v in by_pressure(views):
        rooms = {c.name: c.headroom for c in v.ceilings}
        cells: list[RenderableType] = [
            v.node_id,
            status_text(v.status, v.reason),
            f"{v.cpu_allocated}+{v.cpu_paused}+{v.cpu_reserved}/{v.cpu_capacity}",
            f"{gib(v.memory_allocated_bytes)}+{gib(v.memory_paused_bytes)}"
            f"+{gib(v.memory_reserved_bytes)}/{gib(v.memory_capacity_bytes)}",
            f"{v.sandbox_count}/{v.sandbox_starting_count}/{v.paused_sandbox_count}",
            str(v.pending_reservations),
            Text(f"{v.pressure:.2f}", style=pressure_color(v.pressure)),
            bar(v.pressure),
        ]
        for c in ceilings:
            room = rooms.get(c.name)
            cells.append(
                Text("—", style="dim")
                if room is None
                else Text(ceiling_amount(c.name, room), style="red" if room <= 0 else "")
            )
        cells.append(age(v.heartbeat_age_ms))
        table.add_row(*cells)
    pending = sum(v.pending_reservations for v in views)
    described = ", ".join(f"{c.name} {limits[c.name]}" for c in ceilings) or "none"
    strategy = policy.strategy if policy else "?"
    table.caption = (
        f"{len(views)} nodes, {pending} pending reservations; strategy {strategy}; "
        f"ceilings: {described}"
    )
    return table


def read_nodes(target: Target) -> tuple[list[NodeView], Policy | None]:
    s = target.scheduler
    (_, views), policy = atomically(s, s.ops.nodes(), s.ops.policy())
    return by_pressure(views), policy


def _pause(seconds: float) -> None:
    time.sleep(seconds)


@contextmanager
def _screen() -> Iterator[Live | None]:
    """A live-updating screen on a terminal; frames one after another otherwise."""
    out = console()
    if not out.is_terminal:
        yield None
        return
    with Live(console=out, auto_refresh=False, screen=False) as live:
        yield live


def watch(target: Target, interval: float) -> None:
    views, policy = read_nodes(target)  # the first read fails loudly
    with _screen() as live:
        problem: str | None = None
        while True:
            if target.json:
                if problem is None:
                    target.out.emit_line(views)
            else:
                frame: RenderableType = nodes_table(views, policy, target.where)
                if problem:
                    frame = Group(frame, Text(f"{problem} (retrying)", style="bold red"))
                if live is None:
                    console().print(frame)
                else:
                    live.update(frame, refresh=True)
            _pause(interval)
            try:
                views, policy = read_nodes(target)
                problem = None
            except SchedulerError as e:
                # Keep watching through an outage; the screen says what is wrong.
                problem = e.message
                if target.json or live is None:
                    target.out.note(f"error: {problem} (retrying)")


@click.command()
@cell_options()
@click.option("--watch", "watch_", is_flag=True, help="Refresh until Ctrl-C.")
@click.option(
    "--interval",
    type=click.FloatRange(0.1, 3600),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes with --watch.",
)
@pass_target
def nodes(target: Target, watch_: bool, interval: float) -> None:
    """Node pressure: one row per node, most pressed first.

    CPU and memory read allocated+paused+reserved/capacity; "room" columns are
    the headroom left under each configured ceiling (red: none left).
    With --json: a list of node objects (with --watch, one list per line).
    """
    if not watch_:
        views, policy = read_nodes(target)
        target.out.emit(views, lambda: nodes_table(views, policy, target.where))
        return
    try:
        watch(target, interval)
    except KeyboardInterrupt:
        return
