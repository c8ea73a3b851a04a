"""The campaign expander against in-memory ports: every row expanded once with its derived id,
rejections reported, a crash resumed from the checkpoint, pause, quota, local windows in three
zones (injected clock), and yielding to the backlog and P0 signals."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, time, timedelta

import orjson
import pytest
from pydantic import SecretStr

from notiflow.adapters.campaign_notices import Notice
from notiflow.adapters.campaign_store import CampaignRow, Progress
from notiflow.adapters.kafka_io import OutRecord
from notiflow.correlation import CorrelationKeys
from notiflow.flows.campaigns.expander import Expander, Pace, campaign_rate, tier_capacity
from notiflow.schemas.campaigns import (
    CampaignRequest,
    CampaignState,
    LocalWindow,
    RowError,
    parse_row_message_id,
    row_message_id,
)
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import IngestRecord
from notiflow.schemas.scheduling import ScheduledRow
from notiflow.settings import IngestBinding, Settings
from tests.helpers import wait_until

NOW = datetime(2026, 12, 4, 15, 0, tzinfo=UTC)
CID = "cmp_" + "ab" * 16
KEYS = CorrelationKeys((b"e" * 32,))


def manifest(n: int, bad_every: int = 0, zones: Sequence[str] = ("",)) -> bytes:
    lines = ["phone,name,tz"]
    for i in range(1, n + 1):
        phone = "not-a-number" if bad_every and i % bad_every == 0 else f"+1415{2000000 + i}"
        lines.append(f"{phone},User {i},{zones[i % len(zones)]}")
    return ("\n".join(lines) + "\n").encode()


def request(**over: object) -> CampaignRequest:
    body = {"name": "winter sale", "channel": "SMS", "template_id": "promo",
            "template_version": 1, "manifest": "s3://notiflow/tenants/mkt/m.csv",
            "mapping": {"recipient": "phone", "variables": {"name": "name"},
                        "timezone": "tz"}, **over}
    return CampaignRequest.model_validate(body)


def row(req: CampaignRequest, quota: int = 10**9, rate: float = 1e6) -> CampaignRow:
    return CampaignRow(
        tenant_id="mkt", campaign_id=CID, name=req.name, request=req, state="scheduled",
        reason=None, starts_at=NOW - timedelta(minutes=1), ends_at=NOW + timedelta(days=1),
        max_rate=rate, quota=quota, created_at=NOW, updated_at=NOW, finished_at=None,
        progress=Progress(), lease_until=datetime(1970, 1, 1, tzinfo=UTC))


class Board:
    """The campaign row with the store's conditions (owner, state) applied."""

    def __init__(self, r: CampaignRow) -> None:
        self.row = r
        self.errors: dict[int, str] = {}
        self.checkpoints = 0

    async def live(self) -> list[tuple[str, str]]:
        return [(self.row.tenant_id, self.row.campaign_id)] if self.row.state in (
            "scheduled", "running", "paused") else []

    async def get(self, tenant_id: str, campaign_id: str) -> CampaignRow | None:
        return self.row

    async def take(self, r: CampaignRow, owner: str, until: datetime, now: datetime) -> bool:
        lease = self.row.lease_until
        if self.row.state not in ("scheduled", "running") or (lease and lease >= now):
            return False
        self.row = dataclasses.replace(self.row, owner=owner, lease_until=until,
                                       state="running")
        return True

    async def checkpoint(self, r: CampaignRow, owner: str, p: Progress, until: datetime,
                         now: datetime) -> bool:
        if self.row.owner != owner:
            return False
        self.checkpoints += 1
        self.row = dataclasses.replace(self.row, progress=p, lease_until=until)
        return self.row.state == "running"

    async def finish(self, r: CampaignRow, owner: str, p: Progress, state: CampaignState,
                     reason: str | None, now: datetime) -> bool:
        if self.row.owner != owner or self.row.state != "running":
            return False
        self.row = dataclasses.replace(self.row, progress=p, state=state, reason=reason)
        return True

    async def release(self, r: CampaignRow, owner: str, now: datetime) -> None:
        if self.row.owner == owner:
            self.row = dataclasses.replace(self.row, lease_until=now - timedelta(seconds=1))

    async def reject(self, campaign_id: str, errors: Sequence[RowError]) -> None:
        self.errors.update({e.row: e.reason for e in errors})


