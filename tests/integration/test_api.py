"""The Messaging API against the real local stack (``notiflow api`` as a subprocess)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cassandra.cluster import Session
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from notiflow.adapters.cassandra.idempotency import OutboxSlot, ReservationRow
from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.envelope import envelope, load
from notiflow.adapters.kafka_io import header
from notiflow.adapters.scheduled_store import ScheduledStore
from notiflow.devenv import free_port
from notiflow.gateway.messages import request_hash
from notiflow.gateway.outbox import outbox_shard, outbox_slot, snapshot
from notiflow.ops.procs import ManagedProcess
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import IngestRecord, SendRequest, new_message_id
from notiflow.schemas.scheduling import ScheduledRow
from notiflow.settings import Settings
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

PHONE = "+14155550123"
TEMPLATE = "otp"
TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-01$")


@pytest.fixture(scope="session")
def fakes(stack: Settings) -> str:
    """The Messaging API never calls a provider: these tests need no emulators."""
    return f"http://127.0.0.1:{stack.fakes_port}"


@pytest.fixture(scope="module")
def client(api: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api, timeout=30.0) as c:
        yield c


@pytest.fixture(scope="module")
def auth(tokens: dict[str, str]) -> Callable[..., dict[str, str]]:
    def make(tenant: str, key: str | None = None, **extra: str) -> dict[str, str]:
        h = {"Authorization": f"Bearer {tokens[tenant]}", **extra}
        if key is not None:
            h["Idempotency-Key"] = key
        return h

    return make


@pytest.fixture(scope="module")
def otp_template(client: httpx.Client, auth: Callable[..., dict[str, str]]) -> str:
    """Version 1 of an SMS template with one variable, for every test tenant."""
    for tenant in ("acme", "globex", "mkt"):
        r = client.post("/v1/templates", headers=auth(tenant), json={
            "template_id": TEMPLATE, "version": 1, "channel": "SMS",
            "body": "Your code is {{ code }}",
        })
        assert r.status_code in (200, 201), r.text
    return TEMPLATE


@pytest.fixture(scope="session")
def store(stack: Settings) -> Iterator[CassandraStore]:
    cluster, session = connect(stack)
    yield CassandraStore(session, stack)
    cluster.shutdown()


def sms(tier: str = "P1", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"channel": "SMS", "tier": tier, "recipient": PHONE,
                            "template_id": TEMPLATE, "template_version": 1,
                            "variables": {"code": "123456"}}
    body.update(overrides)
    return body


def key() -> str:
    return f"test-{uuid.uuid4().hex}"


def find_record(settings: Settings, topic: str, message_id: str,
                timeout: float = 30.0) -> Message:
    """The first record of ``topic`` whose ``message_id`` header matches (from offset 0)."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap,
                         "group.id": f"test-api-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            if header(msg.headers(), "message_id") == message_id:
                return msg
        raise AssertionError(f"{message_id} not found on {topic} within {timeout}s")
    finally:
        consumer.close()


def start_api(name: str, log_dir: Path, **env: str) -> tuple[ManagedProcess, str]:
    port = free_port()
    proc = ManagedProcess(name, ["api"], log_dir,
                          env=os.environ | {"NOTIFLOW_API_PORT": str(port), **env})
    base = f"http://127.0.0.1:{port}"
    proc.start().wait_http(f"{base}/healthz")
    return proc, base


