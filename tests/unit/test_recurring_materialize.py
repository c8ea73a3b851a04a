"""Materialising recurring schedules with an injected clock, across the 2027 US and EU DST
transitions: which occurrences become messages, when, and that doing it twice makes nothing
new."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from cryptography.fernet import Fernet

from notiflow.adapters.kafka_io import OutRecord
from notiflow.adapters.schedule_store import ScheduleRow
from notiflow.flows.scheduling.recurring import Materializer
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import MessageSnapshot, SendRequest
from notiflow.schemas.schedules import occurrence_message_id
from notiflow.schemas.scheduling import ScheduledRow
from notiflow.settings import SchedulingRule, Settings
from tests.fakes import ManualClock


@dataclass
class Fakes:
    row: ScheduleRow
    messages: dict[str, Status] = field(default_factory=dict)
    rows: dict[str, ScheduledRow] = field(default_factory=dict)
    published: list[OutRecord] = field(default_factory=list)

    async def in_shard(self, shard: int) -> list[tuple[str, str]]:
        return [(self.row.tenant_id, self.row.schedule_id)] if shard == 0 else []

    async def get(self, tenant_id: str, schedule_id: str) -> ScheduleRow | None:
        return self.row

    async def set_materialized(self, tenant_id: str, schedule_id: str,
                               until: datetime) -> None:
        self.row = replace(self.row, materialized_until=until)

    async def create_message(self, message_id: str, snap: MessageSnapshot, status: Status,
                             now: datetime) -> bool:
        new = message_id not in self.messages
        self.messages.setdefault(message_id, status)
        return new

    async def add(self, row: ScheduledRow, now: datetime) -> None:
        self.rows[row.message_id] = row

    async def publish(self, records: Sequence[OutRecord]) -> None:
        self.published += records


def schedule(cron: str, zone: str, starts_at: datetime,
             materialized_until: datetime | None = None) -> ScheduleRow:
    """A schedule materialised up to ``materialized_until`` (a scheduler was running)."""
    req = SendRequest.model_validate({
        "channel": "SMS", "tier": "P3", "recipient": "+14155550100", "template_id": "t",
        "template_version": 1, "category": "marketing"})
    return ScheduleRow("mkt", "sch_test", "cron", cron, zone, starts_at, None, "SMS", "P3",
                       "t", 1, "+1415*****00", req.model_dump_json(), "active",
                       materialized_until, starts_at, starts_at)


def materializer(fakes: Fakes, clock: ManualClock[datetime]) -> Materializer:
    settings = Settings(dlq_key=Fernet.generate_key().decode(),
                        scheduling=SchedulingRule(horizon=timedelta(days=1)))
    return Materializer(settings, fakes, fakes, fakes, fakes.publish, clock)


async def test_a_daily_0230_fires_once_on_the_us_spring_forward_day() -> None:
    clock = ManualClock(datetime(2027, 3, 13, 12, 0, tzinfo=UTC))
    fakes = Fakes(schedule("30 2 * * *", "America/New_York",
                           datetime(2027, 3, 10, tzinfo=UTC), clock.now))
    m = materializer(fakes, clock)
    assert await m.tick([0]) == 1
    assert [r.scheduled_at for r in fakes.rows.values()] == [
        datetime(2027, 3, 14, 7, 30, tzinfo=UTC)]
    clock.now += timedelta(days=1)
    assert await m.tick([0]) == 1
    assert sorted(r.scheduled_at for r in fakes.rows.values()) == [
        datetime(2027, 3, 14, 7, 30, tzinfo=UTC), datetime(2027, 3, 15, 6, 30, tzinfo=UTC)]
    assert set(fakes.messages.values()) == {Status.SCHEDULED}


async def test_a_daily_0230_fires_once_on_the_eu_fall_back_day_and_again_is_idempotent(
        ) -> None:
    clock = ManualClock(datetime(2027, 10, 30, 12, 0, tzinfo=UTC))
    fakes = Fakes(schedule("30 2 * * *", "Europe/Paris", datetime(2027, 10, 1, tzinfo=UTC),
                           clock.now))
    m = materializer(fakes, clock)
    assert await m.tick([0]) == 1
    (row,) = fakes.rows.values()
    assert row.scheduled_at == datetime(2027, 10, 31, 0, 30, tzinfo=UTC)
    assert row.message_id == occurrence_message_id(m.keys, "sch_test", row.scheduled_at)
    fakes.row = replace(fakes.row, materialized_until=clock.now)
    assert await m.tick([0]) == 1
    assert len(fakes.rows) == 1 and len(fakes.messages) == 1


async def test_a_scheduler_down_for_a_month_catches_up_only_the_tier_ttl() -> None:
    """Occurrences older than the tier's TTL would expire unsent: skipped; a missed one
    within it goes to Kafka at once (late), the coming one to its bucket."""
    clock = ManualClock(datetime(2027, 10, 30, 12, 0, tzinfo=UTC))
    fakes = Fakes(schedule("30 2 * * *", "Europe/Paris", datetime(2027, 9, 1, tzinfo=UTC),
                           datetime(2027, 9, 30, tzinfo=UTC)))
    m = materializer(fakes, clock)
    assert await m.tick([0]) == 2
    missed = datetime(2027, 10, 30, 0, 30, tzinfo=UTC)
    assert [r.scheduled_at for r in fakes.rows.values()] == [
        datetime(2027, 10, 31, 0, 30, tzinfo=UTC)]
    assert [r.key for r in fakes.published] == [
        occurrence_message_id(m.keys, "sch_test", missed).encode()]


async def test_paused_schedules_and_other_shards_make_nothing() -> None:
    fakes = Fakes(schedule("*/5 * * * *", "UTC", datetime(2027, 1, 1, tzinfo=UTC)))
    m = materializer(fakes, ManualClock(datetime(2027, 1, 2, tzinfo=UTC)))
    assert await m.tick([1, 2]) == 0
    fakes.row = replace(fakes.row, state="paused")
    assert await m.tick([0]) == 0
    assert not fakes.rows and not fakes.published
