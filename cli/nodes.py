"""``schedctl nodes``: node pressure, one row per node, most pressed first."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import click
import msgspec
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from scheduler.domain.catalog import CEILINGS, ceiling
from scheduler.domain.errors import SchedulerError
from scheduler.domain.policy import Policy
from scheduler.domain.records import NodeView
from scheduler.store.keys import validate_id
from scheduler.store.translate import translated

from .completion import node_ids
from .options import Target, cell_options, pass_target
from .output import age, bar, console, duration_text, gib, pressure_color, size, status_text


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
    """``-o wide``: every number (about 145 columns with two ceilings)."""
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
    table.add_column("load")
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
    table.caption = _caption(views, policy)
    return table


def _tightest(v: NodeView) -> tuple[str, float] | None:
    """The ceiling with the least room left, as a share of its limit: (name, room)."""
    uses = [c for c in v.ceilings if c.limit > 0]
    if not uses:
        return None
    c = min(uses, key=lambda c: (c.headroom / c.limit, c.name))
    return c.name, c.headroom


def _sandboxes(v: NodeView) -> str:
    """What max_sandbox_count counts (running + starting + pending), against it."""
    count = next((c for c in v.ceilings if c.name == "max_sandbox_count"), None)
    if count is not None:
        return f"{count.used}/{count.limit}"
    return str(v.sandbox_count + v.sandbox_starting_count + v.pending_reservations)


def _caption(views: list[NodeView], policy: Policy | None) -> str:
    limits = policy.limits.active() if policy else {}
    pending = sum(v.pending_reservations for v in views)
    described = ", ".join(f"{c.name} {limits[c.name]}" for c in CEILINGS if c.name in limits)
    strategy = policy.strategy if policy else "?"
    return (
        f"{len(views)} nodes, {pending} pending reservations; strategy {strategy}; "
        f"ceilings: {described or 'none'}"
    )


BAR = 5
_COMPACT_HEADERS = ("NODE", "STATUS", "PRESSURE", "SANDBOXES", "ROOM", "HEARTBEAT")


def compact_table(
    views: list[NodeView],
    policy: Policy | None,
    where: str,
    width: int = 80,
    max_rows: int | None = None,
) -> Table:
    """The default view: one line per node within ``width`` columns, the id whole.

    SANDBOXES is what max_sandbox_count counts (running + starting + pending)
    against it; ROOM is the room left under the tightest ceiling (by its share
    of the limit), with the ceiling's short name.  When long ids leave too
    little room, the pressure bar goes first, then the ceiling's name (the
    caption says so).  ``-o wide`` shows every number."""
    rows = []
    shown = by_pressure(views)
    if max_rows is not None and len(shown) > max_rows:
        shown = shown[: max(1, max_rows)]
    for v in shown:
        tight = _tightest(v)
        room = None if tight is None else (ceiling(tight[0]).alias, tight[0], tight[1])
        rows.append((v, room))

    def room_text(room: tuple[str, str, float] | None, named: bool) -> Text:
        if room is None:
            return Text("-", style="dim")
        alias, name, left = room
        amount = ceiling_amount(name, left)
        return Text(f"{alias} {amount}" if named else amount, style="red" if left <= 0 else "")

    def needed(with_bar: bool, named: bool) -> int:
        cols = [
            [v.node_id for v, _ in rows],
            [v.status for v, _ in rows],
            [f"{v.pressure:.2f}" + (" " + "x" * BAR if with_bar else "") for v, _ in rows],
            [_sandboxes(v) for v, _ in rows],
            [room_text(r, named).plain for _, r in rows],
            [age(v.heartbeat_age_ms) for v, _ in rows],
        ]
        widths = [max([len(h), *map(len, c)]) for h, c in zip(_COMPACT_HEADERS, cols, strict=True)]
        return sum(widths) + 2 * (len(widths) - 1)  # two spaces between columns

    with_bar, named = True, True
    if needed(with_bar, named) > width:
        with_bar = False
    if needed(with_bar, named) > width:
        named = False
    table = Table(
        title=f"nodes of {where}",
        title_justify="left",
        caption_justify="left",
        box=None,
        padding=(0, 1),
        pad_edge=False,
        header_style="bold",
    )
    table.add_column("NODE", no_wrap=True, overflow="fold")
    table.add_column("STATUS", no_wrap=True)
    table.add_column("PRESSURE", no_wrap=True)
    table.add_column("SANDBOXES", justify="right", no_wrap=True)
    table.add_column("ROOM", justify="right", no_wrap=True)
    table.add_column("HEARTBEAT", justify="right", no_wrap=True)
    for v, room in rows:
        pressure = Text(f"{v.pressure:.2f}", style=pressure_color(v.pressure))
        if with_bar:
            pressure.append(" ")
            pressure.append_text(bar(v.pressure, width=BAR))
        table.add_row(
            v.node_id,
            status_text(v.status),
            pressure,
            _sandboxes(v),
            room_text(room, named),
            age(v.heartbeat_age_ms),
        )
    table.caption = _caption(views, policy) + (
        "" if named else "; ROOM is under each node's tightest ceiling (-o wide names them)"
    )
    if len(shown) < len(views):
        table.caption += f"; the {len(shown)} most pressed of {len(views)} shown (fit the screen)"
    return table


def nodes_view(
    views: list[NodeView],
    policy: Policy | None,
    where: str,
    wide: bool,
    width: int = 80,
    max_rows: int | None = None,
) -> Table:
    if wide:
        return nodes_table(views, policy, where)
    return compact_table(views, policy, where, width, max_rows)


#: Lines of a --watch screen that are not node rows: title, header, caption
#: (up to three lines), the refresh line, and one to spare.
WATCH_CHROME_LINES = 7


def read_nodes(target: Target) -> tuple[list[NodeView], Policy | None]:
    """The fleet page by page (each page one bounded call, NODES_PAGE nodes:
    a large cell is never read in one call), then the policy."""
    s = target.scheduler
    views = s.nodes()
    return by_pressure(views), s.run(s.ops.policy())


def _pause(seconds: float) -> None:
    time.sleep(seconds)


def _clock() -> float:
    return time.time()


@contextmanager
def _screen() -> Iterator[Live | None]:
    """A live-updating screen on a terminal; frames one after another otherwise."""
    out = console()
    if not out.is_terminal:
        yield None
        return
    with Live(console=out, auto_refresh=False, screen=False) as live:
        yield live


def _at(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def watch_frame(
    table: Table,
    refreshed: float,
    interval: float,
    problem: str | None,
    now: float,
) -> RenderableType:
    """The table with when it was read; a view that could not be refreshed says
    so in red, with since when and why (its numbers are that old)."""
    if problem is None:
        return Group(table, Text(f"refreshed {_at(refreshed)}, every {interval:g}s", style="dim"))
    table.title = f"NOT REFRESHED: {table.title}"
    table.title_style = "bold red"
    return Group(
        table,
        Text(
            f"NOT REFRESHED since {_at(refreshed)} ({duration_text(int((now - refreshed) * 1000))}"
            f"): {problem} (retrying every {interval:g}s)",
            style="bold red",
        ),
    )


def watch(target: Target, interval: float, wide: bool) -> None:
    views, policy = read_nodes(target)  # the first read fails loudly
    refreshed = _clock()
    with _screen() as live:
        problem: str | None = None
        while True:
            if target.json:
                if problem is None:
                    target.out.emit_line(views)
            else:
                screen = console()
                # on a terminal, rows that fit its height (rich would cut the rest to "...")
                # (a frame that could not refresh has two lines more: title and problem)
                fit = (
                    None if live is None else screen.height - WATCH_CHROME_LINES - 3 * bool(problem)
                )
                frame = watch_frame(
                    nodes_view(views, policy, target.where, wide, screen.width, fit),
                    refreshed,
                    interval,
                    problem,
                    _clock(),
                )
                if live is None:
                    console().print(frame)
                else:
                    live.update(frame, refresh=True)
            _pause(interval)
            try:
                views, policy = read_nodes(target)
                refreshed = _clock()
                problem = None
            except SchedulerError as e:
                # Keep watching through an outage; the screen says what is wrong.
                problem = e.message
                if target.json or live is None:
                    target.out.note(f"error: {problem} (retrying)")


OUTPUTS = ("wide", "json")


@click.group(invoke_without_command=True)
@cell_options()
@click.option(
    "-o",
    "--output",
    type=click.Choice(OUTPUTS),
    default=None,
    help="wide: every column (CPU, memory, each ceiling's room); json: as --json.",
)
@click.option("--watch", "watch_", is_flag=True, help="Refresh until Ctrl-C.")
@click.option(
    "--interval",
    type=click.FloatRange(0.1, 3600),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes with --watch.",
)
@click.pass_context
def nodes(ctx: click.Context, output: str | None, watch_: bool, interval: float) -> None:
    """Node pressure: one row per node, most pressed first (or forget one).

    The default view fits 80 columns: status, pressure, SANDBOXES (what
    max_sandbox_count counts: running + starting + pending, against it), ROOM
    (the room left under the tightest ceiling) and the heartbeat's age.
    With -o wide, CPU and memory read allocated+paused+reserved/capacity and
    every ceiling gets its room column (red: none left).
    With --json (or -o json): a list of node objects (with --watch, one list per line).
    """
    target = ctx.ensure_object(Target)
    if output == "json":
        target.json = True
    if ctx.invoked_subcommand is not None:
        return
    wide = output == "wide"
    if not watch_:
        views, policy = read_nodes(target)
        target.out.emit(
            views, lambda: nodes_view(views, policy, target.where, wide, console().width)
        )
        return
    try:
        watch(target, interval, wide)
    except KeyboardInterrupt:
        return


class Forgotten(msgspec.Struct, kw_only=True):
    node_id: str
    #: False: the cell did not know the node (already forgotten)
    forgotten: bool


@nodes.command()
@cell_options()
@click.argument("node_id", metavar="NODE", shell_complete=node_ids)
@pass_target
def forget(target: Target, node_id: str) -> None:
    """Remove a node from the cell now, as UnregisterNode does (its pending
    reservations end, its bindings go).  A node that heartbeats again comes
    back.  Idempotent: forgetting an unknown node exits 0 and says so."""
    s = target.scheduler
    nid = validate_id("node_id", node_id)
    with translated(s.target):  # UnregisterNode names the instance it ends: the current one
        instance = s.client.hget(s.keys.node(nid), "service_instance_id")
    sid = (instance.decode() if isinstance(instance, bytes) else instance) or "schedctl"
    removed = s.unregister(nid, sid)
    done = Forgotten(node_id=nid, forgotten=removed)
    target.out.emit(
        done,
        lambda: (
            f"forgot node {nid} of {target.where}: its reservations ended, its bindings are gone"
            if removed
            else f"node {nid} is not known in {target.where} (already forgotten)"
        ),
    )