@contextlib.asynccontextmanager
async def kafka_less_api(name: str, log_dir: Path,
                         window: int) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an API process of its own whose Kafka bootstrap is a port nothing listens
    on, with an outage window of ``window`` messages (stopped on exit)."""
    proc, base = await asyncio.to_thread(
        start_api, name, log_dir, NOTIFLOW_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}",
        NOTIFLOW_KAFKA_WINDOW__MAX_MESSAGES=str(window))
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30.0) as bad:
            yield bad
    finally:
        await asyncio.to_thread(proc.stop)


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


# ------------------------------------------------------------------------- templates


def test_template_versions_are_immutable(client: httpx.Client,
                                         auth: Callable[..., dict[str, str]]) -> None:
    tid = f"tpl-{uuid.uuid4().hex[:8]}"
    first = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": tid, "channel": "SMS", "subject": "Hi {{ name }}",
        "body": "Order {{ order_id }} arrives {{ eta }}"})
    assert first.status_code == 201, first.text
    created = first.json()
    assert created["version"] == 1
    assert created["variables"] == ["eta", "name", "order_id"]
    assert set(created) == {"template_id", "version", "channel", "variables", "checksum",
                            "created_at"}

    same = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": tid, "channel": "SMS", "version": 1, "subject": "Hi {{ name }}",
        "body": "Order {{ order_id }} arrives {{ eta }}"})
    assert same.status_code == 200
    assert same.json() == created

    changed = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": tid, "channel": "SMS", "version": 1, "body": "Different {{ x }}"})
    assert changed.status_code == 409
    assert changed.json()["error"] == "template_version_immutable"

    second = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": tid, "channel": "SMS", "body": "Order {{ order_id }} is late"})
    assert second.status_code == 201
    assert second.json()["version"] == 2
    again = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": tid, "channel": "SMS", "body": "Order {{ order_id }} is late"})
    assert again.status_code == 200
    assert again.json() == second.json()

    got = client.get(f"/v1/templates/{tid}/versions/1", headers=auth("acme"))
    assert got.status_code == 200
    g = got.json()
    assert (g["subject"], g["body"], g["variables"]) == (
        "Hi {{ name }}", "Order {{ order_id }} arrives {{ eta }}", ["eta", "name", "order_id"])
    assert g["checksum"] == created["checksum"]
    assert g["created_at"] == created["created_at"]

    assert client.get(f"/v1/templates/{tid}/versions/1", headers=auth("globex")).status_code \
        == 404
    assert client.get(f"/v1/templates/{tid}/versions/9", headers=auth("acme")).status_code \
        == 404


def test_template_syntax_error_is_422(client: httpx.Client,
                                      auth: Callable[..., dict[str, str]]) -> None:
    r = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": "broken", "channel": "SMS", "body": "Hi {{ name"})
    assert r.status_code == 422
    assert r.json()["reason"] == "template_syntax_error"


def test_template_channel_must_match(client: httpx.Client,
                                     auth: Callable[..., dict[str, str]]) -> None:
    tid = f"push-{uuid.uuid4().hex[:8]}"
    r = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": tid, "channel": "PUSH", "body": "{{ code }}"})
    assert r.status_code == 201
    r = client.post("/v1/messages", headers=auth("acme"), json=sms(template_id=tid))
    assert (r.status_code, r.json()["reason"]) == (422, "unknown_template")


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


# ----------------------------------------------------------- crash recovery (the outbox)


async def crashed_acceptance(store: CassandraStore, settings: Settings, tenant_id: str,
                             idem_key: str, body: dict[str, Any],
                             accepted_at: datetime) -> IngestRecord:
    """What a process that died after steps (b)-(d) leaves: a PENDING reservation, an
    outbox row and a message row, but nothing published."""
    req = SendRequest.model_validate(body)
    data = req.model_dump()
    data.update(tenant_id=tenant_id, message_id=new_message_id(), idempotency_key=idem_key,
                accepted_at=accepted_at,
                expires_at=accepted_at + timedelta(hours=1))
    record = IngestRecord.model_validate(data)
    assert record.message_id is not None
    topic = settings.ingest_topic(req.channel, req.tier)
    reservation = await store.idempotency.reserve(tenant_id, idem_key, request_hash(req),
                                                  record.message_id, topic,
                                                  record.model_dump_json(exclude_none=True),
                                                  accepted_at)
    assert reservation.applied
    await store.idempotency.outbox_add(outbox_slot(tenant_id, idem_key, accepted_at), accepted_at,
                                       tenant_id, idem_key)
    await store.messages.create_message(record.message_id, snapshot(record), Status.QUEUED,
                                        accepted_at)
    return record


def ms(d: datetime) -> datetime:
    return d.replace(microsecond=d.microsecond // 1000 * 1000)


async def settled_reservation(store: CassandraStore, tenant_id: str,
                              idem_key: str) -> ReservationRow | None:
    """The key's reservation once it is settled (``ACCEPTED``), else None."""
    rec = await store.idempotency.get_reservation(tenant_id, idem_key)
    return rec if rec is not None and rec.state == "ACCEPTED" else None


async def outbox_has(cql: Session, tenant_id: str, idem_key: str) -> bool:
    """Whether any outbox bucket of the last hour holds the key's row."""
    shard = outbox_shard(tenant_id, idem_key)
    now = OutboxSlot.bucket_of(datetime.now(UTC))
    buckets = list(range(now - 360, now + 2))
    rows = cql.execute("SELECT tenant_id, idempotency_key FROM outbox_buckets WHERE bucket IN "
                       f"({', '.join(map(str, buckets))}) AND shard = %s", (shard,))
    return any(r["tenant_id"] == tenant_id and r["idempotency_key"] == idem_key for r in rows)


