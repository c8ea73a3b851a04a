"""Campaign manifests, parsed incrementally from byte chunks, and their rows mapped to ingest
records (pure: no I/O).

:class:`RowReader` works on bytes so every row's end offset is exact: a reader started at a
row's ``end_offset`` with the next row number (and the CSV header) yields exactly the rows
after it, which is how an expander resumes mid-file. Chunks may split anywhere. A row that
cannot be read is a row with an ``error`` (never its content: rows are personal data); only
a manifest without a usable CSV header is a :class:`ManifestError`.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
from pydantic import ValidationError

from notiflow.schemas.campaigns import ColumnMapping, LocalWindow, ManifestFormat, row_message_id
from notiflow.schemas.enums import Category, Channel, Tier
from notiflow.schemas.messages import IngestRecord
from notiflow.schemas.preferences import phone_timezone

BOM = b"\xef\xbb\xbf"


class ManifestError(Exception):
    """The manifest as a whole cannot be expanded (``reason`` says why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ManifestRow:
    """One data row: its 1-based number, the byte offset just after it, and its fields or
    why it could not be read."""

    number: int
    end_offset: int
    fields: dict[str, Any] | None
    error: str | None = None


class RowReader:
    """Rows of a CSV (RFC 4180, header first) or JSON Lines manifest from byte chunks."""

    def __init__(self, fmt: ManifestFormat, *, start_offset: int = 0, next_row: int = 1,
                 header: tuple[str, ...] | None = None, max_row_bytes: int = 65_536) -> None:
        if fmt == "csv" and start_offset > 0 and header is None:
            raise ValueError("resuming a CSV manifest needs its header")
        self.fmt = fmt
        self.offset = start_offset
        self.next_row = next_row
        self.header = header
        self.max_row_bytes = max_row_bytes
        self._buf = bytearray()
        self._scan = 0
        self._quotes = 0
        self._skipping = False

    def feed(self, chunk: bytes) -> list[ManifestRow]:
        """The rows completed by ``chunk``."""
        self._buf += chunk
        out: list[ManifestRow] = []
        while True:
            end = self._record_end()
            if end is None:
                if len(self._buf) > self.max_row_bytes and not self._skipping:
                    out.append(self._too_long())
                    self._skipping = True
                if self._skipping:
                    self._drop_to_newline()
                return out
            record = bytes(self._buf[:end])
            del self._buf[:end]
            self.offset += end
            self._scan = self._quotes = 0
            if self._skipping:
                self._skipping = False
                continue
            row = self._row(record)
            if row is not None:
                out.append(row)

    def finish(self) -> list[ManifestRow]:
        """The last row when the data does not end with a newline."""
        if not self._buf or self._skipping:
            return []
        record = bytes(self._buf)
        self.offset += len(record)
        self._buf.clear()
        if self.fmt == "csv" and self._quotes % 2:
            return [self._error("row has an unterminated quoted field")]
        row = self._row(record)
        return [row] if row is not None else []

    def _record_end(self) -> int | None:
        """End (exclusive) of the first complete record in the buffer: a newline outside
        quotes (JSON Lines: any newline)."""
        buf = self._buf
        while True:
            nl = buf.find(b"\n", self._scan)
            if nl < 0:
                if self.fmt == "csv":
                    self._quotes += buf.count(b'"', self._scan)
                self._scan = len(buf)
                return None
            if self.fmt == "csv":
                self._quotes += buf.count(b'"', self._scan, nl)
                self._scan = nl + 1
                if self._quotes % 2:
                    if nl + 1 > self.max_row_bytes:
                        return None
                    continue
            return nl + 1

    def _drop_to_newline(self) -> None:
        nl = self._buf.find(b"\n")
        if nl < 0:
            self.offset += len(self._buf)
            self._buf.clear()
        else:
            self.offset += nl + 1
            del self._buf[:nl + 1]
            self._skipping = False
        self._scan = self._quotes = 0

    def _too_long(self) -> ManifestRow:
        return self._error(f"row longer than {self.max_row_bytes} bytes")

    def _error(self, reason: str) -> ManifestRow:
        row = ManifestRow(self.next_row, self.offset, None, reason)
        self.next_row += 1
        return row

    def _row(self, record: bytes) -> ManifestRow | None:
        if record.startswith(BOM) and self.offset - len(record) == 0:
            record = record[len(BOM):]
        if not record.strip():
            return None
        try:
            text = record.decode("utf-8")
        except UnicodeDecodeError:
            return self._error("row is not valid UTF-8")
        if self.fmt == "jsonl":
            return self._json(text)
        try:
            values = next(csv.reader([text.removesuffix("\n").removesuffix("\r")],
                                     strict=True), [])
        except csv.Error as exc:
            return self._error(f"not valid CSV: {exc}")
        if self.header is None:
            names = tuple(v.strip() for v in values)
            if not names or not all(names) or len(set(names)) != len(names):
                raise ManifestError("the CSV header must name every column once")
            self.header = names
            return None
        if len(values) != len(self.header):
            return self._error(f"expected {len(self.header)} fields, got {len(values)}")
        row = ManifestRow(self.next_row, self.offset, dict(zip(self.header, values,
                                                               strict=True)))
        self.next_row += 1
        return row

    def _json(self, text: str) -> ManifestRow:
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            return self._error(f"not valid JSON (at character {exc.pos})")
        if not isinstance(value, dict):
            return self._error("not a JSON object")
        for name, v in value.items():
            if isinstance(v, dict | list):
                return self._error(f"column {name!r} is not a scalar")
        row = ManifestRow(self.next_row, self.offset, value)
        self.next_row += 1
        return row


@dataclass(frozen=True, slots=True)
class CampaignSpec:
    """What every row of one campaign shares."""

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


@dataclass(frozen=True, slots=True)
class Rejected:
    row: int
    reason: str


@dataclass(frozen=True, slots=True)
class Mapped:
    row: int
    record: IngestRecord
    due: datetime


@functools.lru_cache(maxsize=1024)
def _zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def _reason(exc: ValidationError) -> str:
    """The first error's field and message, without the input (personal data)."""
    errors = exc.errors(include_input=False, include_url=False, include_context=False)
    err = next((e for e in errors if e["loc"][-1:] != ("str",)), errors[0])
    field = ".".join(str(p) for p in err["loc"] if p != "PushRecipient") or "row"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{field}: {msg.split(':', 1)[0] if field.startswith('recipient') else msg}"


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def map_row(spec: CampaignSpec, row: ManifestRow, now: datetime) -> Mapped | Rejected:
    """The row's ingest record and when it is due (the recipient's window), or why not."""
    if row.fields is None:
        return Rejected(row.number, row.error or "unreadable row")
    f, m = row.fields, spec.mapping
    needed = [m.recipient, *(c for c in (m.platform, m.timezone) if c), *m.variables.values()]
    for column in needed:
        if column not in f:
            return Rejected(row.number, f"missing column {column!r}")
    recipient: Any = _text(f[m.recipient])
    if not recipient:
        return Rejected(row.number, "empty recipient")
    if m.platform is not None:
        recipient = {"device_token": recipient, "platform": _text(f[m.platform]).lower()}
    zone_name = _text(f[m.timezone]) if m.timezone else ""
    if zone_name:
        zone = _zone(zone_name)
        if zone is None:
            return Rejected(row.number, f"unknown time zone in column {m.timezone!r}")
    else:
        zone = None
    try:
        record = IngestRecord.model_validate({
            "channel": spec.channel, "tier": spec.tier, "recipient": recipient,
            "template_id": spec.template_id, "template_version": spec.template_version,
            "variables": {name: f[column] for name, column in m.variables.items()},
            "category": spec.category, "expires_at": spec.ends_at,
            "tenant_id": spec.tenant_id,
            "message_id": row_message_id(spec.campaign_id, row.number), "accepted_at": now})
    except ValidationError as exc:
        return Rejected(row.number, _reason(exc))
    due = now
    if spec.window is not None:
        if zone is None:
            by_phone = (phone_timezone(recipient) if spec.channel is Channel.SMS
                        and isinstance(recipient, str) else None)
            zone = _zone(by_phone or spec.default_zone) or _zone("UTC")
        assert zone is not None
        due = spec.window.next_open(now, zone)
        if due >= spec.ends_at:
            return Rejected(row.number, "no send window before the campaign ends")
    return Mapped(row.number, record, due)