class Manifests:
    def __init__(self, data: bytes, chunk: int = 777) -> None:
        self.data = data
        self.chunk = chunk

    async def size(self, uri: str, tenant_id: str) -> int:
        return len(self.data)

    async def chunks(self, uri: str, tenant_id: str, start: int,
                     size: int | None = None) -> AsyncIterator[bytes]:
        assert size in (None, len(self.data))
        for at in range(start, len(self.data), self.chunk):
            yield self.data[at:at + self.chunk]


class Signals:
    def __init__(self) -> None:
        self.p0: float | None = None
        self.backlog: float | None = None
        self.backlog_asked = 0

    async def p0_worst(self) -> float | None:
        return self.p0

    async def backlog_age(self, tier: Tier) -> float | None:
        self.backlog_asked += 1
        return self.backlog


class Sink:
    def __init__(self, fail_at: int | None = None) -> None:
        self.records: list[OutRecord] = []
        self.held: list[ScheduledRow] = []
        self.calls = 0
        self.fail_at = fail_at

    async def publish(self, records: Sequence[OutRecord]) -> None:
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            raise RuntimeError("kafka did not acknowledge")
        self.records.extend(records)

    async def hold(self, rows: Sequence[ScheduledRow], now: datetime) -> None:
        self.held.extend(rows)

    def rows(self) -> list[int]:
        ids = [r.headers[0][1].decode() for r in self.records] + [h.message_id
                                                                  for h in self.held]
        return [found[1] for i in ids if (found := parse_row_message_id(KEYS, i))]


def expander(board: Board, data: bytes, sink: Sink, signals: Signals | None = None,
             owner: str = "x1", **rule: object) -> Expander:
    settings = Settings(ingest_binding=IngestBinding(keys=SecretStr("k" * 32)),
                        correlation_key=SecretStr(KEYS.keys[0].decode())).model_copy(
        update={"campaigns": Settings().campaigns.model_copy(update={"batch": 50, **rule})})
    return Expander(settings, board, Manifests(data), sink.publish, sink.hold,
                    signals or Signals(), owner, clock=lambda: NOW)


async def run_one(x: Expander) -> str:
    assert await x.tick() == 1
    return await next(iter(x.tasks.values()))


async def test_every_row_once_with_rejections() -> None:
    board, sink = Board(row(request())), Sink()
    assert await run_one(expander(board, manifest(1000, bad_every=100), sink)) == "completed"
    rows = sink.rows()
    assert len(rows) == len(set(rows)) == 990
    assert sorted(board.errors) == list(range(100, 1001, 100))
    assert all("not-a-number" not in r and "recipient" in r for r in board.errors.values())
    p = board.row.progress
    assert (p.rows_read, p.expanded, p.rejected, board.row.state) == (
        1000, 990, 10, "completed")
    record = IngestRecord.model_validate_json(sink.records[0].value)
    assert record.message_id == row_message_id(KEYS, CID, 1) and record.tier is Tier.P3
    assert record.expires_at == board.row.ends_at


async def test_crash_resumes_from_checkpoint_without_loss() -> None:
    data = manifest(1000)
    board, crashed = Board(row(request())), Sink(fail_at=7)
    with pytest.raises(RuntimeError):
        await run_one(expander(board, data, crashed, owner="x1"))
    assert board.row.progress.next_row == 301
    resumed = Sink()
    assert await run_one(expander(board, data, resumed, owner="x2")) == "completed"
    assert sorted(set(crashed.rows()) | set(resumed.rows())) == list(range(1, 1001))
    assert set(crashed.rows()) & set(resumed.rows()) == set()


