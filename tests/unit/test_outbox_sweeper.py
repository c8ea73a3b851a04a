"""The outbox sweeper's cursor over time buckets, on an in-memory store: a round reads the
pending rows and a few buckets whatever the history, publishes what is pending, parks what
cannot be published, never passes a bucket it could not empty, and drains the legacy table
once; where a row goes when it is written late."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from notiflow.adapters.cassandra.idempotency import (
    OUTBOX_SHARDS,
    OutboxRow,
    OutboxSlot,
    ReservationRow,
)
from notiflow.gateway import sweeper as sweeper_module
from notiflow.gateway.kafka_window import Window
from notiflow.gateway.outbox import ON_TIME, outbox_shard, outbox_slot
from notiflow.gateway.sweeper import OutboxSweeper
from notiflow.settings import Settings

NOW = datetime(2026, 12, 4, 15, 0, tzinfo=UTC)
PAYLOAD = ('{"channel":"SMS","tier":"P2","tenant_id":"acme","recipient":"+14155550100",'
           '"template_id":"t","template_version":1,"message_id":"msg_1",'
           '"accepted_at":"2026-12-04T14:00:00Z"}')


@dataclass
class Store:
    rows: dict[tuple[int | None, int], list[dict[str, Any]]] = field(
        default_factory=lambda: defaultdict(list))
    reservations: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    cursors: dict[int, int] = field(default_factory=dict)
    parked: list[tuple[str, str, str]] = field(default_factory=list)
    reads: int = 0

    @property
    def idempotency(self) -> Store:
        return self

    def add(self, slot: OutboxSlot, created_at: datetime, tenant: str, key: str,
            state: str = "PENDING", payload: str | None = PAYLOAD) -> None:
        self.rows[(slot.bucket, slot.shard)].append(
            {"created_at": created_at.replace(tzinfo=None), "tenant_id": tenant,
             "idempotency_key": key})
        self.reservations[(tenant, key)] = {"state": state, "payload": payload,
                                            "topic": "t" if payload else None}

    async def outbox_rows(self, slot: OutboxSlot) -> list[OutboxRow]:
        self.reads += 1
        return [OutboxRow.of(r) for r in self.rows.get((slot.bucket, slot.shard), [])]

    async def outbox_remove(self, slot: OutboxSlot, created_at: datetime, tenant: str,
                            key: str) -> None:
        self.rows[(slot.bucket, slot.shard)] = [
            r for r in self.rows[(slot.bucket, slot.shard)]
            if (r["tenant_id"], r["idempotency_key"]) != (tenant, key)]

    async def outbox_cursor(self, shard: int, start: int) -> int:
        return self.cursors.setdefault(shard, start)

    async def outbox_advance(self, shard: int, bucket: int) -> None:
        self.cursors[shard] = bucket

    async def outbox_park(self, slot: OutboxSlot, created_at: datetime, tenant: str, key: str,
                          reason: str, now: datetime) -> None:
        self.parked.append((tenant, key, reason))
        await self.outbox_remove(slot, created_at, tenant, key)

    async def get_reservation(self, tenant: str, key: str) -> ReservationRow | None:
        found = self.reservations.get((tenant, key))
        return ReservationRow(tenant, key, **found) if found is not None else None


class Runtime:
    connected = True

    def __init__(self, store: Store) -> None:
        self.settings = Settings()
        self._store = store
        self.window = Window(self.settings.kafka_window)

    def store(self) -> Store:
        return self._store

    async def topic_exists(self, topic: str) -> bool | None:
        return {"t": True, "gone": False}.get(topic)


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Keys the sweeper published (complete_acceptance replaced by one that settles)."""
    done: list[str] = []

    async def complete(rt: Runtime, *, tenant_id: str, key: str, created_at: datetime,
                       slot: OutboxSlot, **_: Any) -> str:
        store = rt.store()
        if key.startswith("fail"):
            raise RuntimeError("Kafka down")
        done.append(key)
        store.reservations[(tenant_id, key)]["state"] = "ACCEPTED"
        await store.idempotency.outbox_remove(slot, created_at, tenant_id, key)
        return "{}"

    monkeypatch.setattr(sweeper_module, "complete_acceptance", complete)
    return done


def sweeper(store: Store) -> OutboxSweeper:
    s = OutboxSweeper(Runtime(store))  # type: ignore[arg-type]
    s.legacy_done = True
    return s


async def running() -> tuple[Store, OutboxSweeper]:
    """A store and a sweeper that has made its first round at NOW (cursors set)."""
    store = Store()
    s = sweeper(store)
    await s.sweep_once(NOW)
    return store, s


def slot_at(at: datetime, shard: int = 3) -> OutboxSlot:
    return OutboxSlot(OutboxSlot.bucket_of(at), shard)


async def test_a_round_reads_a_few_buckets_whatever_the_history(published: list[str]) -> None:
    store = Store()
    s = sweeper(store)
    start = NOW - timedelta(hours=3)
    for shard in range(OUTBOX_SHARDS):
        store.cursors[shard] = OutboxSlot.bucket_of(start)
    assert await s.sweep_once(start + timedelta(hours=2)) == 0
    assert store.reads == OUTBOX_SHARDS * 360
    store.add(slot_at(NOW - timedelta(minutes=2)), NOW - timedelta(minutes=2), "acme", "k1")
    for back in (60, 30, 0):
        await s.sweep_once(NOW - timedelta(minutes=back))
    assert published == ["k1"]
    store.reads = 0
    await s.sweep_once(NOW + timedelta(seconds=5))
    assert store.reads <= OUTBOX_SHARDS * 2
    assert all(c == s.last_bucket(NOW + timedelta(seconds=5)) + 1
               for c in store.cursors.values())


