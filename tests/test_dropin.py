"""Drop-in for the reference system (issue 26): its own config files (written
here in tests/dropin/ with its keys and values), its ``-config`` flag and
environment start a real ``schedctl serve`` process, a heartbeat shaped as its
runtime reporter sends it (no metadata) registers a node, and a Schedule, a
RecordAssignment and a LookupNode succeed over gRPC.  Also: a replica started
while Redis is down listens at once (health NOT_SERVING, /metrics with
``sched_redis_up 0``, /healthz alive, /readyz not ready) and serves once Redis
is there; a ``-query-only`` replica answers LookupNode alone."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.testing.redis_server import RedisServer, free_port
from scheduler.testing.replicas import QUICK_RECONNECT, SCHEDCTL

FIXTURES = Path(__file__).parent / "dropin"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Upstream:
    """``schedctl serve -config PATH`` as the reference system's compose file
    runs its scheduler: the environment names its variables; the gRPC and
    metrics addresses come from SCHEDULER_GRPC_LISTEN_ADDR and
    SCHEDULER_METRICS_LISTEN_ADDR (free loopback ports, not :9090/:9101)."""

    def __init__(
        self,
        config: Path,
        redis_addr: str,
        *args: str,
        cell: str = "",
        host: str = "127.0.0.1",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.address = f"{host}:{self.port}"
        # (not in a pod, and no kubeconfig but one the test gives)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SCHEDULER_", "KUBERNETES_")) and k != "KUBECONFIG"
        } | dict(env or {})
        env.update(
            SCHEDULER_GRPC_LISTEN_ADDR=self.address,
            SCHEDULER_METRICS_LISTEN_ADDR=f"127.0.0.1:{self.metrics_port}",
            SCHEDULER_STRATEGY="round_robin",
            SCHEDULER_REDIS_ADDR=redis_addr,
            SCHEDULER_BINDING_TTL="45s",
            LOG_LEVEL="info",
            SCHEDULER_NOT_A_SETTING="1",
        )
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"dropin-{uuid.uuid4().hex}.log"
        self._log = self.log_path.open("wb")
        extra = ("--cell", cell) if cell else ()
        self.proc = subprocess.Popen(
            [*SCHEDCTL, "serve", "-config", str(config), *extra, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        # (polled while the replica starts: reconnect within 100 ms, not gRPC's 1 s and more)
        self.channel = grpc.insecure_channel(self.address, options=QUICK_RECONNECT)
        self.stub = pb_grpc.SchedulerStub(self.channel)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> int | None:
        """The health status; None while nothing answers on the port."""
        try:
            reply = health_pb2_grpc.HealthStub(self.channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1
            )
        except grpc.RpcError:
            return None
        return int(reply.status)

    def wait_health(self, want: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.health() != want:
            if self.proc.poll() is not None:
                raise AssertionError(f"replica exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"replica did not reach health {want}:\n{self.log()}")
            time.sleep(0.05)

    def wait_answering(self, timeout: float = 30) -> int:
        """The first health status the replica answers with."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.health()
            if status is not None:
                return status
            if self.proc.poll() is not None:
                raise AssertionError(f"replica exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"replica did not listen:\n{self.log()}")
            time.sleep(0.02)

    def http(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()

    def close(self) -> int:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self.log_path.unlink(missing_ok=True)
        return int(self.proc.returncode)


@pytest.fixture
def upstream() -> Iterator[list[Upstream]]:
    started: list[Upstream] = []
    yield started
    for u in started:
        u.close()


def redis_addr(server: RedisServer) -> str:
    """The reference system's host:port form of SCHEDULER_REDIS_ADDR."""
    return f"127.0.0.1:{server.port}"


def reporter_heartbeat(node_id: str) -> pb.HeartbeatRequest:
    """A heartbeat as the reference runtime's reporter builds it
    (src/observability/reporter.rs, build_heartbeat_request)."""
    return pb.HeartbeatRequest(
        node_id=node_id,
        cluster_id="default",
        service_instance_id=str(uuid.uuid4()),
        version="0.1.0",
        commit="0123abc",
        machine_info=pb.MachineInfo(
            cpu_family="6",
            cpu_model="85",
            cpu_model_name="Intel(R) Xeon(R) Platinum",
            cpu_architecture="x86_64",
            cpu_config_json="",
        ),
        snapshot=pb.NodeSnapshot(
            status=pb.NODE_STATUS_READY,
            allocated_cpu=0,
            allocated_memory_bytes=0,
            cpu_percent=3,
            cpu_count=16,
            memory_used_bytes=2 << 30,
            memory_total_bytes=64 << 30,
            disks=[
                pb.DiskMetric(
                    mount_point="/",
                    device="/dev/vda1",
                    filesystem_type="ext4",
                    used_bytes=10 << 30,
                    total_bytes=100 << 30,
                )
            ],
            sandbox_count=0,
            sandbox_starting_count=0,
            create_successes=0,
            create_fails=0,
            reported_at_unix_ms=int(time.time() * 1000),
            paused_sandbox_count=0,
            paused_allocated_cpu=0,
            paused_allocated_memory_bytes=0,
        ),
        sandbox_ids=[],
    )


def place_record_lookup(u: Upstream, node_id: str, endpoint: str) -> None:
    """The gateway's three calls, as it makes them (no metadata)."""
    u.stub.Heartbeat(reporter_heartbeat(node_id), timeout=10)
    placed = u.stub.Schedule(
        pb.ScheduleRequest(
            hint=pb.ScheduleRequestHint(
                new_cold_sandbox=pb.NewColdSandboxHint(cpu_count=1, memory_mb=512)
            )
        ),
        timeout=10,
    )
    assert (placed.node.node_id, placed.node.endpoint) == (node_id, endpoint)
    sandbox = f"sb-{uuid.uuid4().hex[:12]}"
    u.stub.RecordAssignment(
        pb.RecordAssignmentRequest(sandbox_id=sandbox, node=placed.node), timeout=10
    )
    found = u.stub.LookupNode(pb.LookupNodeRequest(sandbox_id=sandbox), timeout=10)
    assert (found.node.node_id, found.node.endpoint) == (node_id, endpoint)


def test_the_compose_file_and_env_start_a_replica_that_places(
    redis_server: RedisServer, upstream: list[Upstream]
) -> None:
    cell = f"dropin-{uuid.uuid4().hex[:8]}"
    u = Upstream(FIXTURES / "default.json", redis_addr(redis_server), cell=cell)
    upstream.append(u)
    u.wait_health(SERVING)
    # the static list of the file; node-b never heartbeats, so node-a is placed on
    place_record_lookup(u, "node-a", "http://agentenv-a:8000")
    log = u.log()
    assert "section 'gateway' ignored" in log
    assert "SCHEDULER_NOT_A_SETTING is not a setting" in log
    # LOG_FORMAT unset, the file's "auto" with a log that is no terminal: JSON lines
    assert '"msg":"strategy: round_robin; discovery: static (2 static nodes)"' in log
    assert "binding_ttl: 45000ms" in log  # SCHEDULER_BINDING_TTL over the file's 30s
    # the gateway's own address: the metrics port serves the probes too
    assert u.http("/healthz") == (200, "ok\n")
    assert u.http("/readyz")[0] == 200
    assert "sched_redis_up 1.0" in u.http("/metrics")[1]


def test_a_reporter_heartbeat_without_metadata_gets_its_peer_address(
    redis_server: RedisServer, upstream: list[Upstream]
) -> None:
    cell = f"dropin-{uuid.uuid4().hex[:8]}"
    u = Upstream(FIXTURES / "heartbeat.json", redis_addr(redis_server), cell=cell)
    upstream.append(u)
    u.wait_health(SERVING)
    # discovery.heartbeat.port 8000, scheme http, and the caller's loopback address
    place_record_lookup(u, "node-hb", "http://127.0.0.1:8000")
    listed = u.stub.ListNodes(pb.ListNodesRequest(), timeout=10)
    assert [(n.node_id, n.endpoint) for n in listed.nodes] == [("node-hb", "http://127.0.0.1:8000")]


def test_an_ipv6_caller_gets_a_bracketed_endpoint(
    redis_server: RedisServer, upstream: list[Upstream]
) -> None:
    cell = f"dropin-{uuid.uuid4().hex[:8]}"
    u = Upstream(FIXTURES / "heartbeat.json", redis_addr(redis_server), cell=cell, host="[::1]")
    upstream.append(u)
    u.wait_health(SERVING)
    place_record_lookup(u, "node-v6", "http://[::1]:8000")


def test_without_the_heartbeat_port_such_a_node_stays_without_endpoint(
    redis_server: RedisServer, upstream: list[Upstream], tmp_path: Path
) -> None:
    config = tmp_path / "no-port.json"
    config.write_text('{"scheduler": {"discovery": {"mode": "heartbeat"}}}')
    u = Upstream(config, redis_addr(redis_server), cell=f"dropin-{uuid.uuid4().hex[:8]}")
    upstream.append(u)
    u.wait_health(SERVING)
    u.stub.Heartbeat(reporter_heartbeat("node-x"), timeout=10)
    with pytest.raises(grpc.RpcError) as e:
        u.stub.Schedule(pb.ScheduleRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no endpoint" in (e.value.details() or "")
    assert "set scheduler.discovery.heartbeat.port and scheme" in u.log()


def test_a_replica_started_while_redis_is_down_listens_at_once(
    upstream: list[Upstream],
) -> None:
    redis = RedisServer()  # its port chosen, the server not started yet
    try:
        u = Upstream(FIXTURES / "default.json", redis_addr(redis), cell="dropin-late")
        upstream.append(u)
        assert u.wait_answering() == NOT_SERVING
        assert "sched_redis_up 0.0" in u.http("/metrics")[1]
        assert u.http("/healthz") == (200, "ok\n")
        status, body = u.http("/readyz")
        assert status == 503 and "Redis" in body
        with pytest.raises(grpc.RpcError) as e:
            u.stub.LookupNode(pb.LookupNodeRequest(sandbox_id="sb-1"), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "Redis" in (e.value.details() or "")
        assert u.proc.poll() is None

        redis.start()
        u.wait_health(SERVING, timeout=60)
        assert "sched_redis_up 1.0" in u.http("/metrics")[1]
        assert u.http("/readyz")[0] == 200
        place_record_lookup(u, "node-a", "http://agentenv-a:8000")
    finally:
        redis.close()


def test_query_only_answers_lookup_alone(
    redis_server: RedisServer, upstream: list[Upstream]
) -> None:
    cell = f"dropin-{uuid.uuid4().hex[:8]}"
    full = Upstream(FIXTURES / "default.json", redis_addr(redis_server), cell=cell)
    upstream.append(full)
    # the query-only replica of the Kubernetes file: its discovery is not checked
    query = Upstream(
        FIXTURES / "scheduler.json", redis_addr(redis_server), "-query-only", cell=cell
    )
    upstream.append(query)
    full.wait_health(SERVING)
    query.wait_health(SERVING)
    full.stub.Heartbeat(reporter_heartbeat("node-a"), timeout=10)
    placed = full.stub.Schedule(pb.ScheduleRequest(), timeout=10)
    full.stub.RecordAssignment(
        pb.RecordAssignmentRequest(sandbox_id="sb-q", node=placed.node), timeout=10
    )
    found = query.stub.LookupNode(pb.LookupNodeRequest(sandbox_id="sb-q"), timeout=10)
    assert (found.node.node_id, found.node.endpoint) == ("node-a", "http://agentenv-a:8000")
    for call, request in (
        (query.stub.Schedule, pb.ScheduleRequest()),
        (query.stub.Heartbeat, reporter_heartbeat("node-a")),
        (query.stub.ListNodes, pb.ListNodesRequest()),
    ):
        with pytest.raises(grpc.RpcError) as e:
            call(request, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "query-only" in (e.value.details() or "")


def test_schedctl_health_exits_0_when_serving_and_1_otherwise(
    redis_server: RedisServer, upstream: list[Upstream]
) -> None:
    u = Upstream(
        FIXTURES / "default.json", redis_addr(redis_server), cell=f"dropin-{uuid.uuid4().hex[:8]}"
    )
    upstream.append(u)
    u.wait_health(SERVING)

    def health(addr: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*SCHEDCTL, "health", "--addr", addr, "--timeout", "2"],
            capture_output=True,
            text=True,
            timeout=60,
        )

    ok = health(u.address)
    assert (ok.returncode, ok.stdout) == (0, f"{u.address}: SERVING\n")
    nobody = f"127.0.0.1:{free_port()}"
    down = health(nobody)
    assert down.returncode == 1
    assert down.stdout.startswith(f"{nobody}: UNAVAILABLE") and down.stdout.count("\n") == 1


def test_health_says_not_serving_while_redis_is_down(upstream: list[Upstream]) -> None:
    redis = RedisServer()
    try:
        u = Upstream(FIXTURES / "default.json", redis_addr(redis), cell="dropin-hc")
        upstream.append(u)
        assert u.wait_answering() == NOT_SERVING
        r = subprocess.run(
            [*SCHEDCTL, "health", "--addr", u.address],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (r.returncode, r.stdout) == (1, f"{u.address}: NOT_SERVING\n")
    finally:
        redis.close()


def test_the_kubernetes_file_starts_the_watcher_beside_the_replica(
    redis_server: RedisServer, upstream: list[Upstream], tmp_path: Path
) -> None:
    """The reference's Kubernetes file as it is: serve starts the watcher once
    the cell is prepared and stops it on SIGTERM.  Out of a pod and without a
    kubeconfig (tests/test_dropin_kubernetes.py gives one naming the API
    double) the watcher says so and retries, and the replica serves all the
    while."""
    pytest.importorskip("scheduler.server.kubernetes")
    missing = tmp_path / "no-kubeconfig"
    u = Upstream(
        FIXTURES / "scheduler.json",
        redis_addr(redis_server),
        cell="dropin-k8s",
        env={"KUBECONFIG": str(missing)},
    )
    upstream.append(u)
    u.wait_health(SERVING)
    deadline = time.monotonic() + 30
    while f"no kubeconfig file: {missing}" not in u.log():
        assert time.monotonic() < deadline, u.log()
        time.sleep(0.1)
    assert "KUBERNETES_SERVICE_HOST is not set" in u.log()
    # kubernetes keeps a static node policy: a node no slice lists is refused
    with pytest.raises(grpc.RpcError) as e:
        u.stub.Heartbeat(reporter_heartbeat("node-a"), timeout=10)
    assert "not in scheduler node list" in (e.value.details() or "")
    assert u.health() == SERVING
    u.proc.terminate()
    assert u.proc.wait(30) == 0
    assert "stopped" in u.log()
