"""schedctl entry point (commands are added module by module)."""

from __future__ import annotations

import click

from .serve import serve


@click.group()
def main() -> None:
    """Operate a Redis-centric placement scheduler cell."""


main.add_command(serve)
