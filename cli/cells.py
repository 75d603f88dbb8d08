"""``schedctl cells``: every cell on the target (one Redis, or every primary
of a Redis Cluster), with its nodes, pending reservations and where it lives;
``schedctl cells delete NAME``: remove a cell and every key it holds."""

from __future__ import annotations

import click
import msgspec
from rich.table import Table

from scheduler.ops.cells import CellSummary, cell_names, delete_cell, read_replicas, summarize
from scheduler.store.connection import describe_target
from scheduler.store.keys import CellKeys
from scheduler.store.translate import translated

from .options import Failure, Target, cell_options, complete_cells, pass_target


def cells_table(rows: list[CellSummary], where: str) -> Table:
    t = Table(title=f"{len(rows)} cells at {where}", title_justify="left")
    for col in ("cell", "slot", "primary", "nodes", "ready", "pending", "placed", "strategy"):
        t.add_column(col, justify="left" if col in ("cell", "primary", "strategy") else "right")
    for r in rows:
        t.add_row(
            r.cell,
            str(r.slot),
            r.primary,
            str(r.nodes),
            str(r.ready),
            str(r.pending_reservations),
            str(r.placed_total),
            r.strategy,
        )
    return t


@click.group(invoke_without_command=True)
@cell_options(cell=False)
@click.pass_context
def cells(ctx: click.Context) -> None:
    """Every cell on the target: nodes, READY nodes, pending reservations,
    placements so far, and the primary (and hash slot) that holds it."""
    if ctx.invoked_subcommand is not None:
        return
    target = ctx.ensure_object(Target)
    s = target.scheduler
    with translated(s.target):  # SCAN may be refused (an ACL), or the server not Redis
        rows = summarize(s)
    target.out.emit(rows, lambda: cells_table(rows, describe_target(target.url)))


class Deleted(msgspec.Struct, kw_only=True):
    cell: str
    #: keys removed (0: the cell did not exist)
    keys: int
    #: replicas whose roster entry was live: they put the cell back
    live_replicas: list[str]


@cells.command()
@cell_options(cell=False)
@click.argument("name", metavar="NAME", shell_complete=complete_cells)
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
@click.option("--ignore-not-found", is_flag=True, help="Exit 0 when the target holds no such cell.")
@pass_target
def delete(target: Target, name: str, yes: bool, ignore_not_found: bool) -> None:
    """Delete cell NAME: every key under its hash tag, in bounded SCAN/UNLINK steps.

    Asks first unless --yes.  Stop its replicas before (``schedctl replicas
    --cell NAME``): a replica still serving it stores its policy again.
    """
    keys = CellKeys(name.strip())  # names the field when the name is not a cell's
    s = target.scheduler
    with translated(s.target):
        exists = keys.cell in cell_names(s.client, keys.prefix)
        anything = exists or bool(next(iter(s.client.scan_iter(match=keys.base + "*")), None))
        live = [e.replica_id for e in read_replicas(s.client, keys.cell, keys.prefix)]
    if not anything:
        if not ignore_not_found:
            raise Failure(f"cell {keys.cell} not found at {describe_target(target.url)}")
        done = Deleted(cell=keys.cell, keys=0, live_replicas=[])
        target.out.emit(done, lambda: f"cell {keys.cell} not found (nothing to delete)")
        return
    if not yes:
        warn = f" ({len(live)} replicas still serve it and will put it back)" if live else ""
        click.confirm(
            f"delete cell {keys.cell} at {describe_target(target.url)}{warn}?",
            abort=True,
            err=True,
        )
    with translated(s.target):
        removed = delete_cell(s.client, keys.cell, keys.prefix)
    done = Deleted(cell=keys.cell, keys=removed, live_replicas=live)
    if live:
        target.out.note(
            f"warning: replicas {', '.join(live)} serve cell {keys.cell}: they store it again "
            "at their next check; stop them first"
        )
    target.out.emit(done, lambda: f"deleted cell {keys.cell}: {removed} keys")
