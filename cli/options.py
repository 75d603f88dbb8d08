"""The options every command shares (``--redis``, ``--cell``, ``--json``), as one decorator.

The values land on one :class:`Target` per invocation, so a group and its
subcommands share them: ``schedctl reservations --cell c show ID`` and
``schedctl reservations show ID --cell c`` mean the same.  A value typed on
the command line wins over the environment and defaults, wherever it was typed.
The connection opens on first use only (``--help`` and bad arguments never
touch Redis).  Our errors become one line on stderr and a non-zero exit:
1 for a failure (Redis unreachable, not found, ...), 2 for a bad argument.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click
from click.core import ParameterSource

from scheduler import embedded
from scheduler.client import Scheduler, describe_target
from scheduler.errors import InvalidArgument, SchedulerError
from scheduler.keys import DEFAULT_CELL

from .output import Output

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FAILURE = 1
EXIT_BAD_ARGUMENT = 2


class Target:
    """What ``--redis`` / ``--cell`` / ``--json`` selected, and the lazily opened client."""

    def __init__(self) -> None:
        self.redis: str | None = None
        self.cell: str = DEFAULT_CELL
        self.json: bool = False
        self.typed: set[str] = set()
        self._scheduler: Scheduler | None = None

    @property
    def out(self) -> Output:
        return Output(self.json)

    @property
    def where(self) -> str:
        return f"cell {self.cell} at {describe_target(self.redis)}"

    @property
    def scheduler(self) -> Scheduler:
        if self._scheduler is None:
            if not self.redis:
                self.out.note(f"note: {embedded.WARNING} (set --redis or SCHEDULER_REDIS_ADDR)")
            self._scheduler = Scheduler.connect(self.redis, cell=self.cell)
            click.get_current_context().call_on_close(self._scheduler.close)
        return self._scheduler


pass_target = click.make_pass_decorator(Target, ensure=True)

#: option name on the command -> attribute of Target
_SHARED = {"redis_url": "redis", "cell": "cell", "as_json": "json"}
_TYPED = (ParameterSource.COMMANDLINE, ParameterSource.PROMPT)


def _merge(ctx: click.Context, values: dict[str, Any]) -> None:
    """Put this command's shared options on the Target.  Group callbacks run
    before their subcommand's, so a value typed on either wins over an
    environment or default value of the other."""
    target = ctx.ensure_object(Target)
    for option, attr in _SHARED.items():
        if option not in values:
            continue
        typed = ctx.get_parameter_source(option) in _TYPED
        if typed or attr not in target.typed:
            value = values[option]
            setattr(target, attr, (value or None) if attr == "redis" else value)
        if typed:
            target.typed.add(attr)


def cell_options(default_cell: str = DEFAULT_CELL, cell: bool = True) -> Callable[[F], F]:
    """Add ``--redis``, ``--cell`` (unless ``cell`` is False: a command about
    every cell) and ``--json``, and map our errors to exits."""

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _merge(click.get_current_context(), {k: kwargs.pop(k) for k in _SHARED if k in kwargs})
            try:
                return f(*args, **kwargs)
            except InvalidArgument as e:
                raise Failure(e.message, EXIT_BAD_ARGUMENT) from None
            except SchedulerError as e:
                raise Failure(e.message) from None

        options = [
            click.option(
                "--redis",
                "redis_url",
                envvar="SCHEDULER_REDIS_ADDR",
                metavar="URL",
                help="Redis to use: host:port, a redis://, rediss://, unix:// URL, "
                "redis+sentinel://h:p[,h:p...]/MASTER or "
                "redis+cluster://h:p[,h:p...] "
                "[env SCHEDULER_REDIS_ADDR; default: the embedded store]",
            ),
            *(
                [
                    click.option(
                        "--cell",
                        default=default_cell,
                        show_default=True,
                        help="Scheduling domain (key hash tag).",
                    )
                ]
                if cell
                else []
            ),
            click.option(
                "--json",
                "as_json",
                is_flag=True,
                help="Machine-readable JSON on stdout (and nothing else there).",
            ),
        ]
        for option in reversed(options):
            wrapper = option(wrapper)
        return cast(F, wrapper)

    return decorate


class Failure(click.ClickException):
    """One line on stderr ("Error: ..."), exit status 1 or 2."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        # (click >= 8.2 declares exit_code a class variable; it is read per instance)
        vars(self)["exit_code"] = exit_code


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


if TYPE_CHECKING:  # click >= 8.2 makes ParamType generic; older ones cannot subscript it
    _IntParamType = click.ParamType[int]
else:
    _IntParamType = click.ParamType


class Duration(_IntParamType):
    """A Go-style duration ("30s", "10m", "1m30s", "250ms") as whole milliseconds."""

    name = "duration"

    def __init__(self, zero_ok: bool = False) -> None:
        self.zero_ok = zero_ok  # "0" is 0 (e.g. node_forget_after: never)

    def convert(
        self,
        value: Any,
        param: click.Parameter | None,
        ctx: click.Context | None,
    ) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if self.zero_ok and text == "0":
            return 0
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            self.fail(f"{text!r} is not a duration like 30s, 10m, 1m30s or 250ms", param, ctx)
        ms = sum(float(n) * _UNIT_MS[u] for n, u in parts)
        if ms != int(ms) or ms <= 0:
            self.fail(f"{text!r} must be a positive whole number of milliseconds", param, ctx)
        return int(ms)


def format_duration(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
