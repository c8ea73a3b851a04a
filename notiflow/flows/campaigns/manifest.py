"""Campaign manifests read incrementally from byte chunks, and their rows mapped to ingest
records (pure: no I/O). A row that cannot be read or sent is a row with a reason that never
quotes the row (rows are personal data); only a CSV manifest without a usable header, or a
campaign whose default zone is unknown, is a :class:`ManifestError`."""

from __future__ import annotations

import csv
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
from pydantic import ValidationError

from notiflow.correlation import CorrelationKeys
from notiflow.schemas.campaigns import ColumnMapping, LocalWindow, ManifestFormat, row_message_id
from notiflow.schemas.enums import Category, Channel, Tier
from notiflow.schemas.messages import IngestRecord
from notiflow.schemas.preferences import phone_timezone


class ManifestError(Exception):
    """The manifest as a whole cannot be expanded (``reason`` says why, without row data)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ManifestRow:
    """One data row: its 1-based number (header and blank lines not counted), the byte
    offset just after it, and its fields, or (``fields`` None) why it could not be read."""

    number: int
    end_offset: int
    fields: dict[str, Any] | None
    error: str | None = None


def _header_problem(names: Sequence[str]) -> str | None:
    if not names or not all(n and n == n.strip() for n in names):
        return "the CSV header must name every column (without surrounding blanks)"
    return "the CSV header names a column twice" if len(set(names)) < len(names) else None


class RowReader:
    """Rows of a CSV (RFC 4180, header first, UTF-8) or JSON Lines manifest from byte chunks
    that may split anywhere; rows and offsets depend on the bytes only.

    A record ends at a newline (CSV: one outside double quotes). A record longer than
    ``max_row_bytes``, or a CSV record whose quote is still open at the end of the data, is
    one error row ending at the record's first newline, where reading resumes: a stray quote
    costs one row, not the rest of the file. A reader started at a row's ``end_offset`` with
    ``next_row`` one past its number (and the header) yields exactly the rows after it.
    """

    def __init__(self, fmt: ManifestFormat, *, start_offset: int = 0, next_row: int = 1,
                 header: Sequence[str] | None = None, max_row_bytes: int = 65_536) -> None:
        self._csv = fmt == "csv"
        if self._csv and start_offset > 0 and header is None:
            raise ValueError("resuming a CSV manifest needs its header")
        self._given = tuple(header) if self._csv and header is not None else None
        self._header = self._given if start_offset > 0 else None
        self._next, self._max, self._base = next_row, max_row_bytes, start_offset
        self._buf, self._scan, self._quotes = bytearray(), 0, 0
        self._skipping: str | None = None

    @property
    def header(self) -> tuple[str, ...] | None:
        """The CSV column names, once read (or as given when resuming); None for JSON Lines."""
        return self._header

    def feed(self, chunk: bytes) -> list[ManifestRow]:
        """The rows that ``chunk``, the bytes following those fed so far, completes."""
        out: list[ManifestRow] = []
        if self._skipping is not None:
            nl = chunk.find(b"\n")
            if nl < 0:
                self._base += len(chunk)
                return out
            self._base += nl + 1
            out.append(self._bad(self._skipping, self._base))
            self._skipping, chunk = None, chunk[nl + 1:]
        self._buf += chunk
        self._drain(out, final=False)
        return out

    def finish(self) -> list[ManifestRow]:
        """The rows left at the end of the data (a last row without a newline); a CSV
        manifest that never had a header row is a :class:`ManifestError`."""
        out = [] if self._skipping is None else [self._bad(self._skipping, self._base)]
        self._skipping = None
        self._drain(out, final=True)
        if self._csv and self._header is None:
            raise ManifestError("the CSV manifest has no header row")
        return out

    def _drain(self, out: list[ManifestRow], final: bool) -> None:
        buf, start = self._buf, 0
        while start < len(buf):
            end = self._end(start)
            if end is None:
                oversize = len(buf) - start > self._max
                if not (oversize or final):
                    break
                if oversize or self._quotes % 2:
                    reason = (f"row longer than {self._max} bytes" if oversize
                              else "row has an unterminated quoted field")
                    nl = buf.find(b"\n", start)
                    if nl < 0 and not final:
                        self._skipping = reason
                        start, self._scan, self._quotes = len(buf), len(buf), 0
                        break
                    end = len(buf) if nl < 0 else nl + 1
                    row: ManifestRow | None = self._bad(reason, self._base + end)
                else:
                    row = self._record(start, end := len(buf))
            else:
                row = self._record(start, end)
            if row is not None:
                out.append(row)
            start, self._scan, self._quotes = end, end, 0
        del buf[:start]
        self._base, self._scan = self._base + start, self._scan - start

    def _end(self, start: int) -> int | None:
        """End of the record at ``start`` when it is complete within ``max_row_bytes``."""
        buf, scan, limit = self._buf, self._scan, start + self._max
        while True:
            nl = buf.find(b"\n", scan, limit)
            stop = min(len(buf), limit) if nl < 0 else nl
            if self._csv:
                self._quotes += buf.count(b'"', scan, stop)
            if nl < 0:
                self._scan = stop
                return None
            scan = nl + 1
            if not self._quotes % 2:
                return scan

    def _bad(self, reason: str, end_offset: int) -> ManifestRow:
        if self._csv and self._header is None:
            raise ManifestError(f"CSV header: {reason}")
        return self._row(end_offset, None, reason)

    def _row(self, end_offset: int, fields: Any, error: str | None = None) -> ManifestRow:
        self._next += 1
        return ManifestRow(self._next - 1, end_offset, fields, error)

    def _record(self, start: int, end: int) -> ManifestRow | None:
        end_offset = self._base + end
        try:
            line = self._buf[start:end].decode().removesuffix("\n").removesuffix("\r")
        except UnicodeDecodeError:
            return self._bad("row is not valid UTF-8", end_offset)
        if self._base + start == 0:
            line = line.removeprefix("\ufeff")
        if not line or line.isspace():
            return None
        if not self._csv:
            return self._json(line, end_offset)
        if '"' not in line and "\r" not in line:
            values = line.split(",")
        else:
            try:
                values = next(csv.reader((line,), strict=True), [])
            except csv.Error:
                return self._bad("not valid CSV (a quote or line break out of place)",
                                 end_offset)
        if self._header is None:
            names = tuple(v.strip() for v in values)
            if problem := _header_problem(names):
                raise ManifestError(problem)
            if self._given is not None and names != self._given:
                raise ManifestError("the CSV header is not the one the expansion started with")
            self._header = names
            return None
        if len(values) != len(self._header):
            return self._bad(f"expected {len(self._header)} fields, got {len(values)}",
                             end_offset)
        return self._row(end_offset, dict(zip(self._header, values, strict=False)))

    def _json(self, line: str, end_offset: int) -> ManifestRow:
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            return self._bad(f"not valid JSON (at character {exc.pos})", end_offset)
        if not isinstance(value, dict):
            return self._bad("not a JSON object", end_offset)
        for name, v in value.items():
            if isinstance(v, dict | list):
                return self._bad(f"column {name!r} is not a scalar", end_offset)
        return self._row(end_offset, value)


@dataclass(frozen=True, slots=True)
class CampaignSpec:
    """What every row of one campaign shares. ``default_zone``: the zone of a row whose own
    is unknown; ``window``: local hours a row may be sent in (None: any time); ``sender``:
    who every message comes from (None: the provider accounts' own)."""

    tenant_id: str
    campaign_id: str
    channel: Channel
    tier: Tier
    category: Category
    template_id: str
    template_version: int
    mapping: ColumnMapping
    ends_at: datetime
    default_zone: str
    window: LocalWindow | None = None
    sender: str | None = None


@dataclass(frozen=True, slots=True)
class Rejected:
    """Row ``row`` is not sent, for ``reason`` (which never quotes the row)."""

    row: int
    reason: str


@dataclass(frozen=True, slots=True)
class Mapped:
    """Row ``row`` as a message, to be sent at ``due`` (its recipient's window)."""

    row: int
    record: IngestRecord
    due: datetime


@functools.lru_cache(maxsize=1024)
def zone_of(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


def _reason(exc: ValidationError, values: Iterable[Any]) -> str:
    """The first error's field and message, never quoting ``values`` (recipient, variables)."""
    errors = exc.errors(include_input=False, include_url=False, include_context=False)
    err = next((e for e in errors if e["loc"][-1:] != ("str",)), errors[0])
    field = ".".join(str(p) for p in err["loc"] if p != "PushRecipient" and "[" not in str(p))
    msg = str(err["msg"]).removeprefix("Value error, ")
    msg = msg.split(":", 1)[0] if field.startswith("recipient") else msg
    if any(len(s) >= 3 and s in msg for v in values if (s := _text(v))):
        msg = f"invalid ({err['type']})"
    return f"{field or 'row'}: {msg}"


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def map_row(spec: CampaignSpec, row: ManifestRow, now: datetime, keys: CorrelationKeys
            ) -> Mapped | Rejected:
    """The row's ingest record (message id keyed by ``keys`` over (campaign, row), accepted
    at ``now``,
    expiring at the campaign's end) and when it is due, or why the row is not sent. The
    recipient's zone: the row's zone column (missing or empty: unknown), else an SMS number's
    only zone, else the spec's default (an unknown default is a :class:`ManifestError`)."""
    if row.fields is None:
        return Rejected(row.number, row.error or "unreadable row")
    f, m = row.fields, spec.mapping
    for column in (m.recipient, m.platform, *m.variables.values()):
        if column is not None and column not in f:
            return Rejected(row.number, f"missing column {column!r}")
    if not (address := _text(f[m.recipient])):
        return Rejected(row.number, "empty recipient")
    recipient: Any = address if m.platform is None else {
        "device_token": address, "platform": _text(f[m.platform]).lower()}
    variables = {name: f[column] for name, column in m.variables.items()}
    locale = (_text(f.get(m.locale)) if m.locale is not None else "") or None
    zone_name = _text(f.get(m.timezone)) if m.timezone is not None else ""
    zone = zone_of(zone_name) if zone_name else None
    if zone_name and zone is None:
        return Rejected(row.number, f"unknown time zone in column {m.timezone!r}")
    try:
        record = IngestRecord.model_validate({
            "channel": spec.channel, "tier": spec.tier, "recipient": recipient,
            "template_id": spec.template_id, "template_version": spec.template_version,
            "variables": variables, "category": spec.category, "expires_at": spec.ends_at,
            "tenant_id": spec.tenant_id, "sender": spec.sender, "locale": locale,
            "message_id": row_message_id(keys, spec.campaign_id, row.number),
            "accepted_at": now})
    except ValidationError as exc:
        return Rejected(row.number, _reason(exc, (address, *variables.values())))
    due = now
    if spec.window is not None:
        if zone is None and spec.channel is Channel.SMS and isinstance(record.recipient, str):
            zone = zone_of(phone_timezone(record.recipient) or spec.default_zone)
        if (zone := zone or zone_of(spec.default_zone)) is None:
            raise ManifestError(f"unknown time zone {spec.default_zone!r}")
        due = spec.window.next_open(now, zone)
    if due >= spec.ends_at:
        return Rejected(row.number, "no send window before the campaign ends")
    return Mapped(row.number, record, due)
