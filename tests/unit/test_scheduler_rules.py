"""The scheduler's rules against an in-memory board: which rows are released when, watermarks,
fair shares, lost leases, expiry, and the bucket layout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from cryptography.fernet import Fernet
from hypothesis import given
from hypothesis import strategies as st

from notiflow.adapters.delayed_intake import Delayed
from notiflow.adapters.kafka_io import OutRecord
from notiflow.adapters.scheduled_store import ShardLease
from notiflow.flows.common.items import Retry, SourceRef, Work
from notiflow.flows.common.steps import Encoder
from notiflow.flows.scheduling.due_work import Scheduler
from notiflow.ingest_binding import binder
from notiflow.schemas.messages import IngestRecord
from notiflow.schemas.scheduling import ScheduledRow, bucket_of, fair_share, shard_of
from notiflow.settings import SchedulingRule, Settings
from tests.fakes import ManualClock

T0 = datetime(2027, 3, 1, 12, 0, 0, tzinfo=UTC)


@dataclass
class FakeBoard:
    """``scheduled_work`` and the lease table in memory, with Cassandra's ordering."""

    rows: dict[tuple[datetime, int], dict[tuple[datetime, str], ScheduledRow]] = field(
        default_factory=dict)
    lease_rows: dict[int, ShardLease] = field(default_factory=dict)
    alive: dict[str, datetime] = field(default_factory=dict)

    def put(self, row: ScheduledRow) -> None:
        self.rows.setdefault((row.time_bucket, row.shard), {})[row.position] = row

    async def leases(self) -> list[ShardLease]:
        return list(self.lease_rows.values())

    async def claim(self, shard: int, owner: str, until: datetime, now: datetime,
                    exists: bool) -> bool:
        cur = self.lease_rows.get(shard)
        if cur is not None and cur.lease_until is not None and cur.lease_until >= now:
            return False
        self.lease_rows[shard] = ShardLease(shard, owner, until, cur.watermark if cur else None)
        return True

    async def renew(self, owner: str, until: datetime,
                    watermarks: dict[int, datetime | None]) -> bool:
        if any(self.lease_rows[s].owner != owner for s in watermarks):
            return False
        for s, mark in watermarks.items():
            self.lease_rows[s] = ShardLease(s, owner, until, mark)
        return True

    async def give_up(self, shards: Sequence[int], owner: str, now: datetime,
                      watermarks: dict[int, datetime | None]) -> None:
        for s in shards:
            if self.lease_rows[s].owner == owner:
                self.lease_rows[s] = ShardLease(s, owner, now - timedelta(milliseconds=1),
                                                watermarks.get(s))

    async def members(self, now: datetime) -> list[str]:
        return [o for o, until in self.alive.items() if until > now]

    async def heartbeat(self, owner: str, until: datetime) -> None:
        self.alive[owner] = until

    async def leave(self, owner: str) -> None:
        self.alive.pop(owner, None)

    async def due(self, bucket: datetime, shard: int, after: tuple[datetime, str],
                  until: datetime, limit: int) -> list[ScheduledRow]:
        part = self.rows.get((bucket, shard), {})
        return [part[k] for k in sorted(part) if k > after and k[0] <= until][:limit]

    async def mark_released(self, rows: Sequence[ScheduledRow], at: datetime,
                            owner: str) -> None:
        for r in rows:
            self.put(replace(r, released_at=at))

    async def add(self, row: ScheduledRow, now: datetime) -> None:
        self.put(row)


KEY = Fernet.generate_key().decode()


def settings(**rule: object) -> Settings:
    return Settings(dlq_key=KEY, scheduling=SchedulingRule.model_validate(
        {"shards": 4, "bucket": timedelta(minutes=1), "page": 3, **rule}))


