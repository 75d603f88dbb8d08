"""Hostile input: every repeated field has a bound that is checked before
Redis is touched, a heartbeat applies all or nothing whatever the length of
its roster, and an endpoint from metadata must be host:port."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import msgspec.structs
import pytest

from scheduler import Policy, Request, Scheduler
from scheduler.domain.errors import InvalidArgument, StoreUnavailable
from scheduler.domain.limits import (
    MAX_DISKS,
    MAX_EVENTS,
    MAX_IMAGES,
    MAX_METADATA,
    MAX_STATIC_NODES,
    endpoint,
)
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.server.config import ConfigError, load
from scheduler.store.calls import schedule_argv
from scheduler.store.p2p import PeerOps
from scheduler.testing.redis_server import free_port
from scheduler.testing.replicas import ThreadedReplica
from tests.helpers import endpoint_md, hb, hb_request, snapshot_keys

Make = Callable[..., Scheduler]


def roster(n: int, prefix: str = "sb") -> list[str]:
    return [f"{prefix}-{i:06d}" for i in range(n)]


def bind_keys(s: Scheduler) -> int:
    return sum(1 for _ in s.client.scan_iter(match=s.keys.base + "bind:*", count=5000))


# ---------------------------------------------------------------------------
# Rosters
# ---------------------------------------------------------------------------
def test_a_roster_over_max_roster_ids_is_refused_before_redis() -> None:
    # a client whose Redis is down: the bound answers first, naming the field
    s = Scheduler.connect(f"redis://127.0.0.1:{free_port()}/0", cell="x")
    try:
        with pytest.raises(InvalidArgument) as e:
            s.heartbeat(hb("n1", roster=roster(4097)))
        assert e.value.field == "sandbox_ids"
        assert e.value.message == ("sandbox_ids has 4097 entries, more than max_roster_ids (4096)")
        with pytest.raises(StoreUnavailable):  # at the limit, it goes to Redis
            s.heartbeat(hb("n1", roster=roster(4096)))
    finally:
        s.close()


def test_the_script_holds_the_stored_limit_and_writes_nothing(make_scheduler: Make) -> None:
    """A client that has not read the cell's policy checks the default bound;
    the script holds the stored one, before its first write (not even the
    sweep of a due reservation runs)."""
    a = make_scheduler(Policy(max_roster_ids=10, reservation_ttl_ms=1000))
    a.heartbeat(hb("n1", roster=roster(3)))
    a.schedule(Request.cold(1, 1))
    a.advance_clock(5000)  # that reservation is now due
    b = Scheduler(a.client, cell="test")
    before = snapshot_keys(a.client)
    with pytest.raises(InvalidArgument) as e:
        b.heartbeat(hb("n1", roster=roster(11)))
    assert e.value.field == "sandbox_ids"
    assert "11 entries, more than max_roster_ids (10)" in e.value.message
    assert snapshot_keys(a.client) == before
    assert a.stats().pending == 1


def test_a_roster_past_luas_unpack_limit_applies_whole(make_scheduler: Make) -> None:
    """10,000 new ids (Lua's unpack stops near 8,000): all of them or nothing."""
    s = make_scheduler(Policy(max_roster_ids=10_000))
    ids = roster(10_000)
    r = s.heartbeat(hb("n1", roster=ids, sandbox_count=len(ids)))
    assert r.roster_mode
    assert s.client.scard(s.keys.node_roster("n1")) == 10_000
    assert s.client.scard(s.keys.node_sbx("n1")) == 0  # (listed: in the roster set only)
    assert bind_keys(s) == 10_000
    assert s.lookup(ids[0]).node_id == s.lookup(ids[-1]).node_id == "n1"
    s.heartbeat(hb("n1", roster=[]))
    assert bind_keys(s) == 0
    assert not s.client.exists(s.keys.node_roster("n1"))


@pytest.mark.real_only
def test_a_roster_of_100000_ids_at_a_limit_of_100000(make_scheduler: Make) -> None:
    s = make_scheduler(Policy(max_roster_ids=100_000))
    ids = roster(100_000)
    s.heartbeat(hb("n1", roster=ids, sandbox_count=len(ids)))
    assert bind_keys(s) == 100_000
    assert s.client.scard(s.keys.node_roster("n1")) == 100_000
    assert s.client.hget(s.keys.node("n1"), "roster_size") == b"100000"
    # the next one replaces half of it
    s.heartbeat(hb("n1", roster=ids[50_000:] + roster(50_000, "new"), sandbox_count=100_000))
    assert bind_keys(s) == 100_000
    assert s.lookup("new-000000").node_id == "n1"
    with pytest.raises(Exception, match="sandbox assignment not found"):
        s.lookup(ids[0])
    with pytest.raises(InvalidArgument, match="100001 entries"):
        s.heartbeat(hb("n1", roster=roster(100_001)))


def test_the_static_node_list_is_bounded(tmp_path: Path) -> None:
    nodes = [
        {"id": f"n{i}", "endpoint": f"10.0.{i // 250}.{i % 250}:5000"}
        for i in range(MAX_STATIC_NODES + 1)
    ]
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"scheduler": {"nodes": nodes}}))
    with pytest.raises(ConfigError, match=r"scheduler.nodes: has 10001 entries, more than 10000"):
        load(path, env={})