async def test_sweeper_publishes_a_crashed_acceptance(
        client: httpx.Client, auth: Callable[..., dict[str, str]], settings: Settings,
        store: CassandraStore, otp_template: str, cql: Session) -> None:
    k = key()
    long_ago = ms(datetime.now(UTC) - timedelta(minutes=5))
    record = await crashed_acceptance(store, settings, "acme", k, sms(tier="P2"), long_ago)
    assert record.message_id is not None

    assert await wait_until(lambda: settled_reservation(store, "acme", k), timeout=120,
                            interval=0.2, what="the sweeper settling the pending acceptance")
    msg = await asyncio.to_thread(find_record, settings,
                                  settings.ingest_topic(Channel.SMS, Tier.P2),
                                  record.message_id)
    assert load(msg.value(), envelope(settings)) == record
    assert not await outbox_has(cql, "acme", k)

    replay = client.post("/v1/messages", headers=auth("acme", k), json=sms(tier="P2"))
    assert replay.status_code == 202
    assert replay.json()["message_id"] == record.message_id
    assert datetime.fromisoformat(replay.json()["accepted_at"]) == long_ago
    view = client.get(f"/v1/messages/{record.message_id}", headers=auth("acme"))
    assert view.json()["status"] == "QUEUED"


async def test_retry_finishes_a_pending_acceptance(
        client: httpx.Client, auth: Callable[..., dict[str, str]], settings: Settings,
        store: CassandraStore, otp_template: str, cql: Session) -> None:
    k = key()
    record = await crashed_acceptance(store, settings, "globex", k, sms(tier="P1"),
                                      ms(datetime.now(UTC)))
    assert record.message_id is not None and record.accepted_at is not None

    r = await asyncio.to_thread(client.post, "/v1/messages",
                                headers=auth("globex", k), json=sms(tier="P1"))
    assert r.status_code == 202, r.text
    assert r.json()["message_id"] == record.message_id
    assert datetime.fromisoformat(r.json()["accepted_at"]) == record.accepted_at

    msg = await asyncio.to_thread(find_record, settings,
                                  settings.ingest_topic(Channel.SMS, Tier.P1),
                                  record.message_id)
    assert load(msg.value(), envelope(settings)) == record

    rec = await wait_until(lambda: settled_reservation(store, "globex", k), timeout=10,
                           interval=0.05, what="the settle after the 202 (gateway/settler.py)")
    assert rec.response is not None
    assert json.loads(rec.response) == r.json()
    assert not await outbox_has(cql, "globex", k)

    conflict = client.post("/v1/messages", headers=auth("globex", k), json=sms(tier="P2"))
    assert conflict.status_code == 409


# ------------------------------------------------------------ infrastructure failures


async def test_kafka_unreachable_is_503_and_leaves_nothing(
        client: httpx.Client, auth: Callable[..., dict[str, str]], settings: Settings,
        store: CassandraStore, log_dir: Path, otp_template: str, cql: Session) -> None:
    async with kafka_less_api("api-nokafka", log_dir, window=0) as bad:
        k = key()
        started = time.monotonic()
        r = await bad.post("/v1/messages", headers=auth("acme", k), json=sms())
        elapsed = time.monotonic() - started
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "5"
        assert r.json()["error"] == "unavailable"
        assert r.json()["reason"] == "kafka_unavailable"
        assert elapsed < 15
        ready = await bad.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["cassandra"] == "ok"
        assert ready.json()["checks"]["kafka"] != "ok"

    assert await store.idempotency.get_reservation("acme", k) is None
    assert not await outbox_has(cql, "acme", k)
    retry = await asyncio.to_thread(client.post, "/v1/messages",
                                    headers=auth("acme", k), json=sms())
    assert retry.status_code == 202, retry.text


async def test_unreachable_kafka_opens_the_outage_window(
        auth: Callable[..., dict[str, str]], store: CassandraStore, log_dir: Path,
        otp_template: str, cql: Session) -> None:
    """P1-P3 durable in Cassandra are answered 202 (replays too) up to the window's count;
    beyond, 503 ``outage_window_full``; P0 is refused within its ack wait, then at once."""
    async with kafka_less_api("api-window", log_dir, window=2) as bad:
        k1 = key()
        started = time.monotonic()
        first = await bad.post("/v1/messages", headers=auth("acme", k1), json=sms("P2"))
        assert first.status_code == 202, first.text
        assert time.monotonic() - started < 3.0
        mid = first.json()["message_id"]
        replay = await bad.post("/v1/messages", headers=auth("acme", k1), json=sms("P2"))
        assert replay.status_code == 202 and replay.json() == first.json()
        p0 = []
        for _ in range(2):
            started = time.monotonic()
            r = await bad.post("/v1/messages", headers=auth("acme", key()), json=sms("P0"))
            p0.append((r, time.monotonic() - started))
        assert [(r.status_code, r.json()["reason"]) for r, _ in p0] == [
            (503, "kafka_unavailable")] * 2
        assert p0[1][1] < 0.3, "P0 waited although Kafka was known down"
        second = await bad.post("/v1/messages", headers=auth("acme", key()), json=sms())
        assert second.status_code == 202, second.text
        full = await bad.post("/v1/messages", headers=auth("acme", key()), json=sms("P3"))
        assert (full.status_code, full.json()["reason"]) == (503, "outage_window_full")
        assert full.headers["Retry-After"] == "1"
        ready = (await bad.get("/readyz")).json()
        assert ready["checks"]["kafka"] != "ok"
        view = await bad.get(f"/v1/messages/{mid}", headers=auth("acme"))
        assert view.json()["status"] == "QUEUED"
    record = await store.idempotency.get_reservation("acme", k1)
    assert record is not None and record.state == "PENDING"
    assert await outbox_has(cql, "acme", k1)


