"""``schedctl linger NODE``: stop new placements on a node (or, with --off, resume them).

A lingering node keeps its sandboxes, bindings and heartbeats; Schedule
skips it with the reason ``lingering`` and ListNodes still lists it.
"""

from __future__ import annotations

import click
import msgspec

from .completion import node_ids
from .options import Target, cell_options, pass_target


class Lingering(msgspec.Struct, kw_only=True):
    node_id: str
    lingering: bool
    was_lingering: bool


@click.command()
@cell_options()
@click.argument("node_id", metavar="NODE", shell_complete=node_ids)
@click.option("--off", is_flag=True, help="Make the node schedulable again.")
@pass_target
def linger(target: Target, node_id: str, off: bool) -> None:
    """Drain a node of new placements (no-schedule), or undo it with --off."""
    was = target.scheduler.set_lingering(node_id, not off)
    done = Lingering(node_id=node_id.strip(), lingering=not off, was_lingering=was)
    state = "lingering: no new placements" if done.lingering else "schedulable again"
    target.out.emit(done, lambda: f"node {done.node_id} is {state} ({target.where})")