def test_events_are_bounded_in_the_client_too(make_scheduler: Make) -> None:
    from scheduler.domain.records import SandboxEvent

    s = make_scheduler()
    s.heartbeat(hb("n1"))
    events = [SandboxEvent(sandbox_id=f"s{i}", event_type="CREATE") for i in range(MAX_EVENTS + 1)]
    with pytest.raises(InvalidArgument, match=f"events has {MAX_EVENTS + 1} entries"):
        s.events("n1", events)
    assert s.events("n1", events[:3]).acked == 0


# ---------------------------------------------------------------------------
# Artifact keys
# ---------------------------------------------------------------------------
def test_artifact_keys_are_capped(make_scheduler: Make) -> None:
    s = make_scheduler()
    s.heartbeat(hb("n1"))
    ops = PeerOps(s.keys, lambda: s.ops.bounds)
    s.run(ops.record("c", "bt", "k" * 512, "n1"))
    with pytest.raises(InvalidArgument) as e:
        ops.record("c", "bt", "k" * 513, "n1")
    assert e.value.field == "key"
    assert e.value.message == "key is longer than 512 bytes (artifact_key_max_bytes)"
    with pytest.raises(InvalidArgument, match="key is longer"):
        ops.lookup("c", "bt", "é" * 257)  # 514 bytes
    # the script holds the stored bound for a client that checks another one
    s.sync_policy(Policy(artifact_key_max_bytes=16), overwrite=True)
    before = snapshot_keys(s.client)
    loose = PeerOps(s.keys, lambda: Policy(artifact_key_max_bytes=4096))
    with pytest.raises(InvalidArgument, match="key is longer than 16 bytes"):
        s.run(loose.record("c", "bt", "k" * 17, "n1"))
    assert snapshot_keys(s.client) == before


# ---------------------------------------------------------------------------
# Endpoints
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [
        "10.0.0.1:5000",
        "node-1.local:5000",
        "localhost:1",
        "[::1]:443",
        "[fd00::1]:50051",
        "http://10.0.0.1:80",
        "https://node-1.example.com:8443",
        "https://[::1]:443/",
    ],
)
def test_endpoints_that_pass(value: str) -> None:
    assert endpoint("x-node-endpoint", value) == value