def row(s: Settings, mid: str, due: datetime, expires_at: datetime | None = None,
        payload: str | None = None) -> ScheduledRow:
    record = IngestRecord.model_validate({
        "message_id": mid, "tenant_id": "mkt", "channel": "SMS", "tier": "P3",
        "recipient": "+14155550100", "template_id": "t", "template_version": 1,
        "accepted_at": T0 - timedelta(hours=1), "scheduled_at": due,
        "expires_at": expires_at or due + timedelta(hours=1)})
    return ScheduledRow(bucket_of(due, s.scheduling.bucket),
                        shard_of(mid, s.scheduling.shards), due, mid,
                        s.ingest_topic(record.channel, record.tier),
                        payload or record.model_dump_json(exclude_none=True), "mkt", "P3",
                        expires_at=record.expires_at)


def scheduler(s: Settings, board: FakeBoard, clock: ManualClock[datetime], owner: str = "a"
              ) -> tuple[Scheduler, list[OutRecord]]:
    out: list[OutRecord] = []

    async def publish(records: Sequence[OutRecord]) -> None:
        out.extend(records)

    return Scheduler(s, board, publish, owner, clock), out


def ids(out: list[OutRecord]) -> list[str]:
    return [dict(o.headers)["message_id"].decode()  # type: ignore[union-attr]
            for o in out]


async def test_due_rows_are_released_in_order_once_and_later_ones_wait() -> None:
    s, board, clock = settings(), FakeBoard(), ManualClock(T0)
    rows = [row(s, f"m{i}", T0 + timedelta(seconds=10 * i)) for i in range(12)]
    for r in rows:
        board.put(r)
    sched, out = scheduler(s, board, clock)
    await sched.tick_leases()
    assert sorted(sched.held) == [0, 1, 2, 3]
    clock.now = T0 + timedelta(seconds=35)
    await sched.tick_leases()
    done = await sched.tick_release()
    assert done.published == 4
    assert sorted(ids(out)) == ["m0", "m1", "m2", "m3"]
    await sched.tick_release()
    assert len(out) == 4
    clock.now = T0 + timedelta(minutes=5)
    await sched.tick_leases()
    await sched.tick_release()
    assert sorted(ids(out)) == sorted(r.message_id for r in rows)
    assert all(x.released_at is not None for p in board.rows.values() for x in p.values())
    assert all(st.watermark == bucket_of(clock.now, s.scheduling.bucket)
               for st in sched.held.values())


async def test_a_new_owner_resumes_from_the_watermark_and_skips_released_rows() -> None:
    s, board, clock = settings(), FakeBoard(), ManualClock(T0)
    first = [row(s, f"m{i}", T0 + timedelta(seconds=i)) for i in range(5)]
    for r in first:
        board.put(r)
    a, out_a = scheduler(s, board, clock, "a")
    await a.tick_leases()
    clock.now = T0 + timedelta(minutes=2)
    await a.tick_leases()
    await a.tick_release()
    await a.tick_leases()
    marks = {sh: st.watermark for sh, st in a.held.items()}
    later = row(s, "late", T0 + timedelta(minutes=2, seconds=30))
    board.put(later)
    clock.now = T0 + timedelta(minutes=3)
    b, out_b = scheduler(s, board, clock, "b")
    await b.tick_leases()
    assert {sh: st.watermark for sh, st in b.held.items()} == marks
    await b.tick_release()
    assert ids(out_b) == ["late"]
    assert len(out_a) == 5


async def test_a_crash_between_publish_and_mark_publishes_again_once() -> None:
    s, board, clock = settings(), FakeBoard(), ManualClock(T0)
    board.put(row(s, "m", T0 + timedelta(seconds=1)))
    a, out_a = scheduler(s, board, clock, "a")
    await a.tick_leases()

    async def crash(rows: Sequence[ScheduledRow], at: datetime, owner: str) -> None:
        raise ConnectionError("process died")

    board_mark = board.mark_released
    board.mark_released = crash  # type: ignore[method-assign]
    clock.now = T0 + timedelta(seconds=2)
    await a.tick_leases()
    with pytest.raises(ConnectionError):
        await a.tick_release()
    board.mark_released = board_mark  # type: ignore[method-assign]
    clock.now += timedelta(seconds=5)
    b, out_b = scheduler(s, board, clock, "b")
    await b.tick_leases()
    await b.tick_release()
    await b.tick_release()
    assert ids(out_a) == ["m"] and ids(out_b) == ["m"]


