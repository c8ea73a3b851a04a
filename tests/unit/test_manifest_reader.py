"""RowReader on bytes: RFC 4180 CSV and JSON Lines, exact offsets, bad rows as rows with
reasons that never quote the row, resynchronisation after an oversize or unbalanced record,
and the two properties an expander relies on: any chunking gives the same rows, and a reader
resumed at any row's end offset gives exactly the rows after it."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notiflow.flows.campaigns.manifest import ManifestError, ManifestRow, RowReader
from notiflow.schemas.campaigns import ManifestFormat


def read(data: bytes, fmt: ManifestFormat = "csv", cuts: list[int] | None = None,
         **kw: object) -> list[ManifestRow]:
    reader = RowReader(fmt, **kw)  # type: ignore[arg-type]
    out: list[ManifestRow] = []
    at = 0
    for cut in [*sorted(set(cuts or [])), len(data)]:
        out += reader.feed(data[at:cut])
        at = cut
    return out + reader.finish()


def outcome(data: bytes, fmt: ManifestFormat, cuts: list[int] | None = None,
            **kw: object) -> list[ManifestRow] | str:
    """The rows, or the ManifestError's reason."""
    try:
        return read(data, fmt, cuts, **kw)
    except ManifestError as exc:
        return f"ManifestError: {exc.reason}"


def ends(data: bytes) -> list[int]:
    """Offsets just after each newline."""
    return [i + 1 for i, b in enumerate(data) if b == ord("\n")]


# -- CSV ----------------------------------------------------------------------------------


def test_quotes_embedded_newlines_crlf_and_bom() -> None:
    blob = ('\ufeffphone , name,note\r\n'
            '+14155550100,"Smith, J.","said ""hi""\r\nthen left"\r\n'
            '\r\n'
            '+14155550101,Zoë,\r\n'
            '+14155550102,"",plain').encode()
    rows = read(blob)
    assert [r.number for r in rows] == [1, 2, 3]
    assert rows[0].fields == {"phone": "+14155550100", "name": "Smith, J.",
                              "note": 'said "hi"\r\nthen left'}
    assert rows[1].fields == {"phone": "+14155550101", "name": "Zoë", "note": ""}
    assert rows[2].fields == {"phone": "+14155550102", "name": "", "note": "plain"}
    lines = ends(blob)
    assert [r.end_offset for r in rows] == [lines[2], lines[4], len(blob)]
    assert all(r.error is None for r in rows)
    reader = RowReader("csv")
    reader.feed(blob[:2])
    assert reader.header is None
    reader.feed(blob[2:40])
    assert reader.header == ("phone", "name", "note")


def test_a_chunk_may_split_a_utf8_character_a_crlf_or_a_quoted_field() -> None:
    blob = 'a,b\r\n"x\r\ny",Zoë\r\n1,ü\r\n'.encode()
    whole = read(blob)
    assert [r.fields for r in whole] == [{"a": "x\r\ny", "b": "Zoë"}, {"a": "1", "b": "ü"}]
    for cut in range(len(blob) + 1):
        assert read(blob, cuts=[cut]) == whole
    assert read(blob, cuts=list(range(len(blob)))) == whole


def test_field_counts_non_utf8_and_misplaced_quotes_are_bad_rows() -> None:
    blob = (b"phone,name\n+14155550100\n+14155550101,Ana,extra\n"
            b"+14155550102,Jos\xe9\n+14155550103,\"Ana\" B\n+14155550104,a\rb\n"
            b"+14155550105,ok\n")
    rows = read(blob)
    assert [(r.number, r.error) for r in rows] == [
        (1, "expected 2 fields, got 1"),
        (2, "expected 2 fields, got 3"),
        (3, "row is not valid UTF-8"),
        (4, "not valid CSV (a quote or line break out of place)"),
        (5, "not valid CSV (a quote or line break out of place)"),
        (6, None),
    ]
    assert rows[5].fields == {"phone": "+14155550105", "name": "ok"}
    assert [r.end_offset for r in rows] == ends(blob)[1:]
    assert not any("+1415" in (r.error or "") or "Ana" in (r.error or "") for r in rows)


