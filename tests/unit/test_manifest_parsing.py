"""Manifest parsing on bytes: any chunking gives the same rows, a reader resumed at any row's
end offset gives exactly the rest, CSV round-trips, bad rows are rows with reasons (never
their content), and rows map to records with their recipient's local window."""

from __future__ import annotations

import csv
import dataclasses
import io
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notiflow.flows.manifest import (
    CampaignSpec,
    ManifestError,
    ManifestRow,
    Mapped,
    Rejected,
    RowReader,
    map_row,
)
from notiflow.schemas.campaigns import ColumnMapping, LocalWindow, ManifestFormat
from notiflow.schemas.enums import Category, Channel, Tier

cells = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r"),
                max_size=12)
"""Cells without a bare CR: Python's writer leaves one unquoted, which RFC 4180 forbids
(and the reader reports as a bad row)."""


def read(data: bytes, fmt: ManifestFormat = "csv", cuts: list[int] | None = None,
         **kw: object) -> list[ManifestRow]:
    reader = RowReader(fmt, **kw)  # type: ignore[arg-type]
    out: list[ManifestRow] = []
    at = 0
    for cut in [*sorted(set(cuts or [])), len(data)]:
        out += reader.feed(data[at:cut])
        at = cut
    return out + reader.finish()


def write_csv(rows: list[list[str]], newline: str = "\n") -> bytes:
    buf = io.StringIO()
    csv.writer(buf, lineterminator=newline).writerows([["a", "b", "c"], *rows])
    return buf.getvalue().encode()


@given(rows=st.lists(st.lists(cells, min_size=3, max_size=3), max_size=20),
       newline=st.sampled_from(["\n", "\r\n"]), data=st.data())
def test_any_chunking_and_any_resume_point_give_the_same_rows(
        rows: list[list[str]], newline: str, data: st.DataObject) -> None:
    blob = write_csv(rows, newline)
    whole = read(blob)
    oracle = [r for r in csv.reader(io.StringIO(blob.decode(), newline=""))][1:]
    assert [list(r.fields.values()) for r in whole if r.fields] == [r for r in oracle if r]
    assert all(r.error is None for r in whole)
    cuts = data.draw(st.lists(st.integers(0, len(blob)), max_size=8))
    assert read(blob, cuts=cuts) == whole
    if whole:
        k = data.draw(st.integers(0, len(whole) - 1))
        at = whole[k]
        rest = read(blob[at.end_offset:], start_offset=at.end_offset, next_row=at.number + 1,
                    header=("a", "b", "c"))
        assert rest == whole[k + 1:]


def test_quotes_newlines_bom_and_bad_rows() -> None:
    blob = ('\ufeffphone,note\n+14155550100,"two\nlines, one field"\n'
            '+14155550101\n+14155550102,x,y\n').encode() + b"\xff\xfe,bad\n\n+14155550103,ok"
    rows = read(blob)
    assert [r.number for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0].fields == {"phone": "+14155550100", "note": "two\nlines, one field"}
    assert rows[1].error == "expected 2 fields, got 1"
    assert rows[2].error == "expected 2 fields, got 3"
    assert rows[3].error == "row is not valid UTF-8"
    assert rows[4].fields == {"phone": "+14155550103", "note": "ok"}
    assert rows[4].end_offset == len(blob)
    assert all("+1415" not in (r.error or "") for r in rows)


def test_a_bare_carriage_return_is_a_bad_row() -> None:
    rows = read(b"a,b\n1,x\ry\n2,ok\n")
    assert rows[0].error is not None and rows[0].error.startswith("not valid CSV")
    assert rows[1].fields == {"a": "2", "b": "ok"}


def test_an_unbalanced_quote_costs_one_row_not_the_file() -> None:
    blob = b'a,b\n1,"never closed\n' + b"x" * 200 + b"\n2,ok\n3,ok\n"
    rows = read(blob, max_row_bytes=100, cuts=[30, 90, 150])
    assert rows[0].error == "row longer than 100 bytes"
    assert [r.fields for r in rows[1:]][-2:] == [{"a": "2", "b": "ok"}, {"a": "3", "b": "ok"}]


def test_headers_must_name_every_column_once() -> None:
    for bad in (b"a,,b\n1,2,3\n", b"a,a\n1,2\n"):
        with pytest.raises(ManifestError):
            read(bad)
    with pytest.raises(ValueError):
        RowReader("csv", start_offset=10)


def test_json_lines() -> None:
    blob = b'{"phone": "+14155550100", "n": 3}\n\n[1]\n{"p": {"x": 1}}\n{bad\n{"phone": "x"}'
    rows = read(blob, "jsonl", cuts=[5, 40])
    assert rows[0].fields == {"phone": "+14155550100", "n": 3}
    assert [r.error for r in rows[1:4]] == ["not a JSON object", "column 'p' is not a scalar",
                                             rows[3].error]
    assert rows[3].error is not None and rows[3].error.startswith("not valid JSON")
    assert rows[4].fields == {"phone": "x"} and rows[4].number == 5


