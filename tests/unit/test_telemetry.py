"""The telemetry module: settings, resource attributes, trace context helpers, the JSON and
text log formatters (with redaction), the FastAPI URL hook, the send path's metric labels,
and a whole ``setup`` with the console exporter in a child process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from bytewax.connectors.kafka import KafkaSourceMessage
from cryptography.fernet import Fernet
from opentelemetry.sdk.trace import TracerProvider
from pydantic import ValidationError

from notiflow import names, telemetry
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.kafka_io import header
from notiflow.adapters.providers.base import Outcome, SendResult
from notiflow.flows.common.items import SourceRef, Work
from notiflow.flows.common.steps import Encoder, parse_reconcile, status_event, suppression_reason
from notiflow.flows.send.stages.metrics import attempt_outcome, error_type
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import IngestRecord, StatusEvent
from notiflow.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def sdk_tracer() -> Any:
    """A recording tracer that is not the global one."""
    return TracerProvider().get_tracer("test")


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.makeLogRecord({"name": "notiflow.test", "levelno": logging.WARNING,
                                 "levelname": "WARNING", "msg": msg, "args": args, **extra})
    telemetry.TraceContextFilter().filter(rec)
    return rec


# settings ----------------------------------------------------------------------------------


def test_telemetry_settings_default_off_and_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().telemetry.exporter == "off"
    assert Settings().log_format == "text"
    monkeypatch.setenv("NOTIFLOW_TELEMETRY__EXPORTER", "otlp-grpc")
    monkeypatch.setenv("NOTIFLOW_TELEMETRY__ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("NOTIFLOW_TELEMETRY__METRIC_INTERVAL", "PT2S")
    monkeypatch.setenv("NOTIFLOW_LOG_FORMAT", "json")
    s = Settings()
    assert (s.telemetry.exporter, s.telemetry.endpoint) == ("otlp-grpc", "http://127.0.0.1:4317")
    assert s.telemetry.metric_interval.total_seconds() == 2
    assert s.log_format == "json"
    monkeypatch.setenv("NOTIFLOW_TELEMETRY__EXPORTER", "zipkin")
    with pytest.raises(ValidationError):
        Settings()


def test_resource_attributes_name_the_process_tier_and_worker() -> None:
    attrs = telemetry.resource_attributes(Settings(), "send-p0", tier="P0", worker=1)
    assert attrs["service.name"] == "notiflow-send-p0"
    assert attrs["service.namespace"] == "notiflow"
    assert (attrs["notiflow.tier"], attrs["notiflow.worker"]) == ("P0", "1")
    assert attrs["service.instance.id"].endswith(f":{os.getpid()}")
    custom = Settings(telemetry={"service_name": "edge-api",
                                 "resource_attributes": {"deployment.environment": "dev"}})
    attrs = telemetry.resource_attributes(custom, "api")
    assert attrs["service.name"] == "edge-api"
    assert attrs["deployment.environment"] == "dev"
    assert "notiflow.tier" not in attrs


# trace context -----------------------------------------------------------------------------


def test_trace_context_round_trip(sdk_tracer: Any) -> None:
    assert telemetry.context_of(None) is None
    assert telemetry.context_of("00-" + "0" * 32 + "-" + "0" * 16 + "-01") is None
    assert telemetry.context_of("garbage") is None
    assert telemetry.link_to("garbage") is None
    assert telemetry.header_traceparent([("message_id", b"m"), ("traceparent", TP.encode())]) \
        == TP
    assert telemetry.header_traceparent(None) is None
    with sdk_tracer.start_as_current_span("x", context=telemetry.context_of(TP)) as sp:
        current = telemetry.current_traceparent()
        assert current == telemetry.traceparent_of(sp)
        assert current is not None and current.split("-")[1] == TP.split("-")[1]
        assert current != TP
    assert telemetry.current_traceparent() is None


def test_span_without_an_sdk_passes_the_parent_on_and_binds_the_message_id() -> None:
    """Export off: the no-op tracer keeps the incoming context current, so records written
    inside still carry the producer's traceparent; log lines carry the message id."""
    with telemetry.span(names.SEND, {names.ATTR_MESSAGE_ID: "m1", names.ATTR_TIER: None},
                        parent=TP) as sp:
        assert not sp.is_recording()
        assert telemetry.current_traceparent() == TP
        assert record("x").message_id == "m1"
        with telemetry.span(names.PROVIDER_CALL, {names.ATTR_PROVIDER: "twilio"}):
            assert telemetry.current_traceparent() == TP
    assert record("x").message_id is None
    assert telemetry.current_traceparent() is None
    with telemetry.message_context("m2"):
        assert record("x").message_id == "m2"


