"""Error replies map to exceptions by their code alone: the lost-cell restore
(``CellNotInitialised``, a code of its own) never reads the message."""

from __future__ import annotations

from scheduler.domain.errors import (
    CODES,
    NO_POLICY,
    SCRIPT_CODES,
    CellNotInitialised,
    FailedPrecondition,
    InvalidArgument,
    UnknownNode,
    from_reply,
)


def test_the_missing_policy_has_its_own_code() -> None:
    e = from_reply(f"NO_POLICY {NO_POLICY}")
    assert type(e) is CellNotInitialised and e.message == NO_POLICY
    assert isinstance(e, FailedPrecondition)  # (the same gRPC status as before)
    # the code decides, not the text: the message may say anything
    assert type(from_reply("NO_POLICY policy gone")) is CellNotInitialised
    assert type(from_reply(f"PRECONDITION {NO_POLICY}")) is FailedPrecondition


def test_every_script_code_maps_to_its_class() -> None:
    for code in SCRIPT_CODES:
        e = from_reply(f"{code} field went wrong")
        assert e is not None and e.code == code
    bad = from_reply("BADARG cpu must be positive")
    assert isinstance(bad, InvalidArgument) and bad.field == "cpu"
    assert isinstance(from_reply("UNKNOWN_NODE node is not in scheduler node list"), UnknownNode)
    assert set(SCRIPT_CODES) - {InvalidArgument.code} <= set(CODES)
    assert from_reply("ERR some Redis error") is None
