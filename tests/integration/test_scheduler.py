"""The scheduler against the real stack: rows in Cassandra's buckets, two scheduler processes
(one SIGKILLed), records read back from Kafka; shard leases as lightweight transactions."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from cassandra.cluster import Session
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from notiflow.adapters.cassandra.values import to_ms
from notiflow.adapters.envelope import envelope, load
from notiflow.adapters.kafka_io import AsyncProducer, OutRecord, header, make_headers
from notiflow.adapters.scheduled_store import ScheduledStore
from notiflow.flows.scheduling.due_work import Scheduler
from notiflow.ops.procs import ManagedProcess, ProcessGroup
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import IngestRecord, new_message_id
from notiflow.schemas.scheduling import ScheduledRow
from notiflow.settings import Settings
from tests.fakes import ManualClock
from tests.helpers import hold_async, read_topic, signed, wait_until

pytestmark = pytest.mark.integration

BEFORE_CRASH_S = 15.0
"""How long the schedulers publish before one of them is killed."""


@pytest.fixture
async def board(stack: Settings, cql: Session) -> AsyncIterator[ScheduledStore]:
    yield ScheduledStore(cql, stack)


@pytest.fixture(scope="module")
def schedulers(stack: Settings, log_dir: Path) -> Iterator[list[ManagedProcess]]:
    group = ProcessGroup()
    procs = [group.add(ManagedProcess(f"scheduler-{n}", ["flow", "scheduler", "--name", n],
                                      log_dir)).start() for n in ("a", "b")]
    try:
        for p in procs:
            p.wait_until(lambda p=p: "claimed shard" in p.log_path.read_text(), timeout=60)
        yield procs
    finally:
        group.stop_all()


def row(settings: Settings, board: ScheduledStore, due: datetime, *,
        expires_at: datetime | None = None) -> ScheduledRow:
    """A valid P3 SMS ingest record due at ``due``, as the API would store it."""
    message_id = new_message_id()
    due = to_ms(due)
    record = IngestRecord.model_validate({
        "message_id": message_id, "tenant_id": "mkt", "channel": "SMS", "tier": "P3",
        "recipient": "+14155550100", "template_id": "otp", "template_version": 1,
        "variables": {"code": "1"}, "accepted_at": datetime.now(UTC),
        "expires_at": expires_at or due + timedelta(hours=1), "scheduled_at": due})
    bucket, shard = board.place(message_id, due)
    return ScheduledRow(bucket, shard, due, message_id,
                        settings.ingest_topic(Channel.SMS, Tier.P3),
                        record.model_dump_json(exclude_none=True), "mkt", "P3",
                        expires_at=record.expires_at)


def published(settings: Settings, topic: str, ids: set[str], until: float
              ) -> dict[str, list[datetime]]:
    """Producer timestamps of every record of ``topic`` whose message id is in ``ids``,
    read until all were seen and ``until`` (monotonic) passed."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap,
                         "group.id": f"test-scheduler-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    seen: dict[str, list[datetime]] = {}
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        deadline = until + 30
        while time.monotonic() < deadline and (len(seen) < len(ids)
                                               or time.monotonic() < until):
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            mid = header(msg.headers(), "message_id")
            if mid in ids:
                at = datetime.fromtimestamp(msg.timestamp()[1] / 1000, UTC)
                seen.setdefault(mid, []).append(at)
    finally:
        consumer.close()
    return seen


async def published_by(settings: Settings, topic: str, ids: set[str], after: float
                       ) -> set[str]:
    """Which of ``ids`` ``topic`` holds ``after`` seconds from now, read to its end then."""
    await hold_async(after)
    return await asyncio.to_thread(lambda: {
        mid for m in read_topic(settings, topic, timeout=30)
        if (mid := header(m.headers(), "message_id")) in ids})


@pytest.mark.solo
async def test_rows_are_published_on_time_across_a_scheduler_crash(
        stack: Settings, board: ScheduledStore, schedulers: list[ManagedProcess]) -> None:
    now = datetime.now(UTC)
    rows = [row(stack, board, now + timedelta(seconds=5, milliseconds=100 * i))
            for i in range(300)]
    await asyncio.gather(*(board.add(r, now) for r in rows))
    await hold_async(BEFORE_CRASH_S)
    schedulers[0].kill()
    seen = await asyncio.to_thread(published, stack, rows[0].topic,
                                   {r.message_id for r in rows}, time.monotonic() + 22)
    due = {r.message_id: r.scheduled_at for r in rows}
    assert set(seen) == set(due), f"{len(due) - len(seen)} rows never published"
    early = [m for m, at in seen.items() if min(at) < due[m] - timedelta(milliseconds=5)]
    assert not early, f"{len(early)} published before their scheduled_at"
    late = sorted((min(at) - due[m]).total_seconds() for m, at in seen.items())
    p99 = late[int(len(late) * 0.99) - 1]
    assert p99 <= 2.0, f"lateness p99 {p99:.3f} s"
    copies = sum(len(at) - 1 for at in seen.values())
    assert copies <= 50, f"{copies} rows published twice"
    stored = await asyncio.gather(*(board.get(r.message_id, r.scheduled_at) for r in rows))
    assert all(s is not None and s.released_at is not None for s in stored)


async def test_a_row_that_expired_while_waiting_becomes_an_expired_event(
        stack: Settings, board: ScheduledStore, schedulers: list[ManagedProcess]) -> None:
    now = datetime.now(UTC)
    due = now + timedelta(seconds=3)
    r = row(stack, board, due, expires_at=due)
    await board.add(r, now)
    seen = await asyncio.to_thread(published, stack, stack.events_topic, {r.message_id},
                                   time.monotonic())
    assert r.message_id in seen
    consumer_ids = await published_by(stack, r.topic, {r.message_id}, 2)
    assert r.message_id not in consumer_ids