def test_an_unbalanced_quote_costs_one_row_not_the_file() -> None:
    body = b"".join(b"+1415555%04d,ok\n" % i for i in range(40))
    blob = b'phone,name\n+14155550999,"never closed\n' + body
    for cuts in ([], [20], [20, 70, 300], list(range(0, len(blob), 7))):
        rows = read(blob, cuts=cuts, max_row_bytes=200)
        assert rows[0].error == "row longer than 200 bytes"
        assert rows[0].end_offset == ends(blob)[1]
        assert [r.fields for r in rows[1:]] == [
            {"phone": f"+1415555{i:04d}", "name": "ok"} for i in range(40)]
        assert [r.number for r in rows] == list(range(1, 42))
    small = read(blob, max_row_bytes=65_536)
    assert small[0].error == "row has an unterminated quoted field"
    assert len(small) == 41 and small[-1].fields == {"phone": "+14155550039", "name": "ok"}


def test_an_oversize_line_is_skipped_to_its_newline_without_buffering_it() -> None:
    reader = RowReader("csv", max_row_bytes=100)
    rows = reader.feed(b"a,b\n1,")
    for _ in range(50):
        rows += reader.feed(b"x" * 1000)
        assert len(reader._buf) <= 1100
    rows += reader.feed(b"x\n2,ok\n3")
    rows += reader.finish()
    assert [(r.number, r.fields, r.error) for r in rows] == [
        (1, None, "row longer than 100 bytes"), (2, {"a": "2", "b": "ok"}, None),
        (3, None, "expected 2 fields, got 1")]
    assert rows[0].end_offset == 4 + 2 + 50_000 + 2
    tail = RowReader("csv", max_row_bytes=100)
    assert tail.feed(b"a,b\n" + b"y" * 150) == []
    assert [(r.number, r.end_offset, r.error) for r in tail.finish()] == [
        (1, 154, "row longer than 100 bytes")]


def test_a_last_row_of_exactly_max_row_bytes_is_a_row() -> None:
    assert read(b"a\n" + b"x" * 10, max_row_bytes=10)[0].fields == {"a": "x" * 10}
    assert read(b"a\n" + b"x" * 9 + b"\n", max_row_bytes=10)[0].fields == {"a": "x" * 9}
    assert read(b"a\n" + b"x" * 10 + b"\n", max_row_bytes=10)[0].error is not None


@pytest.mark.parametrize("blob", [
    b"", b"\n\n", b"a,,b\n1,2,3\n", b"a,a\n1,2\n", b"a, a \n1,2\n", b"a,\xff\n1,2\n",
    b'a,"b\n' + b"x" * 300, b'"a"x,b\n1,2\n',
])
def test_a_manifest_without_a_usable_header_is_a_manifest_error(blob: bytes) -> None:
    with pytest.raises(ManifestError) as err:
        read(blob, max_row_bytes=100)
    assert err.value.reason


def test_resuming_a_csv_needs_its_header() -> None:
    with pytest.raises(ValueError):
        RowReader("csv", start_offset=10)
    with pytest.raises(ManifestError):
        read(b"a,c\n1,2\n", header=("a", "b"))
    assert read(b"a,b\n1,2\n", header=("a", "b"))[0].fields == {"a": "1", "b": "2"}
    assert RowReader("jsonl", start_offset=10).header is None


# -- JSON Lines ---------------------------------------------------------------------------


def test_json_lines() -> None:
    blob = (b'\xef\xbb\xbf{"phone": "+14155550100", "n": 3, "vip": true, "x": null}\r\n'
            b"\n  \n[1, 2]\n"
            b'{"phone": {"cc": 1}}\n'
            b'{"tags": ["a"]}\n'
            b'{"phone": "+14155550101", oops}\n'
            b'{"phone": "+1415555\xff"}\n'
            b'{"phone": "+14155550102", "score": 1.5}')
    rows = read(blob, "jsonl", cuts=[5, 40, 41])
    assert rows[0].fields == {"phone": "+14155550100", "n": 3, "vip": True, "x": None}
    assert rows[0].end_offset == ends(blob)[0]
    assert [r.error for r in rows[1:4]] == [
        "not a JSON object", "column 'phone' is not a scalar", "column 'tags' is not a scalar"]
    assert rows[4].error is not None and rows[4].error.startswith("not valid JSON")
    assert "+1415" not in rows[4].error and "oops" not in rows[4].error
    assert rows[5].error == "row is not valid UTF-8"
    assert rows[6].fields == {"phone": "+14155550102", "score": 1.5}
    assert [r.number for r in rows] == list(range(1, 8))
    assert rows[6].end_offset == len(blob)
    assert read(b"", "jsonl") == []


