"""One error table shared by the Lua scripts and Python.

A script fails with ``redis.error_reply("<CODE> <message>")``; :func:`from_reply`
maps the code to the exception class below.  The codes a script may answer
are :data:`SCRIPT_CODES`; the include ``constants`` spells them for the
scripts as the table ``ERR`` (``fail(ERR.NOT_FOUND, ...)``, ``fail`` in
lua/includes/base.lua), so no Lua file writes a code itself.
"""

from __future__ import annotations

import re


class SchedulerError(Exception):
    """Base of every error this package raises on purpose."""

    code = "ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(SchedulerError):
    """Bad input; nothing was written.  ``field`` names the offending field."""

    code = "BADARG"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(f"{field} {problem}" if field else problem)


class UnknownNode(SchedulerError):
    """The node is not in the scheduler's node list (exact reference string)."""

    code = "UNKNOWN_NODE"

    def __init__(self, message: str = "node is not in scheduler node list") -> None:
        super().__init__(message)


class NoNodesAvailable(SchedulerError):
    """Nothing eligible; the message carries the counted reasons."""

    code = "NO_NODES"


class IndexBehind(SchedulerError):
    """A Schedule the placement index could not decide (built anew, rebuilt,
    or stale nodes still listed) on a fleet larger than the full scan reads
    (``FULL_SCAN_MAX``): refused before any reservation, to be retried once
    the replicas' bounded steps have caught the index up.  The message says
    what is under way."""

    code = "BEHIND"


class NotFound(SchedulerError):
    code = "NOT_FOUND"


class FailedPrecondition(SchedulerError):
    code = "PRECONDITION"


class SyncSuperseded(FailedPrecondition):
    """A step of a node-list sync pass (lua/includes/sync_pass.lua) that is not the
    pass under way: another replica began one of another list since, or the
    pass expired.  Nothing was written by the refused step."""

    code = "SUPERSEDED"


class CorruptState(FailedPrecondition):
    """The cell holds what this version cannot read: a record field that fails
    its type or range check, or a key of the wrong type (an old version's or
    an operator's write).  The message names the key and the field;
    ``schedctl doctor`` finds such state.  A script answers it with its own
    code (``fail(ERR.CORRUPT, ...)``, or ``corrupt_field`` in
    lua/includes/base.lua from inside a helper)."""

    code = "CORRUPT"


#: What every script answers when the cell has no policy (the generated include
#: ``constants`` spells it for the scripts).
NO_POLICY = "cell policy is not initialised: start a replica or run `schedctl policy set`"


class CellNotInitialised(FailedPrecondition):
    """The cell has no policy: no replica stored one yet, or Redis lost its data
    (a client that keeps the cell restores it, see ``Scheduler.keep_cell``).
    A code of its own: the restore never reads the message."""

    code = "NO_POLICY"

    def __init__(self, message: str = NO_POLICY) -> None:
        super().__init__(message)


class PolicyConflict(SchedulerError):
    """The cell's stored policy differs from the one this process was given."""

    code = "POLICY_CONFLICT"

    def __init__(self, message: str, stored: dict[str, str], wanted: dict[str, str]) -> None:
        super().__init__(message)
        self.stored = stored
        self.wanted = wanted


class StaticNodesConflict(SchedulerError):
    """The cell's stored static node list differs from this replica's config."""


class StoreUnavailable(SchedulerError):
    """Redis cannot be reached (or answered with a transport error)."""

    code = "UNAVAILABLE"


class NotReplicated(StoreUnavailable):
    """The write reached fewer Redis replicas than ``min_replicas_acked`` asks
    for in time: a failover could lose it, so it is not acknowledged."""


CODES: dict[str, type[SchedulerError]] = {
    cls.code: cls
    for cls in (
        UnknownNode,
        NoNodesAvailable,
        IndexBehind,
        NotFound,
        FailedPrecondition,
        SyncSuperseded,
        CorruptState,
        CellNotInitialised,
        StoreUnavailable,
    )
}

#: Every code a script may answer (``ERR`` in the include ``constants``).
SCRIPT_CODES: tuple[str, ...] = (
    InvalidArgument.code,
    UnknownNode.code,
    NoNodesAvailable.code,
    IndexBehind.code,
    NotFound.code,
    FailedPrecondition.code,
    SyncSuperseded.code,
    CorruptState.code,
    CellNotInitialised.code,
)

#: What Redis appends to an error a script raised with error() (rather than
#: returned): " script: <name>, on @user_function:<line>."
_RAISED_AT = re.compile(r" script: [^ ]+, on @\w+:\d+\.$")


def from_reply(text: str) -> SchedulerError | None:
    """Turn a script error reply into our exception, or None if it is not ours."""
    code, _, message = _RAISED_AT.sub("", text).partition(" ")
    if code == InvalidArgument.code:
        field, _, problem = message.partition(" ")
        return InvalidArgument(field, problem)
    cls = CODES.get(code)
    if cls is None:
        return None
    return cls(message)
