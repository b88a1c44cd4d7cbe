"""deploy/monitoring/: the alert rules pass promtool's checks and unit tests, the
PrometheusRule carries the same rules, and every metric the rules and the Grafana
dashboard query is one ks-scheduler exports."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from history.watcher import metrics as watcher_metrics
from kssched import metrics as web_metrics
from tests.helpers import IS_CI, REPO

MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "rules.yaml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
ALERT_TESTS = [
    REPO / "tests" / "monitoring" / "alerts_test.yaml",
    REPO / "tests" / "monitoring" / "hit_rate_test.yaml",
]
SCHEDULER_CONFIG = REPO / "deploy" / "base" / "kube-scheduler-config.yaml"

# PromQL words that look like metric names but are not.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
KEYWORDS |= {"group_left", "group_right"}  # also written without a label list
GROUPING = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
SAMPLE_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if IS_CI:
            pytest.fail("promtool is missing: .ci/run installs Debian's prometheus")
        pytest.skip("promtool is not installed (Debian package prometheus)")
    return path


def rules() -> dict:
    return yaml.safe_load(RULES.read_text())


def alerts() -> dict[str, dict]:
    return {
        rule["alert"]: rule
        for group in rules()["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, label
    matchers, ranges, grouping clauses and numbers left out)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(GROUPING, " ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[match.end() :].lstrip().startswith("("):
            continue  # a function
        if match.group(0).lower() not in KEYWORDS:
            names.add(match.group(0))
    return names


def exported_names(text: str) -> set[str]:
    """Every sample name the `# TYPE` lines of a Prometheus exposition announce."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.update(name + suffix for suffix in SAMPLE_SUFFIXES.get(kind, ("",)))
    return names


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_rules_pass_promtool_check():
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 5 rules found" in result.stdout


def test_alerts_pass_their_promtool_unit_tests():
    result = subprocess.run(
        [promtool(), "test", "rules", *map(str, ALERT_TESTS)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(ALERT_TESTS)


def test_the_alerts_a_platform_engineer_needs_with_a_severity():
    found = alerts()
    assert set(found) == {
        "KsSchedulerWatcherStalled",
        "KsSchedulerDatabaseDown",
        "KsSchedulerExtenderErrors",
        "KsSchedulerExtenderSlow",
        "KsSchedulerExactHitRateDropping",
    }
    for name, rule in found.items():
        assert rule["labels"]["severity"] in ("page", "ticket"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert rule.get("for"), f"{name} fires on a single evaluation"


def test_the_latency_alert_sits_just_under_the_scheduler_http_timeout():
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    timeout = float(config["extenders"][0]["httpTimeout"].rstrip("s"))
    rule = alerts()["KsSchedulerExtenderSlow"]
    threshold = float(re.search(r">\s*([\d.]+)\s*$", rule["expr"].strip()).group(1))
    assert timeout / 2 <= threshold < timeout
    assert f"{timeout:g}s httpTimeout" in rule["annotations"]["summary"]
    assert threshold < max(web_metrics.LATENCY_BUCKETS)


def test_the_prometheus_rule_carries_exactly_the_rule_file():
    crd = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert (crd["apiVersion"], crd["kind"]) == (
        "monitoring.coreos.com/v1",
        "PrometheusRule",
    )
    assert crd["metadata"]["namespace"] == "kube-system"
    assert crd["spec"] == rules()
    assert "GENERATED by deploy/render.sh" in PROMETHEUS_RULE.read_text()


def test_metric_names_finds_selectors_only():
    expr = (
        'sum by (verb, le) (rate(kssched_a_bucket{verb!="x y"}[5m])) / ignoring '
        "(warmth) group_left sum(b_total offset 6h) > 1e3 and on () c >= 20"
    )
    assert metric_names(expr) == {"kssched_a_bucket", "b_total", "c"}


@pytest.mark.django_db
def test_every_metric_queried_is_one_ks_scheduler_exports():
    web = generate_latest(web_metrics.REGISTRY) + generate_latest(
        web_metrics._history_registry
    )
    watcher = generate_latest(watcher_metrics.REGISTRY)
    exported = exported_names(web.decode()) | exported_names(watcher.decode())
    assert {
        "kssched_extender_request_seconds_bucket",
        "kssched_placements_warmth_total",
        "kssched_pipeline_run_seconds_count",
        "watch_events_total",
    } <= exported
    queried = {}
    for expr in [rule["expr"] for rule in alerts().values()] + dashboard_exprs():
        for name in metric_names(expr):
            queried.setdefault(name, expr)
    unknown = {name: expr for name, expr in queried.items() if name not in exported}
    assert unknown == {}
    # What the dashboard must show.
    shown = set().union(*(metric_names(expr) for expr in dashboard_exprs()))
    assert {
        "kssched_extender_request_seconds_bucket",
        "kssched_extender_errors_total",
        "kssched_extender_scores_total",
        "kssched_placements_warmth_total",
        "kssched_pipeline_startup_seconds_bucket",
        "kssched_pipeline_run_seconds_bucket",
        "kssched_pipeline_startup_seconds_sum",
        "kssched_counts_staleness_seconds",
        "kssched_watch_relists_total",
        "watch_events_total",
        "kssched_pipeline_timings_unusable_total",
    } <= shown


def test_dashboard_is_importable_grafana_json():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "ks-scheduler"
    titles = [p["title"] for p in dashboard["panels"]]
    assert len(titles) == len(set(titles))
    assert any(title.startswith("Time saved") for title in titles)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
            assert panel["targets"], panel["title"]


def test_ci_installs_promtool():
    assert re.search(
        r"apt-get install[^\n]*\\\n[^\n]*\bprometheus\b",
        (Path(REPO / ".ci" / "run").read_text()),
    )