async def test_shares_are_fair_and_a_lost_lease_stops_releases() -> None:
    s, board, clock = settings(), FakeBoard(), ManualClock(T0)
    a, _ = scheduler(s, board, clock, "a")
    b, out_b = scheduler(s, board, clock, "b")
    await a.tick_leases()
    assert len(a.held) == 4
    await b.tick_leases()
    assert len(b.held) == 0
    await a.tick_leases()
    assert len(a.held) == 2
    await b.tick_leases()
    assert len(b.held) == 2 and not set(a.held) & set(b.held)
    board.put(row(s, "x", T0 + timedelta(seconds=1)))
    clock.now = T0 + timedelta(seconds=30)
    assert not b.holds(clock.now)
    await b.tick_release()
    assert out_b == []


async def test_expired_rows_become_expired_events_and_bad_payloads_pass_on() -> None:
    s, board, clock = settings(), FakeBoard(), ManualClock(T0)
    board.put(row(s, "old", T0 + timedelta(seconds=1), expires_at=T0 + timedelta(seconds=2)))
    board.put(row(s, "bad", T0 + timedelta(seconds=1), payload="{not json"))
    sched, out = scheduler(s, board, clock)
    clock.now = T0 + timedelta(seconds=3)
    await sched.tick_leases()
    done = await sched.tick_release()
    assert (done.published, done.expired) == (1, 1)
    by_id = {i: o for i, o in zip(ids(out), out, strict=True)}
    assert by_id["old"].topic == s.events_topic
    assert orjson.loads(by_id["old"].value)["status"] == "EXPIRED"
    assert by_id["bad"].topic == s.ingest_topic("SMS", "P3")  # type: ignore[arg-type]
    assert by_id["bad"].value == b"{not json"


@given(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),
                    timezones=st.just(UTC)),
       st.sampled_from([timedelta(seconds=1), timedelta(minutes=1), timedelta(minutes=7)]))