def test_status_events_carry_their_trace_to_the_kafka_header(sdk_tracer: Any) -> None:
    s = Settings(tenants=[{"id": "acme", "token": "t" * 32}],
                 dlq_key=Fernet.generate_key().decode())
    rec = IngestRecord.model_validate({
        "channel": "SMS", "tier": "P0", "recipient": "+14155552671", "template_id": "otp",
        "template_version": 1, "tenant_id": "acme", "message_id": "m1", "accepted_at": NOW,
        "expires_at": NOW, "variables": {"code": "1"}})
    work = Work(rec, SourceRef("ingest.sms.p0", 0, 1), b"", b"m1", (("traceparent", TP.encode()),))
    plain = status_event(work, Status.SUPPRESSED, NOW, "send.p0", reason="opt_out")
    assert plain._traceparent == TP
    assert "traceparent" not in plain.model_dump_json()
    with sdk_tracer.start_as_current_span("send", context=telemetry.context_of(TP)) as sp:
        ev = status_event(work, Status.PROVIDER_ACCEPTED, NOW, "send.p0")
    assert ev._traceparent == telemetry.traceparent_of(sp)
    out = Encoder(s)(ev)
    assert header(out.headers, "traceparent") == ev._traceparent
    msg = KafkaSourceMessage(key=b"m1", value=out.value, topic=s.events_topic,
                             headers=out.headers, latency=None, offset=1, partition=0,
                             timestamp=(1, 1))
    back = parse_reconcile(msg, s, DlqCipher(Fernet.generate_key()), lambda: NOW)
    assert isinstance(back, StatusEvent) and back._traceparent == ev._traceparent


# logs --------------------------------------------------------------------------------------


def test_json_lines_carry_trace_and_message_ids_and_mask_recipients(sdk_tracer: Any) -> None:
    fmt = telemetry.JsonFormatter()
    with sdk_tracer.start_as_current_span("x") as sp, telemetry.message_context("msg_1"):
        rec = record("sent to %s and %s", "+14155552671", "ada.lovelace@example.com",
                     tenant="acme", attempt=2)
    doc = json.loads(fmt.format(rec))
    ctx = sp.get_span_context()
    assert doc["trace_id"] == f"{ctx.trace_id:032x}"
    assert doc["span_id"] == f"{ctx.span_id:016x}"
    assert doc["message_id"] == "msg_1"
    assert (doc["level"], doc["logger"]) == ("WARNING", "notiflow.test")
    assert (doc["tenant"], doc["attempt"]) == ("acme", 2)
    assert "+14155552671" not in doc["message"] and "ada.lovelace" not in doc["message"]
    assert "+1415" in doc["message"] and "@example.com" in doc["message"]
    assert datetime.fromisoformat(doc["time"]).tzinfo is not None


def test_json_line_outside_a_span_and_with_an_exception() -> None:
    try:
        raise ValueError("bad address +447911123456")
    except ValueError:
        rec = record("failed", exc_info=sys.exc_info())
    line = telemetry.JsonFormatter().format(rec)
    assert "\n" not in line
    doc = json.loads(line)
    assert "trace_id" not in doc and "message_id" not in doc
    assert "ValueError" in doc["exception"] and "+447911123456" not in doc["exception"]


def test_text_format_stays_human_and_masked() -> None:
    with telemetry.message_context("msg_9"):
        rec = record("to %s", "+14155552671")
    line = telemetry.TextFormatter().format(rec)
    assert "WARNING notiflow.test: to +1415" in line
    assert "+14155552671" not in line and line.endswith("[msg_9]")
    assert telemetry.scrub("no recipient here: 42 + 1") == "no recipient here: 42 + 1"


def test_uvicorn_access_lines_lose_the_path() -> None:
    rec = logging.makeLogRecord({
        "name": "uvicorn.access", "msg": '%s - "%s %s HTTP/%s" %d',
        "args": ("127.0.0.1:5", "GET", "/webhooks/vonage?msisdn=447911123456", "1.1", 200)})
    telemetry.TraceContextFilter().filter(rec)
    assert rec.getMessage() == '127.0.0.1:5 - "GET <path> HTTP/1.1" 200'


