"""Manifest rows mapped to ingest records: one message per row with id (campaign, row),
rejections whose reasons never quote the row, and the due instant from the recipient's local
window (its zone from the row, the SMS number, or the campaign), across zones, midnight and
DST; plus LocalWindow.next_open against a minute-by-minute oracle."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from notiflow.correlation import CorrelationKeys
from notiflow.flows.campaigns.manifest import (
    CampaignSpec,
    ManifestError,
    ManifestRow,
    Mapped,
    Rejected,
    map_row,
)
from notiflow.schemas.campaigns import ColumnMapping, LocalWindow, row_message_id
from notiflow.schemas.enums import Category, Channel, PushPlatform, Tier
from notiflow.schemas.messages import PushRecipient

CAMPAIGN = "cmp_" + "c" * 32
KEYS = CorrelationKeys((b"r" * 32,))
NOW = datetime(2026, 6, 15, 6, 0, tzinfo=UTC)
TEN_TO_EIGHT = LocalWindow(start=time(10), end=time(20))


def spec(channel: Channel = Channel.SMS, window: LocalWindow | None = None,
         ends_at: datetime = NOW + timedelta(days=3), default_zone: str = "Europe/Berlin",
         **mapping: object) -> CampaignSpec:
    m = ColumnMapping.model_validate({"recipient": "to", "variables": {"name": "n"},
                                      **mapping})
    return CampaignSpec("mkt", CAMPAIGN, channel, Tier.P3, Category.MARKETING, "promo", 2, m,
                        ends_at, default_zone, window)


def row(number: int = 7, **fields: object) -> ManifestRow:
    return ManifestRow(number, 1234, {"n": "Ana", **fields})


def mapped(s: CampaignSpec, r: ManifestRow, now: datetime = NOW) -> Mapped:
    out = map_row(s, r, now, KEYS)
    assert isinstance(out, Mapped), out
    return out


def rejected(s: CampaignSpec, r: ManifestRow, now: datetime = NOW) -> str:
    out = map_row(s, r, now, KEYS)
    assert isinstance(out, Rejected), out
    assert out.row == r.number
    return out.reason


# -- records ------------------------------------------------------------------------------


def test_every_row_carries_the_campaigns_sender() -> None:
    assert mapped(spec(), row(to="+14155550100")).record.sender is None
    named = dataclasses.replace(spec(), sender="ACME")
    assert mapped(named, row(to="+14155550100")).record.sender == "ACME"


def test_an_sms_row_becomes_its_message() -> None:
    out = mapped(spec(), row(to=" +14155550100 "))
    r = out.record
    assert out.row == 7 and out.due == NOW
    assert (r.channel, r.tier, r.category) == (Channel.SMS, Tier.P3, Category.MARKETING)
    assert (r.recipient, r.template_id, r.template_version) == ("+14155550100", "promo", 2)
    assert r.variables == {"name": "Ana"}
    assert (r.tenant_id, r.message_id) == ("mkt", row_message_id(KEYS, CAMPAIGN, 7))
    assert r.expires_at == NOW + timedelta(days=3) and r.accepted_at == NOW
    assert r.scheduled_at is None


def test_an_email_row_and_json_values() -> None:
    out = mapped(spec(Channel.EMAIL, variables={"name": "n", "points": "p", "vip": "v"}),
                 row(to="Bob@Example.COM", p=1200, v=True))
    assert out.record.recipient == "Bob@example.com"
    assert out.record.variables == {"name": "Ana", "points": 1200, "vip": True}


def test_a_push_row_takes_its_platform_from_a_column() -> None:
    ios = mapped(spec(Channel.PUSH, platform="os"), row(to="ab" * 32, os=" iOS "))
    assert ios.record.recipient == PushRecipient(device_token="ab" * 32,
                                                 platform=PushPlatform.IOS)
    android = mapped(spec(Channel.PUSH, platform="os"), row(to="tok:" + "x" * 40, os="android"))
    assert isinstance(android.record.recipient, PushRecipient)
    assert android.record.recipient.platform is PushPlatform.ANDROID


def test_missing_columns_and_empty_recipients() -> None:
    assert rejected(spec(), ManifestRow(3, 10, {"n": "Ana"})) == "missing column 'to'"
    assert rejected(spec(), ManifestRow(3, 10, {"to": "+14155550100"})) == "missing column 'n'"
    push = spec(Channel.PUSH, platform="os")
    assert rejected(push, row(to="ab" * 32)) == "missing column 'os'"
    for empty in ("", "   ", None):
        assert rejected(spec(), row(to=empty)) == "empty recipient"
    assert rejected(spec(), ManifestRow(4, 10, None, "expected 3 fields, got 2")) == (
        "expected 3 fields, got 2")


def test_a_missing_or_empty_zone_column_falls_back() -> None:
    s = spec(window=TEN_TO_EIGHT, timezone="tz")
    no_column = mapped(s, row(to="+81312345678"))
    empty = mapped(s, row(to="+81312345678", tz=" "))
    assert no_column.due == empty.due == NOW


@pytest.mark.parametrize("number", ["+19995550100", "4155550100", "+1415555010", "+44 20 x"])
def test_an_invalid_phone_number_is_rejected_without_quoting_it(number: str) -> None:
    reason = rejected(spec(), row(to=number))
    assert reason.startswith("recipient: ")
    assert number not in reason and number.lstrip("+") not in reason


@pytest.mark.parametrize("address", ["bob@@secret.example", "bob<x>@secret.example",
                                     "bob", "bob@secret..example"])
def test_an_invalid_email_address_is_rejected_without_quoting_it(address: str) -> None:
    reason = rejected(spec(Channel.EMAIL), row(to=address))
    assert reason == "recipient: invalid email address"


def test_other_invalid_fields_name_the_field_not_the_value() -> None:
    push = spec(Channel.PUSH, platform="os")
    assert rejected(push, row(to="short", os="ios")).startswith("recipient.device_token: ")
    assert rejected(push, row(to="zz" * 32, os="ios")) == (
        "recipient: device_token is not a valid ios token")
    assert rejected(push, row(to="ab" * 32, os="windows")).startswith("recipient.platform: ")
    long = rejected(spec(), row(to="+14155550100", n="secret " * 1000))
    assert long.startswith("variables: ") and "secret" not in long
    echo = rejected(push, row(to="zz" * 32, os="ios", n="is not a valid"))
    assert echo == "recipient: invalid (value_error)"


def test_a_locale_column_sets_each_rows_locale() -> None:
    s = spec(locale="lang")
    assert mapped(s, row(to="+14155550100", lang="fr-ca")).record.locale == "fr-CA"
    assert mapped(s, row(to="+14155550100", lang=" ")).record.locale is None
    assert mapped(s, row(to="+14155550100")).record.locale is None
    assert mapped(spec(), row(to="+14155550100", lang="fr")).record.locale is None
    assert rejected(s, row(to="+14155550100", lang="klingon!")).startswith(
        "locale: locale is a BCP 47 tag")


@pytest.mark.parametrize("zone", ["Mars/Olympus", "America", "Europe/", "../etc/passwd",
                                  "x" * 300])
def test_an_unknown_zone_in_the_row_is_rejected(zone: str) -> None:
    s = spec(window=TEN_TO_EIGHT, timezone="tz")
    assert rejected(s, row(to="+14155550100", tz=zone)) == "unknown time zone in column 'tz'"


def test_an_unknown_default_zone_fails_the_campaign() -> None:
    with pytest.raises(ManifestError):
        map_row(spec(Channel.EMAIL, TEN_TO_EIGHT, default_zone="Nowhere/Town"),
                row(to="bob@example.com"), NOW, KEYS)


# -- due instants -------------------------------------------------------------------------


def test_a_window_in_three_zones() -> None:
    s = spec(window=TEN_TO_EIGHT, timezone="tz")
    due = {tz: mapped(s, row(to="+14155550100", tz=tz)).due
           for tz in ("America/New_York", "Europe/Berlin", "Asia/Tokyo")}
    assert due == {
        "America/New_York": datetime(2026, 6, 15, 14, 0, tzinfo=UTC),
        "Europe/Berlin": datetime(2026, 6, 15, 8, 0, tzinfo=UTC),
        "Asia/Tokyo": NOW,
    }


def test_the_zone_comes_from_the_row_then_the_number_then_the_campaign() -> None:
    s = spec(window=TEN_TO_EIGHT)
    assert mapped(s, row(to="+12125550123")).due == datetime(2026, 6, 15, 14, tzinfo=UTC)
    assert mapped(s, row(to="+81312345678")).due == NOW
    assert mapped(s, row(to="+447911123456")).due == datetime(2026, 6, 15, 8, tzinfo=UTC)
    email = spec(Channel.EMAIL, TEN_TO_EIGHT, default_zone="Asia/Tokyo")
    assert mapped(email, row(to="bob@example.com")).due == NOW
    by_row = spec(window=TEN_TO_EIGHT, timezone="tz")
    assert mapped(by_row, row(to="+81312345678", tz="America/New_York")).due == datetime(
        2026, 6, 15, 14, tzinfo=UTC)


@pytest.mark.parametrize(("now", "due"), [
    (datetime(2026, 12, 4, 11, 0), datetime(2026, 12, 4, 21, 0)),
    (datetime(2026, 12, 4, 22, 30), datetime(2026, 12, 4, 22, 30)),
    (datetime(2026, 12, 5, 4, 59), datetime(2026, 12, 5, 4, 59)),
    (datetime(2026, 12, 5, 5, 0), datetime(2026, 12, 5, 21, 0)),
])
def test_a_window_across_midnight(now: datetime, due: datetime) -> None:
    s = spec(window=LocalWindow(start=time(22), end=time(6)), timezone="tz",
             ends_at=datetime(2027, 1, 1, tzinfo=UTC))
    out = mapped(s, row(to="+14155550100", tz="Europe/Berlin"), now.replace(tzinfo=UTC))
    assert out.due == due.replace(tzinfo=UTC)


@pytest.mark.parametrize(("zone", "start", "end", "now", "due"), [
    ("America/New_York", time(2, 30), time(20), datetime(2026, 3, 8, 5), datetime(2026, 3, 8, 7)),
    ("America/New_York", time(2, 10), time(2, 50), datetime(2026, 3, 8, 5),
     datetime(2026, 3, 9, 6, 10)),
    ("Europe/Berlin", time(2, 30), time(20), datetime(2026, 3, 29), datetime(2026, 3, 29, 1)),
    ("America/New_York", time(1, 30), time(2), datetime(2026, 11, 1, 6, 15),
     datetime(2026, 11, 1, 6, 30)),
    ("America/New_York", time(0, 30), time(1, 30), datetime(2026, 11, 1, 5, 45),
     datetime(2026, 11, 1, 6)),
])
def test_dst_days(zone: str, start: time, end: time, now: datetime, due: datetime) -> None:
    """A start in the spring-forward gap opens at the gap's end (03:00 local), unless the
    whole window is in the gap; the repeated autumn hour opens a window a second time."""
    s = spec(window=LocalWindow(start=start, end=end), timezone="tz",
             ends_at=datetime(2027, 1, 1, tzinfo=UTC))
    out = mapped(s, row(to="+14155550100", tz=zone), now.replace(tzinfo=UTC))
    assert out.due == due.replace(tzinfo=UTC)


def test_no_window_before_the_end_is_a_rejection() -> None:
    s = spec(window=TEN_TO_EIGHT, timezone="tz", ends_at=datetime(2026, 6, 15, 8, tzinfo=UTC))
    assert rejected(s, row(to="+14155550100", tz="Europe/Berlin")) == (
        "no send window before the campaign ends")
    assert mapped(s, row(to="+14155550100", tz="Asia/Tokyo")).due == NOW
    ended = dataclasses.replace(spec(), ends_at=NOW)
    assert rejected(ended, row(to="+14155550100")) == "no send window before the campaign ends"


# -- LocalWindow.next_open ----------------------------------------------------------------

ZONES = ["America/New_York", "Europe/Berlin", "Asia/Tokyo", "Australia/Lord_Howe",
         "America/Havana", "America/Santiago", "Europe/Dublin", "Asia/Kathmandu",
         "Pacific/Chatham", "Africa/Casablanca", "UTC"]
YEAR = datetime(2026, 1, 1, tzinfo=UTC)


@functools.cache
def transitions(zone: str) -> list[datetime]:
    """The first whole hour (UTC) after each of the zone's 2026 offset changes."""
    tz, out = ZoneInfo(zone), []
    hours = [YEAR + timedelta(hours=h) for h in range(366 * 24)]
    for before, after in itertools.pairwise(hours):
        if before.astimezone(tz).utcoffset() != after.astimezone(tz).utcoffset():
            out.append(after)
    return out