@pytest.mark.parametrize(
    "value",
    [
        "javascript:alert(1) <b>",
        "10.0.0.1",
        "10.0.0.1:0",
        "10.0.0.1:65536",
        "host:port",
        "ftp://h:21",
        "http://h:80/path",
        "h:80/",
        "a b:80",
        "<b>:80",
        "[::1",
        "[zz::1]:80",
        "user@h:80",
        "http://user:pw@h:80",
        "-h:80",
        "h_1:80",
        "x" * 300 + ":80",
    ],
)
def test_endpoints_that_do_not(value: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        endpoint("x-node-endpoint", value)
    assert e.value.field == "x-node-endpoint"


# ---------------------------------------------------------------------------
# Over gRPC: INVALID_ARGUMENT naming the field, nothing written
# ---------------------------------------------------------------------------
@pytest.fixture
def replica(make_replica: Callable[..., ThreadedReplica]) -> ThreadedReplica:
    return make_replica(Policy())


def refused(fn: Callable[[], Any]) -> str:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    return str(e.value.details())


def test_grpc_bounds_name_the_field_and_write_nothing(
    replica: ThreadedReplica, redis_client: Any
) -> None:
    stub = replica.stub
    stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1.local:5000"))
    before = snapshot_keys(redis_client, monitor=True)
    big = hb_request("n1", roster=roster(4097))
    assert refused(lambda: stub.Heartbeat(big)).startswith(
        "sandbox_ids has 4097 entries, more than max_roster_ids (4096)"
    )
    disks = hb_request("n1")
    disks.snapshot.disks.extend(pb.DiskMetric(mount_point=f"/d{i}") for i in range(MAX_DISKS + 1))
    assert refused(lambda: stub.Heartbeat(disks)).startswith("snapshot.disks has 257 entries")
    assert refused(
        lambda: stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("javascript:alert(1) <b>"))
    ).startswith("x-node-endpoint must be host:port or an http(s)://host:port URL")
    events = pb.ReportSandboxEventRequest(
        node_id="n1",
        events=[
            pb.SandboxEvent(sandbox_id=f"s{i}", event_type=pb.SANDBOX_EVENT_TYPE_CREATE)
            for i in range(MAX_EVENTS + 1)
        ],
    )
    assert refused(lambda: stub.ReportSandboxEvent(events)).startswith(
        f"events has {MAX_EVENTS + 1} entries"
    )
    images = pb.ScheduleRequest(
        hint=pb.ScheduleRequestHint(
            new_cold_sandbox=pb.NewColdSandboxHint(
                cpu_count=1, memory_mb=1, images=[f"i{i}" for i in range(MAX_IMAGES + 1)]
            )
        )
    )
    assert refused(lambda: stub.Schedule(images)).startswith(
        "hint.new_cold_sandbox.images has 257 entries"
    )
    meta = pb.ScheduleRequest(
        hint=pb.ScheduleRequestHint(
            new_sandbox=pb.NewSandboxHint(metadata={f"k{i}": "v" for i in range(MAX_METADATA + 1)})
        )
    )
    assert refused(lambda: stub.Schedule(meta)).startswith(
        "hint.new_sandbox.metadata has 257 entries"
    )
    fat = pb.ScheduleRequest(
        hint=pb.ScheduleRequestHint(new_sandbox=pb.NewSandboxHint(metadata={"k": "v" * 70_000}))
    )
    assert refused(lambda: stub.Schedule(fat)).startswith(
        "hint.new_sandbox.metadata holds more than 65536 characters"
    )
    art = pb.RecordP2pArtifactRequest(cluster_id="c1", backend="bt", key="k" * 513, node_id="n1")
    assert refused(lambda: stub.RecordP2pArtifact(art)).startswith(
        "key is longer than 512 bytes (artifact_key_max_bytes)"
    )
    assert snapshot_keys(redis_client, monitor=True) == before
    # a good endpoint is taken
    stub.Heartbeat(hb_request("n2"), metadata=endpoint_md("https://[::1]:8443"))
    assert (
        redis_client.hget(replica.settings.prefix + ":{test}:node:n2", "endpoint")
        == b"https://[::1]:8443"
    )


