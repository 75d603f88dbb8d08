"""``schedctl reservations`` (list, show, cancel) and ``schedctl bindings lookup``."""

from __future__ import annotations

import click
import msgspec
from rich.console import Group
from rich.table import Table
from rich.text import Text

from scheduler.calls import Call
from scheduler.errors import NotFound
from scheduler.records import Binding, Reservation

from .options import Target, cell_options, pass_target
from .output import age, duration_text, size
from .snapshot import atomically


class ReservationView(msgspec.Struct, kw_only=True):
    """A reservation as the CLI shows it: the record, its key and the cell's clock."""

    reservation: Reservation
    key: str
    now_ms: int


def _expires(r: Reservation, now: int) -> str:
    if r.ended_ms is not None:
        return age(now - r.ended_ms)
    return f"in {duration_text(max(0, r.expires_ms - now))}"


def _record(title: str, rows: list[tuple[str, str]], key: str) -> Group:
    """A record as a two-column table, with the redis-cli command that reads it."""
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for k, v in rows:
        table.add_row(k, v)
    return Group(table, Text(f"redis-cli HGETALL '{key}'", style="dim"))


def reservations_table(found: list[Reservation], now: int, where: str) -> Table:
    table = Table(
        title=f"live reservations of {where}",
        title_justify="left",
        caption=f"{len(found)} live",
        caption_justify="left",
    )
    for col in (
        "reservation",
        "node",
        "state",
        "cpu",
        "memory",
        "sandbox",
        "age",
        "expires",
        "pressure at placement",
    ):
        table.add_column(col, justify="right" if col in ("cpu", "memory", "age") else "left")
    for r in found:
        table.add_row(
            r.reservation_id,
            r.node_id,
            r.state,
            str(r.cpu),
            size(r.memory_bytes),
            r.sandbox_id or "-",
            age(now - r.created_ms),
            _expires(r, now),
            "-" if r.pressure is None else f"{r.pressure:.3f}",
        )
    return table


@click.group(invoke_without_command=True)
@cell_options()
@click.option("--node", "node_id", metavar="NODE", help="Only this node's reservations.")
@click.pass_context
def reservations(ctx: click.Context, node_id: str | None) -> None:
    """Pending placements: list them (default), show or cancel one."""
    if ctx.invoked_subcommand is None:
        target = ctx.ensure_object(Target)
        s = target.scheduler
        found, (now, views) = atomically(s, s.ops.reservations(node_id), s.ops.nodes())
        if node_id and node_id.strip() not in {v.node_id for v in views}:
            raise NotFound(f"node {node_id.strip()} is not known in {target.where}")
        target.out.emit(found, lambda: reservations_table(found, now, target.where))


def _show_table(view: ReservationView) -> Group:
    r, now = view.reservation, view.now_ms
    return _record(
        f"reservation {r.reservation_id}",
        [
            ("node", r.node_id),
            ("state", r.state),
            ("cpu", str(r.cpu)),
            ("memory", f"{size(r.memory_bytes)} ({r.memory_bytes} B)"),
            ("sandbox", r.sandbox_id or "- (not assigned yet)"),
            ("created", age(now - r.created_ms)),
            ("ended" if r.ended_ms is not None else "expires", _expires(r, now)),
            ("pressure at placement", "-" if r.pressure is None else f"{r.pressure:.4f}"),
        ],
        view.key,
    )


@reservations.command()
@cell_options()
@click.argument("reservation_id", metavar="ID")
@pass_target
def show(target: Target, reservation_id: str) -> None:
    """One reservation, live or ended (ended ones stay readable for the policy's
    reservation_tombstone_ttl, 10 minutes by default)."""
    s = target.scheduler
    found, (now, _) = atomically(s, s.ops.reservations(None, reservation_id), s.ops.nodes())
    if not found:
        raise NotFound(f"reservation {reservation_id.strip()} not found in {target.where}")
    view = ReservationView(
        reservation=found[0], key=s.keys.res(found[0].reservation_id), now_ms=now
    )
    target.out.emit(view, lambda: _show_table(view))


class Cancelled(msgspec.Struct, kw_only=True):
    reservation_id: str
    node_id: str
    state: str = "cancelled"


@reservations.command()
@cell_options()
@click.argument("reservation_id", metavar="ID")
@pass_target
def cancel(target: Target, reservation_id: str) -> None:
    """Give a reservation back now (its create failed), instead of waiting for its TTL."""
    node_id = target.scheduler.cancel(reservation_id)
    done = Cancelled(reservation_id=reservation_id.strip(), node_id=node_id)
    target.out.emit(
        done,
        lambda: (
            f"cancelled reservation {done.reservation_id} on node "
            f"{node_id}: its cpu, memory and slot are free again"
        ),
    )


@click.group()
@cell_options()
def bindings() -> None:
    """Sandbox -> node bindings (what LookupNode answers)."""


class BindingView(msgspec.Struct, kw_only=True):
    binding: Binding
    key: str
    now_ms: int


@bindings.command()
@cell_options()
@click.argument("sandbox_id", metavar="SANDBOX")
@pass_target
def lookup(target: Target, sandbox_id: str) -> None:
    """The node a sandbox is bound to, as every replica would answer it."""
    s = target.scheduler
    call = s.ops.lookup(sandbox_id)
    # The script also returns the cell's clock; keep it for "expires in".
    binding, now = s.run(
        Call(call.script, call.keys, call.args, lambda r: (call.parse(r), int(r[5])))
    )
    view = BindingView(binding=binding, key=s.keys.bind(binding.sandbox_id), now_ms=now)

    target.out.emit(
        view,
        lambda: _record(
            f"sandbox {binding.sandbox_id}",
            [
                ("node", binding.node_id),
                ("endpoint", binding.endpoint),
                ("expires", f"in {duration_text(max(0, binding.expires_ms - now))}"),
                ("reservation", binding.reservation_id or "-"),
                ("listed by the node's roster", "yes" if binding.listed else "not yet"),
            ],
            view.key,
        ),
    )
