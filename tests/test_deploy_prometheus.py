"""The alert rules (deploy/prometheus/rules.yaml): promtool checks them and
runs their unit tests (deploy/prometheus/tests.yaml); every alert has a test
that fires it and one where it stays quiet, and a runbook in
docs/operations.md. The compose stack's Prometheus config loads them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.testing.redis_server import in_ci

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "rules.yaml"
TESTS = PROM / "tests.yaml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    found = shutil.which("promtool")
    if found is None:
        if in_ci():
            pytest.fail("promtool is missing (.ci/run installs the Debian package prometheus)")
        pytest.skip("promtool is not installed")
    return subprocess.run(
        [found, *args], capture_output=True, text=True, timeout=120, check=False, cwd=PROM
    )


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rules() -> None:
    out = promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        f"SUCCESS: {sum(len(g['rules']) for g in yaml.safe_load(RULES.read_text())['groups'])}"
        in (out.stdout)
    )


def test_promtool_runs_the_rule_unit_tests() -> None:
    out = promtool("test", "rules", str(TESTS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_the_unit_tests_fail_when_an_alert_cannot_fire(tmp_path: Path) -> None:
    # the tests are not vacuous: an alert whose condition never holds fails them
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "SchedulerRedisDown":
                rule["expr"] = 'sched_redis_up{job="agentenv-scheduler"} == 2'
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    (tmp_path / "tests.yaml").write_text(TESTS.read_text())
    out = promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert out.returncode != 0
    assert "SchedulerRedisDown" in out.stdout + out.stderr


def test_every_alert_fires_in_a_unit_test_and_stays_quiet_in_one() -> None:
    cases = [
        case
        for test in yaml.safe_load(TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    for rule in alerts():
        name = rule["alert"]
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name}: no test fires it"
        assert any(not c["exp_alerts"] for c in mine), f"{name}: no test keeps it quiet"


def test_every_alert_has_a_severity_and_a_runbook_in_operations() -> None:
    operations = (ROOT / "docs" / "operations.md").read_text()
    headings = {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", operations, re.M)
    }
    for rule in alerts():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        doc, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert doc == "docs/operations.md", rule["alert"]
        assert anchor == rule["alert"].lower() and anchor in headings, rule["alert"]


def test_the_compose_prometheus_config_loads_the_rules() -> None:
    out = promtool("check", "config", str(PROM / "prometheus.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rules.yaml" in out.stdout