async def test_a_cancelled_row_is_never_published(
        stack: Settings, board: ScheduledStore, schedulers: list[ManagedProcess]) -> None:
    now = datetime.now(UTC)
    r = row(stack, board, now + timedelta(seconds=3))
    await board.add(r, now)
    await board.unschedule(r.message_id, r.scheduled_at)
    seen = await published_by(stack, r.topic, {r.message_id}, 6)
    assert r.message_id not in seen


async def test_shard_leases_are_exclusive(stack: Settings, cql: Session) -> None:
    ring = f"test-{uuid.uuid4().hex[:8]}"
    one, two = ScheduledStore(cql, stack, ring), ScheduledStore(cql, stack, ring)
    now = datetime.now(UTC)
    until = now + timedelta(seconds=30)
    wins = await asyncio.gather(one.claim(3, "one", until, now, exists=False),
                                two.claim(3, "two", until, now, exists=False))
    assert sorted(wins) == [False, True]
    owner = "one" if wins[0] else "two"
    other = "two" if owner == "one" else "one"
    assert await one.renew(owner, until, {3: None})
    assert not await one.renew(other, until, {3: None})
    assert not await two.claim(3, other, until, now, exists=True)
    await one.give_up([3], owner, datetime.now(UTC), {3: now})
    later = datetime.now(UTC) + timedelta(milliseconds=10)
    assert await two.claim(3, other, later + timedelta(seconds=30), later, exists=True)
    (lease,) = [x for x in await two.leases() if x.shard == 3]
    assert lease.owner == other and lease.watermark is not None


async def test_a_message_scheduled_25_days_ahead_is_sent_and_stays_queryable(
        stack: Settings, cql: Session, api: str, tokens: dict[str, str]) -> None:
    """Accepted through the API, released by a scheduler whose clock is 25 days ahead, and
    its message row outlives the send by the operational retention."""
    due = datetime.now(UTC) + timedelta(days=25)
    auth = {"Authorization": f"Bearer {tokens['mkt']}"}
    async with httpx.AsyncClient(base_url=api, timeout=10) as client:
        tpl = await client.post("/v1/templates", headers=auth,
                                json={"template_id": f"far-{uuid.uuid4().hex[:6]}",
                                      "channel": "SMS", "body": "Sale {{ code }}"})
        assert tpl.status_code in (200, 201), tpl.text
        r = await client.post("/v1/messages", headers=auth,
                              json={"channel": "SMS", "tier": "P3", "recipient": "+14155550100",
                                    "template_id": tpl.json()["template_id"],
                                    "template_version": tpl.json()["version"],
                                    "variables": {"code": "1"},
                                    "scheduled_at": due.isoformat()})
    assert r.status_code == 202, r.text
    message_id = r.json()["message_id"]
    (ttl,) = cql.execute("SELECT TTL(tenant_id) AS t FROM messages WHERE message_id = %s",
                         (message_id,)).one().values()
    retention = stack.operational_ttl.total_seconds()
    assert ttl >= (due - datetime.now(UTC)).total_seconds() + retention - 60

    clock = ManualClock(due + timedelta(seconds=1))
    board = ScheduledStore(cql, stack, ring=f"future-{uuid.uuid4().hex[:6]}")
    producer = AsyncProducer(stack)

    async def publish(records: Sequence[OutRecord]) -> None:
        await asyncio.gather(*(producer.produce(x) for x in records))

    try:
        sched = Scheduler(stack, board, publish, "future", clock)
        await sched.tick_leases()
        await sched.tick_release()
    finally:
        await asyncio.to_thread(producer.close)
    topic = stack.ingest_topic(Channel.SMS, Tier.P3)
    seen = await asyncio.to_thread(published, stack, topic, {message_id}, time.monotonic())
    assert message_id in seen
    stored = await board.get(message_id, to_ms(due))
    assert stored is not None and stored.released_at is not None


async def test_a_long_retry_waits_in_a_bucket_and_returns_when_due(
        stack: Settings, board: ScheduledStore, schedulers: list[ManagedProcess]) -> None:
    now = datetime.now(UTC)
    due = now + timedelta(seconds=4)
    r = row(stack, board, now)
    record = load(r.payload, envelope(stack)).model_copy(
        update={"attempt": 3, "not_before": due, "scheduled_at": None})
    producer = AsyncProducer(stack)
    try:
        await producer.produce(signed(stack, OutRecord(
            stack.delayed_topic, r.message_id.encode(),
            record.model_dump_json(exclude_none=True).encode(),
            make_headers(r.message_id, "mkt", "P3"))))
    finally:
        await asyncio.to_thread(producer.close)

    async def stored() -> ScheduledRow | None:
        return await board.get(r.message_id, to_ms(due))

    await wait_until(stored, timeout=10, interval=0.2, what="the delayed record in its bucket")
    waiting = await stored()
    assert waiting is not None, "the delayed record never reached its bucket"
    assert waiting.released_at is None
    assert load(waiting.payload, envelope(stack)).attempt == 3
    raw = board.session.execute(
        "SELECT payload FROM scheduled_work WHERE time_bucket = %s AND shard = %s "
        "AND scheduled_at = %s AND message_id = %s",
        (waiting.time_bucket, waiting.shard, waiting.scheduled_at, r.message_id)).one()
    assert "+1415" not in raw["payload"], "the payload is not encrypted at rest"
    seen = await asyncio.to_thread(published, stack, r.topic, {r.message_id},
                                   time.monotonic())
    assert min(seen[r.message_id]) >= to_ms(due) - timedelta(milliseconds=5)
