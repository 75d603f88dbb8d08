"""A frame that is not the protobuf message its method takes: INVALID_ARGUMENT
naming the method and a rate-limited log line, not UNKNOWN with a 729-byte
traceback per request; well-formed calls on the same channel go on."""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
import pytest

from scheduler.grpc import scheduler_pb2 as pb
from scheduler.testing.replicas import ThreadedReplica
from tests.helpers import endpoint_md, hb_request

#: not protobuf: a field 1 of wire type 7 (none), then a truncated varint
GARBAGE = [b"\x0f\xff\xff", b"\x0a\x05ab", b"\xff" * 64]


def raw(r: ThreadedReplica, method: str) -> Callable[..., bytes]:
    assert r.channel is not None
    return r.channel.unary_unary(f"/scheduler.v1.Scheduler/{method}")  # type: ignore[no-any-return]


@pytest.mark.parametrize("method", ["Schedule", "Heartbeat", "LookupNode", "ListNodes"])
def test_a_malformed_frame_is_invalid_argument_with_one_log_line(
    make_replica: Callable[..., ThreadedReplica],
    caplog: pytest.LogCaptureFixture,
    method: str,
) -> None:
    r = make_replica()
    call = raw(r, method)
    with caplog.at_level(logging.DEBUG):
        for _ in range(10):
            for frame in GARBAGE:
                with pytest.raises(grpc.RpcError) as e:
                    call(frame, timeout=5)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
                assert (e.value.details() or "").startswith(f"{method}: the request is not a valid")
        r.stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"), timeout=5)
        assert r.stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes[0].node_id == "n1"
    lines = [m for m in caplog.messages if "malformed request" in m]
    assert len(lines) == 1 and lines[0].startswith(f"{method}: refused"), caplog.messages
    assert not [rec for rec in caplog.records if rec.exc_info], "a traceback was logged"
    assert not [m for m in caplog.messages if "Traceback" in m or "deserializ" in m.lower()]
