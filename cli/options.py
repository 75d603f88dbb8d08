"""The options every command shares (``--redis``, ``--cell``, ``--json``), as one decorator.

The values land on one :class:`Target` per invocation, so a group and its
subcommands share them: ``schedctl reservations --cell c show ID`` and
``schedctl reservations show ID --cell c`` mean the same.  A value typed on
the command line wins over the environment and defaults, wherever it was typed.
The options are accepted before the command as well (``schedctl --redis URL
nodes``).  The connection opens on first use only (``--help`` and bad
arguments never touch Redis).  Operator commands need a target: ``--redis``,
``SCHEDULER_REDIS_ADDR``, or an explicit ``--redis embedded`` (the in-process
store); only ``simulate`` defaults to the embedded store, and says so.  Our
errors become one line on stderr and a non-zero exit: 1 for a failure (Redis
unreachable, not found, ...), 2 for a bad argument (see :mod:`.main` for the
last-resort handler and the JSON document ``--json`` prints on failure).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click
import redis
from click.core import ParameterSource

from scheduler.client.sync import Scheduler, describe_target
from scheduler.domain.errors import InvalidArgument, SchedulerError
from scheduler.server.config import ConfigError, parse_duration_ms
from scheduler.store import embedded
from scheduler.store.keys import DEFAULT_CELL

from .output import Output

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FAILURE = 1
EXIT_BAD_ARGUMENT = 2

#: ``--redis embedded``: the in-process store, asked for by name.
EMBEDDED = "embedded"
NO_TARGET = (
    "no Redis to operate on: give --redis URL or set SCHEDULER_REDIS_ADDR "
    "(--redis embedded: this process's own in-process store)"
)


class Target:
    """What ``--redis`` / ``--cell`` / ``--json`` selected, and the lazily opened client."""

    def __init__(self) -> None:
        self.redis: str | None = None
        self.cell: str = DEFAULT_CELL
        self.json: bool = False
        self.typed: set[str] = set()
        #: the command may run on the embedded store when no target is given
        #: (simulate); every other command refuses to guess
        self.embedded_default = False
        self._scheduler: Scheduler | None = None

    @property
    def out(self) -> Output:
        return Output(self.json)

    @property
    def url(self) -> str | None:
        """The URL to connect to (None: the embedded store); Failure when no
        target was given to a command that needs one."""
        if self.redis is None:
            if not self.embedded_default:
                raise Failure(NO_TARGET, EXIT_BAD_ARGUMENT)
            return None
        if self.redis.strip().lower() == EMBEDDED:
            return None
        return self.redis

    @property
    def where(self) -> str:
        url = None if self.redis is None or self.redis.strip().lower() == EMBEDDED else self.redis
        return f"cell {self.cell} at {describe_target(url)}"

    @property
    def scheduler(self) -> Scheduler:
        if self._scheduler is None:
            url = self.url
            if url is None and self.redis is None:
                self.out.note(f"note: {embedded.WARNING} (set --redis or SCHEDULER_REDIS_ADDR)")
            elif url is None:
                self.out.note(
                    "note: --redis embedded: using this process's embedded in-process store "
                    "(fakeredis); no other process sees it, and it is gone when this one exits"
                )
            self._scheduler = Scheduler.connect(url, cell=self.cell)
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


def complete_cells(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    from .completion import cells as names

    return names(ctx, incomplete)


def cell_options(
    default_cell: str = DEFAULT_CELL, cell: bool = True, embedded_default: bool = False
) -> Callable[[F], F]:
    """Add ``--redis``, ``--cell`` (unless ``cell`` is False: a command about
    every cell) and ``--json``, and map our errors to exits.  With
    ``embedded_default`` the command runs on the embedded store when no
    target is given (simulate); otherwise it needs one."""

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = click.get_current_context()
            _merge(ctx, {k: kwargs.pop(k) for k in _SHARED if k in kwargs})
            if embedded_default:
                ctx.ensure_object(Target).embedded_default = True
            try:
                return f(*args, **kwargs)
            except InvalidArgument as e:
                raise Failure(e.message, EXIT_BAD_ARGUMENT) from None
            except SchedulerError as e:
                raise Failure(e.message) from None
            except redis.exceptions.InvalidResponse as e:  # (a subclass of RedisError)
                where = describe_target(ctx.ensure_object(Target).redis)
                raise Failure(f"the server at {where} does not answer as Redis: {e}") from None
            except redis.exceptions.RedisError as e:  # what translated() does not know
                where = describe_target(ctx.ensure_object(Target).redis)
                raise Failure(f"Redis at {where} answered: {e}") from None
            except (ValueError, TypeError, IndexError) as e:
                # A reply or record this schedctl cannot read (a corrupt field, a
                # key written by another version): one line, not a traceback.
                if os.environ.get("SCHEDCTL_DEBUG"):
                    raise
                where = ctx.ensure_object(Target).where
                raise Failure(
                    f"{where} holds data this schedctl cannot read (corrupt, or written by "
                    f"another version?): {type(e).__name__}: {e} (SCHEDCTL_DEBUG=1 shows where)"
                ) from None

        options = [
            click.option(
                "--redis",
                "redis_url",
                envvar="SCHEDULER_REDIS_ADDR",
                metavar="URL",
                help="Redis to use: host:port, a redis://, rediss://, unix:// URL, "
                "redis+sentinel://h:p[,h:p...]/MASTER or "
                "redis+cluster://h:p[,h:p...] "
                "or 'embedded' (this process's in-process store) "
                + (
                    "[env SCHEDULER_REDIS_ADDR; default: the embedded store]"
                    if embedded_default
                    else "[env SCHEDULER_REDIS_ADDR; required]"
                ),
            ),
            *(
                [
                    click.option(
                        "--cell",
                        default=default_cell,
                        show_default=True,
                        shell_complete=complete_cells,
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

    def __init__(
        self, message: str, exit_code: int = EXIT_FAILURE, detail: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        #: more fields of the ``{"error": ...}`` document ``--json`` prints
        self.detail = detail or {}
        # (click >= 8.2 declares exit_code a class variable; it is read per instance)
        vars(self)["exit_code"] = exit_code


if TYPE_CHECKING:  # click >= 8.2 makes ParamType generic; older ones cannot subscript it
    _IntParamType = click.ParamType[int]
else:
    _IntParamType = click.ParamType


class Duration(_IntParamType):
    """A Go-style duration ("30s", "10m", "1m30s", "250ms", "1500us") as whole
    milliseconds: the configuration file's parser
    (:func:`scheduler.server.config.parse_duration_ms`), so both accept the same text."""

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
        text = str(value)
        try:
            return parse_duration_ms("", text, zero_ok=self.zero_ok)
        except ConfigError as e:
            self.fail(str(e).removeprefix(": "), param, ctx)


def format_duration(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
