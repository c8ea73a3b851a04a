"""notiflow/names.py: the one declaration of metric and span names, their OpenTelemetry shape and
the Prometheus names the Collector's exporter derives from them."""

from __future__ import annotations

import ast
import itertools
import pickle
import re
from pathlib import Path

import pytest
from opentelemetry import metrics

from notiflow import names
from notiflow.names import Kind, prometheus_name

SOURCE = Path(names.__file__).read_text()


@pytest.mark.parametrize(("name", "unit", "kind", "expected"), [
    # the Collector's translator (UnderscoreEscapingWithSuffixes), its documented examples
    ("http.server.duration", "s", Kind.HISTOGRAM, "http_server_duration_seconds"),
    ("system.filesystem.usage", "By", Kind.GAUGE, "system_filesystem_usage_bytes"),
    ("requests.count", "1", Kind.COUNTER, "requests_count_total"),
    ("system.memory.utilization", "1", Kind.GAUGE, "system_memory_utilization_ratio"),
    ("system.network.dropped", "{packets}", Kind.COUNTER, "system_network_dropped_total"),
    ("system.network.dropped", "packets", Kind.GAUGE, "system_network_dropped_packets"),
    ("net.io", "By/s", Kind.GAUGE, "net_io_bytes_per_second"),
    ("jobs.total", "", Kind.COUNTER, "jobs_total"),
    ("queue.wait.seconds", "s", Kind.GAUGE, "queue_wait_seconds"),
    ("queue.depth", "{record}", Kind.UP_DOWN_COUNTER, "queue_depth"),
    ("a__b..c", "ms", Kind.HISTOGRAM, "a_b_c_milliseconds"),
])
def test_prometheus_name_translation(name: str, unit: str, kind: Kind, expected: str) -> None:
    assert prometheus_name(name, kind, unit) == expected


def test_prometheus_names_of_the_slo_signals() -> None:
    assert names.QUEUE_OLDEST_AGE.prometheus == "notiflow_queue_oldest_age_seconds"
    assert names.ACCEPT_TO_PROVIDER.series == (
        "notiflow_send_accept_to_provider_duration_seconds_bucket",
        "notiflow_send_accept_to_provider_duration_seconds_sum",
        "notiflow_send_accept_to_provider_duration_seconds_count")
    assert names.DLQ_DEPTH.prometheus == "notiflow_dlq_depth"
    assert names.DLQ_LIMIT_BREACHES.prometheus == "notiflow_dlq_limit_breaches_total"
    assert names.BREAKER_STATE.prometheus == "notiflow_breaker_state"
    assert names.RATELIMIT_FILL.prometheus == "notiflow_ratelimit_fill_ratio"
    assert names.PROVIDER_ERRORS.labels == ("provider", "channel", "error_type")


def test_existing_names_are_kept() -> None:
    """Flows already emit these: renaming them would orphan dashboards and alerts."""
    assert names.METER == "notiflow"
    assert names.DLQ_DEPTH == "notiflow.dlq.depth"
    assert names.DLQ_RECORDS == "notiflow.dlq.records"
    assert names.DLQ_LIMIT_BREACHES == "notiflow.dlq.limit_breaches"
    assert names.RETRIES_SCHEDULED == "notiflow.send.retries_scheduled"
    assert names.CLIENT_WEBHOOK_DELIVERIES == "notiflow.webhooks.deliveries"
    assert isinstance(names.DLQ_DEPTH, str)


def test_issue_signals_are_all_declared() -> None:
    """Every signal docs/design.md ("Observability") lists has a metric."""
    declared = set(names.METRICS)
    for metric in ("notiflow.ingest.messages", "notiflow.queue.oldest_age",
                   "notiflow.retry.oldest_age", "notiflow.receipts",
                   "notiflow.send.accept_to_provider.duration", "notiflow.send.retries_scheduled",
                   "notiflow.send.suppressions", "notiflow.send.expirations",
                   "notiflow.dlq.records", "notiflow.dlq.depth",
                   "notiflow.provider.request.duration", "notiflow.provider.errors",
                   "notiflow.ratelimit.fill", "notiflow.breaker.state", "notiflow.consumer.lag",
                   "notiflow.scheduler.lateness"):
        assert metric in declared, metric
    assert {"tenant", "channel", "tier"} <= set(names.INGEST_MESSAGES.attributes)
    assert {"tier", "provider"} <= set(names.ACCEPT_TO_PROVIDER.attributes)
    assert set(names.SPANS) == {
        "notiflow.api.request", "notiflow.api.batch", "notiflow.ingest.produce", "notiflow.send",
        "notiflow.provider.call", "notiflow.receipt", "notiflow.reconcile",
        "notiflow.client_webhook"}


