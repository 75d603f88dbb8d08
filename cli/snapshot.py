"""Read several views of a cell at one instant.

Commands that combine views (explain with the node numbers behind each
verdict, reservations with the cell's clock) queue the read-only scripts in
one MULTI/EXEC, so Redis runs them back to back with nothing in between and
the numbers add up even while replicas are placing.

A pipeline cannot load the function library in the middle of a MULTI: when
Redis answers that a function is missing (it restarted empty, or someone ran
FUNCTION FLUSH), the library is loaded again and the read sent once more, so
``nodes --watch`` goes on where a replica would.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

import redis

from scheduler.client.sync import Scheduler
from scheduler.domain.errors import SchedulerError
from scheduler.store.calls import Call
from scheduler.store.translate import reply_error, translated

A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")


@overload
def atomically(s: Scheduler, a: Call[A], b: Call[B], /) -> tuple[A, B]: ...
@overload
def atomically(s: Scheduler, a: Call[A], b: Call[B], c: Call[C], /) -> tuple[A, B, C]: ...
def atomically(s: Scheduler, *calls: Call[Any]) -> tuple[Any, ...]:
    replies = _send(s, calls)
    if any(_missing(r) for r in replies):
        s.scripts.mode = None  # load the library before queueing again
        replies = _send(s, calls)
    for reply in replies:
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply_error(reply, s.target) or SchedulerError(
                f"Redis at {s.target} answered: {reply}"
            )
    return tuple(call.parse(reply) for call, reply in zip(calls, replies, strict=True))


def _missing(reply: Any) -> bool:
    return isinstance(reply, redis.exceptions.ResponseError) and (
        "function not found" in str(reply).lower() or str(reply).startswith("NOSCRIPT")
    )


def _send(s: Scheduler, calls: tuple[Call[Any], ...]) -> list[Any]:
    pipe = s.client.pipeline(transaction=True)
    try:
        with translated(s.target):  # MULTI, or loading the scripts, may be refused (ACL)
            for call in calls:  # may load the function library first
                s.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
            replies = pipe.execute(raise_on_error=False)
    finally:
        pipe.reset()
    return list(replies)
