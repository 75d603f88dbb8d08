"""The local stack (deploy/compose.yaml) validates against the Compose
specification's JSON schema (deploy/schemas/compose-spec.json, from the PyPI
package check-jsonschema) and is wired as its docs say: a Redis primary and
replica, three sentinels naming the master the replicas follow, three
scheduler replicas, Prometheus scraping each one, Grafana with the dashboard.
No container engine runs here: this is what ``docker compose config``
would check, plus the wiring."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((DEPLOY / "schemas" / "compose-spec.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_compose_file_validates_against_the_compose_spec() -> None:
    errors = [f"{e.json_path}: {e.message}" for e in validator().iter_errors(compose())]
    assert errors == []


def test_the_schema_rejects_a_misspelled_key() -> None:
    doc = compose()
    doc["services"]["scheduler-1"]["helthcheck"] = doc["services"]["scheduler-1"].pop("healthcheck")
    assert list(validator().iter_errors(doc))


def services(prefix: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in compose()["services"].items() if k.startswith(prefix)}


def test_three_schedulers_follow_the_sentinels_master() -> None:
    sentinels = services("sentinel-")
    schedulers = services("scheduler-")
    assert len(sentinels) == 3 and len(schedulers) == 3
    script = (DEPLOY / "k8s" / "overlays" / "redis-sentinel" / "sentinel-start.sh").read_text()
    for svc in schedulers.values():
        url = urlsplit(svc["environment"]["SCHEDULER_REDIS_ADDR"])
        assert url.scheme == "redis+sentinel"
        assert url.netloc.split(",") == [f"{name}:26379" for name in sorted(sentinels)]
        assert f"sentinel monitor {url.path.strip('/')} " in script
        assert svc["read_only"] is True and svc["user"].split(":")[0] != "0"
        assert svc["cap_drop"] == ["ALL"]
        assert svc["command"] == ["-config", "/config/default.json"]
        assert svc["healthcheck"]["test"][1:3] == ["schedctl", "health"]
        assert svc["build"]["dockerfile"] == "deploy/docker/Dockerfile"
        assert (COMPOSE.parent / svc["build"]["context"] / svc["build"]["dockerfile"]).exists()
    for name, svc in sentinels.items():
        env = svc["environment"]
        assert env["SELF"] == name and env["FIRST_PRIMARY"] == "redis-primary:6379"
        assert env["SENTINELS"].split() == [f"{n}:26379" for n in sorted(sentinels)]
        (mount,) = svc["volumes"]
        assert svc["command"] == ["sh", mount.split(":")[1]]
    replica = compose()["services"]["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1] == "redis-primary"
    for name in ("redis-primary", "redis-replica"):
        cmd = compose()["services"][name]["command"]
        assert cmd[cmd.index("--maxmemory-policy") + 1] == "noeviction", name


def test_prometheus_scrapes_every_replica_on_the_images_metrics_port() -> None:
    config = json.loads((DEPLOY / "docker" / "config.json").read_text())
    port = config["scheduler"]["metrics_listen_addr"].rpartition(":")[2]
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = prom["scrape_configs"]
    assert job["job_name"] == "agentenv-scheduler"  # the job the rules select
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert sorted(targets) == sorted(f"{name}:{port}" for name in services("scheduler-"))


@pytest.mark.parametrize("service", ["prometheus", "grafana", "sentinel-1"])
def test_every_mounted_file_exists(service: str) -> None:
    for volume in compose()["services"][service].get("volumes", []):
        source = volume.split(":")[0]
        assert (COMPOSE.parent / source).exists(), f"{service}: {source}"


def test_grafana_provisions_the_dashboard_from_prometheus() -> None:
    provisioning = DEPLOY / "grafana" / "provisioning"
    (ds,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "scheduler.yaml").read_text())[
        "providers"
    ]
    mounts = compose()["services"]["grafana"]["volumes"]
    dashboard = next(v for v in mounts if v.startswith("./grafana/scheduler.json:"))
    assert dashboard.split(":")[1].startswith(provider["options"]["path"] + "/")
