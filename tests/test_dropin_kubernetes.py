"""Kubernetes discovery as the reference system deploys it (issue 26), from
outside a pod: where the watcher finds its API server (in a pod the
in-cluster configuration, else the kubeconfig), and a real ``schedctl serve
-config tests/dropin/scheduler.json`` (the reference's Kubernetes file as it
is) with the reference's environment and a kubeconfig written here that
finds its nodes through the API server double (scheduler/testing/kube_api.py;
no Kubernetes API server can run on these machines) and places on them."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

pytest.importorskip("scheduler.server.kubernetes")

from scheduler.client.aio import AsyncScheduler  # noqa: E402
from scheduler.domain.policy import Policy  # noqa: E402
from scheduler.grpc import scheduler_pb2 as pb  # noqa: E402
from scheduler.server.kubernetes import (  # noqa: E402
    ConfigUnavailable,
    KubernetesWatcher,
    Timing,
    k8s_client,
    kubeconfig_paths,
    load_client_configuration,
)
from scheduler.store.connection import async_client  # noqa: E402
from scheduler.testing.kube_api import (  # noqa: E402
    SLICES,
    KubeApiServer,
    endpoint,
    endpoint_slice,
)
from scheduler.testing.redis_server import RedisServer  # noqa: E402
from tests.test_dropin import (  # noqa: E402
    FIXTURES,
    SERVING,
    Upstream,
    place_record_lookup,
    redis_addr,
    reporter_heartbeat,
    upstream,  # noqa: F401 (the fixture)
)

NS = "agentenv-system"
SERVICE = "agentenv-nodes"
FAST = Timing(
    backoff_s=0.05, max_backoff_s=0.2, watch_timeout_s=30, request_timeout_s=2, resync_s=60
)


class Settings:
    namespace = NS
    service_name = SERVICE
    port = 8000
    scheme = "http"
    ignore_pod_selector = ""
    no_schedule_pod_selector = ""


def write_kubeconfig(
    path: Path,
    server: str,
    token: str,
    *,
    ca_pem: bytes | None = None,
    insecure: bool = False,
    namespace: str = "somewhere-else",
) -> Path:
    """A kubeconfig as kubectl writes one (JSON is YAML): one cluster, one
    user with a bearer token, the current context with its own namespace."""
    cluster: dict[str, Any] = {"server": server}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    if insecure:
        cluster["insecure-skip-tls-verify"] = True
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "double", "cluster": cluster}],
        "users": [{"name": "tester", "user": {"token": token}}],
        "contexts": [
            {"name": "other", "context": {"cluster": "nowhere", "user": "tester"}},
            {
                "name": "laptop",
                "context": {"cluster": "double", "user": "tester", "namespace": namespace},
            },
        ],
        "current-context": "laptop",
        "preferences": {},
    }
    path.write_text(json.dumps(doc))
    return path


def configure(environ: dict[str, str], sa_dir: Path) -> tuple[Any, str]:
    async def go() -> tuple[Any, str]:
        cfg = k8s_client.Configuration()
        source = await load_client_configuration(
            cfg, service_account_dir=str(sa_dir), environ=environ
        )
        return cfg, source

    return asyncio.run(go())


# -- the choice ------------------------------------------------------------------


def test_kubeconfig_paths_are_kubectls() -> None:
    assert kubeconfig_paths({"HOME": "/home/op"}) == ["/home/op/.kube/config"]
    assert kubeconfig_paths({}) == []
    assert kubeconfig_paths({"HOME": "/h", "KUBECONFIG": f"/a{os.pathsep}~/b{os.pathsep}"}) == [
        "/a",
        "/h/b",
    ]
    assert kubeconfig_paths({"HOME": "/h", "KUBECONFIG": ""}) == ["/h/.kube/config"]


def test_outside_a_pod_the_kubeconfig_is_used(tmp_path: Path) -> None:
    kc = write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:6443/", "laptop-token")
    # no KUBERNETES_SERVICE_HOST
    cfg, source = configure({"KUBECONFIG": str(kc)}, tmp_path / "no-sa")
    assert cfg.host == "http://127.0.0.1:6443"
    assert cfg.api_key["BearerToken"] == "Bearer laptop-token"
    assert "http://127.0.0.1:6443" in source and str(kc) in source and "'laptop'" in source
    assert "KUBERNETES_SERVICE_HOST is not set" in source
    assert "laptop-token" not in source
    # ~/.kube/config when KUBECONFIG is unset
    (tmp_path / ".kube").mkdir()
    write_kubeconfig(tmp_path / ".kube" / "config", "http://127.0.0.1:7443", "t")
    cfg, source = configure({"HOME": str(tmp_path)}, tmp_path / "no-sa")
    assert cfg.host == "http://127.0.0.1:7443"
    assert str(tmp_path / ".kube" / "config") in source


def test_a_service_host_without_a_token_is_not_a_pod(tmp_path: Path) -> None:
    kc = write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:6443", "t")
    sa = tmp_path / "sa"
    sa.mkdir()  # (no token in it)
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg, source = configure({**env, "KUBECONFIG": str(kc)}, sa)
    assert cfg.host == "http://127.0.0.1:6443"
    assert f"no service account token at {sa}/token" in source


def test_in_a_pod_in_cluster_wins_over_a_kubeconfig(tmp_path: Path) -> None:
    kc = write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:6443", "laptop-token")
    sa = tmp_path / "sa"
    sa.mkdir()
    from tests.certs import Authority

    (sa / "token").write_text("pod-token")
    Authority().write(sa, "ca")
    env = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.9",
        "KUBERNETES_SERVICE_PORT": "8443",
        "KUBECONFIG": str(kc),
    }
    cfg, source = configure(env, sa)
    assert cfg.host == "https://127.0.0.9:8443"
    assert source.startswith("the in-cluster API server at https://127.0.0.9:8443")
    assert "pod-token" not in source


def test_neither_a_pod_nor_a_kubeconfig_says_both(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(ConfigUnavailable) as e:
        configure({"KUBECONFIG": str(missing)}, tmp_path)
    assert "KUBERNETES_SERVICE_HOST is not set" in str(e.value)
    assert f"no kubeconfig file: {missing}" in str(e.value)
    with pytest.raises(ConfigUnavailable, match="KUBECONFIG and HOME unset"):
        configure({}, tmp_path)


@pytest.mark.parametrize("tls", ["ca", "insecure"])
def test_a_watcher_outside_a_pod_finds_nodes_through_the_kubeconfig(
    tmp_path: Path, real_url: str, tls: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Over TLS, the double's CA in the kubeconfig (or insecure-skip-tls-verify);
    the context's namespace is not the one watched: the settings' is."""
    from tests.certs import Authority

    ca = Authority()
    cert, key = ca.issue("127.0.0.1", server=True).write(tmp_path, "server")
    caplog.set_level(logging.INFO, logger="scheduler.server.kubernetes")
    with KubeApiServer(token="laptop-token", certfile=str(cert), keyfile=str(key)) as api:
        api.put(SLICES, endpoint_slice("nodes-a", SERVICE, [endpoint("node-1", "10.0.0.1")]))
        kc = write_kubeconfig(
            tmp_path / "kc",
            api.url,
            "laptop-token",
            ca_pem=ca.pem if tls == "ca" else None,
            insecure=tls == "insecure",
        )

        async def go() -> None:
            s = AsyncScheduler(async_client(real_url), cell="kube", url=real_url)
            await s.sync_policy(Policy(static_nodes=True))
            w = KubernetesWatcher(
                Settings(),
                s,
                service_account_dir=str(tmp_path / "no-sa"),
                environ={"KUBECONFIG": str(kc)},
                timing=FAST,
            )
            task = asyncio.create_task(w.run())
            try:
                end = asyncio.get_running_loop().time() + 15
                while {v.node_id: v.endpoint for v in await s.nodes()} != {
                    "node-1": "http://10.0.0.1:8000"
                }:
                    assert asyncio.get_running_loop().time() < end, "never found"
                    await asyncio.sleep(0.02)
            finally:
                await w.stop()
                await asyncio.wait_for(task, 10)
                await s.close()

        asyncio.run(go())
        watched = {path for path, _ in api.requests}
        assert watched == {f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"}
    said = [r.getMessage() for r in caplog.records if "watching EndpointSlices" in r.getMessage()]
    assert len(said) == 1 and f"at the API server at {api.url} from kubeconfig {kc}" in said[0]
    assert all("laptop-token" not in r.getMessage() for r in caplog.records)


# -- the drop-in, end to end -------------------------------------------------------


def _until(check: Any, what: str, u: Upstream, limit: float = 30) -> Any:
    """Poll ``check`` until it returns something true (a bound, not a timing)."""
    deadline = time.monotonic() + limit
    while True:
        got = check()
        if got:
            return got
        if u.proc.poll() is not None:
            raise AssertionError(f"replica exited {u.proc.returncode}:\n{u.log()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}\n{u.log()}")
        time.sleep(0.05)


def test_the_kubernetes_file_discovers_nodes_through_a_kubeconfig_and_places(
    redis_server: RedisServer,
    upstream: list[Upstream],  # noqa: F811
    tmp_path: Path,
) -> None:
    """The reference's deploy/k8s/base/config/scheduler.json as it is, its
    environment, and a kubeconfig naming the API server double: the replica
    lists the two ready endpoints of agentenv-nodes as nodes, places on the
    one that heartbeats as the reference's reporter does, drops the one the
    double deletes, and refuses a pod that no slice lists."""
    with KubeApiServer(token="operator-token") as api:
        api.put(
            SLICES,
            endpoint_slice(
                "agentenv-nodes-x7k2p",
                SERVICE,
                [
                    endpoint("agentenv-node-0", "10.244.1.5"),
                    endpoint("agentenv-node-1", "10.244.2.7"),
                ],
            ),
        )
        kc = write_kubeconfig(tmp_path / "kubeconfig", api.url, "operator-token")
        u = Upstream(
            FIXTURES / "scheduler.json",
            redis_addr(redis_server),
            cell=f"dropin-k8s-{uuid.uuid4().hex[:8]}",
            env={"KUBECONFIG": str(kc), "HOME": str(tmp_path)},
        )
        upstream.append(u)
        u.wait_health(SERVING)

        def listed() -> dict[str, str]:
            reply = u.stub.ListNodes(pb.ListNodesRequest(), timeout=10)
            return {n.node_id: n.endpoint for n in reply.nodes}

        both = {
            "agentenv-node-0": "http://10.244.1.5:8000",
            "agentenv-node-1": "http://10.244.2.7:8000",
        }
        _until(lambda: listed() == both, "both nodes listed", u)
        log = u.log()
        assert f"at the API server at {api.url} from kubeconfig {kc}" in log
        assert "operator-token" not in log

        # a heartbeat exactly as the reporter sends it; Schedule, Record, Lookup
        place_record_lookup(u, "agentenv-node-0", "http://10.244.1.5:8000")

        # the pod goes away: the double deletes its endpoint from the slice
        api.put(
            SLICES,
            endpoint_slice(
                "agentenv-nodes-x7k2p", SERVICE, [endpoint("agentenv-node-1", "10.244.2.7")]
            ),
        )
        _until(lambda: listed() == {"agentenv-node-1": "http://10.244.2.7:8000"}, "node left", u)
        # it is not placed on: every placement goes to the node that stays
        # (never heard from, which the status stage admits, ranked last)
        for _ in range(4):
            got = u.stub.Schedule(pb.ScheduleRequest(), timeout=10)
            assert (got.node.node_id, got.node.endpoint) == (
                "agentenv-node-1",
                "http://10.244.2.7:8000",
            )
        # nor does its heartbeat bring it back
        with pytest.raises(grpc.RpcError) as e:
            u.stub.Heartbeat(reporter_heartbeat("agentenv-node-0"), timeout=10)
        assert "node is not in scheduler node list" in (e.value.details() or "")
        # a pod that no slice lists is refused as the reference refuses it
        with pytest.raises(grpc.RpcError) as e:
            u.stub.Heartbeat(reporter_heartbeat("agentenv-node-9"), timeout=10)
        assert "node is not in scheduler node list" in (e.value.details() or "")
        # the node that stays is placed on once it heartbeats
        for _ in range(3):
            place_record_lookup(u, "agentenv-node-1", "http://10.244.2.7:8000")
        assert u.health() == SERVING


def test_an_exec_plugins_token_is_asked_again_once_it_expired(
    tmp_path: Path, real_url: str
) -> None:
    """A kubeconfig user with an exec plugin (as EKS and GKE write them): its
    token expires at once here, so each reconnection runs the plugin again."""
    runs = tmp_path / "runs"
    plugin = tmp_path / "credential-plugin"
    plugin.write_text(
        "#!/bin/sh\n"
        f"echo run >> {runs}\n"
        'printf \'{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",'
        ' "status": {"token": "exec-token", "expirationTimestamp": "2000-01-01T00:00:00Z"}}\'\n'
    )
    plugin.chmod(0o755)
    with KubeApiServer(token="exec-token") as api:
        api.put(SLICES, endpoint_slice("nodes-a", SERVICE, [endpoint("node-1", "10.0.0.1")]))
        kc = write_kubeconfig(tmp_path / "kc", api.url, "unused")
        doc = json.loads(kc.read_text())
        doc["users"][0]["user"] = {
            "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}
        }
        kc.write_text(json.dumps(doc))

        async def go() -> None:
            s = AsyncScheduler(async_client(real_url), cell="kube", url=real_url)
            await s.sync_policy(Policy(static_nodes=True))
            w = KubernetesWatcher(
                Settings(),
                s,
                service_account_dir=str(tmp_path / "no-sa"),
                environ={"KUBECONFIG": str(kc)},
                timing=FAST,
            )
            task = asyncio.create_task(w.run())
            try:
                end = asyncio.get_running_loop().time() + 15
                # found (the list answered), then watching: the nodes show
                # before the watch request is open, and expiring no watch
                # would prove nothing
                while not await s.nodes() or not api.open_watches():
                    assert asyncio.get_running_loop().time() < end, "never watching"
                    await asyncio.sleep(0.02)
                before = len(runs.read_text().split())
                sent = len(api.requests)
                assert api.expire_watches() >= 1  # (the watcher watches again)
                while len(runs.read_text().split()) <= before:
                    assert asyncio.get_running_loop().time() < end, "plugin not asked again"
                    await asyncio.sleep(0.02)
                # the plugin runs before the request it signs is sent
                while len(api.requests) <= sent:
                    assert asyncio.get_running_loop().time() < end, "no request after expiry"
                    await asyncio.sleep(0.02)
            finally:
                await w.stop()
                await asyncio.wait_for(task, 10)
                await s.close()

        asyncio.run(go())
        # every request carried the plugin's token (the double answers 401 otherwise)
        assert len(api.requests) >= 3
        assert api.unauthorized == 0
