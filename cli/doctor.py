"""``schedctl doctor [--repair]``: check a cell's invariants and say what a
repair would fix; with ``--repair``, fix what is derived (scheduler/ops/doctor.py).
Exit 0 when the cell is consistent (or everything found was repaired), 1 when
something is left."""

from __future__ import annotations

import click
import msgspec
from rich.table import Table

from scheduler.ops.doctor import Report, doctor

from .options import Failure, Target, cell_options, pass_target


def report_table(r: Report, where: str) -> Table | str:
    if r.ok:
        return (
            f"{where}: consistent ({r.keys} keys, {r.nodes} nodes, "
            f"{r.reservations} live reservations)"
        )
    title = f"{len(r.findings)} findings in {where} ({r.keys} keys)"
    t = Table(title=title, title_justify="left")
    for col in ("check", "key", "problem", "repair" if r.repaired else "a repair would"):
        t.add_column(col, overflow="fold")
    for f in r.findings:
        did = ("done: " if f.repaired else "") + (f.fix or "nothing (reported only)")
        t.add_row(f.check, f.key, f.problem, did)
    return t


@click.command()
@cell_options()
@click.option("--repair", is_flag=True, help="Fix what is derived (index, sets); records stay.")
@pass_target
def doctor_command(target: Target, repair: bool) -> None:
    """Check the cell's invariants (read-only); --repair fixes the derived ones."""
    r = doctor(target.scheduler, repair=repair)
    left = [f for f in r.findings if not f.repaired]
    message = f"{len(left)} of {len(r.findings)} findings left" + (
        "" if repair else " (run with --repair to fix the derived ones)"
    )
    if left and target.json:
        # one JSON document on stdout: the report, with the error beside it
        raise Failure(message, detail=msgspec.to_builtins(r))
    target.out.emit(r, lambda: report_table(r, target.where))
    if left:
        raise Failure(message)
