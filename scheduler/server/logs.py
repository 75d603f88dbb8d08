"""Log set-up of ``schedctl serve``: every line carries its context.

Each line names the replica it comes from (``cell``, ``worker`` under
``--workers``, ``pid``, ``version``) and, inside an RPC, the call (``rpc``,
and where they apply ``node`` and ``reservation``).  The call's part lives
in context variables the servicer sets per RPC (:func:`call`, :func:`bind`):
gRPC runs each call in its own task, so one call's fields never reach
another's lines.

Two formats: ``text`` (one human line) and ``json`` (one JSON document a
line, python-json-logger's formatter on msgspec's encoder; ``extra=`` fields
are kept).  Third-party loggers (gRPC, redis-py, asyncio, ...) stay at
WARNING unless ``SCHEDULER_LOG_THIRD_PARTY`` names a level.

The decision log (``scheduler.decision_log``) is the logger
:data:`DECISIONS` at INFO: one line per Schedule, written by the servicer.
"""

from __future__ import annotations

import logging
import os
import sys
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pythonjsonlogger.msgspec import MsgspecFormatter

from scheduler import version

if TYPE_CHECKING:
    from scheduler.server.config import Settings

FORMATS = ("text", "json")
#: the level third-party loggers are held at, unless this variable names another
THIRD_PARTY_ENV = "SCHEDULER_LOG_THIRD_PARTY"
THIRD_PARTY = (
    "grpc",
    "grpc_health",
    "grpc_reflection",
    "redis",
    "fakeredis",
    "asyncio",
    "urllib3",
    "httpx",
    "httpcore",
    "hpack",
    "aiohttp",
    "kubernetes_asyncio",
    "lightkube",
    "kr8s",
)
#: one line per Schedule when ``scheduler.decision_log`` is on
DECISIONS = "scheduler.decisions"

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING}
_LEVELS.update(warning=logging.WARNING, error=logging.ERROR)

# The call's fields ("" = not set).  Set per RPC by the servicer.
_rpc: ContextVar[str] = ContextVar("rpc", default="")
_node: ContextVar[str] = ContextVar("node", default="")
_reservation: ContextVar[str] = ContextVar("reservation", default="")
#: the call fields, in the order a text line shows them
CALL_FIELDS = ("rpc", "node", "reservation")


def call(rpc: str) -> None:
    """A new RPC: its name, and no node or reservation yet."""
    _rpc.set(rpc)
    _node.set("")
    _reservation.set("")


def bind(*, node: str | None = None, reservation: str | None = None) -> None:
    """The node or reservation the current call is about (later lines carry it).
    They come from the caller, unchecked yet: a long or unprintable one is
    logged cut short and quoted, so it cannot forge a line of its own."""
    if node is not None:
        _node.set(node if _plain(node) else _quoted(node))
    if reservation is not None:
        _reservation.set(reservation if _plain(reservation) else _quoted(reservation))


#: the longest caller-given field a line carries as it is
FIELD_MAX = 256


def _plain(value: str) -> bool:
    return len(value) <= FIELD_MAX and value.isprintable() and " " not in value


def _quoted(value: str) -> str:
    return repr(value[:FIELD_MAX]) + ("..." if len(value) > FIELD_MAX else "")


def call_fields() -> dict[str, str]:
    """The current call's fields that are set."""
    return {
        k: v
        for k, v in (
            ("rpc", _rpc.get()),
            ("node", _node.get()),
            ("reservation", _reservation.get()),
        )
        if v
    }


class ContextFilter(logging.Filter):
    """Puts the replica's fields and the current call's on every record
    (an ``extra=`` field of the same name wins)."""

    def __init__(self, replica: dict[str, Any]) -> None:
        super().__init__()
        self.replica = replica

    def filter(self, record: logging.LogRecord) -> bool:
        d = record.__dict__
        for k, v in self.replica.items():
            d.setdefault(k, v)
        for k, v in call_fields().items():
            d.setdefault(k, v)
        return True


class TextFormatter(logging.Formatter):
    """``2026-12-01 10:00:00,123 INFO scheduler.server.replica [cell=c pid=7 v0.1.0]:
    message rpc=Schedule reservation=r-1``."""

    def __init__(self, replica_keys: tuple[str, ...]) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(_replica)s: %(message)s")
        self.replica_keys = replica_keys

    def format(self, record: logging.LogRecord) -> str:
        d = record.__dict__
        d["_replica"] = "[" + " ".join(_text_field(k, d.get(k)) for k in self.replica_keys) + "]"
        line = super().format(record)
        call = " ".join(f"{k}={d[k]}" for k in CALL_FIELDS if d.get(k))
        return f"{line} {call}" if call else line


def _text_field(key: str, value: Any) -> str:
    return f"v{value}" if key == "version" else f"{key}={value}"


class JsonFormatter(MsgspecFormatter):
    """One JSON document a line: time (UTC, ISO 8601), level (lower case),
    logger, msg, the replica's and the call's fields, and any ``extra=``.

    The library formats the message, the exception and the stack and encodes
    the line; the fields are gathered here in one pass over the record (its
    own pass tests every attribute twice: a third of a decision line's cost)."""

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["time"] = datetime.fromtimestamp(record.created, tz=timezone.utc)
        log_data["level"] = record.levelname.lower()
        log_data["logger"] = record.name
        log_data["msg"] = record.message
        for key, value in message_dict.items():
            log_data["exc" if key == "exc_info" else key] = value
        for key, value in record.__dict__.items():
            if key not in _NOT_FIELDS and key[:1] != "_":
                log_data[key] = value


#: LogRecord attributes that are not fields of a line
_NOT_FIELDS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


def level_of(name: str) -> int:
    """A level name of the config (``debug``, ``info``, ``warn``, ``error``)."""
    try:
        return _LEVELS[name.lower()]
    except KeyError:
        raise ValueError(f"not a log level: {name!r}") from None


def configure(
    level: str,
    fmt: str,
    *,
    cell: str,
    worker: int | None = None,
    decision_log: bool = False,
    stream: Any = None,
) -> None:
    """Log to stderr (or ``stream``) in ``fmt`` ("text" or "json") at ``level``;
    third-party loggers at WARNING unless :data:`THIRD_PARTY_ENV` says;
    the decision log at INFO when on, silent when off."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be text or json, not {fmt!r}")
    root_level = level_of(level)
    third = os.environ.get(THIRD_PARTY_ENV, "").strip()
    try:
        third_level = level_of(third) if third else logging.WARNING
    except ValueError as e:
        raise ValueError(f"{THIRD_PARTY_ENV}: {e}") from None
    replica: dict[str, Any] = {"cell": cell}
    if worker is not None:
        replica["worker"] = worker
    replica["pid"] = os.getpid()
    replica["version"] = version.version()
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.addFilter(ContextFilter(replica))
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(tuple(replica)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(root_level)
    for name in THIRD_PARTY:
        logging.getLogger(name).setLevel(third_level)
    logging.getLogger(DECISIONS).setLevel(logging.INFO if decision_log else logging.CRITICAL + 1)


def from_settings(settings: Settings, worker: int | None = None) -> None:
    """:func:`configure` as ``settings`` say (``schedctl serve`` and its workers)."""
    configure(
        settings.log_level,
        settings.log_format,
        cell=settings.cell,
        worker=worker,
        decision_log=settings.decision_log,
    )