async def test_pause_stops_at_the_next_batch_and_resume_continues() -> None:
    board, sink = Board(row(request())), Sink()
    x = expander(board, manifest(500), sink)
    original = sink.publish

    async def pausing(records: Sequence[OutRecord]) -> None:
        await original(records)
        if sink.calls == 3:
            board.row = dataclasses.replace(board.row, state="paused")

    x.publish = pausing
    assert await run_one(x) == "stopped"
    assert len(sink.rows()) == 150 and board.row.progress.next_row == 151
    assert board.row.progress.expanded == 150
    board.row = dataclasses.replace(board.row, state="running")
    rest = Sink()
    assert await run_one(expander(board, manifest(500), rest, owner="x2")) == "completed"
    assert sorted(set(sink.rows()) | set(rest.rows())) == list(range(1, 501))


async def test_quota_ends_the_campaign() -> None:
    board, sink = Board(row(request(), quota=120)), Sink()
    assert await run_one(expander(board, manifest(1000, bad_every=10), sink)) == "quota"
    assert len(sink.rows()) == 120
    assert (board.row.state, board.row.reason, board.row.progress.expanded) == (
        "completed", "quota", 120)


async def test_local_windows_in_three_zones() -> None:
    zones = ("America/New_York", "Europe/Berlin", "Asia/Tokyo")
    req = request(window={"start": "10:00", "end": "20:00"})
    board, sink = Board(row(req)), Sink()
    assert await run_one(expander(board, manifest(30, zones=zones), sink)) == "completed"
    now_rows = sorted(sink.rows()[:len(sink.records)])
    assert now_rows == [i for i in range(1, 31) if zones[i % 3] != "Asia/Tokyo"]
    assert len(sink.held) == 10
    assert {h.scheduled_at for h in sink.held} == {datetime(2026, 12, 5, 1, 0, tzinfo=UTC)}
    assert board.row.progress.waiting == 10
    window = LocalWindow(start=time(10), end=time(20))
    assert window.contains(time(10)) and not window.contains(time(20))


async def test_backlog_and_p0_pressure_hold_expansion() -> None:
    signals = Signals()
    signals.backlog = 10_000.0
    board, sink = Board(row(request())), Sink()
    x = expander(board, manifest(100), sink, signals)
    assert await x.tick() == 1
    await wait_until(lambda: signals.backlog_asked >= 3, timeout=5.0,
                     what="the expander holding on the backlog three times")
    assert sink.records == []
    signals.backlog = None
    assert await next(iter(x.tasks.values())) == "completed"
    assert len(sink.records) == 100

    slow = Signals()
    slow.p0 = 5.0
    board2, sink2 = Board(row(request())), Sink()
    x2 = expander(board2, manifest(100), sink2, slow)
    for _ in range(8):
        await x2.tick_signal()
    assert x2.factor == 0.0
    assert Pace(100.0, 50).wait_s(51, x2.factor) is None


def test_rate_is_capped_by_the_tier_share() -> None:
    settings = Settings().model_copy(update={"provider_rates": {"twilio": 100.0,
                                                                "vonage": 50.0}})
    cap = tier_capacity(settings, Tier.P3, Channel.SMS)
    assert cap is None or cap == pytest.approx(settings.share(Tier.P3) * 150.0)
    assert campaign_rate(settings, row(request(), rate=1e6)) == (cap or 1e6)
    assert campaign_rate(settings, row(request(), rate=10.0)) == 10.0


class Notices:
    def __init__(self) -> None:
        self.added: list[Notice] = []

    async def add(self, n: Notice) -> None:
        self.added.append(n)


async def test_state_changes_are_announced_when_the_campaign_names_a_webhook() -> None:
    board, sink, notices = Board(row(request(webhook="https://hooks.example/c"))), Sink(), \
        Notices()
    x = expander(board, manifest(120, bad_every=60), sink)
    x.notices = notices  # type: ignore[assignment]
    assert await run_one(x) == "completed"
    states = [orjson.loads(n.body)["data"]["state"] for n in notices.added]
    assert states == ["running", "completed"]
    assert orjson.loads(notices.added[-1].body)["data"]["counts"]["rejected"] == 2
    quiet, none = Board(row(request())), Notices()
    y = expander(quiet, manifest(10), Sink())
    y.notices = none  # type: ignore[assignment]
    assert await run_one(y) == "completed" and none.added == []
