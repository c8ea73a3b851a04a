"""Quiet hours (DST-correct), consent and caps decisions, as pure logic."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from bytewax.operators import StatefulLogic
from hypothesis import given
from hypothesis import strategies as st

from notiflow.flows.caps import RecipientCap, TenantDailyCap
from notiflow.flows.consent import (
    PolicyStep,
    PreferenceJoin,
    WithPreferences,
    phone_timezone,
    quiet_until,
)
from notiflow.flows.model import SourceRef, Work
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import IngestRecord, StatusEvent
from notiflow.schemas.preferences import OptOut, PreferenceState, QuietWindow
from notiflow.settings import CapRule, QuietHours, Settings

NIGHT = QuietHours()
NY = "America/New_York"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(("now", "zone", "window", "expected"), [
    (utc(2026, 3, 8, 6, 0), NY, NIGHT, utc(2026, 3, 8, 12, 0)),
    (utc(2026, 3, 7, 6, 0), NY, NIGHT, utc(2026, 3, 7, 13, 0)),
    (utc(2026, 11, 1, 5, 30), NY, NIGHT, utc(2026, 11, 1, 13, 0)),
    (utc(2026, 11, 1, 6, 30), NY, NIGHT, utc(2026, 11, 1, 13, 0)),
    (utc(2026, 3, 8, 3, 30), NY, NIGHT, utc(2026, 3, 8, 12, 0)),
    (utc(2026, 3, 8, 6, 30), NY, QuietWindow(start=time(22), end=time(2, 30)),
     utc(2026, 3, 8, 7, 0)),
    (utc(2026, 11, 1, 5, 10), NY, QuietWindow(start=time(0), end=time(1, 30)),
     utc(2026, 11, 1, 5, 30)),
    (utc(2026, 6, 1, 19, 0), NY, NIGHT, None),
    (utc(2026, 6, 1, 21, 0), "Asia/Kolkata", NIGHT, utc(2026, 6, 2, 2, 30)),
    (utc(2026, 6, 1, 12, 0), "Europe/Berlin", QuietWindow(start=time(13), end=time(15)),
     utc(2026, 6, 1, 13, 0)),
])
def test_quiet_until_examples(now: datetime, zone: str, window: QuietHours,
                              expected: datetime | None) -> None:
    assert quiet_until(now, zone, window) == expected


ZONES = ["America/New_York", "Europe/London", "Australia/Sydney", "Asia/Kolkata",
         "America/Santiago", "Pacific/Chatham", "UTC"]


@given(st.datetimes(min_value=datetime(2025, 1, 1), max_value=datetime(2028, 12, 31),
                    timezones=st.just(UTC)),
       st.sampled_from(ZONES),
       st.times(), st.times())
def test_quiet_until_properties(now: datetime, zone: str, start: time, end: time) -> None:
    window = QuietWindow(start=start.replace(microsecond=0), end=end.replace(microsecond=0))
    due = quiet_until(now, zone, window)
    tz = ZoneInfo(zone)

    def inside(t: datetime) -> bool:
        local = t.astimezone(tz).time().replace(tzinfo=None)
        s, e = window.start, window.end
        return s != e and ((s <= local < e) if s < e else (local >= s or local < e))

    if due is None:
        assert not inside(now)
        return
    assert inside(now)
    assert now < due <= now + timedelta(days=1, hours=2)
    assert not inside(due)
    assert inside(due - timedelta(seconds=1))


def test_phone_timezone() -> None:
    assert phone_timezone("+14155552671") == "America/Los_Angeles"
    assert phone_timezone("+33612345678") == "Europe/Paris"
    assert phone_timezone("+12025550143") == "America/New_York"


def work(**kw: object) -> Work:
    doc = {"channel": "SMS", "tier": "P3", "recipient": "+12025550143", "template_id": "t",
           "template_version": 1, "tenant_id": "acme", "category": "marketing",
           "message_id": "msg_1", "accepted_at": "2026-06-01T00:00:00Z"}
    doc.update(kw)
    return Work(IngestRecord.model_validate(doc), SourceRef("t", 0, 0), b"", None)


def state(**kw: object) -> PreferenceState:
    doc = {"tenant_id": "acme", "recipient_hash": "h", "version": 1,
           "updated_at": "2026-06-01T00:00:00Z"}
    doc.update(kw)
    return PreferenceState.model_validate(doc)


def test_policy_suppresses_opted_out_and_suppressed() -> None:
    step = PolicyStep(Settings(), lambda: utc(2026, 6, 1, 16))
    [ev] = step(WithPreferences(work(), state(opt_outs=[OptOut(channel="SMS",
                                                                category="marketing")])))
    assert isinstance(ev, StatusEvent) and ev.status is Status.SUPPRESSED
    assert ev.reason == "opted_out"
    [ev] = step(WithPreferences(work(), state(suppressed="unsubscribed")))
    assert ev.reason == "unsubscribed"
    assert step(WithPreferences(work(), state(opt_outs=[OptOut(category="otp")]))) == [work()]


def test_policy_defers_p3_in_quiet_hours_but_not_p1() -> None:
    night = utc(2026, 6, 2, 3, 0)
    step = PolicyStep(Settings(), lambda: night)
    ev, deferred = step(WithPreferences(work(), None))
    assert ev.status is Status.SCHEDULED and ev.reason == "quiet_hours"
    assert deferred.record.not_before == utc(2026, 6, 2, 12, 0) == ev.next_attempt_at
    assert step(WithPreferences(work(tier="P1", category="transactional"), None)) == [
        work(tier="P1", category="transactional")]
    tokyo = state(timezone="Asia/Tokyo")
    assert step(WithPreferences(work(), tokyo)) == [work()]


def test_join_keeps_newest_state_and_pairs_messages() -> None:
    join = PreferenceJoin(None)
    out, discard = join.on_item(work())
    assert list(out) == [WithPreferences(work(), None)] and discard is True
    join.on_item(state(version=2, timezone="UTC"))
    join.on_item(state(version=1, timezone="Asia/Tokyo"))
    [paired], _ = join.on_item(work())
    assert paired.state is not None and paired.state.timezone == "UTC"
    assert PreferenceJoin(join.snapshot()).state == join.state


def test_recipient_cap_is_exact_and_counts_each_message_once() -> None:
    clock = [utc(2026, 1, 1)]
    s = Settings(caps={"otp": CapRule(limit=2, window=timedelta(minutes=10))})
    cap = RecipientCap(None, s, lambda: clock[0])
    outs = [next(iter(cap.on_item(work(category="otp", message_id=f"m{i}"))[0])) for i in range(3)]
    assert [isinstance(o, Work) for o in outs] == [True, True, False]
    assert outs[2].reason == "frequency_cap"
    assert isinstance(next(iter(cap.on_item(work(category="otp", message_id="m0"))[0])), Work)
    clock[0] += timedelta(minutes=10)
    cap = RecipientCap(cap.snapshot(), s, lambda: clock[0])
    assert isinstance(next(iter(cap.on_item(work(category="otp", message_id="m9"))[0])), Work)


def test_recipient_cap_state_is_dropped_when_its_window_ends() -> None:
    clock = [utc(2026, 1, 1)]
    s = Settings(caps={"otp": CapRule(limit=2, window=timedelta(minutes=10)),
                       "marketing": CapRule(limit=1, window=timedelta(days=1))})
    cap = RecipientCap(None, s, lambda: clock[0])
    _, keep = cap.on_item(work(category="otp", message_id="m1"))
    assert keep is StatefulLogic.RETAIN
    clock[0] += timedelta(minutes=4)
    cap.on_item(work(category="otp", message_id="m2"))
    due = cap.notify_at()
    assert due is not None
    assert abs((due - datetime.now(UTC)) - timedelta(minutes=6)) < timedelta(seconds=5)
    clock[0] += timedelta(minutes=6)
    assert cap.on_notify() == ([], StatefulLogic.RETAIN) and [m for _, m in cap.sent] == ["m2"]
    clock[0] += timedelta(minutes=4)
    assert cap.on_notify() == ([], StatefulLogic.DISCARD) and cap.notify_at() is None
    resumed = RecipientCap([(clock[0], "m3")], s, lambda: clock[0])
    clock[0] += timedelta(hours=2)
    assert resumed.on_notify()[1] is StatefulLogic.RETAIN  # window unknown: the longest (1 day)


def test_uncapped_category_passes() -> None:
    cap = RecipientCap(None, Settings(), lambda: utc(2026, 1, 1))
    out, discard = cap.on_item(work(category="transactional"))
    assert list(out) == [work(category="transactional")] and discard is True


def test_tenant_daily_marketing_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFLOW_TENANTS",
                       '[{"id": "acme", "token": "t", "daily_marketing_cap": 2}]')
    clock = [utc(2026, 1, 1, 10)]
    cap = TenantDailyCap(None, Settings(), lambda: clock[0])
    results = [next(iter(cap.on_item(work(message_id=f"m{i}"))[0])) for i in range(3)]
    assert [isinstance(r, Work) for r in results] == [True, True, False]
    assert results[2].reason == "tenant_daily_cap"
    again = TenantDailyCap(cap.snapshot(), Settings(), lambda: clock[0])
    assert isinstance(next(iter(again.on_item(work(message_id="m1"))[0])), Work)
    assert not isinstance(next(iter(again.on_item(work(message_id="m9"))[0])), Work)
    clock[0] += timedelta(days=1)
    assert isinstance(next(iter(cap.on_item(work(message_id="m3"))[0])), Work)
