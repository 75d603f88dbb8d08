"""schedctl entry point (commands are added module by module)."""

from __future__ import annotations

import click

from .cells import cells
from .explain import explain
from .health import health
from .linger import linger
from .nodes import nodes
from .policy import policy
from .reservations import bindings, reservations
from .serve import serve
from .simulate import simulate


@click.group()
def main() -> None:
    """Operate a Redis-centric placement scheduler cell."""


main.add_command(nodes)
main.add_command(reservations)
main.add_command(bindings)
main.add_command(explain)
main.add_command(policy)
main.add_command(simulate)
main.add_command(linger)
main.add_command(cells)

main.add_command(serve)
main.add_command(health)
