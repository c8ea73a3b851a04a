"""One message through the whole path, every process exporting OTLP/HTTP to an in-test
receiver: API → ingest → P0 send flow → SMS emulator → signed status callbacks (receipts)
→ reconcile → client status webhook. One trace holds them all, correctly parented, no
recipient or content appears in any span or metric attribute or any log line, and each
process exported its declared metrics. Twilio echoes the ``traceparent`` in the signed
callback URL, so its receipt spans join the trace; Vonage echoes nothing, so its receipts'
reconcile spans continue the send's trace stored with the provider message index and link
the receipt's own trace."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from cassandra.cluster import Session

from notiflow import names
from notiflow.bench.webhook_receiver import Receiver
from notiflow.devenv import free_port
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from tests.helpers import message_row, wait_for
from tests.integration.conftest import Isolated, ready
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.integration

PHONE = "+14155552671"
WANTED = {names.API_REQUEST, names.INGEST_PRODUCE, names.SEND, names.PROVIDER_CALL,
          names.RECEIPT, names.RECONCILE, names.CLIENT_WEBHOOK}


def one(spans: list[ReceivedSpan], name: str, **attrs: Any) -> ReceivedSpan:
    found = [s for s in spans if s.name == name
             and all(s.attributes.get(k) == v for k, v in attrs.items())]
    assert len(found) == 1, f"{name} {attrs}: {found}"
    return found[0]


def forbidden_in(text: str, secrets: list[str]) -> list[str]:
    return [s for s in secrets if s in text]


@pytest.mark.parametrize("provider", ["twilio", "vonage"])
def test_one_trace_from_the_api_to_the_client_webhook(
        stack: Settings, fakes: str, cql: Session, isolated: Callable[..., Isolated],
        provider: str) -> None:
    echoes = provider == "twilio"
    only = ({"NOTIFLOW_TWILIO__STATUS_CALLBACK_URL": "/webhooks/twilio"} if echoes else
            {"NOTIFLOW_TWILIO__AUTH_TOKEN": "",
             "NOTIFLOW_VONAGE__STATUS_CALLBACK_URL": "/webhooks/vonage"})
    tenant = stack.tenant("acme")
    assert tenant is not None
    api_port = free_port()
    base = f"http://127.0.0.1:{api_port}"
    with OtlpReceiver() as otlp, Receiver(list(tenant.webhook_secrets)) as rx:
        iso = isolated(
            f"tracing-{provider}",
            NOTIFLOW_TELEMETRY__EXPORTER="otlp-http",
            NOTIFLOW_TELEMETRY__ENDPOINT=otlp.endpoint,
            NOTIFLOW_TELEMETRY__METRIC_INTERVAL="PT1S",
            NOTIFLOW_LOG_FORMAT="json",
            OTEL_BSP_SCHEDULE_DELAY="200",
            NOTIFLOW_API_PORT=str(api_port),
            **{k: f"{base}{v}" if v else v for k, v in only.items()},
        )
        iso.start("api", ["api"]).wait_http(f"{base}/healthz", timeout=90)
        for kind in ("reconcile", "webhooks"):
            proc = iso.start(kind, ["flow", kind, "--recovery-dir", str(iso.recovery / kind)])
            proc.wait_until(lambda p=proc: ready(p), timeout=120)
        iso.flow(Tier.P0)

        auth = {"Authorization": f"Bearer {tenant.token.get_secret_value()}"}
        r = httpx.post(f"{base}/v1/templates", headers=auth, json={
            "template_id": "otp", "channel": "SMS", "body": "Your code is {{ code }}"})
        assert r.status_code in (200, 201), r.text
        code = f"tok{uuid.uuid4().hex[:12]}"
        key = {"Idempotency-Key": uuid.uuid4().hex}
        r = httpx.post(f"{base}/v1/messages", headers={**auth, **key}, json={
            "channel": "SMS", "tier": "P0", "recipient": PHONE, "template_id": "otp",
            "template_version": r.json()["version"], "variables": {"code": code},
            "status_webhook": rx.url("/trace")})
        assert r.status_code == 202, r.text
        mid = r.json()["message_id"]

        wait_for(lambda: (message_row(cql, mid) or {}).get("status") == "DELIVERED",
                 timeout=90, what="DELIVERED in Cassandra")
        wait_for(lambda: {(mid, "PROVIDER_ACCEPTED"), (mid, "DELIVERED")} <= rx.seen(),
                 timeout=90, what=f"client webhooks (seen {rx.seen()})")

        def whole_trace() -> list[ReceivedSpan] | None:
            roots = [s for s in otlp.snapshot() if s.name == names.API_REQUEST
                     and s.attributes.get(names.ATTR_MESSAGE_ID) == mid]
            if not roots:
                return None
            spans = otlp.trace(roots[0].trace_id)
            got = {s.name for s in spans}
            if not echoes:
                linked = [s for s in spans if s.name == names.RECONCILE and s.links
                          and s.attributes.get(names.ATTR_STATUS) == "DELIVERED"]
                hooked = linked and any(
                    s.name == names.CLIENT_WEBHOOK for s in otlp.trace(linked[0].links[0][0]))
                return spans if got >= WANTED - {names.RECEIPT} and hooked else None
            hooks = [s for s in spans if s.name == names.CLIENT_WEBHOOK
                     and s.attributes.get(names.ATTR_STATUS) == "DELIVERED"]
            receipts = [s for s in spans if s.name == names.RECEIPT]
            reconciled = {s.parent_span_id for s in spans if s.name == names.RECONCILE}
            done = (got >= WANTED and len(receipts) >= 2 and hooks
                    and all(r.span_id in reconciled for r in receipts))
            return spans if done else None

        spans = wait_for(whole_trace, timeout=60, what="every span of the message's trace")

        def exported(service: str, wanted: set[str]) -> bool:
            return wanted <= otlp.metrics.get(service, set())

        for service, wanted in {
            "notiflow-api": {names.INGEST_MESSAGES, names.RECEIPTS},
            "notiflow-send-p0": {names.SEND_ATTEMPTS, names.ACCEPT_TO_PROVIDER,
                                 names.PROVIDER_REQUEST_DURATION, names.QUEUE_OLDEST_AGE,
                                 names.BREAKER_STATE},
            "notiflow-reconcile": {names.STATUS_TRANSITIONS},
            "notiflow-webhooks": {names.CLIENT_WEBHOOK_DELIVERIES},
        }.items():
            wait_for(lambda s=service, w=wanted: exported(s, w), timeout=30,
                     what=f"metrics of {service} (got {otlp.metrics.get(service)})")
        iso.processes.stop_all()
        logs = {p.name: p.read_text(errors="replace") for p in Path(iso.log_dir).glob("*.log")}

    # one trace, parented hop by hop
    api = one(spans, names.API_REQUEST)
    assert api.service == "notiflow-api"
    server = next(s for s in spans if s.span_id == api.parent_span_id)
    assert server.kind == "SERVER" and server.service == "notiflow-api"
    produce = one(spans, names.INGEST_PRODUCE)
    assert (produce.parent_span_id, produce.kind) == (api.span_id, "PRODUCER")
    send = one(spans, names.SEND, **{names.ATTR_ATTEMPT: 1})
    assert (send.parent_span_id, send.kind, send.service) == (
        produce.span_id, "CONSUMER", "notiflow-send-p0")
    assert send.resource.get("notiflow.tier") == "P0"
    assert send.attributes[names.ATTR_PROVIDER] == provider
    assert send.attributes[names.ATTR_OUTCOME] == "accepted"
    call = one(spans, names.PROVIDER_CALL)
    assert (call.parent_span_id, call.kind) == (send.span_id, "CLIENT")
    assert call.attributes[names.ATTR_OUTCOME] == "accepted"

    reconciles = [s for s in spans if s.name == names.RECONCILE]
    assert all(s.service == "notiflow-reconcile" and s.kind == "CONSUMER" for s in reconciles)
    assert "PROVIDER_ACCEPTED" in {s.attributes[names.ATTR_STATUS] for s in reconciles
                                   if s.parent_span_id == send.span_id}

    receipts = [s for s in spans if s.name == names.RECEIPT]
    if echoes:
        assert {s.attributes[names.ATTR_STATUS] for s in receipts} >= {"SENT", "DELIVERED"}
        for receipt in receipts:
            assert receipt.parent_span_id == call.span_id
            assert receipt.service == "notiflow-api"
            assert receipt.links, "a receipt span links the callback's own HTTP request"
            assert any(s.parent_span_id == receipt.span_id for s in reconciles)
    else:
        assert receipts == []
        [delivered] = [s for s in reconciles if s.attributes[names.ATTR_STATUS] == "DELIVERED"]
        assert delivered.parent_span_id == send.span_id
        [(linked_trace, linked_span)] = delivered.links
        receipt_trace = otlp.trace(linked_trace)
        [receipt] = [s for s in receipt_trace if s.span_id == linked_span]
        assert (receipt.name, receipt.service) == (names.RECEIPT, "notiflow-api")
        receipts = [receipt]
        spans = spans + [s for s in receipt_trace if s.name == names.CLIENT_WEBHOOK]

    hooks = [s for s in spans if s.name == names.CLIENT_WEBHOOK]
    receipt_ids = {s.span_id for s in receipts}
    assert all(s.service == "notiflow-webhooks" and s.kind == "CLIENT" for s in hooks)
    assert all(s.parent_span_id in receipt_ids | {send.span_id} for s in hooks)
    assert {s.attributes[names.ATTR_STATUS] for s in hooks} >= {"PROVIDER_ACCEPTED",
                                                                 "DELIVERED"}

    # nothing of the recipient or the content anywhere
    secrets = [PHONE, PHONE[1:], code, f"Your code is {code}"]
    leaks = [(s.service, s.name, k, v) for s in otlp.snapshot()
             for k, v in {**s.attributes, **s.resource}.items()
             if forbidden_in(str(v), secrets)]
    assert leaks == []
    assert [p for p in otlp.metric_points if forbidden_in(str(p[2]), secrets)] == []
    assert set(logs) >= {"api.log", "reconcile.log", "webhooks.log", "send-p0.log"}
    for name, text in logs.items():
        assert forbidden_in(text, secrets) == [], name

    # JSON lines with the trace id (the API's access line of the request is in the trace)
    traced = []
    for line in logs["api.log"].splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        assert {"time", "level", "logger", "message"} <= doc.keys()
        if doc.get("trace_id") == api.trace_id:
            traced.append(doc)
    assert traced, "no API log line carries the message's trace id"
