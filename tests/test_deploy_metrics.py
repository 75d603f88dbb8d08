"""Every metric the alert rules (deploy/prometheus/rules.yaml) and the
dashboard (deploy/grafana/scheduler.json) query is served by a live
replica's /metrics: a real ``schedctl serve`` on a real Redis, scraped."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from scheduler.testing.replicas import ServeProcess

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"

#: series Prometheus makes itself, not a replica
PROMETHEUS_OWN = {"up"}

FUNCTIONS = {
    "abs", "absent", "avg", "bottomk", "ceil", "count", "count_values", "delta", "deriv",
    "floor", "group", "histogram_quantile", "increase", "irate", "label_replace",
    "label_values", "max", "max_over_time", "min", "min_over_time", "quantile", "rate",
    "round", "sort", "stddev", "sum", "sum_over_time", "time", "topk", "vector",
}  # fmt: skip
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects."""
    expr = re.sub(r"label_values\(([^,()]+),\s*\w+\)", r"\1", expr)  # Grafana's
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges and subqueries
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    names = set()
    for m in re.finditer(r"(?<![\w:$.])([a-zA-Z_:][\w:]*)(\s*\()?", expr):
        name, call = m.group(1), m.group(2)
        if call or name in KEYWORDS or name in FUNCTIONS:
            continue
        names.add(name)
    return names


def recorded() -> set[str]:
    groups = yaml.safe_load((DEPLOY / "prometheus" / "rules.yaml").read_text())["groups"]
    return {r["record"] for g in groups for r in g["rules"] if "record" in r}


def queries() -> Iterator[tuple[str, str]]:
    """(query, where it stands) of every rule, panel and query variable."""
    groups = yaml.safe_load((DEPLOY / "prometheus" / "rules.yaml").read_text())["groups"]
    for rule in (r for g in groups for r in g["rules"]):
        yield rule["expr"], rule.get("alert") or rule["record"]
    dashboard = json.loads((DEPLOY / "grafana" / "scheduler.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield target["expr"], f"panel {panel['title']!r}"
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            yield var["query"], f"variable {var['name']}"


def queried() -> dict[str, set[str]]:
    """Series name -> where it is queried."""
    where: dict[str, set[str]] = {}
    for expr, at in queries():
        for name in metric_names(expr):
            where.setdefault(name, set()).add(at)
    return where


#: labels Prometheus attaches to every scraped series itself
SCRAPE_LABELS = {"job", "instance"}


def exact_matchers(expr: str) -> set[tuple[str, str, str]]:
    """(series, label, value) of every ``label="value"`` matcher in a query."""
    out = set()
    for m in re.finditer(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", expr):
        for label, value in re.findall(r'(\w+)\s*=\s*"([^"]*)"', m.group(2)):
            if label not in SCRAPE_LABELS:
                out.add((m.group(1), label, value))
    return out


def queried_matchers() -> dict[tuple[str, str, str], set[str]]:
    """(series, label, value) -> where a query asks for exactly that value."""
    where: dict[tuple[str, str, str], set[str]] = {}
    for expr, at in queries():
        for key in exact_matchers(expr):
            where.setdefault(key, set()).add(at)
    return where


def served_values(text: str) -> set[tuple[str, str, str]]:
    """(sample name, label, value) of every sample the exposition carries."""
    return {
        (s.name, label, value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        for label, value in s.labels.items()
    }


def served_names(text: str) -> set[str]:
    """Every sample name the exposition can carry, from its families (a
    labelled family with no child yet has no samples, but is served)."""
    out = set()
    for fam in text_string_to_metric_families(text):
        out.add(fam.name)
        if fam.type == "counter":
            out |= {fam.name + "_total", fam.name + "_created"}
        elif fam.type == "histogram":
            out |= {fam.name + s for s in ("_bucket", "_count", "_sum", "_created")}
        out |= {s.name for s in fam.samples}
    return out


def test_metric_names_reads_promql() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (job, le) (rate(a_bucket{job="x", le=~"1"}[5m]))) > 0.25'
    ) == {"a_bucket"}
    assert metric_names("job:b:max < max_over_time(job:b:max[1h]) and on() absent(up == 1)") == {
        "job:b:max",
        "up",
    }
    assert metric_names("label_values(sched_redis_up, job)") == {"sched_redis_up"}
    assert exact_matchers('sum(rate(a_total{job="x", status="ok", le=~"1"}[5m]))') == {
        ("a_total", "status", "ok")
    }


@pytest.mark.slow
def test_every_queried_metric_is_served_by_a_live_replica(real_url: str) -> None:
    wanted = queried()
    assert "sched_redis_up" in wanted  # the parse found the queries
    expected = set(wanted) - recorded() - PROMETHEUS_OWN
    replica = ServeProcess({"scheduler": {"strategy": "least_loaded"}}, real_url, cell="metrics")
    try:
        replica.wait_serving(60)
        url = f"http://127.0.0.1:{replica.metrics_port}/metrics"
        # the cell-wide families appear with the monitor loop's first snapshot
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
            served = served_names(text)
            missing = {n: sorted(wanted[n]) for n in expected - served}
            values = served_values(text)
            # a label value no replica writes (status="UNHEALTHY" where it
            # writes "unhealthy") matches nothing and silences its alert
            unmatched = {
                k: sorted(w)
                for k, w in queried_matchers().items()
                if k[0] not in recorded() and k not in values
            }
            if (not missing and not unmatched) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        replica.close()
    assert missing == {}, "queried but not served"
    assert unmatched == {}, "label values queried but never served"


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "scheduler.json").read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        assert panel["datasource"]["uid"] == "${datasource}"
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= variables, f"{panel['title']}: {used - variables}"
    # what the issue asks the dashboard to show
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for name in (
        "agentenv_scheduler_schedule_assignments_total",
        "sched_refusals_total",
        "sched_reservations_pending",
        "agentenv_scheduler_observed_nodes",
        "agentenv_scheduler_rpc_duration_seconds_bucket",
        "sched_script_duration_seconds_bucket",
        "sched_batched_calls_total",
        "sched_redis_up",
    ):
        assert name in exprs, name