def test_an_oversize_json_line_is_one_bad_row() -> None:
    blob = b'{"a": "' + b"x" * 500 + b'"}\n{"a": 1}\n'
    rows = read(blob, "jsonl", cuts=[100, 200], max_row_bytes=100)
    assert [(r.number, r.error) for r in rows] == [(1, "row longer than 100 bytes"), (2, None)]


# -- properties ---------------------------------------------------------------------------

CSV_BYTES = st.lists(st.sampled_from([b"a", b"b", b",", b'"', b"\n", b"\r\n", b"\r", b" ",
                                      b"\xff", "é".encode(), b"\xef\xbb\xbf"]),
                     max_size=80).map(b"".join)
JSON_BYTES = st.lists(st.sampled_from([b'{"a": 1}', b'{"b": "x\\ny"}', b"[1]", b"{", b"}",
                                       b'"', b"\n", b"\r\n", b" ", b"\xff", b'{"c": {}}']),
                      max_size=30).map(b"".join)
MANIFESTS = st.one_of(
    st.tuples(st.just("csv"), st.builds(lambda h, body: h + body,
                                        st.sampled_from([b"a,b\n", b"\xef\xbb\xbfa,b\r\n",
                                                         b'"a",b\n']), CSV_BYTES)),
    st.tuples(st.just("csv"), CSV_BYTES),
    st.tuples(st.just("jsonl"), JSON_BYTES))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifest=MANIFESTS, limit=st.sampled_from([8, 16, 65_536]), data=st.data())
def test_any_chunking_gives_the_same_rows(manifest: tuple[ManifestFormat, bytes], limit: int,
                                          data: st.DataObject) -> None:
    fmt, blob = manifest
    whole = outcome(blob, fmt, max_row_bytes=limit)
    cuts = data.draw(st.lists(st.integers(0, len(blob)), max_size=10))
    assert outcome(blob, fmt, cuts, max_row_bytes=limit) == whole
    assert outcome(blob, fmt, list(range(len(blob))), max_row_bytes=limit) == whole


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifest=MANIFESTS, limit=st.sampled_from([8, 16, 65_536]), data=st.data())
def test_resuming_at_any_row_gives_exactly_the_remaining_rows(
        manifest: tuple[ManifestFormat, bytes], limit: int, data: st.DataObject) -> None:
    fmt, blob = manifest
    reader = RowReader(fmt, max_row_bytes=limit)
    try:
        whole = reader.feed(blob) + reader.finish()
    except ManifestError:
        return
    offsets = [r.end_offset for r in whole]
    assert offsets == sorted(set(offsets)) and all(0 < o <= len(blob) for o in offsets)
    assert [r.number for r in whole] == list(range(1, len(whole) + 1))
    for k, at in enumerate(whole):
        cuts = data.draw(st.lists(st.integers(0, len(blob) - at.end_offset), max_size=4))
        rest = read(blob[at.end_offset:], fmt, cuts, start_offset=at.end_offset,
                    next_row=at.number + 1, header=reader.header, max_row_bytes=limit)
        assert rest == whole[k + 1:]


cells = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
names = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\r"), min_size=1,
                max_size=8).filter(
    lambda s: s == s.strip() and not s.startswith("\ufeff"))


@settings(deadline=None)
@given(header=st.lists(names, min_size=2, max_size=4, unique=True), data=st.data(),
       newline=st.sampled_from(["\n", "\r\n"]))
def test_csv_writer_output_round_trips(header: list[str], data: st.DataObject,
                                       newline: str) -> None:
    cell = cells if newline == "\r\n" else cells.filter(lambda s: "\r" not in s)
    rows = data.draw(st.lists(st.lists(cell, min_size=len(header), max_size=len(header)),
                              max_size=15))
    buf = io.StringIO()
    csv.writer(buf, lineterminator=newline).writerows([header, *rows])
    blob = buf.getvalue().encode()
    reader = RowReader("csv")
    got = reader.feed(blob) + reader.finish()
    assert reader.header == tuple(header)
    assert [r.fields for r in got] == [dict(zip(header, row, strict=True)) for row in rows]
    assert [r.number for r in got] == list(range(1, len(rows) + 1))
    cuts = data.draw(st.lists(st.integers(0, len(blob)), max_size=6))
    assert read(blob, cuts=cuts) == got