@st.composite
def windows_and_instants(draw: st.DrawFn) -> tuple[LocalWindow, datetime, ZoneInfo]:
    """Mostly an instant within a day and a half of one of the zone's DST transitions and a
    window opening or closing within two hours of the transition's wall-clock time, so gaps
    and repeated hours are hit; else anything."""
    zone = draw(st.sampled_from(ZONES))
    minute = st.integers(0, 24 * 60 - 1).map(lambda m: time(m // 60, m % 60))
    near = transitions(zone)
    if near and draw(st.integers(0, 3)):
        t = draw(st.sampled_from(near))
        at = t + timedelta(minutes=draw(st.integers(-36 * 60, 6 * 60)))
        wall = t.astimezone(ZoneInfo(zone)).replace(tzinfo=None)
        edge = st.integers(-120, 120).map(lambda m: (wall + timedelta(minutes=m)).time())
        start, end = draw(st.one_of(st.tuples(edge, minute), st.tuples(minute, edge)))
    else:
        at = YEAR + timedelta(minutes=draw(st.integers(0, 365 * 24 * 60)))
        start, end = draw(minute), draw(minute)
    assume(start != end)
    return LocalWindow(start=start, end=end), at, ZoneInfo(zone)


def first_open_minute(w: LocalWindow, at: datetime, zone: ZoneInfo) -> datetime:
    t = at
    while not w.contains(t.astimezone(zone).time()):
        t += timedelta(minutes=1)
    return t


@settings(max_examples=400, deadline=None)
@given(case=windows_and_instants(),
       probes=st.lists(st.floats(0, 1, exclude_max=True), max_size=8))
def test_next_open_is_the_first_instant_inside_the_window(
        case: tuple[LocalWindow, datetime, ZoneInfo], probes: list[float]) -> None:
    w, at, tz = case
    got = w.next_open(at, tz)
    assert at <= got <= at + timedelta(days=2)
    assert w.contains(got.astimezone(tz).time())
    assert got == at or not w.contains(at.astimezone(tz).time())
    for p in probes:
        probe = at + (got - at) * p
        assert probe >= got or not w.contains(probe.astimezone(tz).time())
    assert got == first_open_minute(w, at, tz)
    in_zone = w.next_open(at.astimezone(tz), tz)
    assert in_zone.tzinfo is tz and in_zone.timestamp() == got.timestamp()


def test_a_zone_directory_is_an_unknown_zone_not_a_crash() -> None:
    from pydantic import ValidationError

    from notiflow.schemas.campaigns import CampaignRequest

    with pytest.raises(ValidationError, match="unknown time zone"):
        CampaignRequest.model_validate({
            "name": "n", "channel": "SMS", "template_id": "t", "template_version": 1,
            "manifest": "s3://b/k.csv", "mapping": {"recipient": "p"}, "timezone": "America"})
