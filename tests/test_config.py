"""The replica's configuration: file keys, durations, environment, flags, and
the start-up refusals of ``schedctl serve``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from scheduler.cli.main import main

from scheduler import Limits, Policy, Scheduler
from scheduler.config import ConfigError, Overrides, load, parse_duration_ms, summary
from scheduler.connection import describe_target


def write(tmp_path: Path, doc: Any) -> Path:
    p = tmp_path / "config.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("30s", 30_000),
        ("10m", 600_000),
        ("1h", 3_600_000),
        ("500ms", 500),
        ("1h30m", 5_400_000),
        ("1.5s", 1_500),
        ("2m0.5s", 120_500),
        ("1000us", 1),
    ],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms("k", text) == ms


@pytest.mark.parametrize("text", ["", "30", "s", "30x", "-5s", "1 h", "100us", "1d"])
def test_bad_durations_name_the_key(text: str) -> None:
    with pytest.raises(ConfigError, match="^scheduler.report_ttl: "):
        parse_duration_ms("scheduler.report_ttl", text)


def test_full_reference_config(tmp_path: Path) -> None:
    s = load(
        write(
            tmp_path,
            {
                "scheduler": {
                    "grpc_listen_addr": ":7000",
                    "metrics_listen_addr": "127.0.0.1:7001",
                    "strategy": "round_robin",
                    "report_ttl": "15s",
                    "binding_ttl": "2m",
                    "placement_reservation_ttl": "5m",
                    "redis_addr": "127.0.0.1:6380",
                    "nodes": [
                        {"id": "n1", "endpoint": "10.0.0.1:5000"},
                        {"id": "n2", "endpoint": " 10.0.0.2:5000 "},
                    ],
                    "node_resource_limit": {"max_sandbox_count": 10, "max_cpu_used_percent": 90},
                    "artifact_store_capacity": 5000,
                    "artifact_lookup_node_limit": 3,
                    "overcommit": {"cpu": 2.0},
                    "default_request": {"cpu": 1, "memory_mb": 512},
                    "cell": "eu-1",
                },
                "log_level": "debug",
                "log_format": "json",
            },
        ),
        env={},
    )
    p = s.policy
    assert (p.strategy, p.report_ttl_ms, p.binding_ttl_ms, p.reservation_ttl_ms) == (
        "round_robin",
        15_000,
        120_000,
        300_000,
    )
    assert p.limits.active() == {"max_sandbox_count": 10, "max_cpu_used_percent": 90}
    assert (p.overcommit.cpu, p.overcommit.memory) == (2.0, 1.0)
    assert p.static_nodes and s.discovery == "static"
    assert s.nodes == [("n1", "10.0.0.1:5000"), ("n2", "10.0.0.2:5000")]
    assert (s.grpc_listen, s.metrics_listen) == ("[::]:7000", "127.0.0.1:7001")
    assert (s.redis_url, s.cell) == ("127.0.0.1:6380", "eu-1")
    assert (s.artifact_store_capacity, s.artifact_lookup_node_limit) == (5000, 3)
    assert (s.log_level, s.log_format) == ("debug", "json")


def test_defaults() -> None:
    s = load(None, env={})
    assert s.policy == Policy()
    assert s.redis_url is None  # the embedded store
    assert (s.durability.replicas, s.durability.timeout_ms, s.redis_timeout_s) == (0, 200, 2.0)
    assert s.discovery == "heartbeat" and s.nodes == []
    assert s.artifact_store_capacity == 1_000_000


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ({"schedular": {}}, "unknown key 'schedular'"),
        ({"scheduler": {"stratgy": "random"}}, "unknown key 'scheduler.stratgy'"),
        (
            {"scheduler": {"node_resource_limit": {"max_sandboxes": 1}}},
            "unknown key 'scheduler.node_resource_limit.max_sandboxes'",
        ),
        (
            {"scheduler": {"nodes": [{"id": "n1", "endpoint": "e", "zone": "a"}]}},
            "unknown key 'scheduler.nodes[0].zone'",
        ),
        ({"scheduler": {"report_ttl": 30}}, "scheduler.report_ttl: Expected `str`"),
        ({"scheduler": {"report_ttl": "30"}}, "scheduler.report_ttl: '30' is not a duration"),
        ({"scheduler": {"strategy": "fastest"}}, "scheduler.strategy: must be one of"),
        (
            {"scheduler": {"node_resource_limit": {"max_sandbox_count": -1}}},
            "scheduler.node_resource_limit.max_sandbox_count",
        ),
        ({"scheduler": {"nodes": [{"id": "n{1}", "endpoint": "e"}]}}, "scheduler.nodes[0].id"),
        ({"scheduler": {"nodes": [{"id": "n1", "endpoint": " "}]}}, "scheduler.nodes[0].endpoint"),
        (
            {
                "scheduler": {
                    "nodes": [{"id": "n1", "endpoint": "a"}, {"id": "n1", "endpoint": "b"}]
                }
            },
            "scheduler.nodes[1].id",
        ),
        ({"scheduler": {"discovery": "dns"}}, "scheduler.discovery"),
        ({"scheduler": {"discovery": "static"}}, "scheduler.discovery: static needs"),
        ({"scheduler": {"grpc_listen_addr": "nowhere"}}, "scheduler.grpc_listen_addr"),
        ({"scheduler": {"overcommit": {"cpu": 0}}}, "scheduler.overcommit.cpu"),
        ({"scheduler": {"cell": "a{b}"}}, "scheduler.cell"),
        (
            {"scheduler": {"redis_addr": "redis+sentinel://h:1"}},
            "scheduler.redis_addr: 'redis+sentinel://h:1' names no primary",
        ),
        ({"scheduler": {"redis_addr": "http://h:1"}}, "scheduler.redis_addr: must be host:port"),
        ({"scheduler": {"min_replicas_acked": -1}}, "scheduler.min_replicas_acked: must be 0..64"),
        ({"scheduler": {"replica_ack_timeout": "soon"}}, "scheduler.replica_ack_timeout"),
        ({"scheduler": {"redis_timeout": "0s"}}, "scheduler.redis_timeout"),
        ({"log_level": "loud"}, "log_level"),
        ({"log_format": "xml"}, "log_format"),
        ("{not json", "not valid JSON"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, doc: Any, named: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, doc), env={})
    assert named in str(e.value)


def test_environment_overrides_file_and_flags_override_both(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "scheduler": {
                "redis_addr": "file:1",
                "binding_ttl": "1m",
                "artifact_store_capacity": 10,
                "artifact_lookup_node_limit": 1,
            }
        },
    )
    env = {
        "SCHEDULER_REDIS_ADDR": "env:2",
        "SCHEDULER_BINDING_TTL": "90s",
        "SCHEDULER_ARTIFACT_STORE_CAPACITY": "20",
        "SCHEDULER_ARTIFACT_LOOKUP_NODE_LIMIT": "4",
    }
    s = load(path, env=env)
    assert (
        s.redis_url,
        s.policy.binding_ttl_ms,
        s.artifact_store_capacity,
        s.artifact_lookup_node_limit,
    ) == ("env:2", 90_000, 20, 4)
    s = load(
        path,
        env=env,
        flags=Overrides(redis="flag:3", grpc_listen="127.0.0.1:1", metrics_listen="", cell="c2"),
    )
    assert (s.redis_url, s.grpc_listen, s.metrics_listen, s.cell) == (
        "flag:3",
        "127.0.0.1:1",
        None,
        "c2",
    )
    with pytest.raises(ConfigError, match="SCHEDULER_ARTIFACT_STORE_CAPACITY"):
        load(path, env={"SCHEDULER_ARTIFACT_STORE_CAPACITY": "lots"})
    with pytest.raises(ConfigError, match="scheduler.binding_ttl"):
        load(path, env={"SCHEDULER_BINDING_TTL": "soon"})


# ---------------------------------------------------------------------------
# schedctl serve refuses to start, saying why
# ---------------------------------------------------------------------------
def test_serve_refuses_unknown_key(tmp_path: Path) -> None:
    path = write(tmp_path, {"scheduler": {"node_resource_limit": {"max_sandbox_cout": 10}}})
    result = CliRunner().invoke(main, ["serve", "--config", str(path)])
    assert result.exit_code == 1
    assert "unknown key 'scheduler.node_resource_limit.max_sandbox_cout'" in result.output


@pytest.mark.real_only
def test_serve_refuses_a_policy_that_differs_from_the_stored_one(
    tmp_path: Path, real_url: str
) -> None:
    Scheduler.connect(real_url, cell="pc", policy=Policy(limits=Limits(max_sandbox_count=10)))
    path = write(
        tmp_path,
        {
            "scheduler": {
                "node_resource_limit": {"max_sandbox_count": 20},
                "report_ttl": "45s",
                "metrics_listen_addr": "",
            }
        },
    )
    result = CliRunner().invoke(
        main,
        [
            "serve",
            "--config",
            str(path),
            "--redis",
            real_url,
            "--cell",
            "pc",
            "--grpc-listen",
            "127.0.0.1:0",
        ],
    )
    assert result.exit_code == 1
    out = result.output
    assert "stored policy differs" in out and "--overwrite-policy" in out
    rows = {
        line.split()[0]: line.split()[1:]
        for line in out.splitlines()
        if line.startswith("  ") and line.split()
    }
    assert rows["max_sandbox_count"] == ["10", "20"]  # stored, configured
    assert rows["report_ttl_ms"] == ["30000", "45000"]
    stored = Scheduler.connect(real_url, cell="pc").policy()
    assert stored is not None and stored.limits.max_sandbox_count == 10  # untouched


@pytest.mark.real_only
def test_serve_refuses_a_static_node_list_that_differs(tmp_path: Path, real_url: str) -> None:
    s = Scheduler.connect(real_url, cell="sn", policy=Policy(static_nodes=True))
    s.sync_nodes([("n1", "10.0.0.1:1")])
    path = write(
        tmp_path,
        {
            "scheduler": {
                "nodes": [{"id": "n2", "endpoint": "10.0.0.2:1"}],
                "metrics_listen_addr": "",
            }
        },
    )
    result = CliRunner().invoke(
        main,
        [
            "serve",
            "--config",
            str(path),
            "--redis",
            real_url,
            "--cell",
            "sn",
            "--grpc-listen",
            "127.0.0.1:0",
        ],
    )
    assert result.exit_code == 1
    assert "stored:     n1=10.0.0.1:1" in result.output
    assert "configured: n2=10.0.0.2:1" in result.output
    assert [v.node_id for v in s.nodes()] == ["n1"]


@pytest.mark.parametrize("which", ["--grpc-listen", "--metrics-listen"])
def test_serve_refuses_an_address_in_use(tmp_path: Path, which: str) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = f"127.0.0.1:{busy.getsockname()[1]}"
        args = {"--grpc-listen": "127.0.0.1:0", "--metrics-listen": "127.0.0.1:0", which: taken}
        result = CliRunner().invoke(
            main,
            [
                "serve",
                "--config",
                str(write(tmp_path, {})),
                *[x for kv in args.items() for x in kv],
            ],
        )
    assert result.exit_code == 1
    label = "gRPC" if which == "--grpc-listen" else "/metrics"
    assert f"{label} cannot listen on {taken}" in result.output


def test_fault_tolerance_keys_and_a_sentinel_address(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "scheduler": {
                "redis_addr": "redis+sentinel://app:pw@10.0.0.1:26379,10.0.0.2:26379/sched?db=1",
                "min_replicas_acked": 1,
                "replica_ack_timeout": "500ms",
                "redis_timeout": "750ms",
            }
        },
    )
    s = load(path, env={})
    assert (s.durability.replicas, s.durability.timeout_ms, s.redis_timeout_s) == (1, 500, 0.75)
    lines = "\n".join(summary(s, describe_target(s.redis_url)))
    assert "writes acknowledged once 1 Redis replica(s) have them" in lines
    assert "redis_timeout: 750ms" in lines
    assert "pw" not in lines and "***@10.0.0.1:26379,10.0.0.2:26379/sched" in lines
    env = {"SCHEDULER_REDIS_ADDR": "rediss+sentinel://10.0.0.9:26379/other"}
    assert load(path, env=env).redis_url == env["SCHEDULER_REDIS_ADDR"]


def test_coalescing_is_on_unless_turned_off(tmp_path: Path) -> None:
    assert load(None, env={}).coalesce_schedules
    off = write(tmp_path, {"scheduler": {"coalesce_schedules": False}})
    assert not load(off, env={}).coalesce_schedules
    assert load(off, env={}, flags=Overrides(coalesce=True)).coalesce_schedules
    assert not load(None, env={}, flags=Overrides(coalesce=False)).coalesce_schedules
    assert "coalesce_schedules: off" in "\n".join(summary(load(off, env={}), describe_target(None)))
