"""The replica's configuration: file keys, durations, environment, flags, and
the start-up refusals of ``schedctl serve``."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from scheduler.cli.main import main

from scheduler import Limits, Policy, Scheduler
from scheduler.server.config import (
    ConfigError,
    KubernetesDiscovery,
    Overrides,
    load,
    parse_duration_ms,
    resolve_log_format,
    summary,
)
from scheduler.server.service import peer_endpoint
from scheduler.store.address import describe_target


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
                    "locality": {"weight": 0.15, "pending_decay": 0.5},
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
    assert (p.locality.weight, p.locality.pending_decay) == (0.15, 0.5)
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
        (
            {"scheduler": {"locality": {"weight": 0.15, "pending_decay": -0.5}}},
            "scheduler.locality.pending_decay: must be in [0, 100]",
        ),
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


# -- the reference system's files, env and flags (issue 26) -------------------
DROPIN = Path(__file__).parent / "dropin"


def test_the_reference_kubernetes_file_loads_as_it_is() -> None:
    s = load(DROPIN / "scheduler.json", env={})
    # the watcher's list is the node list: heartbeats of other nodes are refused
    assert s.discovery == "kubernetes" and s.nodes == [] and s.policy.static_nodes
    assert s.kubernetes == KubernetesDiscovery(
        namespace="agentenv-system", service_name="agentenv-nodes", port=8000, scheme="http"
    )
    assert (s.grpc_listen, s.metrics_listen, s.log_format) == ("[::]:9090", "[::]:9101", "json")
    assert s.policy.strategy == "round_robin"


def test_the_reference_compose_file_loads_and_its_gateway_is_noted() -> None:
    s = load(DROPIN / "default.json", env={})
    assert s.discovery == "static" and s.kubernetes is None
    assert s.nodes == [("node-a", "http://agentenv-a:8000"), ("node-b", "http://agentenv-b:8000")]
    assert s.log_format == "auto"
    assert [text for _, text in s.notes] == [
        f"{DROPIN / 'default.json'}: section 'gateway' ignored (it configures the gateway)"
    ]


def test_upstream_defaults_listen_where_a_gateway_looks() -> None:
    s = load(None, env={})
    assert (s.grpc_listen, s.metrics_listen) == ("[::]:9090", "[::]:9101")


def test_kubernetes_sub_object_keys_and_string_form(tmp_path: Path) -> None:
    kube = {
        "namespace": "ns",
        "service_name": "nodes",
        "port": 9000,
        "scheme": "https",
        "ignore_pod_selector": "agentenv.io/ignore=true",
        "no_schedule_pod_selector": "agentenv.io/drain=true",
    }
    doc = {"scheduler": {"discovery": {"mode": "KUBERNETES", "kubernetes": kube}}}
    s = load(write(tmp_path, doc), env={})
    assert s.kubernetes == KubernetesDiscovery(**kube)
    assert "EndpointSlices of ns/nodes, endpoints https://<address>:9000" in summary(s, "x")[1]
    with pytest.raises(
        ConfigError, match=r"^scheduler.discovery.kubernetes.namespace: is required"
    ):
        load(write(tmp_path, {"scheduler": {"discovery": "kubernetes"}}), env={})


@pytest.mark.parametrize(
    ("kube", "named"),
    [
        ({"service_name": "s", "port": 1}, "scheduler.discovery.kubernetes.namespace: is required"),
        ({"namespace": "n", "port": 1}, "scheduler.discovery.kubernetes.service_name: is required"),
        (
            {"namespace": "n", "service_name": "s"},
            "scheduler.discovery.kubernetes.port: must be greater than zero",
        ),
        (
            {"namespace": "n", "service_name": "s", "port": -1},
            "scheduler.discovery.kubernetes.port: must be greater than zero",
        ),
        (
            {"namespace": "n", "service_name": "s", "port": 1, "scheme": " "},
            "scheduler.discovery.kubernetes.scheme: is required",
        ),
        (
            {"namespace": "n", "service_name": "s", "port": 1, "selector": "x"},
            "unknown key 'scheduler.discovery.kubernetes.selector'",
        ),
    ],
)
def test_kubernetes_discovery_is_validated(tmp_path: Path, kube: Any, named: str) -> None:
    doc = {"scheduler": {"discovery": {"mode": "kubernetes", "kubernetes": kube}}}
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, doc), env={})
    assert named in str(e.value)


@pytest.mark.parametrize(
    ("discovery", "named"),
    [
        ({"mode": "dns"}, "scheduler.discovery.mode: must be one of static, heartbeat, kubernetes"),
        ("dns", "scheduler.discovery: must be one of static, heartbeat, kubernetes"),
        ({"mode": "heartbeat", "heartbeat": {"port": 70000}}, "heartbeat.port: must be 0..65535"),
        (
            {"mode": "heartbeat", "heartbeat": {"port": 80, "scheme": ""}},
            "scheduler.discovery.heartbeat.scheme: is required",
        ),
        ({"mode": "heartbeat", "watch": 1}, "unknown key 'scheduler.discovery.watch'"),
        ({"heartbeat": {"port": 80}, "mode": "static"}, "scheduler.discovery.mode: static needs"),
    ],
)
def test_discovery_object_errors_name_the_key(tmp_path: Path, discovery: Any, named: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, {"scheduler": {"discovery": discovery}}), env={})
    assert named in str(e.value)


def test_heartbeat_port_applies_to_heartbeat_discovery_alone(tmp_path: Path) -> None:
    doc = {
        "scheduler": {
            "nodes": [{"id": "n1", "endpoint": "http://n1:8000"}],
            "discovery": {"mode": "static", "heartbeat": {"port": 8000}},
        }
    }
    with pytest.raises(ConfigError, match="^scheduler.discovery.heartbeat: applies to"):
        load(write(tmp_path, doc), env={})
    s = load(DROPIN / "heartbeat.json", env={})
    assert (s.discovery, s.heartbeat_port, s.heartbeat_scheme) == ("heartbeat", 8000, "http")
    assert "gets http://<its address>:8000" in summary(s, "x")[1]
    plain = load(write(tmp_path, {"scheduler": {"discovery": {"mode": "heartbeat"}}}), env={})
    assert plain.heartbeat_port == 0
    assert "set scheduler.discovery.heartbeat.port and scheme" in summary(plain, "x")[1]


def test_shared_file_sections(tmp_path: Path) -> None:
    doc = {"service": "gateway", "gateway": {"http_listen_addr": ":8080"}, "scheduler": {}}
    s = load(write(tmp_path, doc), env={})
    assert [level for level, _ in s.notes] == ["info", "info"]
    assert "service 'gateway' ignored: this is the scheduler" in s.notes[1][1]
    with pytest.raises(ConfigError, match="unknown key 'worker'"):
        load(write(tmp_path, {"worker": {}}), env={})
    with pytest.raises(ConfigError, match="unknown key 'scheduler.gateway'"):
        load(write(tmp_path, {"scheduler": {"gateway": {}}}), env={})


@pytest.mark.parametrize("fmt", ["auto", "json", "console", "text", "JSON", " Console "])
def test_log_formats(tmp_path: Path, fmt: str) -> None:
    s = load(write(tmp_path, {"log_format": fmt}), env={})
    assert s.log_format == fmt.strip().lower()


def test_log_format_refusal_and_resolution(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^log_format: must be one of auto, json, console, text"):
        load(write(tmp_path, {"log_format": "pretty"}), env={})
    with pytest.raises(ConfigError, match="^log_format: must be one of"):
        load(None, env={"LOG_FORMAT": "xml"})

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert resolve_log_format("auto", Tty()) == "text"
    assert resolve_log_format("auto", io.StringIO()) == "json"
    assert (resolve_log_format("console"), resolve_log_format("json")) == ("text", "json")
    assert resolve_log_format("text") == "text"


def test_every_reference_variable_and_its_precedence(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "log_level": "info",
            "log_format": "text",
            "scheduler": {
                "grpc_listen_addr": ":1",
                "strategy": "least_loaded",
                "binding_ttl": "1m",
            },
        },
    )
    env = {
        "SCHEDULER_GRPC_LISTEN_ADDR": "127.0.0.1:7100",
        "SCHEDULER_METRICS_LISTEN_ADDR": "127.0.0.1:7101",
        "SCHEDULER_STRATEGY": "round_robin",
        "SCHEDULER_REDIS_ADDR": "redis-host:6379",
        "SCHEDULER_BINDING_TTL": "45s",
        "SCHEDULER_ARTIFACT_STORE_CAPACITY": "123",
        "SCHEDULER_ARTIFACT_LOOKUP_NODE_LIMIT": "4",
        "LOG_LEVEL": "debug",
        "LOG_FORMAT": "json",
        "SCHEDULER_CONFIG": "ignored-here",
        "GATEWAY_SCHEDULER_ADDR": "scheduler:9090",
        "SCHEDULER_GPRC_LISTEN_ADDR": "typo",
    }
    s = load(path, env=env)
    assert (s.grpc_listen, s.metrics_listen) == ("127.0.0.1:7100", "127.0.0.1:7101")
    assert (s.policy.strategy, s.redis_url, s.policy.binding_ttl_ms) == (
        "round_robin",
        "redis-host:6379",
        45_000,
    )
    assert (s.artifact_store_capacity, s.artifact_lookup_node_limit) == (123, 4)
    assert (s.log_level, s.log_format) == ("debug", "json")
    assert s.notes == (
        ("warning", "environment: SCHEDULER_GPRC_LISTEN_ADDR is not a setting; ignored"),
    )
    # flags over the environment
    f = load(path, env=env, flags=Overrides(grpc_listen="127.0.0.1:7200", log_level="warn"))
    assert (f.grpc_listen, f.log_level) == ("127.0.0.1:7200", "warn")
    # like the reference binary, an empty variable is unset
    blank = load(path, env={"SCHEDULER_STRATEGY": " ", "SCHEDULER_REDIS_ADDR": "", "LOG_LEVEL": ""})
    assert (blank.policy.strategy, blank.redis_url, blank.log_level) == (
        "least_loaded",
        None,
        "info",
    )
    with pytest.raises(ConfigError, match="^SCHEDULER_ARTIFACT_STORE_CAPACITY: 'many'"):
        load(path, env={"SCHEDULER_ARTIFACT_STORE_CAPACITY": "many"})
    with pytest.raises(ConfigError, match="^scheduler.binding_ttl: '45'"):
        load(path, env={"SCHEDULER_BINDING_TTL": "45"})


def test_query_only_needs_redis_and_skips_discovery(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^scheduler.redis_addr: -query-only needs a Redis"):
        load(DROPIN / "scheduler.json", env={}, flags=Overrides(query_only=True))
    s = load(
        DROPIN / "scheduler.json",
        env={"SCHEDULER_REDIS_ADDR": "127.0.0.1:6379"},
        flags=Overrides(query_only=True),
    )
    assert s.query_only and s.kubernetes is None
    assert "query-only: LookupNode alone" in summary(s, "x")[1]


@pytest.mark.parametrize(
    ("peer", "endpoint"),
    [
        ("ipv4:10.0.0.7:53122", "http://10.0.0.7:8000"),
        ("ipv6:[fd00::7]:53122", "http://[fd00::7]:8000"),
        ("ipv6:%5Bfd00::7%5D:53122", "http://[fd00::7]:8000"),
        ("ipv6:[::ffff:10.0.0.8]:4000", "http://10.0.0.8:8000"),
        ("unix:/run/sched.sock", ""),
        ("ipv4:not-an-ip:1", ""),
        ("", ""),
    ],
)
def test_peer_endpoint(peer: str, endpoint: str) -> None:
    assert peer_endpoint(peer, "http", 8000) == endpoint