NOW = datetime(2026, 12, 4, 15, 0, tzinfo=UTC)


def spec(channel: Channel = Channel.SMS, window: LocalWindow | None = None,
         **mapping: object) -> CampaignSpec:
    m = ColumnMapping.model_validate({"recipient": "to", "variables": {"name": "n"},
                                      **mapping})
    return CampaignSpec("mkt", "cmp_" + "c" * 32, channel, Tier.P3, Category.MARKETING,
                        "promo", 1, m, NOW + timedelta(days=1), "Europe/Berlin", window)


def row(n: int = 7, **fields: object) -> ManifestRow:
    return ManifestRow(n, 100, {"n": "Ana", **fields})


def test_rows_become_records_or_reasons() -> None:
    ok = map_row(spec(), row(to="+14155550100"), NOW)
    assert isinstance(ok, Mapped) and ok.due == NOW
    assert ok.record.message_id == "cmp_" + "c" * 32 + "_7"
    assert ok.record.variables == {"name": "Ana"} and ok.record.expires_at == NOW + timedelta(
        days=1)
    email = map_row(spec(Channel.EMAIL), row(to="Bob@Example.com"), NOW)
    assert isinstance(email, Mapped)
    push = map_row(spec(Channel.PUSH, platform="os"), row(to="a" * 64, os="iOS"), NOW)
    assert isinstance(push, Mapped), push
    cases = {
        "missing column 'to'": row(),
        "empty recipient": row(to="  "),
    }
    for reason, r in cases.items():
        assert map_row(spec(), r, NOW) == Rejected(7, reason)
    bad = map_row(spec(), row(to="+1999"), NOW)
    assert isinstance(bad, Rejected) and bad.reason.startswith("recipient")
    assert "+1999" not in bad.reason
    bad_mail = map_row(spec(Channel.EMAIL), row(to="bob@@secret.example"), NOW)
    assert isinstance(bad_mail, Rejected) and "secret" not in bad_mail.reason
    zone = map_row(spec(window=LocalWindow(start=time(10), end=time(20)), timezone="tz"),
                   row(to="+14155550100", tz="Mars/Olympus"), NOW)
    assert zone == Rejected(7, "unknown time zone in column 'tz'")


def test_windows_in_three_zones_and_the_campaign_end() -> None:
    w = LocalWindow(start=time(10), end=time(20))
    s = spec(window=w, timezone="tz")
    due = {}
    for tz in ("America/New_York", "Europe/Berlin", "Asia/Tokyo"):
        out = map_row(s, row(to="+14155550100", tz=tz), NOW)
        assert isinstance(out, Mapped)
        due[tz] = out.due
    assert due == {"America/New_York": NOW, "Europe/Berlin": NOW,
                   "Asia/Tokyo": datetime(2026, 12, 5, 1, 0, tzinfo=UTC)}
    by_phone = map_row(spec(window=w), row(to="+81312345678"), NOW)
    assert isinstance(by_phone, Mapped) and by_phone.due == due["Asia/Tokyo"]
    short = dataclasses.replace(s, ends_at=NOW + timedelta(hours=2))
    assert map_row(short, row(to="+14155550100", tz="Asia/Tokyo"), NOW) == Rejected(
        7, "no send window before the campaign ends")


@given(start=st.times(), end=st.times(), minutes=st.integers(0, 60 * 24 * 400),
       zone=st.sampled_from(["America/New_York", "Europe/Berlin", "Asia/Tokyo",
                             "Australia/Lord_Howe", "UTC"]))
def test_next_open_is_the_first_instant_inside_the_window(
        start: time, end: time, minutes: int, zone: str) -> None:
    start, end = start.replace(microsecond=0), end.replace(microsecond=0)
    if start == end:
        return
    w = LocalWindow(start=start, end=end)
    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=minutes)
    tz = ZoneInfo(zone)
    got = w.next_open(at, tz)
    assert at <= got <= at + timedelta(days=2)
    local = got.astimezone(tz).time()
    assert w.contains(local) or got == at
    for k in range(1, 6):
        probe = at + (got - at) * k / 6
        assert not w.contains(probe.astimezone(tz).time()) or probe >= got


def test_a_zone_directory_is_an_unknown_zone_not_a_crash() -> None:
    from pydantic import ValidationError

    from notiflow.schemas.campaigns import CampaignRequest

    with pytest.raises(ValidationError, match="unknown time zone"):
        CampaignRequest.model_validate({
            "name": "n", "channel": "SMS", "template_id": "t", "template_version": 1,
            "manifest": "s3://b/k.csv", "mapping": {"recipient": "p"}, "timezone": "America"})
