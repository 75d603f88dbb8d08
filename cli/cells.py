"""``schedctl cells``: every cell on the target (one Redis, or every primary
of a Redis Cluster), with its nodes, pending reservations and where it lives."""

from __future__ import annotations

import click
from rich.table import Table

from scheduler.cells import CellSummary, summarize
from scheduler.connection import describe_target

from .options import Target, cell_options, pass_target


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


@click.command()
@cell_options(cell=False)
@pass_target
def cells(target: Target) -> None:
    """Every cell on the target: nodes, READY nodes, pending reservations,
    placements so far, and the primary (and hash slot) that holds it."""
    rows = summarize(target.scheduler)
    target.out.emit(rows, lambda: cells_table(rows, describe_target(target.redis)))
