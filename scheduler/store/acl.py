"""The Redis user the scheduler needs, and Redis ACL refusals as one clear line.

:data:`COMMANDS` is the smallest set of commands a replica and ``schedctl``
use (tests/test_acl.py shows that each one is needed and that together they
suffice, with the function library and with the EVALSHA fallback); the
"A least-privilege Redis user" section of docs/operations.md spells the
``ACL SETUSER`` line :func:`setuser` builds.

A refusal inside a script does not say which command Redis refused, only
the script and the line; :func:`denied` reads that line of the script this
client sent, so the message names the command anyway.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache

import redis

from scheduler.domain.errors import SchedulerError
from scheduler.store.scripts import library, sources

DOC_SECTION = 'docs/operations.md "Security", "A least-privilege Redis user"'

#: Outside the scripts: health checks, calling and loading the scripts, the
#: MULTI/EXEC that schedctl reads several views in, SCAN for the cells of a
#: prefix (``schedctl cells``, ``simulate``), and INFO for the eviction policy
#: and evictions a replica checks at start and in its health probe.
CLIENT_COMMANDS: tuple[str, ...] = ("ping", "multi", "exec", "scan", "info")
#: The function library (Redis 7): FCALL, and FUNCTION LOAD when the server lost it.
FUNCTION_COMMANDS: tuple[str, ...] = ("fcall", "function|load")
#: The EVALSHA fallback (a server without functions, or a user denied them).
SCRIPT_COMMANDS: tuple[str, ...] = ("evalsha", "script|load", "script|exists")
#: What the scripts call (lua/), by key type (tests/test_acl.py reads every
#: command name out of the library text and checks it is here).
SCRIPTED_COMMANDS: tuple[str, ...] = (
    "time",
    "get",
    "set",
    "incr",
    "decr",
    "del",
    "exists",
    "pexpire",
    "persist",
    "hset",
    "hget",
    "hmget",
    "hgetall",
    "hincrby",
    "hdel",
    "hlen",
    "hkeys",
    "sadd",
    "srem",
    "smembers",
    "srandmember",
    "scard",
    "zadd",
    "zrem",
    "zrange",
    "zrangebyscore",
    "zscore",
    "zcard",
    "zpopmin",
    "zunionstore",
)
COMMANDS = CLIENT_COMMANDS + FUNCTION_COMMANDS + SCRIPT_COMMANDS + SCRIPTED_COMMANDS


def setuser(
    user: str = "scheduler", password: str = "<password>", prefix: str = "sched"
) -> list[str]:
    """``ACL SETUSER`` arguments for the scheduler's user: its cells' keys
    (``<prefix>:*``), no channels, exactly :data:`COMMANDS`."""
    return [
        "ACL",
        "SETUSER",
        user,
        "reset",
        "on",
        f">{password}",
        f"~{prefix}:*",
        "resetchannels",
        "-@all",
        *(f"+{c}" for c in COMMANDS),
    ]


class PermissionDenied(SchedulerError):
    """Redis refused a command to this user (ACL).  Not the caller's fault:
    the replica's Redis user lacks a permission."""

    code = "NOPERM"


_PLAIN = re.compile(r"no permissions to run the '([^']+)' command")
_IN_SCRIPT = re.compile(
    r"The user executing the script can't (?P<what>run this command|access)"
    r".*? script: (?P<script>\S+?), on @(?P<kind>user_function|user_script)"
    r":(?P<line>\d+)"
)
_CALL = re.compile(r"redis\.p?call\('([A-Za-z]+)'")


@cache
def _script_lines() -> dict[str, list[str]]:
    """sha1 of each EVAL script -> its lines; "" -> the function library's."""
    out = {"": library().text.splitlines()}
    for _, text in sources().values():
        out[hashlib.sha1(text.encode()).hexdigest()] = text.splitlines()
    return out


def _commands_at(script: str, kind: str, line: int) -> list[str]:
    lines = _script_lines().get("" if kind == "user_function" else script, [])
    if not 1 <= line <= len(lines):
        return []
    return [c.lower() for c in _CALL.findall(lines[line - 1])]


def commands_at(error_text: str) -> tuple[str, list[str]]:
    """(the script, the commands on its line) an error raised inside a script
    names ("script: <name>, on @user_function:<line>"); ("", []) when none."""
    m = re.search(r"script: (\S+?), on @(user_function|user_script):(\d+)", error_text)
    if m is None:
        return "", []
    script = m.group(1).removeprefix(f"{library().name}_")
    return script, _commands_at(m.group(1), m.group(2), int(m.group(3)))


def _message(what: str) -> str:
    return (
        f"Redis refused {what} to this replica's user (ACL); grant the scheduler's ACL, "
        f"see {DOC_SECTION}"
    )


def denied(e: redis.exceptions.ResponseError) -> PermissionDenied | None:
    """The ACL refusal ``e`` as one line naming the command, or None."""
    text = str(e)
    plain = _PLAIN.findall(text)
    if plain:
        if len(plain) == 1:
            return PermissionDenied(_message(f"the command '{plain[0]}'"))
        named = ", then ".join(f"'{c}'" for c in plain)
        return PermissionDenied(_message(f"the commands {named}"))
    m = _IN_SCRIPT.search(text)
    if m:
        cmds = _commands_at(m.group("script"), m.group("kind"), int(m.group("line")))
        named = " or ".join(f"'{c}'" for c in cmds) or "a command"
        if m.group("what") == "access":
            return PermissionDenied(
                _message(
                    f"a key of {named} in a script (the user's key "
                    "pattern must cover the cell's prefix)"
                )
            )
        return PermissionDenied(_message(f"the command {named} in a script"))
    if isinstance(e, redis.exceptions.NoPermissionError):
        return PermissionDenied(_message(f"a key ({text})"))
    if "EXEC without MULTI" in text:
        # redis-py's transaction reads MULTI's refusal and raises only this
        # consequence; nothing else makes a server drop our MULTI
        return PermissionDenied(_message("the command 'multi'"))
    return None