def test_log_config_swaps_formatters_and_adds_the_trace_filter() -> None:
    base = {"version": 1, "formatters": {"plain": {"format": "%(message)s"}},
            "handlers": {"stdout": {"class": "logging.StreamHandler", "formatter": "plain",
                                    "filters": ["repeat"]}}}
    cfg = telemetry.log_config(base, "json")
    assert cfg["formatters"]["plain"] == {"()": "notiflow.telemetry.JsonFormatter"}
    assert cfg["handlers"]["stdout"]["filters"] == ["repeat", "trace_context"]
    assert base["handlers"]["stdout"]["filters"] == ["repeat"]
    assert telemetry.log_config(base, "text")["formatters"]["plain"]["()"].endswith(
        "TextFormatter")


# instrumentation hooks and metric labels ---------------------------------------------------


def test_server_spans_lose_the_query_string(sdk_tracer: Any) -> None:
    with sdk_tracer.start_as_current_span("GET /webhooks/vonage", attributes={
            "http.url": "http://127.0.0.1/webhooks/vonage?msisdn=447911123456&status=ok",
            "http.target": "/webhooks/vonage?msisdn=447911123456",
            "url.query": "msisdn=447911123456"}) as sp:
        telemetry.route_only(lambda scope: "/webhooks/vonage")(sp, {})
        attrs = dict(sp.attributes)
    assert attrs["http.url"] == "http://127.0.0.1/webhooks/vonage"
    assert attrs["http.target"] == "/webhooks/vonage"
    assert attrs["url.query"] == ""


@pytest.mark.parametrize(("outcome", "reason", "kind", "label"), [
    (Outcome.ACCEPTED, None, None, "accepted"),
    (Outcome.AMBIGUOUS, "timeout", "timeout", "ambiguous"),
    (Outcome.TRANSIENT, "connect_error", "connection", "transient"),
    (Outcome.TRANSIENT, "rate_limited", "429", "rate_limited"),
    (Outcome.TRANSIENT, "server_error", "5xx", "transient"),
    (Outcome.PERMANENT, "invalid_recipient", "4xx", "permanent"),
    (Outcome.TRANSIENT, "internal_error:KeyError", None, "transient"),
])
def test_provider_call_labels(outcome: Outcome, reason: str | None, kind: str | None,
                              label: str) -> None:
    result = SendResult(outcome, "twilio", NOW, NOW, reason=reason)
    assert (error_type(result), attempt_outcome(result)) == (kind, label)


def test_suppression_reasons_are_bounded() -> None:
    assert suppression_reason("duplicate_content_of:01HXYZ") == "duplicate"
    assert suppression_reason("opt_out") == "opt_out"
    assert suppression_reason(None) == "unknown"


# the whole setup ---------------------------------------------------------------------------


def test_setup_with_the_console_exporter_writes_spans_and_metrics() -> None:
    """A child process (providers are global): JSON logs, then the span continuing a
    traceparent and the metrics, as JSON lines on stdout after shutdown."""
    code = f"""
import logging
from notiflow import names, telemetry
from notiflow.settings import Settings
t = telemetry.setup(Settings(), "send-p1", tier="P1", worker=0)
assert telemetry.enabled() and telemetry.setup(Settings(), "other") is t
with telemetry.span(names.SEND, {{names.ATTR_MESSAGE_ID: "m1"}}, parent="{TP}"):
    logging.getLogger("notiflow.x").info("inside")
names.SEND_ATTEMPTS.create(telemetry.meter()).add(1, {{"tier": "P1", "outcome": "accepted"}})
t.shutdown()
"""
    env = {**os.environ, "NOTIFLOW_TELEMETRY__EXPORTER": "console",
           "NOTIFLOW_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    docs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    inside = next(d for d in docs if d.get("message") == "inside")
    assert inside["message_id"] == "m1" and inside["trace_id"] == TP.split("-")[1]
    span = next(d for d in docs if d.get("name") == names.SEND)
    assert span["kind"] == "SpanKind.CONSUMER"
    assert span["context"]["trace_id"] == "0x" + TP.split("-")[1]
    assert span["parent_id"] == "0x" + TP.split("-")[2]
    assert span["resource"]["attributes"]["service.name"] == "notiflow-send-p1"
    assert span["resource"]["attributes"]["notiflow.tier"] == "P1"
    exported = [m["name"] for d in docs for rm in d.get("resource_metrics", [])
                for sm in rm["scope_metrics"] for m in sm["metrics"]]
    assert names.SEND_ATTEMPTS in exported
