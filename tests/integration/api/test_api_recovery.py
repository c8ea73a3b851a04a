"""The Messaging API when a process dies mid-acceptance (the outbox, its sweeper and a
retried request) and when Kafka or Cassandra cannot be reached."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cassandra.cluster import Session

from notiflow.adapters.cassandra.idempotency import OutboxSlot, ReservationRow
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.envelope import envelope, load
from notiflow.devenv import free_port
from notiflow.gateway.acceptance import request_hash
from notiflow.gateway.outbox import outbox_shard, outbox_slot, snapshot
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import IngestRecord, SendRequest, new_message_id
from notiflow.settings import Settings
from tests.helpers import wait_until
from tests.integration.api.support import find_record, kafka_less_api, key, ms, sms, start_api

pytestmark = pytest.mark.integration


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
