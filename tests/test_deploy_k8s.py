"""The Kubernetes manifests (deploy/k8s): every overlay renders with
``kubectl kustomize``, every rendered object validates against the
Kubernetes OpenAPI schemas (kubernetes-validate, strict: an unknown field is
an error), and what matters holds: replicas > 1, a PDB, spread, probes on
ports that exist, a Service that selects the pods under upstream's name and
port, non-root, the Redis URL from a Secret, a config the real loader takes.

No API server runs here: these are offline checks of what ``kubectl apply
-k`` would send.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from scheduler.server.config import load
from scheduler.testing.redis_server import free_port, in_ci

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ["base", "overlays/agentenv", "overlays/redis-sentinel"]
#: the oldest Kubernetes the manifests are validated against, and the newest the package knows
VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
#: kinds of CRDs, whose schemas are not Kubernetes' own (checked by their own tests)
CRDS = {"PrometheusRule"}
APP = {"app.kubernetes.io/name": "agentenv-scheduler"}


def kubectl() -> str:
    """``$KUBECTL`` or the kubectl on PATH (the manifests render with the
    kustomize of Debian's kubectl 1.20, v2.0.3, as with today's v5)."""
    found = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if found is None:
        if in_ci():
            pytest.fail("kubectl is missing (.ci/run installs kubernetes-client)")
        pytest.skip("kubectl is not installed")
    return found


@cache
def _render(overlay: str) -> str:
    out = subprocess.run(
        [kubectl(), "kustomize", str(K8S / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, f"kubectl kustomize {overlay}: {out.stderr}"
    return out.stdout


def rendered(overlay: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(_render(overlay)) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def scheduler_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec = one(docs, "Deployment", "agentenv-scheduler")["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "scheduler"]
    return dict(container)


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_object_validates(overlay: str, version: str) -> None:
    docs = rendered(overlay)
    assert docs
    for doc in docs:
        if doc["kind"] in CRDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = "/".join(str(p) for p in e.path)
            pytest.fail(f"{overlay}: {doc['kind']} {doc['metadata']['name']}: {path}: {e.message}")


def test_the_validator_rejects_a_misspelled_field() -> None:
    # strict mode is what catches a typo kubectl would drop silently
    deployment = one(rendered("base"), "Deployment")
    bad = json.loads(json.dumps(deployment))
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_deployment_runs_several_active_replicas_with_a_pdb(overlay: str) -> None:
    docs = rendered(overlay)
    dep = one(docs, "Deployment", "agentenv-scheduler")
    assert dep["spec"]["replicas"] == 3
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert matches(dep["spec"]["selector"]["matchLabels"], pod_labels)
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert matches(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    spread = {
        c["topologyKey"]: c for c in dep["spec"]["template"]["spec"]["topologySpreadConstraints"]
    }
    assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for c in spread.values():
        assert c["maxSkew"] == 1 and matches(c["labelSelector"]["matchLabels"], pod_labels)
    # nodes without a zone label must not make pods unschedulable
    assert spread["topology.kubernetes.io/zone"]["whenUnsatisfiable"] == "ScheduleAnyway"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_point_at_ports_the_container_opens(overlay: str) -> None:
    c = scheduler_container(rendered(overlay))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 9090, "metrics": 9101}

    def port(ref: int | str) -> int:
        return ports[ref] if isinstance(ref, str) else ref

    assert port(c["readinessProbe"]["grpc"]["port"]) == ports["grpc"]  # the health service
    for probe in ("livenessProbe", "startupProbe"):
        http = c[probe]["httpGet"]
        assert http["path"] == "/healthz" and port(http["port"]) == ports["metrics"], probe
    # a replica waiting for Redis must not be killed: the startup probe allows a minute
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_keeps_upstreams_name_and_selects_the_pods(overlay: str) -> None:
    docs = rendered(overlay)
    svc = one(docs, "Service", "agentenv-scheduler")
    dep = one(docs, "Deployment", "agentenv-scheduler")
    assert matches(svc["spec"]["selector"], dep["spec"]["template"]["metadata"]["labels"])
    assert svc["spec"]["selector"] == APP
    by_name = {p["name"]: p for p in svc["spec"]["ports"]}
    assert by_name["grpc"]["port"] == 9090
    container_ports = {p["name"] for p in scheduler_container(docs)["ports"]}
    for p in svc["spec"]["ports"]:
        assert p["targetPort"] in container_ports, p


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pods_run_locked_down(overlay: str) -> None:
    docs = rendered(overlay)
    pod = one(docs, "Deployment", "agentenv-scheduler")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    c = scheduler_container(docs)
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind]), kind
    image = c["image"]
    assert ":" in image and not image.endswith(":latest"), image


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_config_map_is_a_config_the_replica_loads(overlay: str, tmp_path: Path) -> None:
    docs = rendered(overlay)
    c = scheduler_container(docs)
    assert c["args"][0] in ("-config", "--config")
    path = c["args"][1]
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == path]
    pod = one(docs, "Deployment", "agentenv-scheduler")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    cm = one(docs, "ConfigMap", volume["configMap"]["name"])
    text = cm["data"][mount["subPath"]]
    file = tmp_path / "scheduler.json"
    file.write_text(text)
    settings = load(str(file), env={})
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert settings.grpc_listen.rpartition(":")[2] == str(ports["grpc"])
    assert settings.metrics_listen.rpartition(":")[2] == str(ports["metrics"])
    if overlay == "overlays/agentenv":
        # nodes as the reference finds them: its headless Service's EndpointSlices
        assert settings.discovery == "kubernetes"
        k = settings.kubernetes
        assert k is not None
        assert (k.namespace, k.service_name, k.port, k.scheme) == (
            "agentenv-system",
            "agentenv-nodes",
            8000,
            "http",
        )
        # the namespace watched is the one the overlay lands in (the Role's)
        assert one(docs, "Role")["metadata"]["namespace"] == k.namespace
    else:
        assert settings.discovery == "heartbeat"
    # every replica of the Deployment shares the cell: the Redis URL comes from a Secret
    (env,) = [e for e in c["env"] if e["name"] == "SCHEDULER_REDIS_ADDR"]
    assert env["valueFrom"]["secretKeyRef"]["key"] == "SCHEDULER_REDIS_ADDR"
    assert env["valueFrom"]["secretKeyRef"].get("optional") is not True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_discovery_rbac_reads_endpointslices_and_pods(overlay: str) -> None:
    docs = rendered(overlay)
    role = one(docs, "Role")
    grants = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert grants == {
        ("discovery.k8s.io", "endpointslices"): {"get", "list", "watch"},
        ("", "pods"): {"get", "list", "watch"},
    }
    binding = one(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    pod = one(docs, "Deployment", "agentenv-scheduler")["spec"]["template"]["spec"]
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["serviceAccountName"] == sa
    assert {"kind": "ServiceAccount", "name": sa} in [
        {k: s[k] for k in ("kind", "name")} for s in binding["subjects"]
    ]


def test_the_agentenv_overlay_lands_in_agentenvs_namespace_under_its_names() -> None:
    docs = rendered("overlays/agentenv")
    assert {d["metadata"].get("namespace") for d in docs} == {"agentenv-system"}
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    # the reference scheduler's objects (deploy/k8s/base of AgentENV), replaced in place
    for kind, name in [
        ("Deployment", "agentenv-scheduler"),
        ("Service", "agentenv-scheduler"),
        ("ServiceAccount", "agentenv-scheduler"),
        ("Role", "agentenv-scheduler-discovery"),
        ("RoleBinding", "agentenv-scheduler-discovery"),
    ]:
        assert (kind, name) in names
    # the Deployment's selector is immutable: it must be the reference's, label for label
    dep = one(docs, "Deployment", "agentenv-scheduler")
    assert dep["spec"]["selector"]["matchLabels"] == APP


def test_the_sentinel_overlay_gives_the_replicas_a_sentinel_url_to_its_redis() -> None:
    docs = rendered("overlays/redis-sentinel")
    redis = one(docs, "StatefulSet", "redis")
    sentinels = one(docs, "StatefulSet", "redis-sentinel")
    assert redis["spec"]["replicas"] == 3 and sentinels["spec"]["replicas"] == 3
    for sts in (redis, sentinels):
        svc = one(docs, "Service", sts["spec"]["serviceName"])
        assert svc["spec"]["clusterIP"] == "None"
        assert matches(svc["spec"]["selector"], sts["spec"]["template"]["metadata"]["labels"])
    env = next(e for e in scheduler_container(docs)["env"] if e["name"] == "SCHEDULER_REDIS_ADDR")
    ref = env["valueFrom"]["secretKeyRef"]
    secret = one(docs, "Secret", ref["name"])  # the generated name, hash and all
    url = base64.b64decode(secret["data"][ref["key"]]).decode()
    parts = urlsplit(url)
    assert parts.scheme == "redis+sentinel"
    hosts = parts.netloc.split(",")
    service = sentinels["spec"]["serviceName"]
    assert hosts == [f"{sentinels['metadata']['name']}-{i}.{service}:26379" for i in range(3)]
    master = parts.path.strip("/")
    scripts = one(
        docs, "ConfigMap", redis["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    )
    # both start scripts name the same master as the URL, and Redis never evicts
    assert f"sentinel monitor {master} " in scripts["data"]["sentinel-start.sh"]
    assert f"get-master-addr-by-name {master}" in scripts["data"]["redis-start.sh"]
    assert "--maxmemory-policy noeviction" in scripts["data"]["redis-start.sh"]
    assert "--appendonly yes" in scripts["data"]["redis-start.sh"]


@pytest.mark.parametrize("script", ["redis-start.sh", "sentinel-start.sh"])
def test_the_redis_start_scripts_parse(script: str) -> None:
    sh = shutil.which("sh")
    assert sh is not None
    out = subprocess.run(
        [sh, "-n", str(K8S / "overlays" / "redis-sentinel" / script)],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert out.returncode == 0, out.stderr


def test_the_base_prometheusrule_holds_the_rules_file() -> None:
    rule = one(rendered("base"), "PrometheusRule")
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yaml").read_text())
    assert rule["spec"] == rules
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"


# -- the sentinel overlay's start scripts, run against real Redis and Sentinel ----
SCRIPTS = K8S / "overlays" / "redis-sentinel"


class Started:
    """Processes a test starts from the start scripts; killed at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.bin = tmp / "bin"
        self.bin.mkdir()
        server = shutil.which("redis-server")
        if server is None or shutil.which("redis-cli") is None:
            if in_ci():
                pytest.fail("redis-server and redis-cli are missing")
            pytest.skip("redis-server is not installed")
        # the image's redis-sentinel is redis-server under that name
        (self.bin / "redis-sentinel").symlink_to(server)

    def run(self, script: str, name: str, **env: str) -> None:
        data = self.tmp / name
        data.mkdir()
        full = {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "HOSTNAME": name,
            "DATA_DIR": str(data),
            "SELF": "127.0.0.1",
            **env,
        }
        with (self.tmp / f"{name}.log").open("wb") as log:
            self.procs.append(
                subprocess.Popen(["sh", str(SCRIPTS / script)], env=full, stdout=log, stderr=log)
            )

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait(10)


