"""schedctl entry point (commands are added module by module).

Every failure ends here as one line on stderr (``Error: ...``; ``serve``'s
policy and node-list conflicts are the only messages of several lines) and an exit
status (1: a failure, 2: a bad argument); with ``--json`` (or ``-o json``)
stdout also gets one JSON document, ``{"error": "..."}``, so a program reads
a document whatever happened.  An exception nobody expected is still one
line (its type and message; ``SCHEDCTL_DEBUG=1`` shows the traceback), never
a traceback for an operator to read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click
import msgspec
import redis

from scheduler import version as build
from scheduler.domain.errors import SchedulerError

from .cells import cells
from .completion import completion
from .doctor import doctor_command
from .explain import explain
from .health import health
from .linger import linger
from .nodes import nodes
from .options import EXIT_BAD_ARGUMENT, EXIT_FAILURE, Failure, Target, cell_options
from .policy import policy
from .replicas import replicas
from .reservations import bindings, reservations
from .serve import serve
from .simulate import simulate


def _wants_json(args: Sequence[str], target: Target) -> bool:
    """JSON mode, also when the arguments failed before any command read them."""
    if target.json:
        return True
    for i, a in enumerate(args):
        if a == "--":
            break
        if a == "--json" or a in ("-ojson", "--output=json"):
            return True
        if a in ("-o", "--output") and i + 1 < len(args) and args[i + 1] == "json":
            return True
    return False


def _fail(message: str, code: int, as_json: bool, detail: dict[str, Any] | None = None) -> NoReturn:
    if as_json:
        click.echo(msgspec.json.encode({"error": message, **(detail or {})}).decode())
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class Schedctl(click.Group):
    """The group that turns every outcome into an exit status and one line."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        target = extra.pop("obj", None) or Target()
        try:
            super().main(argv, prog_name, complete_var, standalone_mode=False, obj=target, **extra)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            _fail("aborted", EXIT_FAILURE, _wants_json(argv, target))
        except click.ClickException as e:
            # (as the command wrote it: serve's policy conflict is a table of lines)
            message = e.format_message()
            if isinstance(e, click.UsageError) and not _wants_json(argv, target):
                e.show()  # usage errors keep click's "Usage:" hint
                sys.exit(e.exit_code)
            detail = e.detail if isinstance(e, Failure) else None
            _fail(message, e.exit_code, _wants_json(argv, target), detail)
        except SchedulerError as e:  # raised outside a command's own handler
            _fail(_one_line(e.message), EXIT_FAILURE, _wants_json(argv, target))
        except redis.exceptions.RedisError as e:
            _fail(
                _one_line(f"Redis answered what this schedctl cannot use: {e}"),
                EXIT_FAILURE,
                _wants_json(argv, target),
            )
        except (KeyboardInterrupt, EOFError):
            _fail("interrupted", EXIT_FAILURE, _wants_json(argv, target))
        except Exception as e:
            if os.environ.get("SCHEDCTL_DEBUG"):
                raise
            _fail(
                _one_line(f"unexpected {type(e).__name__}: {e} (SCHEDCTL_DEBUG=1 shows where)"),
                EXIT_FAILURE,
                _wants_json(argv, target),
            )
        sys.exit(0)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"schedctl {build.describe()}")
    ctx.exit()


@click.group(cls=Schedctl)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print 'schedctl VERSION (commit SHA)' and exit.",
)
@cell_options()
def main() -> None:
    """Operate a Redis-centric placement scheduler cell.

    --redis, --cell and --json may come before the command or after it.
    """


main.add_command(nodes)
main.add_command(reservations)
main.add_command(bindings)
main.add_command(explain)
main.add_command(policy)
main.add_command(simulate)
main.add_command(linger)
main.add_command(cells)
main.add_command(replicas)
main.add_command(completion)
main.add_command(doctor_command, name="doctor")

main.add_command(serve)
main.add_command(health)

__all__ = ["EXIT_BAD_ARGUMENT", "Failure", "main"]
