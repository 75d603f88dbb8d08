"""Redis failures as this package's errors, in one place.

A script's error reply becomes the exception its code names
(:func:`scheduler.domain.errors.from_reply`); an ACL refusal one line naming the
command (:func:`scheduler.store.acl.denied`); a Redis that cannot serve now (OOM,
READONLY, NOREPLICAS, LOADING, a cluster slot that will not settle, ...) or
cannot be reached
:class:`~scheduler.domain.errors.StoreUnavailable` naming it.  Every path that talks
to Redis (the clients, ``schedctl``'s one-instant reads, the simulator) goes
through :func:`translated`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis

from scheduler.domain.errors import CorruptState, SchedulerError, StoreUnavailable, from_reply
from scheduler.store import acl

#: Error replies by which Redis says it cannot serve right now (not a bug of ours).
TRANSIENT_ERRORS = (
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.MasterDownError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.BusyLoadingError,
)
TRANSIENT_REPLIES = ("NOREPLICAS", "BUSY ", "MASTERDOWN", "LOADING")
#: Failures of the connection itself.
TRANSPORT_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


def reply_error(e: redis.exceptions.ResponseError, target: str) -> SchedulerError | None:
    """An error reply as our error, or None when it is not one we know."""
    mapped = from_reply(str(e)) or acl.denied(e)
    if mapped is not None:
        return mapped
    if str(e).startswith("WRONGTYPE"):
        return wrong_type(str(e))
    if str(e).startswith(NOT_AN_INTEGER):
        return not_an_integer(str(e))
    if isinstance(e, TRANSIENT_ERRORS) or str(e).startswith(TRANSIENT_REPLIES):
        return StoreUnavailable(f"Redis at {target} cannot serve: {e}")
    return None


def wrong_type(text: str) -> CorruptState:
    """WRONGTYPE inside a script: a key of the cell holds another type than
    the scripts write (a foreign or corrupt write)."""
    script, commands = acl.commands_at(text)
    where = f" in {script}" if script else ""
    at = f" at its {' or '.join(repr(c) for c in commands)}" if commands else ""
    return CorruptState(
        f"a key of the cell holds the wrong type of value for the scripts (WRONGTYPE{where}{at}): "
        "corrupt or foreign state; `schedctl doctor` checks the cell"
    )


#: What Redis answers an INCR / HINCRBY of a value that is not an integer.
NOT_AN_INTEGER = ("hash value is not an integer", "value is not an integer")


def not_an_integer(text: str) -> CorruptState:
    """A counter of the cell (stats, the rotation counter) that holds what is
    not an integer, met by a script's INCR or HINCRBY."""
    script, commands = acl.commands_at(text)
    where = f" in {script}" if script else ""
    at = f" at its {' or '.join(repr(c) for c in commands)}" if commands else ""
    return CorruptState(
        f"a counter of the cell is not an integer ({text.split(' script:')[0]}{where}{at}): "
        "corrupt or foreign state; `schedctl doctor` checks the cell"
    )


def closed_transport(e: BaseException) -> bool:
    """uvloop's refusal to write to a transport already closed: redis-py
    meets it when another task closed the connection under it (its cluster
    client resets a node's connections while a slot moves).  Nothing was
    sent, and redis-py drops the connection, so the call is one Redis could
    not take now, like a refused connection."""
    return isinstance(e, RuntimeError) and "the handler is closed" in str(e)


def unreachable(target: str, e: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"Redis at {target} is unreachable: {e}")


@contextmanager
def translated(target: str) -> Iterator[None]:
    """Raise what fails inside as our errors (``target`` names Redis in them)."""
    try:
        yield
    except redis.exceptions.ResponseError as e:
        mapped = reply_error(e, target)
        if mapped is not None:
            raise mapped from None
        raise
    except TRANSPORT_ERRORS as e:
        raise unreachable(target, e) from None
    except RuntimeError as e:
        if not closed_transport(e):
            raise
        raise unreachable(target, e) from None
    except (redis.exceptions.ClusterError, redis.exceptions.RedisClusterException) as e:
        why = str(e)
        if "TTL exhausted" in why:
            why = "its slot is moving or its primary is failing over (TRYAGAIN / MOVED kept coming)"
        raise StoreUnavailable(f"Redis at {target} cannot serve: {why}") from None