def _ask(port: int, *command: str, timeout: float = 20) -> str:
    """A redis-cli answer once the server on ``port`` gives a non-empty one."""
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(
            ["redis-cli", "-p", str(port), "--raw", *command],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout
        assert time.monotonic() < deadline, f"port {port}: {command}: {out.stderr}"
        time.sleep(0.2)


def _replication(port: int) -> dict[str, str]:
    info = _ask(port, "INFO", "replication")
    return dict(line.split(":", 1) for line in info.splitlines() if ":" in line)


def test_the_start_scripts_make_a_primary_replicas_and_sentinels(tmp_path: Path) -> None:
    started = Started(tmp_path)
    try:
        # redis-0, first start (no sentinel answers): the primary
        primary = free_port()
        nowhere = f"127.0.0.1:{free_port()}"
        started.run("redis-start.sh", "redis-0", REDIS_PORT=str(primary), SENTINELS=nowhere)
        assert _replication(primary)["role"] == "master"
        # the first sentinel knows no peer: it monitors the first primary
        s0, s1 = free_port(), free_port()
        first = f"127.0.0.1:{primary}"
        started.run(
            "sentinel-start.sh",
            "redis-sentinel-0",
            SENTINEL_PORT=str(s0),
            SENTINELS=f"127.0.0.1:{s0} {nowhere}",
            FIRST_PRIMARY=first,
        )
        master = ["SENTINEL", "get-master-addr-by-name", "scheduler"]
        assert _ask(s0, *master).split() == ["127.0.0.1", str(primary)]
        # the next learns the primary from it, not from its own fallback
        started.run(
            "sentinel-start.sh",
            "redis-sentinel-1",
            SENTINEL_PORT=str(s1),
            SENTINELS=f"127.0.0.1:{s0} 127.0.0.1:{s1}",
            FIRST_PRIMARY=nowhere,
        )
        assert _ask(s1, *master).split() == ["127.0.0.1", str(primary)]
        # redis-1 asks the sentinels and joins the primary they name as its replica
        replica = free_port()
        started.run(
            "redis-start.sh",
            "redis-1",
            REDIS_PORT=str(replica),
            SENTINELS=f"{nowhere} 127.0.0.1:{s1}",
            FIRST_PRIMARY=nowhere,
        )
        deadline = time.monotonic() + 30
        while (info := _replication(replica)).get("master_link_status") != "up":
            assert time.monotonic() < deadline, info
            time.sleep(0.2)
        assert info["role"] == "slave" and info["master_port"] == str(primary)
        # and Redis never evicts the cell's keys
        policy = _ask(replica, "CONFIG", "GET", "maxmemory-policy").split()
        assert policy == ["maxmemory-policy", "noeviction"]
    finally:
        started.close()
