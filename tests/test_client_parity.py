"""The sync and asyncio clients expose the same operations with the same
parameters (the asyncio one may also take a caller's ``timeout``), and every
asyncio operation is awaitable."""

from __future__ import annotations

import inspect
from typing import Any

from scheduler.client.aio import AsyncScheduler
from scheduler.client.sync import Scheduler

#: asyncio-only parameters: a caller's deadline
ASYNC_ONLY = {"timeout"}


def public(cls: type) -> dict[str, Any]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member)
    }


def params(f: Any, skip: set[str] = frozenset()) -> list[tuple[str, Any, Any]]:
    sig = inspect.signature(f)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values() if p.name not in skip]


def test_same_operations_same_parameters() -> None:
    sync, aio = public(Scheduler), public(AsyncScheduler)
    assert sorted(sync) == sorted(aio)
    assert len(sync) >= 35  # every operation, not a handful
    for name in sync:
        assert params(sync[name], ASYNC_ONLY) == params(aio[name], ASYNC_ONLY), name


def test_async_operations_are_awaitable_and_sync_ones_are_not() -> None:
    # no I/O, or I/O in the background
    plain = {"keep_cell", "scoped", "abandon", "forget", "owe_assignment"}
    for name, member in public(AsyncScheduler).items():
        if name in plain:
            continue
        returns = inspect.signature(member).return_annotation
        awaitable = inspect.iscoroutinefunction(member) or "Awaitable" in str(returns)
        assert (
            awaitable or name == "connect" and inspect.iscoroutinefunction(inspect.unwrap(member))
        ), name
    for name, member in public(Scheduler).items():
        assert not inspect.iscoroutinefunction(member), name
        assert "Awaitable" not in str(inspect.signature(member).return_annotation), name
