"""Recurrence engine: DST semantics, validation, and the properties materialisation needs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from dateutil.rrule import rrulestr
from hypothesis import given, settings
from hypothesis import strategies as st

from notiflow.schemas.recurrence import (
    Recurrence,
    RecurrenceError,
    occurrences,
    parse_recurrence,
)

NY, PARIS = "America/New_York", "Europe/Paris"
START = datetime(2027, 1, 1, tzinfo=UTC)


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def schedule(expression: str, zone: str, starts_at: datetime = START, **kw) -> Recurrence:
    if expression.startswith("RRULE:"):
        return parse_recurrence(
            cron=None, rrule=expression, timezone=zone, starts_at=starts_at, **kw
        )
    return parse_recurrence(cron=expression, rrule=None, timezone=zone, starts_at=starts_at, **kw)


def between(expression: str, zone: str, after: datetime, until: datetime) -> list[datetime]:
    return occurrences(schedule(expression, zone), after, until)


def daily(hour: int, minute: int) -> list[str]:
    """The same daily schedule as cron and as RRULE."""
    return [
        f"{minute} {hour} * * *",
        f"RRULE:FREQ=DAILY;BYHOUR={hour};BYMINUTE={minute};BYSECOND=0",
    ]


HOURLY = ["0 * * * *", "RRULE:FREQ=HOURLY;BYMINUTE=0;BYSECOND=0"]
WEEKDAYS_0930 = ["30 9 * * 1-5", "RRULE:FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=30"]


# --- DST: the documented semantics -------------------------------------------------------


DstCase = tuple[str, list[str], datetime, datetime, list[datetime]]

ACROSS_DST: dict[str, DstCase] = {
    # 02:30 does not exist on 2027-03-14 in New York: it fires at 03:30 EDT = 07:30 UTC.
    "daily-us-spring-forward": (
        NY, daily(2, 30), utc(2027, 3, 13, 0), utc(2027, 3, 16, 0),
        [utc(2027, 3, 13, 7, 30), utc(2027, 3, 14, 7, 30), utc(2027, 3, 15, 6, 30)]),
    # 01:30 happens twice on 2027-11-07: it fires at 01:30 EDT = 05:30 UTC only.
    "daily-us-fall-back": (
        NY, daily(1, 30), utc(2027, 11, 6, 0), utc(2027, 11, 9, 0),
        [utc(2027, 11, 6, 5, 30), utc(2027, 11, 7, 5, 30), utc(2027, 11, 8, 6, 30)]),
    # 02:00 CET jumps to 03:00 CEST on 2027-03-28: 02:30 fires at 03:30 CEST = 01:30 UTC.
    "daily-eu-spring-forward": (
        PARIS, daily(2, 30), utc(2027, 3, 27, 0), utc(2027, 3, 30, 0),
        [utc(2027, 3, 27, 1, 30), utc(2027, 3, 28, 1, 30), utc(2027, 3, 29, 0, 30)]),
    # 03:00 CEST falls back to 02:00 CET on 2027-10-31: 02:30 fires at 02:30 CEST = 00:30 UTC.
    "daily-eu-fall-back": (
        PARIS, daily(2, 30), utc(2027, 10, 30, 0), utc(2027, 11, 2, 0),
        [utc(2027, 10, 30, 0, 30), utc(2027, 10, 31, 0, 30), utc(2027, 11, 1, 1, 30)]),
    # local 00:00 EST, 01:00 EST, 02:00 (-> 03:00 EDT), 03:00 EDT (same instant), 04:00 EDT
    "hourly-us-spring-forward": (
        NY, HOURLY, utc(2027, 3, 14, 4), utc(2027, 3, 14, 8),
        [utc(2027, 3, 14, 5), utc(2027, 3, 14, 6), utc(2027, 3, 14, 7), utc(2027, 3, 14, 8)]),
    # local 00:00 EDT, 01:00 EDT, (01:00 EST skipped), 02:00 EST, 03:00 EST
    "hourly-us-fall-back": (
        NY, HOURLY, utc(2027, 11, 7, 3), utc(2027, 11, 7, 8),
        [utc(2027, 11, 7, 4), utc(2027, 11, 7, 5), utc(2027, 11, 7, 7), utc(2027, 11, 7, 8)]),
    "hourly-eu-spring-forward": (
        PARIS, HOURLY, utc(2027, 3, 27, 22), utc(2027, 3, 28, 3),
        [utc(2027, 3, 27, 23), utc(2027, 3, 28, 0), utc(2027, 3, 28, 1), utc(2027, 3, 28, 2),
         utc(2027, 3, 28, 3)]),
    # local 00:00, 01:00, 02:00 CEST, (02:00 CET skipped), 03:00 CET, 04:00 CET
    "hourly-eu-fall-back": (
        PARIS, HOURLY, utc(2027, 10, 30, 21), utc(2027, 10, 31, 3),
        [utc(2027, 10, 30, 22), utc(2027, 10, 30, 23), utc(2027, 10, 31, 0),
         utc(2027, 10, 31, 2), utc(2027, 10, 31, 3)]),
}


def each_form(cases: dict[str, DstCase]) -> list[object]:
    """One ``(expression, zone, after, until, expected)`` case per expression of each
    named case (its cron and its RRULE form)."""
    return [pytest.param(expression, zone, after, until, expected,
                         id=f"{name}-{'rrule' if expression.startswith('RRULE:') else 'cron'}")
            for name, (zone, expressions, after, until, expected) in cases.items()
            for expression in expressions]


@pytest.mark.parametrize(("expression", "zone", "after", "until", "expected"),
                         each_form(ACROSS_DST))
def test_across_a_dst_change_each_local_time_fires_once(expression, zone, after, until,
                                                         expected):
    """A nonexistent local time fires once, shifted by the gap; an ambiguous one once, at
    its first occurrence."""
    assert between(expression, zone, after, until) == expected


@pytest.mark.parametrize("expression", HOURLY)
def test_hourly_fires_23_times_on_spring_day_and_24_on_fall_day(expression):
    zone = ZoneInfo(NY)
    spring = between(expression, NY, utc(2027, 3, 14, 4, 59), utc(2027, 3, 15, 3, 59))
    fall = between(expression, NY, utc(2027, 11, 7, 3, 59), utc(2027, 11, 8, 4, 59))
    assert {at.astimezone(zone).date().day for at in spring} == {14}
    assert {at.astimezone(zone).date().day for at in fall} == {7}
    assert (len(spring), len(fall)) == (23, 24)


@pytest.mark.parametrize("expression", WEEKDAYS_0930)
def test_weekdays_0930_paris_keep_local_time_across_both_changes(expression):
    spring = between(expression, PARIS, utc(2027, 3, 25), utc(2027, 3, 31))
    assert spring == [
        utc(2027, 3, 25, 8, 30),
        utc(2027, 3, 26, 8, 30),
        utc(2027, 3, 29, 7, 30),
        utc(2027, 3, 30, 7, 30),
    ]
    fall = between(expression, PARIS, utc(2027, 10, 28), utc(2027, 11, 3))
    assert fall == [
        utc(2027, 10, 28, 7, 30),
        utc(2027, 10, 29, 7, 30),
        utc(2027, 11, 1, 8, 30),
        utc(2027, 11, 2, 8, 30),
    ]


@pytest.mark.parametrize("expression", daily(2, 30))
def test_after_inside_the_shifted_hour_still_sees_the_shifted_occurrence(expression):
    # `after` = 07:10 UTC is 03:10 EDT, a wall time later than 02:30: the 02:30 occurrence
    # (07:30 UTC) must still come out of the second half of a split range.
    rec = schedule(expression, NY)
    a, b, c = utc(2027, 3, 14, 0), utc(2027, 3, 14, 7, 10), utc(2027, 3, 14, 12)
    assert occurrences(rec, a, b) == []
    assert occurrences(rec, b, c) == [utc(2027, 3, 14, 7, 30)]


def test_a_day_skipped_by_the_zone_needs_no_special_case():
    # Samoa skipped 2011-12-30 (UTC-10 -> UTC+14): hourly still fires every UTC hour once.
    rec = schedule("0 * * * *", "Pacific/Apia", starts_at=utc(2011, 12, 1))
    got = occurrences(rec, utc(2011, 12, 29), utc(2012, 1, 1))
    assert got == [utc(2011, 12, 29) + timedelta(hours=h) for h in range(1, 73)]
    b = utc(2011, 12, 30, 12)
    assert occurrences(rec, utc(2011, 12, 29), b) + occurrences(rec, b, utc(2012, 1, 1)) == got
    # Friday 2011-12-30 02:30 did not exist: it fires 24 h later in wall time, at 12:30 UTC,
    # which a range starting at 12:00 UTC (Saturday 02:00 local) must still return.
    fridays = schedule("30 2 * * 5", "Pacific/Apia", starts_at=utc(2011, 12, 1))
    assert occurrences(fridays, utc(2011, 12, 20), b) == [utc(2011, 12, 23, 12, 30)]
    assert occurrences(fridays, b, utc(2012, 1, 8)) == [
        utc(2011, 12, 30, 12, 30),
        utc(2012, 1, 5, 12, 30),
    ]


# --- bounds, RRULE details ---------------------------------------------------------------


@pytest.mark.parametrize("expression", ["0 9 * * *", "RRULE:FREQ=DAILY;BYHOUR=9;BYMINUTE=0"])
def test_occurrences_stay_within_starts_at_and_ends_at(expression):
    rec = schedule(expression, "UTC", starts_at=utc(2027, 1, 2, 9), ends_at=utc(2027, 1, 4, 9))
    assert occurrences(rec, utc(2026, 1, 1), utc(2028, 1, 1)) == [
        utc(2027, 1, 2, 9),
        utc(2027, 1, 3, 9),
        utc(2027, 1, 4, 9),
    ]
    assert occurrences(rec, utc(2027, 1, 2, 9), utc(2027, 1, 3, 9)) == [utc(2027, 1, 3, 9)]
    assert occurrences(rec, utc(2026, 1, 1), utc(2028, 1, 1), limit=2) == [
        utc(2027, 1, 2, 9),
        utc(2027, 1, 3, 9),
    ]
    assert occurrences(rec, utc(2026, 1, 1), utc(2028, 1, 1), limit=0) == []


def test_parse_keeps_the_input_and_normalises_instants_to_utc():
    paris = ZoneInfo(PARIS)
    rec = parse_recurrence(
        cron=" 30 9 * * 1-5 ",
        rrule=None,
        timezone=PARIS,
        starts_at=datetime(2027, 1, 1, 12, tzinfo=paris),
    )
    assert rec == Recurrence("cron", "30 9 * * 1-5", PARIS, utc(2027, 1, 1, 11))
    assert rec.starts_at.tzinfo is UTC


@pytest.mark.parametrize(
    "rule", ["FREQ=DAILY;BYHOUR=9", "RRULE:FREQ=DAILY;BYHOUR=9", "rrule:freq=daily;byhour=9"]
)
def test_rrule_accepted_bare_or_prefixed_and_defaults_from_starts_at(rule):
    # RFC 5545: BYMINUTE and BYSECOND left out default from DTSTART (= starts_at)
    rec = parse_recurrence(
        cron=None, rrule=rule, timezone="UTC", starts_at=utc(2027, 1, 1, 10, 17, 42)
    )
    assert occurrences(rec, START, utc(2027, 1, 3)) == [datetime(2027, 1, 2, 9, 17, 42, tzinfo=UTC)]


def test_rrule_count_and_until():
    counted = schedule("RRULE:FREQ=DAILY;BYHOUR=9;BYMINUTE=0;BYSECOND=0;COUNT=3", "UTC")
    assert occurrences(counted, START, utc(2028, 1, 1)) == [utc(2027, 1, d, 9) for d in (1, 2, 3)]
    assert occurrences(counted, utc(2027, 6, 1), utc(2027, 6, 30)) == []
    utc_until = schedule("RRULE:FREQ=DAILY;BYHOUR=9;BYMINUTE=0;UNTIL=20270103T080000Z", PARIS)
    assert occurrences(utc_until, START, utc(2028, 1, 1)) == [utc(2027, 1, d, 8) for d in (1, 2, 3)]
    local_until = schedule("RRULE:FREQ=DAILY;BYHOUR=9;BYMINUTE=0;UNTIL=20270103T085959", PARIS)
    assert occurrences(local_until, START, utc(2028, 1, 1)) == [utc(2027, 1, d, 8) for d in (1, 2)]


@pytest.mark.parametrize(
    "rule",
    [
        "FREQ=MINUTELY;INTERVAL=7;BYHOUR=1,2,3",
        "FREQ=HOURLY;INTERVAL=5;BYMINUTE=10",
        "FREQ=DAILY;INTERVAL=3;BYHOUR=2,9;BYMINUTE=30;BYSETPOS=-1",
        "FREQ=HOURLY;INTERVAL=7;BYDAY=MO,FR;BYHOUR=1,2,3,4,5,6,7,8",
        "FREQ=MINUTELY;INTERVAL=1000;BYMONTHDAY=1,15",
    ],
)
def test_long_lived_rrule_gives_what_iterating_from_its_start_gives(rule):
    # occurrences() skips whole cycles of DAILY/HOURLY/MINUTELY rules instead of iterating
    # from starts_at; dateutil iterating from DTSTART is the reference.
    starts_at = datetime(2025, 2, 3, 4, 5, 6, tzinfo=UTC)
    rec = parse_recurrence(cron=None, rrule=rule, timezone=NY, starts_at=starts_at)
    for after in (utc(2027, 3, 13, 22, 17), utc(2027, 11, 6, 23, 59, 59), utc(2025, 2, 3)):
        assert occurrences(rec, after, after + timedelta(days=9)) == reference(
            rec, after, after + timedelta(days=9)
        )


# --- validation --------------------------------------------------------------------------


def refused(**kw) -> RecurrenceError:
    args = {"cron": None, "rrule": None, "timezone": "UTC", "starts_at": START} | kw
    with pytest.raises(RecurrenceError) as caught:
        parse_recurrence(**args)
    assert caught.value.reason and str(caught.value).startswith(caught.value.field)
    return caught.value


@pytest.mark.parametrize(
    "cron",
    [
        "",
        "61 * * * *",
        "* * *",
        "a b c d e",
        "0 0 * * 8",
        "*/0 * * * *",
        "@reboot",
        "0 0 1 1 * 2030",
        "* * * * * *",
        "H * * * *",
        "R * * * *",
        "H(0-29) * * * *",
    ],
)
def test_malformed_cron_is_refused_on_field_cron(cron):
    assert refused(cron=cron).field == "cron"


@pytest.mark.parametrize(
    "rule",
    [
        "",
        "FREQ=FORTNIGHTLY",
        "FREQ=DAILY;BYHOUR=25",
        "BYHOUR=9",
        "FREQ=DAILY;;",
        "FREQ=DAILY;X-FOO=1",
        "FREQ=DAILY;INTERVAL=0",
        "FREQ=DAILY;INTERVAL=-1",
        "FREQ=SECONDLY;BYSECOND=0",
        "FREQ=YEARLY;BYEASTER=0",
        "EXRULE:FREQ=DAILY",
        "DTSTART:20270101T000000Z\nRRULE:FREQ=DAILY",
        "FREQ=DAILY;DTSTART=20270101T000000",
        "FREQ=DAILY;UNTIL=20270301",
        "FREQ=DAILY;UNTIL=20271332T000000Z",
        "FREQ=DAILY;COUNT=3;UNTIL=20270301T000000Z",
        "FREQ=DAILY BYHOUR=9",
        "FREQ=MINUTELY;INTERVAL=60;BYHOUR=9;BYMINUTE=30",
    ],
)
def test_malformed_rrule_is_refused_on_field_rrule(rule):
    assert refused(rrule=rule).field == "rrule"


@pytest.mark.parametrize("pair", [(None, None), ("0 9 * * *", "FREQ=DAILY"), ("", "")])
def test_exactly_one_of_cron_and_rrule(pair):
    assert refused(cron=pair[0], rrule=pair[1]).field == "cron"


@pytest.mark.parametrize(
    "zone",
    [
        "Mars/Olympus",
        "",
        "europe/paris",
        "Europe/Paris ",
        "localtime",
        "../etc/passwd",
        "/etc/localtime",
    ],
)
def test_unknown_zone_is_refused(zone):
    assert refused(cron="0 9 * * *", timezone=zone).field == "timezone"


def test_naive_instants_and_ends_at_not_after_starts_at_are_refused():
    assert refused(cron="0 9 * * *", starts_at=datetime(2027, 1, 1)).field == "starts_at"
    assert refused(cron="0 9 * * *", ends_at=datetime(2027, 2, 1)).field == "ends_at"
    assert refused(cron="0 9 * * *", ends_at=START).field == "ends_at"
    assert refused(cron="0 9 * * *", ends_at=START - timedelta(days=1)).field == "ends_at"
    assert refused(cron="0 9 * * *", ends_at=utc(2027, 1, 1, 8)).field == "ends_at"


@pytest.mark.parametrize(
    "kind, expression",
    [
        ("cron", "*/5 * * * *"),
        ("rrule", "FREQ=MINUTELY;INTERVAL=5"),
        ("cron", "0,5 9 * * *"),
        ("rrule", "FREQ=DAILY;BYHOUR=9;BYMINUTE=0,5"),
    ],
)
def test_interval_below_min_interval_is_refused(kind, expression):
    error = refused(**{kind: expression}, min_interval=timedelta(minutes=10))
    assert error.field == kind
    parse_recurrence(
        **{"cron": None, "rrule": None, kind: expression},
        timezone="UTC",
        starts_at=START,
        min_interval=timedelta(minutes=5),
    )


@pytest.mark.parametrize(
    "kind, expression",
    [
        ("cron", "0 0 30 2 *"),
        ("cron", "0 0 31 4,6,9,11 *"),
        ("rrule", "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30"),
        ("rrule", "FREQ=DAILY;BYMONTH=4;BYMONTHDAY=31"),
        ("rrule", "FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=30"),
        ("rrule", "FREQ=DAILY;INTERVAL=7;BYDAY=TU"),  # START is a Friday
        ("rrule", "FREQ=DAILY;COUNT=0"),
        ("rrule", "FREQ=DAILY;UNTIL=20261231T000000Z"),
        ("rrule", "FREQ=DAILY;BYHOUR=9;BYSETPOS=2"),
        ("rrule", "FREQ=MINUTELY;BYSETPOS=2"),  # one candidate a minute
        ("rrule", "FREQ=HOURLY;INTERVAL=7;BYHOUR=2;BYDAY=MO"),  # hour 2 falls on Tuesdays
        ("rrule", "FREQ=MINUTELY;BYMONTHDAY=24,27;BYYEARDAY=2;BYHOUR=5,9"),
    ],
)
@pytest.mark.timeout(120)  # dateutil alone would scan up to year 9999 for some of these
def test_expression_that_never_fires_is_refused(kind, expression):
    assert refused(**{kind: expression}).field == kind


def test_rare_but_possible_expressions_are_accepted():
    parse_recurrence(cron="0 0 29 2 *", rrule=None, timezone="UTC", starts_at=START)
    rec = parse_recurrence(
        cron=None,
        rrule="FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO",
        timezone="UTC",
        starts_at=START,
    )
    assert occurrences(rec, START, utc(2100, 1, 1))[0] == utc(2044, 2, 29)


_WORDS = """FREQ= DAILY HOURLY MINUTELY YEARLY ; = , BYHOUR 9 - * / 0 59 L W # ? RRULE: UNTIL
COUNT Z T MON jan @daily INTERVAL BYDAY MO BYSETPOS 2027 20270101T000000"""
_FRAGMENTS = [*_WORDS.split(), " ", "\n"]
_JUNK = st.one_of(
    st.text(max_size=30), st.lists(st.sampled_from(_FRAGMENTS), max_size=12).map("".join)
)


@settings(max_examples=300, deadline=None)
@given(expression=_JUNK, as_rrule=st.booleans(), zone=st.one_of(st.text(max_size=20), st.just(NY)))
def test_any_input_gives_a_recurrence_or_a_recurrence_error(expression, as_rrule, zone):
    try:
        parse_recurrence(
            cron=None if as_rrule else expression,
            rrule=expression if as_rrule else None,
            timezone=zone,
            starts_at=START,
        )
    except RecurrenceError as error:
        assert error.field in {"cron", "rrule", "timezone"}


def _values(low: int, high: int) -> st.SearchStrategy[str]:
    values = st.lists(st.integers(low, high), min_size=1, max_size=3, unique=True)
    return values.map(lambda v: ",".join(map(str, v)))


_PARTS = st.one_of(
    _values(1, 12).map("BYMONTH={}".format),
    _values(-31, 31).filter(lambda v: v != "0").map("BYMONTHDAY={}".format),
    st.sampled_from(["BYDAY=MO", "BYDAY=SA,SU", "BYDAY=1MO,-1FR", "BYDAY=TU,TH"]),
    _values(0, 23).map("BYHOUR={}".format),
    _values(0, 59).map("BYMINUTE={}".format),
    _values(0, 59).map("BYSECOND={}".format),
    _values(-3, 3).filter(lambda v: "0" not in v.split(",")).map("BYSETPOS={}".format),
    _values(1, 53).map("BYWEEKNO={}".format),
    _values(1, 366).map("BYYEARDAY={}".format),
    st.integers(1, 40).map("COUNT={}".format),
    st.sampled_from(["WKST=SU", "WKST=MO", "UNTIL=20270320T000000Z", "UNTIL=20270319T120000"]),
)
RULES = st.builds(
    lambda freq, interval, parts: ";".join([f"FREQ={freq}", f"INTERVAL={interval}", *parts]),
    st.sampled_from(["YEARLY", "MONTHLY", "WEEKLY", "DAILY", "HOURLY", "MINUTELY"]),
    st.integers(1, 100),
    st.lists(_PARTS, max_size=3, unique_by=lambda part: part.split("=")[0]),
)


@settings(max_examples=150, deadline=None)
@given(
    rule=RULES,
    zone=st.sampled_from(["America/New_York", "Europe/Paris"]),
    shift=st.integers(0, 10**5),
)
def test_any_rrule_is_refused_or_agrees_with_dateutil_across_dst(rule, zone, shift):
    starts_at = utc(2027, 3, 10, 4, 5, 6) + timedelta(minutes=shift)
    try:
        rec = parse_recurrence(cron=None, rrule=rule, timezone=zone, starts_at=starts_at)
    except RecurrenceError as error:
        assert error.field == "rrule"
        return
    a = starts_at + timedelta(days=2, minutes=shift % 997)
    b, c = a + timedelta(minutes=shift % 7000), a + timedelta(days=5)
    whole = occurrences(rec, a, c)
    assert occurrences(rec, a, b) + occurrences(rec, b, c) == whole
    assert "UNTIL" in rule or whole == reference(rec, a, c)  # the reference knows no UNTIL


# --- properties --------------------------------------------------------------------------

ZONES = [NY, PARIS, "Australia/Lord_Howe", "Pacific/Apia", "Asia/Kolkata", "UTC"]
EXPRESSIONS = [
    "*/15 * * * *",
    "0 * * * *",
    "30 2 * * *",
    "30 1 * * *",
    "0,30 1-3 * * *",
    "45 2 * * 1-5",
    "15 */2 * * *",
    "0 0 * * 0",
    "RRULE:FREQ=HOURLY;BYMINUTE=0,30;BYSECOND=0",
    "RRULE:FREQ=DAILY;BYHOUR=2;BYMINUTE=30;BYSECOND=0",
    "RRULE:FREQ=MINUTELY;INTERVAL=90",
    "RRULE:FREQ=WEEKLY;BYDAY=SU;BYHOUR=1,2,3;BYMINUTE=15;BYSECOND=0",
    "RRULE:FREQ=DAILY;BYHOUR=2,3;BYMINUTE=0,30;BYSECOND=0;BYSETPOS=2,3",
    "RRULE:FREQ=MINUTELY;INTERVAL=45;COUNT=300",
    "RRULE:FREQ=HOURLY;INTERVAL=5;BYMINUTE=10",
    "RRULE:FREQ=MINUTELY;INTERVAL=7;BYHOUR=1,2,3",
    "RRULE:FREQ=DAILY;INTERVAL=3;BYHOUR=2;BYMINUTE=30;BYSETPOS=1",
]
# 2027 transitions of the zones above, and Samoa's skipped day
PIVOTS = [
    utc(2027, 3, 14, 7),
    utc(2027, 11, 7, 6),
    utc(2027, 3, 28, 1),
    utc(2027, 10, 31, 1),
    utc(2027, 4, 3, 15),
    utc(2027, 10, 2, 15),
    utc(2011, 12, 30, 10),
]
minutes = st.one_of(st.integers(-3 * 24 * 60, 3 * 24 * 60), st.integers(-150, 150)).map(
    lambda m: timedelta(minutes=m)
)
seconds = st.integers(0, 59).map(lambda s: timedelta(seconds=s))


@st.composite
def cases(draw: st.DrawFn) -> tuple[Recurrence, datetime, datetime, datetime]:
    pivot = draw(st.sampled_from(PIVOTS))
    starts_at = pivot + draw(minutes) - timedelta(days=3) + draw(seconds)
    ends = draw(st.one_of(st.none(), minutes.map(lambda d: pivot + d + timedelta(days=3))))
    expression, zone = draw(st.sampled_from(EXPRESSIONS)), draw(st.sampled_from(ZONES))
    try:
        rec = schedule(expression, zone, starts_at=starts_at, ends_at=ends)
    except RecurrenceError as error:  # no occurrence before ends_at
        assert error.field == "ends_at"
        rec = schedule(expression, zone, starts_at=starts_at)
    a, b, c = sorted(pivot + draw(minutes) + draw(seconds) for _ in range(3))
    return rec, a, b, c


def reference(rec: Recurrence, after: datetime, until: datetime) -> list[datetime]:
    """The documented semantics, applied from three days earlier (cron) or DTSTART (RRULE)."""
    zone = ZoneInfo(rec.timezone)
    if rec.kind == "cron":
        start = (after - timedelta(days=3)).astimezone(zone).replace(tzinfo=None)
        walls = croniter(rec.expression, start).all_next(datetime)
    else:
        walls = iter(
            rrulestr(rec.expression, dtstart=rec.starts_at.astimezone(zone).replace(tzinfo=None))
        )
    out: list[datetime] = []
    latest = None
    for wall in walls:
        at = wall.replace(tzinfo=zone).astimezone(UTC)
        if latest is None or at > latest:
            latest = at
            if at > min(until, rec.ends_at or until):
                return out
            if at > after and at >= rec.starts_at:
                out.append(at)
    return out


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_splitting_a_range_gives_the_same_occurrences(case):
    rec, a, b, c = case
    whole = occurrences(rec, a, c)
    assert occurrences(rec, a, b) + occurrences(rec, b, c) == whole
    assert whole == reference(rec, a, c)


@settings(max_examples=300, deadline=None)
@given(case=cases(), limit=st.integers(0, 40))
def test_occurrences_are_increasing_bounded_and_limited(case, limit):
    rec, a, _, c = case
    got = occurrences(rec, a, c, limit=limit)
    assert got == occurrences(rec, a, c)[:limit]
    assert all(x < y for x, y in pairwise(got))
    for at in got:
        assert at.tzinfo is UTC and a < at <= c and rec.starts_at <= at
        assert rec.ends_at is None or at <= rec.ends_at
