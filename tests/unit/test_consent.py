"""Quiet hours (DST-correct), consent and caps decisions, as pure logic."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notiflow.flows.common.items import SourceRef, Work
from notiflow.flows.send.cap_rules import LocalCaps, Verdict, cap_check
from notiflow.flows.send.consent import (
    PolicyStep,
    PreferenceJoin,
    Probe,
    WithPreferences,
    quiet_until,
)
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import IngestRecord, StatusEvent
from notiflow.schemas.preferences import OptOut, PreferenceState, QuietWindow, phone_timezone
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


def test_a_users_zone_decides_quiet_hours_when_the_address_has_none() -> None:
    night = utc(2026, 6, 2, 3, 0)
    step = PolicyStep(Settings(), lambda: night)
    email = {"channel": "EMAIL", "recipient": "ana@example.com"}
    assert step(WithPreferences(work(**email), None)) == [work(**email)]
    in_new_york = work(**email, user={"user_hash": "u1", "timezone": "America/New_York"})
    ev, deferred = step(WithPreferences(in_new_york, None))
    assert ev.reason == "quiet_hours"
    assert deferred.record.not_before == utc(2026, 6, 2, 12, 0)
    in_tokyo = work(**email, user={"user_hash": "u1", "timezone": "Asia/Tokyo"})
    assert step(WithPreferences(in_tokyo, None)) == [in_tokyo]
    assert step(WithPreferences(in_new_york, state(timezone="Asia/Tokyo"))) == [in_new_york]


def test_join_keeps_newest_state_and_pairs_messages() -> None:
    join = PreferenceJoin(None)
    out, discard = join.on_item(Probe(work(), "h"))
    assert list(out) == [WithPreferences(work(), None)] and discard is True
    join.on_item(state(version=2, timezone="UTC"))
    join.on_item(state(version=1, timezone="Asia/Tokyo"))
    [paired], _ = join.on_item(Probe(work(), "h"))
    assert isinstance(paired, WithPreferences)
    assert paired.state is not None and paired.state.timezone == "UTC"
    assert PreferenceJoin(join.snapshot()).state == join.state


def _admit(caps: LocalCaps, s: Settings, w: Work, now: datetime) -> Verdict:
    check = cap_check(w, s, now)
    assert check is not None
    return caps.admit(check, now)


def test_recipient_cap_is_exact_and_counts_each_message_once() -> None:
    now = utc(2026, 1, 1)
    s = Settings(caps={"otp": CapRule(limit=2, window=timedelta(minutes=10))})
    caps = LocalCaps()
    verdicts = [_admit(caps, s, work(category="otp", message_id=f"m{i}"), now)
                for i in range(3)]
    assert verdicts == [Verdict.OK, Verdict.OK, Verdict.RECIPIENT]
    assert Verdict.RECIPIENT.value == "frequency_cap"
    assert _admit(caps, s, work(category="otp", message_id="m0"), now) is Verdict.OK
    later = now + timedelta(minutes=10)
    assert _admit(caps, s, work(category="otp", message_id="m9"), later) is Verdict.OK


def test_a_users_messages_count_against_one_cap_across_addresses() -> None:
    now = utc(2026, 1, 1)
    s = Settings(caps={"marketing": CapRule(limit=2, window=timedelta(days=7))})
    caps = LocalCaps()
    user = {"user_hash": "u1"}
    sends = [work(message_id="m0", user=user),
             work(message_id="m1", channel="EMAIL", recipient="ana@example.com", user=user),
             work(message_id="m2", recipient="+12025550199", user=user),
             work(message_id="m3", recipient="+12025550199")]
    verdicts = [_admit(caps, s, w, now) for w in sends]
    assert verdicts == [Verdict.OK, Verdict.OK, Verdict.RECIPIENT, Verdict.OK]


def test_cap_memory_follows_the_window_not_every_recipient_seen() -> None:
    now = utc(2026, 1, 1)
    s = Settings(caps={"otp": CapRule(limit=2, window=timedelta(minutes=10))})
    caps = LocalCaps(sweep_every=10)
    for i in range(100):
        w = work(category="otp", message_id=f"m{i}").record.model_copy(
            update={"recipient": f"+1555000{i:04d}"})
        _admit(caps, s, Work(w, SourceRef("t", 0, i), b"", None, []), now + timedelta(minutes=i))
    assert len(caps.sent) <= 20
    caps.sweep(now + timedelta(days=1))
    assert caps.sent == {} and caps.windows == {}


def test_uncapped_category_is_not_checked() -> None:
    assert cap_check(work(category="transactional"), Settings(), utc(2026, 1, 1)) is None


def test_cap_windows_follow_the_time_scale() -> None:
    s = Settings(caps={"otp": CapRule(limit=2, window=timedelta(minutes=10))}, time_scale=0.1)
    check = cap_check(work(category="otp"), s, utc(2026, 1, 1))
    assert check is not None and check.window == timedelta(minutes=1)
    assert not check.fail_closed and check.tenant_key is None


def test_tenant_daily_marketing_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFLOW_TENANTS",
                       '[{"id": "acme", "token": "%s", "daily_marketing_cap": 2}]' % ("t" * 32))
    s = Settings(caps={})
    now = utc(2026, 1, 1, 10)
    caps = LocalCaps()
    verdicts = [_admit(caps, s, work(message_id=f"m{i}"), now) for i in range(3)]
    assert verdicts == [Verdict.OK, Verdict.OK, Verdict.TENANT]
    assert Verdict.TENANT.value == "tenant_daily_cap"
    assert _admit(caps, s, work(message_id="m1"), now) is Verdict.OK
    check = cap_check(work(message_id="m3"), s, now)
    assert check is not None and check.fail_closed and check.limit is None
    assert _admit(caps, s, work(message_id="m3"), now + timedelta(days=1)) is Verdict.OK


def test_fallback_share_is_conservative_but_never_zero() -> None:
    now = utc(2026, 1, 1)
    s = Settings(caps={"otp": CapRule(limit=5, window=timedelta(minutes=10))})
    assert [_admit(LocalCaps(share=2), s, work(category="otp", message_id=f"m{i}"), now)
            for i in range(3)].count(Verdict.OK) == 3
    halves = LocalCaps(share=2)
    assert [_admit(halves, s, work(category="otp", message_id=f"m{i}"), now)
            for i in range(5)].count(Verdict.OK) == 2
    tiny = Settings(caps={"otp": CapRule(limit=1, window=timedelta(minutes=10))})
    assert _admit(LocalCaps(share=4), tiny, work(category="otp"), now) is Verdict.OK


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3000)), max_size=60),
       st.integers(0, 4))
def test_no_window_ever_holds_more_than_the_limit(sends: list[tuple[int, int]],
                                                  limit: int) -> None:
    """Sends at increasing times (seconds), message ids drawn from a small set so that
    replays happen. A pass counts a message unless the same message was counted within the
    window before; in every 10-minute window at most ``limit`` messages are counted, and a
    message counted within the window always passes again; otherwise it passes exactly when
    the window has room."""
    s = Settings(caps={"otp": CapRule(limit=limit, window=timedelta(minutes=10))})
    caps = LocalCaps(sweep_every=7)
    t0 = utc(2026, 1, 1)
    counted: list[tuple[int, str]] = []
    for mid, at in sorted(sends, key=lambda x: x[1]):
        verdict = _admit(caps, s, work(category="otp", message_id=f"m{mid}"), t0 +
                         timedelta(seconds=at))
        window = [m for t, m in counted if at - t < 600]
        if f"m{mid}" in window:
            assert verdict is Verdict.OK
        elif len(window) < limit:
            assert verdict is Verdict.OK
            counted.append((at, f"m{mid}"))
        else:
            assert verdict is Verdict.RECIPIENT
