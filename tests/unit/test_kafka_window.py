"""The Kafka-outage window: which acceptances are deferred, refused or published, and how
the deferred ones drain (a fake producer whose acks the test controls)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

import pytest

from notiflow.adapters.kafka_io import DeliveryFailed, OutRecord
from notiflow.gateway.kafka_window import (
    Deferred,
    Outcome,
    Publisher,
    Unconfirmed,
    Window,
)
from notiflow.schemas.enums import Tier
from notiflow.settings import OutageWindow
from tests.fakes import ManualClock

POLICY = OutageWindow(max_messages=3, max_age=timedelta(seconds=60),
                      ack_wait=timedelta(milliseconds=50),
                      p0_ack_wait=timedelta(milliseconds=20),
                      probe_interval=timedelta(milliseconds=10), drain_concurrency=2)


class Producer:
    """``mode``: ``ack`` (acknowledge at once), ``fail`` (DeliveryFailed at once) or
    ``hang`` (a future the test resolves through :meth:`finish`)."""

    def __init__(self) -> None:
        self.mode = "ack"
        self.sent: list[bytes] = []
        self.hanging: list[asyncio.Future[None]] = []

    async def produce(self, record: OutRecord) -> None:
        if self.mode == "fail":
            raise DeliveryFailed("broker down")
        if self.mode == "hang":
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.hanging.append(fut)
            await fut
        self.sent.append(record.value)

    def finish(self, ok: bool) -> None:
        for fut in self.hanging:
            if ok:
                fut.set_result(None)
            else:
                fut.set_exception(DeliveryFailed("timed out"))
        self.hanging.clear()


class Harness:
    def __init__(self, policy: OutageWindow = POLICY) -> None:
        self.clock = ManualClock(1000.0)
        self.window = Window(policy, self.clock)
        self.producer = Producer()
        self.p0_producer = self.producer
        """The same fake unless a test gives P0 its own."""
        self.kafka_answers = False
        self.settled: list[str] = []
        self.undone: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.publisher = Publisher(self.window, self.producer_for, self.spawn, self.probe)

    def producer_for(self, tier: Tier) -> Any:
        return self.p0_producer if tier is Tier.P0 else self.producer

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self.tasks.append(asyncio.ensure_future(coro))

    async def probe(self) -> bool:
        return self.kafka_answers

    def entry(self, mid: str, tier: Tier = Tier.P2, key: bytes | None = None) -> Deferred:
        async def settle() -> None:
            self.settled.append(mid)

        return Deferred(mid, tier, OutRecord("ingest", key or mid.encode(), mid.encode()),
                        settle, ordered=key is not None)

    async def publish(self, mid: str, tier: Tier = Tier.P2, key: bytes | None = None,
                      **kw: Any) -> Outcome:
        async def undo() -> None:
            self.undone.append(mid)

        return await self.publisher.publish(self.entry(mid, tier, key), undo, **kw)

    async def settle_tasks(self) -> None:
        await asyncio.gather(*self.tasks)
        self.tasks.clear()


async def test_acknowledged_records_are_published_and_kafka_stays_up() -> None:
    h = Harness()
    assert await h.publish("m1") is Outcome.PUBLISHED
    assert await h.publish("p0", Tier.P0) is Outcome.PUBLISHED
    assert h.producer.sent == [b"m1", b"p0"]
    assert not h.window.down and len(h.window) == 0


async def test_p0_records_go_through_their_own_producer() -> None:
    h = Harness()
    h.p0_producer = Producer()
    for mid, tier in (("p1", Tier.P1), ("p0", Tier.P0), ("p3", Tier.P3)):
        assert await h.publish(mid, tier) is Outcome.PUBLISHED
    assert h.p0_producer.sent == [b"p0"]
    assert h.producer.sent == [b"p1", b"p3"]


async def test_a_bulk_backlog_on_the_shared_producer_does_not_hold_p0() -> None:
    h = Harness()
    h.p0_producer = Producer()
    h.producer.mode = "hang"
    assert await h.publish("p1", Tier.P1) is Outcome.DEFERRED
    assert h.window.down and h.window.refusal(Tier.P0) is None
    assert await h.publish("p0", Tier.P0) is Outcome.PUBLISHED
    assert h.p0_producer.sent == [b"p0"] and not h.window.down
    h.p0_producer.mode = "hang"
    with pytest.raises(Unconfirmed):
        await h.publish("p0-slow", Tier.P0)
    assert h.window.refusal(Tier.P0) == "kafka_unavailable"
    h.p0_producer.finish(ok=True)
    h.producer.finish(ok=True)
    await h.settle_tasks()
    assert sorted(h.settled) == ["p0-slow", "p1"]


async def test_a_failed_delivery_defers_p1_to_p3_and_refuses_p0() -> None:
    h = Harness()
    h.producer.mode = "fail"
    assert await h.publish("m1") is Outcome.DEFERRED
    assert h.window.down
    assert h.window.refusal(Tier.P0) == "kafka_unavailable"
    assert h.window.refusal(Tier.P2) is None
    with pytest.raises(DeliveryFailed):
        await h.publish("p0", Tier.P0)
    assert await h.publish("m2", Tier.P1) is Outcome.DEFERRED
    assert [d.message_id for d in h.window.deferred()] == ["m1", "m2"]
    assert h.producer.sent == []


async def test_window_is_bounded_by_count_and_by_age() -> None:
    h = Harness()
    h.producer.mode = "fail"
    for mid in ("a", "b", "c"):
        assert await h.publish(mid) is Outcome.DEFERRED
    assert h.window.full()
    assert h.window.refusal(Tier.P3) == "outage_window_full"
    with pytest.raises(DeliveryFailed):
        await h.publish("d")

    aged = Harness()
    aged.producer.mode = "fail"
    await aged.publish("a")
    aged.clock.now += 59
    assert not aged.window.full()
    aged.clock.now += 1
    assert aged.window.full() and aged.window.refusal(Tier.P1) == "outage_window_full"
    assert aged.window.oldest_age() == 60


async def test_no_window_means_every_failure_is_refused() -> None:
    h = Harness(POLICY.model_copy(update={"max_messages": 0}))
    h.producer.mode = "fail"
    with pytest.raises(DeliveryFailed):
        await h.publish("m1")
    assert len(h.window) == 0


async def test_a_slow_ack_defers_and_the_late_ack_settles() -> None:
    h = Harness()
    h.producer.mode = "hang"
    assert await h.publish("m1") is Outcome.DEFERRED
    assert h.window.down and len(h.window) == 1
    h.producer.finish(ok=True)
    await h.settle_tasks()
    assert h.settled == ["m1"] and len(h.window) == 0 and not h.window.down


async def test_a_slow_ack_that_then_fails_stays_deferred_for_the_drain() -> None:
    h = Harness()
    h.producer.mode = "hang"
    await h.publish("m1")
    h.producer.finish(ok=False)
    await h.settle_tasks()
    assert h.settled == [] and len(h.window) == 1 and h.window.down


async def test_unconfirmed_p0_is_refused_then_settled_or_undone_in_the_background() -> None:
    h = Harness()
    h.producer.mode = "hang"
    with pytest.raises(Unconfirmed):
        await h.publish("p0-ok", Tier.P0)
    h.producer.finish(ok=True)
    await h.settle_tasks()
    assert h.settled == ["p0-ok"] and h.undone == []

    with pytest.raises(Unconfirmed):
        await h.publish("p0-lost", Tier.P0)
    h.producer.finish(ok=False)
    await h.settle_tasks()
    assert h.undone == ["p0-lost"] and len(h.window) == 0


async def test_the_sweepers_call_never_defers() -> None:
    h = Harness()
    h.producer.mode = "fail"
    with pytest.raises(DeliveryFailed):
        await h.publish("m1", deferrable=False)
    h.producer.mode = "ack"
    assert await h.publish("m2", deferrable=False) is Outcome.PUBLISHED
    assert len(h.window) == 0 and not h.window.down


async def test_a_sweeper_failure_marks_kafka_down_only_when_the_broker_is_silent() -> None:
    h = Harness()
    h.producer.mode = "fail"
    h.kafka_answers = True
    with pytest.raises(DeliveryFailed):
        await h.publish("gone-topic", deferrable=False)
    assert not h.window.down
    h.kafka_answers = False
    with pytest.raises(DeliveryFailed):
        await h.publish("m1", deferrable=False)
    assert h.window.down


async def test_drain_publishes_oldest_first_once_kafka_acknowledges() -> None:
    h = Harness()
    h.producer.mode = "fail"
    for mid in ("a", "b", "c"):
        await h.publish(mid)
    assert await h.publisher.drain_once() == 0
    assert len(h.window) == 3
    h.producer.mode = "ack"
    assert await h.publisher.drain_once() == 3
    assert h.producer.sent == [b"a", b"b", b"c"]
    assert h.settled == ["a", "b", "c"]
    assert len(h.window) == 0 and not h.window.down


async def test_an_ordering_key_behind_a_deferred_record_waits_its_turn() -> None:
    h = Harness()
    h.producer.mode = "fail"
    await h.publish("first", key=b"acme:order-1")
    h.producer.mode = "ack"
    h.window.mark_up()
    assert await h.publish("second", key=b"acme:order-1") is Outcome.DEFERRED
    assert await h.publish("other", key=b"acme:order-2") is Outcome.PUBLISHED
    await h.publisher.drain_once()
    assert h.producer.sent == [b"other", b"first", b"second"]


async def test_probe_marks_kafka_up_when_nothing_is_deferred() -> None:
    h = Harness()
    h.window.mark_down("test")
    await h.publisher.drain_once()
    assert h.window.down
    h.kafka_answers = True
    await h.publisher.drain_once()
    assert not h.window.down
