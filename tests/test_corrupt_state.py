"""Corrupt state written with plain Redis commands (the kind an old version
or an operator's script leaves) is refused with FAILED_PRECONDITION naming
the key and the field, by the client, through a replica's gRPC and by
schedctl: never read as a number it is not, never INTERNAL with a traceback.
(The scripts' own checks, and the index's self-repair, are the Lua side's.)"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import grpc
import pytest
import redis
from click.testing import CliRunner
from scheduler.cli.main import main

from scheduler import Policy, Request, Scheduler
from scheduler.domain.errors import CorruptState, FailedPrecondition
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.store.connection import async_client
from scheduler.store.keys import CellKeys
from scheduler.store.replies import parse_reservation, parsed, whole
from scheduler.testing.replicas import ThreadedReplica, settings_for
from tests.helpers import endpoint_md, hb, hb_request

pytestmark = pytest.mark.real_only
CELL = "corrupt"
KEYS = CellKeys(CELL)


@pytest.fixture
def admin(real_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(real_url)
    yield client
    client.close()


@pytest.fixture
def sched(real_url: str) -> Iterator[Scheduler]:
    s = Scheduler.connect(real_url, cell=CELL, policy=Policy(), overwrite_policy=True)
    s.heartbeat(hb("n1"))
    yield s
    s.close()


@pytest.fixture
def replica(real_url: str, sched: Scheduler) -> Iterator[ThreadedReplica]:
    with ThreadedReplica(
        settings_for(Policy(), cell=CELL), lambda: async_client(real_url), real_url
    ) as r:
        yield r


CORRUPTIONS: list[tuple[str, Callable[[redis.Redis], object], str]] = [
    ("not a number", lambda a: a.hset(KEYS.node("n1"), "sandbox_count", "abc"), "sandbox_count"),
    ("negative", lambda a: a.hset(KEYS.node("n1"), "cpu_count", "-5"), "cpu_count"),
    ("a fraction", lambda a: a.hset(KEYS.node("n1"), "allocated_cpu", "1.5"), "allocated_cpu"),
]


@pytest.mark.parametrize(("case", "corrupt", "field"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_a_corrupt_node_field_is_named_by_every_read(
    sched: Scheduler,
    admin: redis.Redis,
    replica: ThreadedReplica,
    caplog: pytest.LogCaptureFixture,
    case: str,
    corrupt: Callable[[redis.Redis], object],
    field: str,
) -> None:
    corrupt(admin)
    for read in (sched.nodes, sched.observed_nodes, lambda: sched.observed_node("n1")):
        with pytest.raises(CorruptState) as e:
            read()
        assert f"corrupt record node:n1: field {field} is " in e.value.message
    with caplog.at_level(logging.ERROR):
        for call in (
            lambda: replica.stub.ListObservedNodes(pb.ListObservedNodesRequest(), timeout=5),
            lambda: replica.stub.GetNode(pb.GetNodeRequest(node_id="n1"), timeout=5),
        ):
            with pytest.raises(grpc.RpcError) as rpc:
                call()
            assert rpc.value.code() == grpc.StatusCode.FAILED_PRECONDITION, rpc.value.details()
            assert f"node:n1: field {field}" in (rpc.value.details() or "")
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    result = CliRunner().invoke(main, ["nodes", "--redis", sched.url or "", "--cell", CELL])
    assert result.exit_code == 1, result.output
    assert f"node:n1: field {field}" in result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1, result.output


def test_a_corrupt_reservation_field_is_named(sched: Scheduler, admin: redis.Redis) -> None:
    p = sched.schedule(Request.cold(1, 0))
    admin.hset(KEYS.res(p.reservation_id or ""), "cpu", "many")
    with pytest.raises(CorruptState, match=rf"res:{p.reservation_id}: field cpu is 'many'"):
        sched.reservations()


def test_a_key_of_the_wrong_type_is_failed_precondition(
    sched: Scheduler, admin: redis.Redis, replica: ThreadedReplica
) -> None:
    """A node record overwritten by a string: WRONGTYPE inside the scripts,
    which answered INTERNAL with the raw Redis error before."""
    admin.delete(KEYS.node("n1"))
    admin.set(KEYS.node("n1"), "garbage")
    for read in (sched.nodes, lambda: sched.heartbeat(hb("n1"))):
        with pytest.raises(CorruptState, match=r"WRONGTYPE in (nodes_view|heartbeat\w*) at its '"):
            read()
    with pytest.raises(grpc.RpcError) as rpc:
        replica.stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"), timeout=5)
    assert rpc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "WRONGTYPE" in (rpc.value.details() or "")


def test_the_parsers_check_type_and_range() -> None:
    assert whole({"x": "7"}, "x", "node:a") == 7
    assert whole({}, "x", "node:a") == 0  # (an absent field: a bare record)
    with pytest.raises(CorruptState, match=r"node:a: field x is '-1', not an integer >= 0"):
        whole({"x": "-1"}, "x", "node:a")
    with pytest.raises(CorruptState, match=r"res:r1: field state is missing"):
        parse_reservation({"reservation_id": "r1", "node_id": "n1"})
    # what no parser names: the script, still FAILED_PRECONDITION
    with pytest.raises(FailedPrecondition, match=r"the reply of stats cannot be read \(IndexError"):
        parsed("stats", lambda r: r[3], [])