def test_channel_without_provider_is_422(auth: Callable[..., dict[str, str]], log_dir: Path,
                                        stack: Settings) -> None:
    proc, base = start_api("api-noemail", log_dir, NOTIFLOW_SENDGRID__API_KEY="",
                           NOTIFLOW_SMTP__PASSWORD="")
    try:
        r = httpx.post(f"{base}/v1/messages", headers=auth("acme"),
                       json=sms(channel="EMAIL", recipient="a@example.com"))
        assert (r.status_code, r.json()["reason"]) == (422, "channel_unavailable")
    finally:
        proc.stop()


def test_cassandra_unreachable_is_503(auth: Callable[..., dict[str, str]], log_dir: Path,
                                      stack: Settings) -> None:
    proc, base = start_api("api-nocassandra", log_dir,
                           NOTIFLOW_CASSANDRA_PORT=str(free_port()))
    try:
        with httpx.Client(base_url=base, timeout=30.0) as bad:
            assert bad.get("/healthz").status_code == 200
            ready = bad.get("/readyz")
            assert ready.status_code == 503
            assert ready.headers["Retry-After"] == "5"
            assert ready.json()["checks"]["cassandra"] != "ok"
            r = bad.post("/v1/messages", headers=auth("acme", key()), json=sms())
            assert r.status_code == 503
            assert r.headers["Retry-After"] == "5"
            assert r.json() == {"error": "unavailable", "reason": "cassandra_unavailable",
                                "message": "the message store is unavailable"}
            assert bad.get(f"/v1/messages/{new_message_id()}",
                           headers=auth("acme")).status_code == 503
            assert bad.post("/v1/messages", json=sms()).status_code == 401
    finally:
        proc.stop()


# ------------------------------------------------------------------------------ lanes


def test_lanes_serve_their_tiers_and_time_their_stages(
        log_dir: Path, auth: Callable[..., dict[str, str]], otp_template: str) -> None:
    """A priority-lane process takes P0/P1 and refuses P2/P3 (421), a bulk-lane one the
    reverse plus the provider webhooks; a 202 carries its stages as ``Server-Timing``."""
    priority, p_url = start_api("api-priority", log_dir, NOTIFLOW_API_LANE="priority")
    bulk, b_url = start_api("api-bulk", log_dir, NOTIFLOW_API_LANE="bulk")
    try:
        r = httpx.post(f"{p_url}/v1/messages", json=sms("P0"), headers=auth("acme", key()))
        assert r.status_code == 202, r.text
        timing = dict(part.strip().split(";dur=") for part in
                      r.headers["server-timing"].split(","))
        assert {"api.admission", "api.reserve", "api.write", "api.accept",
                "api.kafka_ack"} <= set(timing)
        assert all(float(v) >= 0 for v in timing.values())
        assert float(timing["api.accept"]) >= float(timing["api.reserve"])
        for url, tier in ((p_url, "P3"), (b_url, "P0"), (b_url, "P1")):
            r = httpx.post(f"{url}/v1/messages", json=sms(tier), headers=auth("acme", key()))
            assert (r.status_code, r.json()["reason"]) == (421, "wrong_lane"), r.text
        r = httpx.post(f"{b_url}/v1/messages", json=sms("P2"), headers=auth("acme", key()))
        assert r.status_code == 202, r.text
        assert httpx.post(f"{p_url}/webhooks/twilio", data={}).status_code == 404
        assert httpx.post(f"{b_url}/webhooks/twilio", data={}).status_code in (401, 403)
        assert httpx.get(f"{b_url}/v1/messages/{r.json()['message_id']}",
                         headers=auth("acme")).status_code == 200
    finally:
        priority.stop()
        bulk.stop()