def test_policy_set_changes_the_bounds_every_replica_holds(real_url: str) -> None:
    from click.testing import CliRunner
    from scheduler.cli.main import main

    s = Scheduler.connect(real_url, cell="pb", policy=Policy())
    result = CliRunner().invoke(
        main,
        [
            "policy",
            "set",
            "--redis",
            real_url,
            "--cell",
            "pb",
            "--max-roster-ids",
            "2",
            "--node-forget-after",
            "0",
            "--reservation-tombstone-ttl",
            "1m",
            "--artifact-key-max-bytes",
            "64",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    stored = s.policy()
    assert stored is not None
    assert (
        stored.max_roster_ids,
        stored.node_forget_after_ms,
        stored.reservation_tombstone_ttl_ms,
        stored.artifact_key_max_bytes,
    ) == (2, 0, 60_000, 64)
    with pytest.raises(InvalidArgument, match="3 entries, more than max_roster_ids \\(2\\)"):
        s.heartbeat(hb("n1", roster=roster(3)))
    shown = json.loads(
        CliRunner()
        .invoke(main, ["policy", "show", "--redis", real_url, "--cell", "pb", "--json"])
        .stdout
    )
    assert shown["max_roster_ids"] == 2 and shown["node_forget_after_ms"] == 0
    s.close()


@pytest.mark.parametrize("value", ["1.5", "", "-1", " 5", "1e3", "0x10", "12345678901234567"])
def test_the_script_takes_only_whole_numbers_for_the_index_fields(
    make_scheduler: Make, value: str
) -> None:
    """A writer other than this client (its own checks bypassed) cannot slip a
    fraction, a sign, a blank or 17 digits into a field the index spells:
    1 to 16 digits, else BADARG naming the field, and nothing written."""
    s = make_scheduler()
    s.heartbeat(hb("n1", allocated_cpu=2))
    call = s.ops.heartbeat(hb("n1", allocated_cpu=3))
    at = call.args.index("allocated_cpu")
    args = [*call.args[: at + 1], value, *call.args[at + 2 :]]
    before = snapshot_keys(s.client)
    with pytest.raises(InvalidArgument) as e:
        s.run(replace(call, args=args))
    assert e.value.field == "snapshot.allocated_cpu"
    assert "must be a whole number below 10^16" in e.value.message
    assert snapshot_keys(s.client) == before
    args[at + 1] = "1234567890123456"  # 16 digits: taken
    s.run(replace(call, args=args))
    assert s.client.hget(s.keys.node("n1"), "allocated_cpu") == b"1234567890123456"


@pytest.mark.parametrize("value", ["1.5", "-1", "inf", "nan", "abc"])
@pytest.mark.parametrize("batch", [False, True], ids=["alone", "batch"])
def test_the_script_takes_only_whole_numbers_for_a_request(
    make_scheduler: Make, value: str, batch: bool
) -> None:
    """A Schedule's cpu and memory reach the script as text: anything but a
    whole number (a fraction, a sign, an infinity, NaN) is BADARG naming the
    field, alone or in a batch, and nothing is written."""
    s = make_scheduler()
    s.heartbeat(hb("n1"))
    for field in ("cpu", "memory_bytes"):
        call = s.ops.schedule(Request.cold(1, 1024), reservation_id=f"r-{field}")
        bad = call.with_argv(msgspec.structs.replace(schedule_argv(call), **{field: value}))
        before = snapshot_keys(s.client)
        if batch:
            answer = s.run(s.ops.schedule_batch([bad]))[0]
            assert isinstance(answer, InvalidArgument)
            error = answer
        else:
            with pytest.raises(InvalidArgument) as e:
                s.run(bad)
            error = e.value
        assert error.field == field
        assert "must be a non-negative whole number" in str(error)
        assert snapshot_keys(s.client) == before