def test_names_follow_opentelemetry_conventions() -> None:
    seen: set[str] = set()
    for metric in names.METRICS.values():
        tokens = re.split(r"[._]", metric)
        assert tokens[-1] not in {"total", "seconds", "ms", "bytes", "count", "ratio"}, metric
        assert not re.search(r"[A-Z]", metric), metric
        assert metric.unit, f"{metric}: give a unit (UCUM, or a {{annotation}})"
        assert metric.unit in {"s", "1"} or re.fullmatch(r"\{[a-z_]+\}", metric.unit), metric
        assert metric.attributes and len(set(metric.attributes)) == len(metric.attributes)
        for series in metric.series:
            assert series not in seen, f"two metrics export {series}"
            seen.add(series)
        if metric.kind is Kind.HISTOGRAM:
            assert metric.buckets == tuple(sorted(set(metric.buckets)))
    for tier_sla in (1.0, 10.0, 300.0, 3600.0):
        assert tier_sla in names.ACCEPT_TO_PROVIDER.buckets


def test_no_attribute_can_carry_recipient_or_content() -> None:
    forbidden = re.compile(r"recipient|phone|email|address|token|body|subject|variables|secret")
    for item in [*names.METRICS.values(), *names.SPANS.values()]:
        for attribute in item.attributes:
            assert not forbidden.search(attribute), f"{item}: {attribute}"


def _documented() -> list[tuple[str, str]]:
    """(constant, docstring) for every Metric/Span assignment in names.py."""
    out = []
    body = ast.parse(SOURCE).body
    for node, nxt in itertools.pairwise(body):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", "") in {"Metric", "Span"}):
            doc = (nxt.value.value if isinstance(nxt, ast.Expr)
                   and isinstance(nxt.value, ast.Constant) else "")
            out.append((node.targets[0].id, doc))
    return out


def test_every_name_has_a_docstring_with_type_unit_and_attributes() -> None:
    documented = _documented()
    assert len(documented) == len(names.METRICS) + len(names.SPANS)
    for const, doc in documented:
        item = getattr(names, const)
        assert doc, f"{const} has no docstring"
        text = " ".join(doc.split())
        if isinstance(item, names.Metric):
            assert text.startswith(f"{item.kind.value} {item.unit}: "), f"{const}: {text}"
        else:
            assert text.startswith(f"Span {item.kind.value}: "), f"{const}: {text}"
        _, _, listed = text.rpartition("attributes ")
        listed_attrs = {a.strip(" .") for a in listed.split(",")}
        for attribute in item.attributes:
            assert attribute.removeprefix("notiflow.") in listed_attrs, f"{const}: {attribute}"


def test_instruments_are_created_with_kind_unit_and_buckets() -> None:
    calls: list[tuple[str, str, dict]] = []

    class Recorder:
        def __getattr__(self, method: str):
            def create(name: str, **kwargs):
                calls.append((method, name, kwargs))
            return create

    for metric in names.METRICS.values():
        metric.create(Recorder())
        metric.create(metrics.NoOpMeter("test"))  # the real API accepts the same arguments
    by_name = {name: (method, kwargs) for method, name, kwargs in calls}
    method, kwargs = by_name["notiflow.send.accept_to_provider.duration"]
    assert method == "create_histogram" and kwargs["unit"] == "s"
    assert kwargs["explicit_bucket_boundaries_advisory"] == names.LATENCY_BUCKETS
    assert by_name["notiflow.dlq.depth"][0] == "create_gauge"
    assert by_name["notiflow.dlq.records"][0] == "create_counter"
    names.BREAKER_STATE.create(Recorder(), callbacks=[lambda options: []])
    assert calls[-1][0] == "create_observable_gauge"


def test_names_pickle_with_their_metadata() -> None:
    for item in [*names.METRICS.values(), *names.SPANS.values()]:
        copy = pickle.loads(pickle.dumps(item))
        assert copy == item and type(copy) is type(item)
        assert copy.kind == item.kind and copy.attributes == item.attributes


def test_bad_names_are_refused() -> None:
    with pytest.raises(ValueError):
        names.Metric("Notiflow.Foo", Kind.COUNTER, "1", ("tier",), "x")
    with pytest.raises(ValueError):
        names.Metric("notiflow.foo", Kind.COUNTER, "1", ("tier",), "x", buckets=(1.0,))
    with pytest.raises(ValueError):
        names.Span("send", names.SpanKind.CLIENT, ())


def test_observability_doc_lists_every_name() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    for metric in names.METRICS.values():
        assert f"| `{metric}` | {metric.kind.value} | `{metric.unit}` |" in doc, metric
        assert f"`{metric.prometheus}`" in doc, metric.prometheus
    for span in names.SPANS.values():
        assert f"| `{span}` | {span.kind.value} |" in doc, span
