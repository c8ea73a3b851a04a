"""The Messaging API's messages against the real local stack (``notiflow api`` as a
subprocess): sending, reading, idempotent replays, tenancy, rejections and the ingest record
it publishes."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.envelope import envelope, load
from notiflow.adapters.kafka_io import header
from notiflow.adapters.scheduled_store import ScheduledStore
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import new_message_id
from notiflow.schemas.scheduling import ScheduledRow
from notiflow.settings import Settings
from tests.integration.api.support import PHONE, TEMPLATE, TRACEPARENT, find_record, key, ms, sms

pytestmark = pytest.mark.integration


# ------------------------------------------------------------------------------ basics


def test_health_and_readiness(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 200, r.text
    assert r.json()["checks"] == {"cassandra": "ok", "kafka": "ok"}


def test_unauthorized_without_or_with_unknown_token(client: httpx.Client) -> None:
    r = client.post("/v1/messages", json=sms())
    assert r.status_code == 401
    assert r.json()["error"] == "unauthorized"
    assert r.json()["reason"] == "missing_token"
    r = client.get("/v1/messages/msg_x", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    assert r.json()["reason"] == "unknown_token"


def test_send_get_replay_and_conflict(client: httpx.Client, auth: Callable[..., dict[str, str]],
                                      otp_template: str) -> None:
    k = key()
    first = client.post("/v1/messages", headers=auth("acme", k), json=sms())
    assert first.status_code == 202, first.text
    body = first.json()
    assert set(body) == {"message_id", "status", "accepted_at"}
    assert body["status"] == "QUEUED"

    view = client.get(f"/v1/messages/{body['message_id']}", headers=auth("acme"))
    assert view.status_code == 200, view.text
    v = view.json()
    assert v["status"] == "QUEUED"
    assert (v["channel"], v["tier"], v["template_id"], v["template_version"]) == (
        "SMS", "P1", TEMPLATE, 1)
    assert v["accepted_at"] == body["accepted_at"]
    assert v["attempts"] == []
    assert PHONE not in view.text

    replay = client.post("/v1/messages", headers=auth("acme", k), json=sms())
    assert replay.status_code == 202
    assert replay.content == first.content

    conflict = client.post("/v1/messages", headers=auth("acme", k),
                           json=sms(variables={"code": "999999"}))
    assert conflict.status_code == 409
    assert conflict.json()["error"] == "idempotency_conflict"


async def test_concurrent_requests_with_one_key_get_one_message(
        api: str, auth: Callable[..., dict[str, str]], otp_template: str) -> None:
    k = key()
    async with httpx.AsyncClient(base_url=api, timeout=30.0) as c:
        replies = await asyncio.gather(*(
            c.post("/v1/messages", headers=auth("acme", k), json=sms()) for _ in range(5)))
    assert [r.status_code for r in replies] == [202] * 5, [r.text for r in replies]
    assert len({r.content for r in replies}) == 1


def test_same_key_is_scoped_per_tenant(client: httpx.Client,
                                       auth: Callable[..., dict[str, str]],
                                       otp_template: str) -> None:
    k = key()
    a = client.post("/v1/messages", headers=auth("acme", k), json=sms())
    g = client.post("/v1/messages", headers=auth("globex", k), json=sms())
    assert a.status_code == g.status_code == 202
    assert a.json()["message_id"] != g.json()["message_id"]


def test_get_is_tenant_scoped(client: httpx.Client, auth: Callable[..., dict[str, str]],
                              otp_template: str) -> None:
    r = client.post("/v1/messages", headers=auth("acme"), json=sms())
    assert r.status_code == 202, r.text
    mid = r.json()["message_id"]
    other = client.get(f"/v1/messages/{mid}", headers=auth("globex"))
    assert other.status_code == 404
    assert other.json() == {"error": "not_found"}
    unknown = client.get(f"/v1/messages/{new_message_id()}", headers=auth("acme"))
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "not_found"}


# ----------------------------------------------------------------------- rejections


def test_invalid_phone_number_is_422_with_reason(client: httpx.Client,
                                                 auth: Callable[..., dict[str, str]]) -> None:
    r = client.post("/v1/messages", headers=auth("acme"), json=sms(recipient="+447700900123"))
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "validation_failed"
    assert any("phone number" in d["msg"] for d in body["details"])
    assert body["details"][0]["loc"] == ["recipient"]
    assert "+447700900123" not in r.text


def test_schema_errors_name_the_field(client: httpx.Client,
                                      auth: Callable[..., dict[str, str]]) -> None:
    r = client.post("/v1/messages", headers=auth("acme"), json=sms(tier="P9"))
    assert r.status_code == 422
    assert r.json()["details"][0]["loc"] == ["tier"]


def test_tier_not_allowed_for_tenant_is_403(client: httpx.Client,
                                            auth: Callable[..., dict[str, str]],
                                            otp_template: str) -> None:
    r = client.post("/v1/messages", headers=auth("mkt"), json=sms(tier="P0"))
    assert r.status_code == 403
    assert r.json()["error"] == "forbidden"
    assert r.json()["reason"] == "tier_not_allowed"
    ok = client.post("/v1/messages", headers=auth("mkt"), json=sms(tier="P3"))
    assert ok.status_code == 202, ok.text


def test_unknown_template_is_422(client: httpx.Client,
                                 auth: Callable[..., dict[str, str]], otp_template: str) -> None:
    r = client.post("/v1/messages", headers=auth("acme"), json=sms(template_version=77))
    assert r.status_code == 422
    assert r.json()["reason"] == "unknown_template"
    r = client.post("/v1/messages", headers=auth("acme"), json=sms(template_id="no-such"))
    assert r.json()["reason"] == "unknown_template"


def test_missing_variable_is_422_naming_it(client: httpx.Client,
                                           auth: Callable[..., dict[str, str]],
                                           otp_template: str) -> None:
    r = client.post("/v1/messages", headers=auth("acme"), json=sms(variables={"other": "x"}))
    assert r.status_code == 422
    assert r.json()["reason"] == "missing_template_variable"
    assert r.json()["variables"] == ["code"]


def test_other_rejections(client: httpx.Client, auth: Callable[..., dict[str, str]],
                          otp_template: str) -> None:
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    r = client.post("/v1/messages", headers=auth("acme"), json=sms(expires_at=past))
    assert (r.status_code, r.json()["reason"]) == (422, "expired")

    r = client.post("/v1/messages", headers=auth("acme"), content=b'{"channel": ')
    assert (r.status_code, r.json()["reason"]) == (400, "malformed_json")

    r = client.post("/v1/messages", headers=auth("acme", "has space"), json=sms())
    assert (r.status_code, r.json()["reason"]) == (400, "invalid_idempotency_key")

    r = client.post("/v1/messages", headers=auth("acme", "k" * 256), json=sms())
    assert r.status_code == 400


# ------------------------------------------------------------------- the ingest record


def test_ingest_record_on_topic(client: httpx.Client, auth: Callable[..., dict[str, str]],
                                settings: Settings, otp_template: str) -> None:
    k = key()
    r = client.post("/v1/messages", headers=auth("acme", k), json=sms(tier="P0"))
    assert r.status_code == 202, r.text
    accepted = r.json()
    msg = find_record(settings, settings.ingest_topic(Channel.SMS, Tier.P0),
                      accepted["message_id"])
    assert msg.key() == accepted["message_id"].encode()
    headers = {name: value.decode() for name, value in msg.headers() or []}
    assert headers["message_id"] == accepted["message_id"]
    assert headers["tenant_id"] == "acme"
    assert headers["tier"] == "P0"
    assert headers["schema_version"] == "1"
    assert TRACEPARENT.match(headers["traceparent"])
    value = json.loads(msg.value())
    assert "recipient" not in value and "variables" not in value and "sealed" in value
    assert PHONE.encode() not in msg.value() and b"123456" not in msg.value()
    record = load(msg.value(), envelope(settings))
    assert record.tenant_id == "acme"
    assert record.message_id == accepted["message_id"]
    assert record.idempotency_key == k
    assert record.recipient == PHONE
    assert record.variables == {"code": "123456"}
    assert record.accepted_at is not None and record.expires_at is not None
    assert record.accepted_at == datetime.fromisoformat(accepted["accepted_at"])
    assert record.expires_at == record.accepted_at + settings.tier_ttl(Tier.P0)
    assert "scheduled_at" not in value


def test_ordering_key_and_incoming_trace(client: httpx.Client,
                                         auth: Callable[..., dict[str, str]],
                                         settings: Settings, otp_template: str) -> None:
    trace_id = uuid.uuid4().hex
    incoming = f"00-{trace_id}-{'a' * 16}-01"
    r = client.post("/v1/messages", headers=auth("globex", traceparent=incoming),
                    json=sms(tier="P1", ordering_key="order:981"))
    assert r.status_code == 202, r.text
    msg = find_record(settings, settings.ingest_topic(Channel.SMS, Tier.P1),
                      r.json()["message_id"])
    assert msg.key() == b"globex:order:981"
    trace = header(msg.headers(), "traceparent")
    assert trace is not None and trace.split("-")[1] == trace_id
    assert trace != incoming


def test_scheduled_message(client: httpx.Client, auth: Callable[..., dict[str, str]],
                           settings: Settings, otp_template: str) -> None:
    due = datetime.now(UTC) + timedelta(hours=2)
    r = client.post("/v1/messages", headers=auth("mkt"),
                    json=sms(tier="P3", scheduled_at=due.isoformat()))
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "SCHEDULED"
    message_id = r.json()["message_id"]
    view = client.get(f"/v1/messages/{message_id}", headers=auth("mkt"))
    assert view.json()["status"] == "SCHEDULED"
    row = asyncio.run(scheduled_row(settings, message_id, due))
    assert row is not None and row.released_at is None
    assert row.topic == settings.ingest_topic(Channel.SMS, Tier.P3)
    assert PHONE not in row.payload
    record = load(row.payload, envelope(settings))
    assert record.expires_at == due + settings.tier_ttl(Tier.P3)
    with pytest.raises(AssertionError, match="not found"):
        find_record(settings, row.topic, message_id, timeout=2.0)


def test_message_due_within_the_lead_goes_to_kafka(
        client: httpx.Client, auth: Callable[..., dict[str, str]], settings: Settings,
        otp_template: str) -> None:
    due = datetime.now(UTC) + settings.scheduling.min_lead / 4
    r = client.post("/v1/messages", headers=auth("mkt"),
                    json=sms(tier="P3", scheduled_at=due.isoformat()))
    assert r.status_code == 202, r.text
    message_id = r.json()["message_id"]
    find_record(settings, settings.ingest_topic(Channel.SMS, Tier.P3), message_id)
    assert asyncio.run(scheduled_row(settings, message_id, due)) is None


async def scheduled_row(settings: Settings, message_id: str,
                        due: datetime) -> ScheduledRow | None:
    cluster, session = await asyncio.to_thread(connect, settings)
    try:
        return await ScheduledStore(session, settings).get(message_id, ms(due))
    finally:
        cluster.shutdown()