async def test_recent_rows_wait_and_old_ones_are_published_or_cleaned(
        published: list[str]) -> None:
    store, s = await running()
    young = NOW + timedelta(seconds=20)
    store.add(slot_at(young), young, "acme", "young")
    old = NOW + timedelta(seconds=1)
    store.add(slot_at(old), old, "acme", "done", state="ACCEPTED")
    store.add(slot_at(old), old, "acme", "pending")
    wait = s.min_age + timedelta(seconds=30)
    assert await s.sweep_once(NOW + wait) == 2
    assert published == ["pending"]
    assert [r["idempotency_key"] for rows in store.rows.values() for r in rows] == ["young"]
    assert await s.sweep_once(young + wait) == 1
    assert published == ["pending", "young"]


async def test_what_cannot_be_published_is_parked_and_the_cursor_moves_on(
        published: list[str]) -> None:
    store, s = await running()
    at = NOW + timedelta(seconds=1)
    store.add(slot_at(at), at, "acme", "broken", payload=None)
    store.add(slot_at(at + timedelta(seconds=10)), at, "acme", "next")
    await s.sweep_once(NOW + timedelta(minutes=2))
    assert store.parked == [("acme", "broken", "ValueError")] and published == ["next"]
    assert store.cursors[3] == s.last_bucket(NOW + timedelta(minutes=2)) + 1


async def test_an_entry_for_a_topic_that_is_gone_is_parked_not_retried(
        published: list[str]) -> None:
    store, s = await running()
    at = NOW + timedelta(seconds=1)
    store.add(slot_at(at), at, "acme", "orphan")
    store.reservations[("acme", "orphan")]["topic"] = "gone"
    store.add(slot_at(at), at, "acme", "unknown")
    store.reservations[("acme", "unknown")]["topic"] = "unanswered"
    await s.sweep_once(NOW + timedelta(minutes=2))
    assert store.parked == [("acme", "orphan", "unknown_topic")]
    assert published == ["unknown"]


async def test_a_bucket_it_could_not_empty_holds_the_cursor(published: list[str]) -> None:
    store, s = await running()
    at = NOW + timedelta(seconds=1)
    store.add(slot_at(at), at, "acme", "fail-1")
    later = NOW + timedelta(minutes=2)
    with pytest.raises(RuntimeError):
        await s.sweep_once(later)
    assert store.cursors[3] == OutboxSlot.bucket_of(at)
    store.reservations[("acme", "fail-1")]["state"] = "ACCEPTED"
    assert await s.sweep_once(later) == 1
    assert store.cursors[3] == s.last_bucket(later) + 1


async def test_the_legacy_table_is_drained_then_left_alone(published: list[str]) -> None:
    store = Store()
    s = OutboxSweeper(Runtime(store))  # type: ignore[arg-type]
    old = NOW - timedelta(minutes=10)
    store.add(OutboxSlot(None, 5), old, "acme", "legacy")
    store.add(OutboxSlot(None, 6), NOW, "acme", "legacy-young")
    await s.sweep_once(NOW)
    assert published == ["legacy"] and not s.legacy_done
    await s.sweep_once(NOW + timedelta(minutes=1))
    assert published == ["legacy", "legacy-young"] and s.legacy_done
    store.reads = 0
    await s.sweep_once(NOW + timedelta(minutes=2))
    assert store.reads <= OUTBOX_SHARDS * 7


async def test_a_failing_legacy_table_never_holds_up_the_buckets(
        published: list[str]) -> None:
    class Overwhelmed(Store):
        async def outbox_rows(self, slot: OutboxSlot) -> list[OutboxRow]:
            if slot.bucket is None:
                raise RuntimeError("TombstoneOverwhelmingException")
            return await super().outbox_rows(slot)

    store = Overwhelmed()
    s = OutboxSweeper(Runtime(store))  # type: ignore[arg-type]
    await s.sweep_once(NOW)
    at = NOW + timedelta(seconds=1)
    store.add(slot_at(at), at, "acme", "fresh")
    assert await s.sweep_once(NOW + timedelta(minutes=2)) == 1
    assert published == ["fresh"] and not s.legacy_done


def test_a_row_written_late_goes_to_the_bucket_it_is_written_in() -> None:
    created = NOW
    on_time = outbox_slot("acme", "k", created, created + ON_TIME)
    late = outbox_slot("acme", "k", created, created + ON_TIME + timedelta(seconds=1))
    assert on_time == OutboxSlot(OutboxSlot.bucket_of(created), outbox_shard("acme", "k"))
    assert late.bucket == OutboxSlot.bucket_of(created + ON_TIME + timedelta(seconds=1))
    s = sweeper(Store())
    written_by = created + ON_TIME + timedelta(seconds=10)
    assert s.last_bucket(written_by + s.min_age) < OutboxSlot.bucket_of(written_by)


async def test_no_round_while_kafka_is_known_down(published: list[str]) -> None:
    store, s = await running()
    store.add(slot_at(NOW), NOW, "acme", "k1")
    later = NOW + timedelta(minutes=2)
    s.rt.window.mark_down("test")
    reads = store.reads
    assert await s.sweep_once(later) == 0
    assert store.reads == reads and published == []
    s.rt.window.mark_up()
    assert await s.sweep_once(later) == 1
    assert published == ["k1"]
