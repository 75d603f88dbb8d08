"""Read several views of a cell at one instant.

Commands that combine views (explain with the node numbers behind each
verdict, reservations with the cell's clock) queue the read-only scripts in
one MULTI/EXEC, so Redis runs them back to back with nothing in between and
the numbers add up even while replicas are placing.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

import redis

from scheduler.calls import Call
from scheduler.client import Scheduler
from scheduler.translate import reply_error, translated

A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")


@overload
def atomically(s: Scheduler, a: Call[A], b: Call[B], /) -> tuple[A, B]: ...
@overload
def atomically(s: Scheduler, a: Call[A], b: Call[B], c: Call[C], /) -> tuple[A, B, C]: ...
def atomically(s: Scheduler, *calls: Call[Any]) -> tuple[Any, ...]:
    pipe = s.client.pipeline(transaction=True)
    try:
        with translated(s.target):  # MULTI, or loading the scripts, may be refused (ACL)
            for call in calls:  # may load the function library first
                s.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
            replies = pipe.execute(raise_on_error=False)
    finally:
        pipe.reset()
    for reply in replies:
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply_error(reply, s.target) or reply
    return tuple(call.parse(reply) for call, reply in zip(calls, replies, strict=True))
