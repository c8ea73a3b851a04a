"""ops/prometheus/alerts.yml: valid for promtool, unit-tested by promtool, and every series a rule
selects is a Prometheus name of a metric declared in notiflow/names.py (with its labels)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from notiflow import names
from tests.promql import metric_names

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "ops" / "prometheus"
RULES = PROM / "alerts.yml"
RULE_TESTS = PROM / "alerts_test.yml"
DOC = ROOT / "docs" / "observability.md"

REQUIRED_ALERTS = {
    "NotiflowP0LatencySLO",         # P0 p99 > 1 s, from the latency histogram
    "NotiflowP1OldestAge",          # P1 oldest age > 10 s
    "NotiflowP2OldestAge",          # P2 oldest age > 5 min
    "NotiflowP3BacklogWindowAtRisk",  # P3 backlog threatens its window
    "NotiflowP3BacklogNearExpiry",  # ... and approaches the P3 TTL
    "NotiflowDlqDepthHigh",         # DLQ depth > 10,000
    "NotiflowCircuitOpen",          # a breaker not closed for > 1 min
    "NotiflowDlqLimitBreach",       # a consumer halted by its DLQ limit
}
# Labels Prometheus or the exporter add to every series, beside the declared attributes.
EXTRA_LABELS = {"job", "instance", "le", "otel_scope_name", "otel_scope_version"}


def _promtool() -> str:
    """promtool's path; a missing promtool fails the test (CI must have it: ops/bootstrap.sh)."""
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool not found: run ops/bootstrap.sh (or apt-get install prometheus)")
    return exe


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60,
                          check=False)


def _rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_check_rules() -> None:
    out = _run(_promtool(), "check", "rules", RULES)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_rule_unit_tests() -> None:
    out = _run(_promtool(), "test", "rules", RULE_TESTS)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_check_config() -> None:
    """prometheus.yml parses and loads the rules next to it (as mounted in docker-compose)."""
    out = _run(_promtool(), "check", "config", PROM / "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_rule_metric_is_declared_in_names() -> None:
    declared = names.prometheus_series()
    for rule in _rules():
        used = metric_names(rule["expr"])
        assert used, f"{rule['alert']}: no metric found in {rule['expr']!r}"
        unknown = used - declared.keys()
        assert not unknown, f"{rule['alert']} uses undeclared metrics {sorted(unknown)}"


def test_rule_labels_are_declared_attributes() -> None:
    """Label matchers and grouping labels exist on the metrics the rule selects."""
    declared = names.prometheus_series()
    for rule in _rules():
        expr = rule["expr"]
        for metric, matchers in re.findall(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", expr):
            allowed = set(declared[metric].labels) | EXTRA_LABELS
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers):
                assert label in allowed, f"{rule['alert']}: {metric} has no label {label!r}"
        allowed = EXTRA_LABELS.union(*(declared[m].labels for m in metric_names(expr)))
        for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
            for label in filter(None, (g.strip() for g in group.split(","))):
                assert label in allowed, f"{rule['alert']}: no metric has label {label!r}"


def test_required_alerts_and_their_shape() -> None:
    rules = _rules()
    alerts = [r["alert"] for r in rules]
    assert len(alerts) == len(set(alerts)), "duplicate alert names"
    assert not REQUIRED_ALERTS - set(alerts), REQUIRED_ALERTS - set(alerts)
    doc = DOC.read_text()
    anchors = {_anchor(h) for h in re.findall(r"^#+\s+(.+?)\s*$", doc, re.M)}
    for rule in rules:
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{rule['alert']}: for"
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], rule["alert"]
        path, _, anchor = notes["runbook_url"].partition("#")
        assert path == "docs/observability.md", rule["alert"]
        assert anchor in anchors, f"{rule['alert']}: no section #{anchor} in {DOC.name}"


def test_slo_thresholds_match_design() -> None:
    """Thresholds are the tier SLAs (P0 1 s, P1 10 s, P2 5 min; docs/design.md, "Tiers") and
    the DLQ limit."""
    exprs = {r["alert"]: " ".join(r["expr"].split()) for r in _rules()}
    assert exprs["NotiflowP0LatencySLO"].startswith("histogram_quantile(0.99,")
    assert 'tier="P0"' in exprs["NotiflowP0LatencySLO"]
    assert exprs["NotiflowP0LatencySLO"].endswith("> 1")
    assert exprs["NotiflowP1OldestAge"].endswith('{tier="P1"}) > 10')
    assert exprs["NotiflowP2OldestAge"].endswith('{tier="P2"}) > 300')
    assert exprs["NotiflowP3BacklogNearExpiry"].endswith(f"> {int(0.75 * 24 * 3600)}")
    assert exprs["NotiflowDlqDepthHigh"].endswith("> 10000")
    circuit = next(r for r in _rules() if r["alert"] == "NotiflowCircuitOpen")
    assert circuit["for"] == "1m"


def test_rule_test_series_are_declared() -> None:
    declared = names.prometheus_series()
    doc = yaml.safe_load(RULE_TESTS.read_text())
    assert doc["rule_files"] == ["alerts.yml"]
    tested = {t["alertname"] for test in doc["tests"] for t in test.get("alert_rule_test", [])}
    assert len(tested & REQUIRED_ALERTS) >= 2
    for test in doc["tests"]:
        for series in test["input_series"]:
            name = series["series"].split("{", 1)[0]
            assert name in declared, f"alerts_test.yml feeds undeclared series {name}"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@pytest.mark.parametrize(("expr", "expected"), [
    ('histogram_quantile(0.99, sum by (le) (rate(a_bucket{tier="P0"}[5m]))) > 1', {"a_bucket"}),
    ("max by (provider) (b) > 0", {"b"}),
    ("(sum by (flow) (increase(c_total[15m])) > 0) or (sum by (flow) "
     "(c_total unless c_total offset 15m) > 0)", {"c_total"}),
    ('absent(d{tier="P0"})', {"d"}),
    ("rate(e[$__rate_interval]) / on (job) group_left (tier) f", {"e", "f"}),
    ('x:recorded:rate5m{le="+Inf"} * 1e3 + 2h', {"x:recorded:rate5m"}),
    ('{__name__="g_total"}', {"g_total"}),
    ('topk(10, sum without (tenant) (h_5xx_total))', {"h_5xx_total"}),
])
def test_promql_metric_extraction(expr: str, expected: set[str]) -> None:
    assert metric_names(expr) == expected
