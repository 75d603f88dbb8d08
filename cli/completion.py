"""``schedctl completion bash|zsh|fish``, and the dynamic completion of cells,
node ids and reservation ids.

The script printed is click's own for the shell; installed, it calls
``schedctl`` back with ``_SCHEDCTL_COMPLETE`` set, and the callbacks below
read the ids from the target the command line (or ``SCHEDULER_REDIS_ADDR``)
names.  Without a target, or when Redis does not answer within a second,
they complete nothing: completion never guesses a store and never prints an
error into the shell.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import click
from click.core import ParameterSource
from click.shell_completion import get_completion_class

from scheduler.client.sync import Scheduler
from scheduler.domain.errors import SchedulerError
from scheduler.ops.cells import cell_names
from scheduler.store.keys import DEFAULT_CELL

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_SCHEDCTL_COMPLETE"
TIMEOUT_S = 1.0


def _given(ctx: click.Context | None, name: str) -> str | None:
    """A parameter's value as the command line typed so far gives it: typed on
    this command or a parent (the nearest wins), else this command's default."""
    fallback = None
    while ctx is not None:
        value = ctx.params.get(name)
        if value:
            if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
                return str(value)
            fallback = fallback or str(value)
        ctx = ctx.parent
    return fallback


def _connect(ctx: click.Context) -> Scheduler | None:
    url = _given(ctx, "redis_url") or os.environ.get("SCHEDULER_REDIS_ADDR", "").strip()
    if not url or url.lower() == "embedded":
        return None
    return Scheduler.connect(url, cell=_given(ctx, "cell") or DEFAULT_CELL, timeout_s=TIMEOUT_S)


def _complete(
    ctx: click.Context, incomplete: str, read: Callable[[Scheduler], list[str]]
) -> list[str]:
    try:
        s = _connect(ctx)
    except (SchedulerError, ValueError):
        return []
    if s is None:
        return []
    try:
        return sorted(x for x in read(s) if x.startswith(incomplete))
    except Exception:  # completion must not print a traceback into the shell
        return []
    finally:
        s.close()


def cells(ctx: click.Context, incomplete: str) -> list[str]:
    return _complete(ctx, incomplete, lambda s: cell_names(s.client, s.keys.prefix))


def node_ids(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    return _complete(ctx, incomplete, lambda s: [v.node_id for v in s.nodes()])


def reservation_ids(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    return _complete(ctx, incomplete, lambda s: [r.reservation_id for r in s.reservations()])


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL (bash, zsh or fish).

    Completes commands, options, and the cells, node ids and reservation ids
    of the target given on the line or in SCHEDULER_REDIS_ADDR.  Install:

    \b
      bash: schedctl completion bash > ~/.local/share/bash-completion/completions/schedctl
      zsh:  schedctl completion zsh > "${fpath[1]}/_schedctl"
      fish: schedctl completion fish > ~/.config/fish/completions/schedctl.fish
    """
    from .main import main

    cls = get_completion_class(shell)
    assert cls is not None  # (every name in SHELLS has one)
    click.echo(cls(main, {}, "schedctl", COMPLETE_VAR).source())