def test_a_bucket_holds_its_instant(at: datetime, width: timedelta) -> None:
    b = bucket_of(at, width)
    assert b <= at.replace(microsecond=at.microsecond // 1000 * 1000) < b + width
    assert bucket_of(b, width) == b


@given(st.integers(1, 1024), st.integers(1, 50))
def test_fair_shares_cover_every_shard(shards: int, members: int) -> None:
    share = fair_share(shards, members)
    assert share * members >= shards > (share - 1) * members


@dataclass
class FakeIntake:
    pending: list[Delayed]
    committed: list[Delayed] = field(default_factory=list)
    rewound: list[Delayed] = field(default_factory=list)

    async def batch(self, most: int, wait: float) -> list[Delayed]:
        out, self.pending = self.pending[:most], self.pending[most:]
        return out

    async def commit(self, records: list[Delayed]) -> None:
        self.committed += records

    def rewind(self, records: list[Delayed]) -> None:
        self.rewound += records


def delayed(s: Settings, mid: str, not_before: datetime, offset: int) -> Delayed:
    r = row(s, mid, T0)
    record = IngestRecord.model_validate_json(r.payload).model_copy(
        update={"attempt": 2, "not_before": not_before, "scheduled_at": None})
    value = record.model_dump_json(exclude_none=True).encode()
    [(_, binding)] = binder(s).sign([], "SMS", "P3", value)
    return Delayed(value, s.delayed_topic, 0, offset, None, None, binding)


async def test_long_retries_move_into_buckets_short_ones_and_bad_ones_pass_on() -> None:
    s, board, clock = settings(), FakeBoard(), ManualClock(T0)
    intake = FakeIntake([delayed(s, "far", T0 + timedelta(minutes=5), 0),
                         delayed(s, "near", T0 + timedelta(milliseconds=500), 1),
                         Delayed(b"{oops", s.delayed_topic, 0, 2, None, None)])
    sched, out = scheduler(s, board, clock)
    sched.intake = intake
    assert await sched.tick_intake() == 3
    assert len(intake.committed) == 3
    (far,) = [x for p in board.rows.values() for x in p.values()]
    assert far.message_id == "far" and far.scheduled_at == T0 + timedelta(minutes=5)
    assert far.topic == s.ingest_topic("SMS", "P3")  # type: ignore[arg-type]
    topics = sorted(o.topic for o in out)
    assert topics == sorted([s.ingest_topic("SMS", "P3"),  # type: ignore[arg-type]
                             s.dlq_topic(None)])
    clock.now = T0 + timedelta(minutes=5, seconds=1)
    await sched.tick_leases()
    await sched.tick_release()
    record = IngestRecord.model_validate_json(out[-1].value)
    assert (record.message_id, record.attempt) == ("far", 2)


async def test_a_batch_that_cannot_be_stored_is_read_again() -> None:
    s, board, clock = settings(), FakeBoard(), ManualClock(T0)
    intake = FakeIntake([delayed(s, "far", T0 + timedelta(minutes=5), 7)])

    async def down(r: ScheduledRow, now: datetime) -> None:
        raise ConnectionError("cassandra down")

    board.add = down  # type: ignore[attr-defined]
    sched, _ = scheduler(s, board, clock)
    sched.intake = intake
    with pytest.raises(ConnectionError):
        await sched.tick_intake()
    assert intake.committed == [] and [d.offset for d in intake.rewound] == [7]


def test_the_encoder_sends_long_waits_to_the_delayed_topic() -> None:
    s = settings()
    r = row(s, "m", T0)
    record = IngestRecord.model_validate_json(r.payload)
    work = Work(record, SourceRef("t", 0, 0), b"", b"m", ())
    enc = Encoder(s, ManualClock(T0))
    soon = Retry(work, record.model_copy(update={"not_before": T0 + timedelta(seconds=29)}))
    later = Retry(work, record.model_copy(update={"not_before": T0 + timedelta(seconds=30)}))
    assert enc(soon).topic == s.ingest_topic("SMS", "P3")  # type: ignore[arg-type]
    assert enc(later).topic == s.delayed_topic


async def test_a_quiet_shard_is_read_again_only_when_a_row_can_be_due() -> None:
    s, board, clock = settings(shards=1), FakeBoard(), ManualClock(T0)
    reads: list[datetime] = []
    inner = board.due

    async def counted(bucket: datetime, shard: int, after: tuple[datetime, str],
                      until: datetime, limit: int) -> list[ScheduledRow]:
        reads.append(clock.now)
        return await inner(bucket, shard, after, until, limit)

    board.due = counted  # type: ignore[method-assign]
    sched, out = scheduler(s, board, clock)
    await sched.tick_leases()
    await sched.tick_release()
    first = len(reads)
    clock.now += timedelta(milliseconds=500)
    await sched.tick_leases()
    await sched.tick_release()
    assert len(reads) == first, "a quiet shard was read again within min_lead / 2"
    board.put(row(s, "soon", T0 + timedelta(milliseconds=1400)))
    clock.now += timedelta(milliseconds=600)
    await sched.tick_leases()
    await sched.tick_release()
    assert len(reads) > first and out == []
    assert sched.held[0].next_at == T0 + timedelta(milliseconds=1400)
    clock.now = T0 + timedelta(milliseconds=1400)
    await sched.tick_leases()
    await sched.tick_release()
    assert ids(out) == ["soon"]
