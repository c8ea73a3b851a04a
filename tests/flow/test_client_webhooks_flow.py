"""The client webhook dataflow under TestingSource/TestingSink (1 and 2 workers) against a
local receiver that verifies every signature: ordered delivery with retries, the DLQ, URL
lookup in Cassandra, the endpoint breaker, and a pending retry that survives a crash."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from bytewax.connectors.kafka import KafkaSourceMessage
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSink, TestingSource, run_main

from notiflow.adapters.breaker import State
from notiflow.adapters.breaker.facade import CircuitBreakers
from notiflow.adapters.client_webhooks import endpoint_id
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.kafka_io import OutRecord
from notiflow.adapters.providers.base import Outcome
from notiflow.bench.webhook_receiver import Hit, Receiver
from notiflow.flows.webhooks.status_webhooks import breaker_id, build_webhook_flow
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import AttemptRecord, DlqRecord, MessageSnapshot, Receipt
from notiflow.settings import BreakerRule, ClientWebhookRule, Settings
from tests.flow.conftest import RUNNERS

pytestmark = pytest.mark.flow

ORDER = ["PROVIDER_ACCEPTED", "SENT", "DELIVERED"]


def with_rule(settings: Settings, *delays_ms: float, **extra: Any) -> Settings:
    """``settings`` with this schedule (policy durations: multiplied by ``time_scale``)."""
    rule = ClientWebhookRule(schedule=tuple(timedelta(milliseconds=d) for d in delays_ms),
                             timeout=timedelta(seconds=2))
    return settings.model_copy(update={"client_webhooks": rule, **extra})


def secrets(settings: Settings) -> list[Any]:
    tenant = settings.tenant("acme")
    assert tenant is not None and tenant.webhook_secrets
    return list(tenant.webhook_secrets)


def snapshot(url: str | None, at: datetime) -> dict[str, Any]:
    return {"tenant_id": "acme", "channel": "SMS", "tier": "P1", "category": "transactional",
            "template_id": "otp", "template_version": 1, "recipient_hash": "h",
            "recipient_masked": "+1415*****71", "accepted_at": at.isoformat(),
            "status_webhook": url}


def event(mid: str, status: str, url: str | None, *, attempt: int = 1,
          with_snapshot: bool = True) -> bytes:
    now = datetime.now(UTC)
    doc: dict[str, Any] = {
        "event_id": f"{mid}:{status}:{attempt}", "message_id": mid, "tenant_id": "acme",
        "channel": "SMS", "tier": "P1", "status": status, "attempt": attempt,
        "occurred_at": now.isoformat(), "source": "test"}
    if with_snapshot:
        doc["message"] = snapshot(url, now)
    return orjson.dumps(doc)


def kmsg(topic: str, value: bytes, offset: int) -> KafkaSourceMessage[bytes, bytes]:
    return KafkaSourceMessage(key=None, value=value, topic=topic, headers=[], latency=None,
                              offset=offset, partition=0, timestamp=(1, 0))


def events(settings: Settings, values: list[bytes]) -> list[Any]:
    return [kmsg(settings.events_topic, v, i) for i, v in enumerate(values)]


def dlq_of(settings: Settings, out: list[OutRecord]) -> list[DlqRecord]:
    assert {r.topic for r in out} <= {settings.webhooks_dlq_topic}
    return [DlqRecord.model_validate_json(r.value) for r in out]


async def fail_first(hit: Hit) -> int:
    return 500 if hit.n == 1 else 200


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_signed_webhooks_in_status_order_with_retries(stack: Settings, runner: str) -> None:
    """Every first request fails: the breaker is made tolerant here (its own test is below)."""
    s = with_rule(stack, 0, 50, 100, 100,
                  breaker=BreakerRule(failure_threshold=1000, min_calls=1000))
    with Receiver(secrets(s), fail_first) as rx:
        url = rx.url("/status")
        mids = [f"msg_wf_{uuid.uuid4().hex}" for _ in range(4)]
        quiet = f"msg_wf_{uuid.uuid4().hex}"
        rng = random.Random(runner)
        values: list[bytes] = []
        for mid in mids:
            per = [event(mid, st, url) for st in ORDER] + [event(mid, "SENT", url)]
            rng.shuffle(per)
            values += per
        values += [event(quiet, st, None) for st in ORDER]
        late = [event(mids[0], "SENT", url), event(mids[0], "PROVIDER_ACCEPTED", url)]
        items: list[Any] = [*events(s, values), TestingSource.PAUSE(timedelta(seconds=2)),
                            *[kmsg(s.events_topic, v, 100 + i) for i, v in enumerate(late)]]
        out: list[OutRecord] = []
        RUNNERS[runner](build_webhook_flow(s, source=TestingSource(items),
                                           sink=TestingSink(out), receipts=False))
        assert out == []
        assert rx.hits and all(h.valid for h in rx.hits), [h.error for h in rx.hits]
        for mid in mids:
            assert rx.first_deliveries(mid) == ORDER
            mine = [h for h in rx.hits if h.message_id == mid]
            assert sorted(h.webhook_id for h in mine) == sorted(
                f"wh_{mid}_{st}" for st in ORDER for _ in range(2))
            assert {h.path for h in mine} == {"/status"}
        assert not [h for h in rx.hits if h.message_id == quiet]


def test_status_filter(stack: Settings) -> None:
    s = with_rule(stack, 0)
    s = s.model_copy(update={"client_webhooks": s.client_webhooks.model_copy(
        update={"statuses": frozenset({"DELIVERED", "failed"})})})
    with Receiver(secrets(s)) as rx:
        mid = f"msg_wf_{uuid.uuid4().hex}"
        values = [event(mid, st, rx.url()) for st in [*ORDER, "FAILED"]]
        run_main(build_webhook_flow(s, source=TestingSource(events(s, values)),
                                    sink=TestingSink([]), receipts=False))
        assert [h.status for h in rx.delivered()] == ["DELIVERED"]


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_exhausted_and_gone_webhooks_are_dead_lettered(stack: Settings, runner: str) -> None:
    s = with_rule(stack, 0, 30, 30)
    gone = f"msg_wf_gone_{uuid.uuid4().hex}"

    async def behaviour(hit: Hit) -> int:
        return 410 if hit.message_id == gone else 503

    with Receiver(secrets(s), behaviour) as rx:
        never = f"msg_wf_never_{uuid.uuid4().hex}"
        values = [event(never, "PROVIDER_ACCEPTED", rx.url()), event(gone, "SENT", rx.url())]
        out: list[OutRecord] = []
        RUNNERS[runner](build_webhook_flow(s, source=TestingSource(events(s, values)),
                                           sink=TestingSink(out), receipts=False))
    by_id = {d.message_id: d for d in dlq_of(s, out)}
    assert set(by_id) == {never, gone}
    exhausted, stopped = by_id[never], by_id[gone]
    assert (exhausted.error_class, exhausted.category) == ("webhook_exhausted", "unavailable")
    assert [a.error_code for a in exhausted.attempts] == ["503"] * 3
    assert exhausted.headers["webhook_id"] == f"wh_{never}_PROVIDER_ACCEPTED"
    assert exhausted.headers["endpoint"] == endpoint_id(rx.url())
    assert exhausted.source_topic == s.events_topic and exhausted.source_offset == 0
    payload = orjson.loads(DlqCipher.from_settings(s).decrypt(exhausted.payload_encrypted))
    assert payload["url"] == rx.url() and payload["webhook_id"] == f"wh_{never}_PROVIDER_ACCEPTED"
    assert (stopped.error_class, len(stopped.attempts)) == ("webhook_gone", 1)
    assert sum(h.message_id == never for h in rx.hits) == 3


def test_urls_of_events_without_snapshot_come_from_cassandra(stack: Settings) -> None:
    from notiflow.adapters.cassandra.session import connect
    from notiflow.adapters.cassandra.store import CassandraStore

    s = with_rule(stack, 0, 50)
    with Receiver(secrets(s)) as rx:
        mid = f"msg_wf_lookup_{uuid.uuid4().hex}"
        sid = "SM" + uuid.uuid4().hex
        now = datetime.now(UTC)
        cluster, session = connect(s)

        async def seed() -> None:
            store = CassandraStore(session, s)
            await store.messages.create_message(mid, MessageSnapshot.model_validate(
                snapshot(rx.url("/from-row"), now)), Status.QUEUED, now)
            await store.delivery.record_attempt(mid, AttemptRecord(
                attempt_no=1, provider_id="twilio", outcome="accepted",
                provider_message_id=sid, started_at=now, completed_at=now))

        asyncio.run(seed())
        cluster.shutdown()

        def receipt(status: Status, with_id: bool) -> bytes:
            return Receipt(provider_id="twilio", provider_event_id=f"{sid}:{status.value}",
                           provider_message_id=sid, status=status, occurred_at=now,
                           message_id=mid if with_id else None).model_dump_json().encode()

        items = [kmsg(s.events_topic, event(mid, "PROVIDER_ACCEPTED", None,
                                            with_snapshot=False), 0),
                 TestingSource.PAUSE(timedelta(milliseconds=300)),
                 kmsg(s.receipts_topic, receipt(Status.SENT, True), 1),
                 TestingSource.PAUSE(timedelta(milliseconds=300)),
                 kmsg(s.receipts_topic, receipt(Status.DELIVERED, False), 2),
                 kmsg(s.receipts_topic, receipt(Status.DELIVERED, True), 3)]
        out: list[OutRecord] = []
        run_main(build_webhook_flow(s, source=TestingSource(items), sink=TestingSink(out)))
        assert out == []
        assert [h.status for h in rx.delivered()] == ORDER
        assert {h.path for h in rx.hits} == {"/from-row"} and all(h.valid for h in rx.hits)
        assert {h.body["data"].get("tenant_id") for h in rx.hits} == {"acme"}


def test_open_breaker_waits_without_spending_the_schedule(stack: Settings) -> None:
    """One scheduled attempt only: had the open breaker spent it, the webhook would be
    dead-lettered instead of delivered once the breaker lets a probe through."""
    s = with_rule(stack, 0, breaker=BreakerRule(open_for=timedelta(seconds=10)))
    with Receiver(secrets(s)) as rx:
        endpoint = endpoint_id(rx.url())

        async def trip() -> float:
            breakers = CircuitBreakers(s)
            try:
                for _ in range(5):
                    state = await breakers.record(breaker_id("acme", endpoint),
                                                  Outcome.TRANSIENT, "http_500", 0.01)
                assert state is State.OPEN
                snap = breakers.snapshot(breaker_id("acme", endpoint))
                assert snap is not None
                return snap.until_us / 1_000_000
            finally:
                await breakers.aclose()

        until = asyncio.run(trip())
        mid = f"msg_wf_breaker_{uuid.uuid4().hex}"
        out: list[OutRecord] = []
        run_main(build_webhook_flow(s, source=TestingSource(events(s, [
            event(mid, "SENT", rx.url())])), sink=TestingSink(out), receipts=False))
        assert out == []
        [hit] = rx.hits
        assert hit.status == "SENT" and hit.received_at >= until - 0.05


def test_a_pending_retry_survives_a_crash(stack: Settings, tmp_path: Path) -> None:
    s = with_rule(stack, 0, 15_000)
    init_db_dir(tmp_path, 1)
    recovery = RecoveryConfig(tmp_path)
    mid = f"msg_wf_crash_{uuid.uuid4().hex}"
    with Receiver(secrets(s), fail_first) as rx:
        items: list[Any] = [*events(s, [event(mid, "SENT", rx.url())]),
                            TestingSource.PAUSE(timedelta(milliseconds=600)),
                            TestingSource.ABORT()]
        out: list[OutRecord] = []

        def flow(eof_timeout: float) -> Any:
            return build_webhook_flow(s, source=TestingSource(items), sink=TestingSink(out),
                                      receipts=False, eof_timeout=eof_timeout)

        run_main(flow(0.0), epoch_interval=timedelta(milliseconds=100),
                 recovery_config=recovery)
        assert [(h.webhook_id, h.n) for h in rx.hits] == [(f"wh_{mid}_SENT", 1)]
        run_main(flow(60.0), epoch_interval=timedelta(milliseconds=100),
                 recovery_config=recovery)
        assert [(h.webhook_id, h.n) for h in rx.hits] == [(f"wh_{mid}_SENT", 1),
                                                          (f"wh_{mid}_SENT", 2)]
        assert [h.status for h in rx.delivered()] == ["SENT"] and out == []


def test_timeouts_and_server_errors_are_retried_until_delivered(stack: Settings) -> None:
    """First try of every webhook hangs past the client timeout, the second gets a 500, the
    third is answered: each status is seen once validly, after exactly three requests."""
    rule = ClientWebhookRule(schedule=(timedelta(0), timedelta(milliseconds=50),
                                       timedelta(milliseconds=50)),
                             timeout=timedelta(milliseconds=300))
    s = stack.model_copy(update={
        "client_webhooks": rule,
        "breaker": BreakerRule(failure_threshold=1000, min_calls=1000)})

    async def flaky(hit: Hit) -> int:
        if hit.n == 1:
            await asyncio.sleep(1.0)
            return 504
        return 500 if hit.n == 2 else 200

    with Receiver(secrets(s), flaky) as rx:
        mids = [f"msg_wf_flaky_{uuid.uuid4().hex}" for _ in range(3)]
        values = [event(mid, st, rx.url()) for mid in mids for st in ORDER]
        out: list[OutRecord] = []
        run_main(build_webhook_flow(s, source=TestingSource(events(s, values)),
                                    sink=TestingSink(out), receipts=False))
        assert out == []
        assert rx.seen() == {(mid, st) for mid in mids for st in ORDER}
        assert all(rx.counts[f"wh_{mid}_{st}"] == 3 for mid in mids for st in ORDER)
        assert all(h.valid for h in rx.hits)


def test_a_slow_endpoint_keeps_to_its_share_of_the_slots(stack: Settings) -> None:
    """``max_per_endpoint`` bounds the POSTs one endpoint holds, so a slow endpoint cannot
    hold up webhooks to the others."""
    rule = ClientWebhookRule(schedule=(timedelta(0),), timeout=timedelta(seconds=5),
                             max_in_flight=4, max_per_endpoint=2)
    s = stack.model_copy(update={"client_webhooks": rule})

    async def slow(hit: Hit) -> int:
        await asyncio.sleep(0.5)
        return 200

    with Receiver(secrets(s), slow) as sluggish, Receiver(secrets(s)) as quick:
        slow_ids = [f"msg_wf_slow_{uuid.uuid4().hex}" for _ in range(6)]
        quick_ids = [f"msg_wf_quick_{uuid.uuid4().hex}" for _ in range(6)]
        values = [event(mid, "SENT", sluggish.url()) for mid in slow_ids]
        values += [event(mid, "SENT", quick.url()) for mid in quick_ids]
        out: list[OutRecord] = []
        run_main(build_webhook_flow(s, source=TestingSource(events(s, values)),
                                    sink=TestingSink(out), receipts=False))
        assert out == []
        assert sluggish.seen() == {(m, "SENT") for m in slow_ids}
        assert quick.seen() == {(m, "SENT") for m in quick_ids}
        assert sluggish.peak == 2
        last_quick = max(h.received_at for h in quick.hits)
        assert last_quick < min(h.received_at for h in sluggish.hits) + 0.5
