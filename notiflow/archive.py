"""The history archive's layout and the rows it holds (pure: no I/O).

One day of one tenant is the unit: every message the tenant accepted that day (UTC, the day
of ``messages_by_tenant_day``), with everything that happened to it later (its status events,
provider attempts and receipts), as four Parquet files under the archive's prefix::

    v1/{dataset}/day=YYYY-MM-DD/tenant={tenant}/part-0.parquet   dataset: messages, events,
    v1/_manifests/day=YYYY-MM-DD/tenant={tenant}.json                     attempts, receipts

The manifest is written last and names each file's rows, bytes and SHA-256: a (day, tenant)
with a manifest is archived; without one it is not (a crash in between leaves files a later
run overwrites). Recipients are never archived: a message keeps its recipient hash (keyed,
``notiflow.redact.recipient_hash``: not reversible without the recipient hash key) and, for
phone numbers, the country of its calling code; not the masked address, the content, the
template variables or the sender. :func:`schemas` is every column there is; it and
:class:`DatasetFile` need pyarrow, the ``archive`` extra.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from typing import TYPE_CHECKING, Any, Final

import phonenumbers

from notiflow.correlation import CorrelationKeys
from notiflow.extras import needs
from notiflow.schemas.campaigns import parse_row_message_id

if TYPE_CHECKING:
    import pyarrow as pa

VERSION: Final = "v1"
DATASETS: Final = ("messages", "events", "attempts", "receipts")
_FEATURE: Final = "the history archive's Parquet files"


@cache
def schemas() -> Mapping[str, pa.Schema]:
    """Columns of each dataset (``day``, ``tenant_id``, ``message_id`` first in all)."""
    with needs("archive", _FEATURE):
        import pyarrow as pa
    ts = pa.timestamp("ms", tz="UTC")
    key: list[tuple[str, pa.DataType]] = [("day", pa.date32()), ("tenant_id", pa.string()),
                                          ("message_id", pa.string())]
    return {
        "messages": pa.schema([*key,
            ("campaign_id", pa.string()), ("channel", pa.string()), ("tier", pa.string()),
            ("category", pa.string()), ("template_id", pa.string()),
            ("template_version", pa.int32()), ("country", pa.string()),
            ("recipient_hash", pa.string()), ("status", pa.string()), ("reason", pa.string()),
            ("attempts", pa.int32()), ("provider_id", pa.string()), ("accepted_at", ts),
            ("provider_accepted_at", ts), ("delivered_at", ts), ("opened_at", ts),
            ("clicked_at", ts), ("failed_at", ts), ("updated_at", ts)]),
        "events": pa.schema([*key,
            ("occurred_at", ts), ("event_id", pa.string()), ("status", pa.string()),
            ("attempt", pa.int32()), ("reason", pa.string()), ("source", pa.string()),
            ("applied", pa.bool_())]),
        "attempts": pa.schema([*key,
            ("attempt_no", pa.int32()), ("channel", pa.string()), ("tier", pa.string()),
            ("country", pa.string()), ("provider_id", pa.string()),
            ("provider_message_id", pa.string()), ("outcome", pa.string()),
            ("normalized_error", pa.string()), ("error_code", pa.string()),
            ("started_at", ts), ("completed_at", ts)]),
        "receipts": pa.schema([*key,
            ("provider_id", pa.string()), ("provider_event_id", pa.string()),
            ("status", pa.string()), ("occurred_at", ts), ("attempt", pa.int32()),
            ("error_code", pa.string()), ("applied", pa.bool_())]),
    }

_FIRST_AT: Final = {"PROVIDER_ACCEPTED": "provider_accepted_at", "DELIVERED": "delivered_at",
                    "OPENED": "opened_at", "CLICKED": "clicked_at"}
_FAILED: Final = frozenset({"FAILED", "BOUNCED", "EXPIRED"})
RECEIPT_SOURCE: Final = "receipt."


def data_key(dataset: str, day: date, tenant_id: str) -> str:
    return f"{VERSION}/{dataset}/day={day.isoformat()}/tenant={tenant_id}/part-0.parquet"


def manifest_key(day: date, tenant_id: str) -> str:
    return f"{VERSION}/_manifests/day={day.isoformat()}/tenant={tenant_id}.json"


_MANIFEST = re.compile(rf"(?:^|/){VERSION}/_manifests/"
                       r"day=(\d{4}-\d{2}-\d{2})/tenant=(.+)\.json$")


def manifest_of(key: str) -> tuple[date, str] | None:
    """The (day, tenant) a manifest key names (under any prefix); None for another key."""
    m = _MANIFEST.search(key)
    return (date.fromisoformat(m.group(1)), m.group(2)) if m else None


def due_days(today: date, ttl: timedelta, settle: timedelta) -> list[date]:
    """The days an archive run covers, oldest first: from the oldest the operational tables
    still hold whole (``ttl`` ago, plus a day of margin) to the newest whose messages have
    settled (``settle`` ago: retries, receipts and expiries done)."""
    first = today - timedelta(days=ttl.days - 1)
    last = today - timedelta(days=max(settle.days, 1))
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def country_of(channel: str | None, masked: str | None) -> str | None:
    """The ISO region of a phone recipient's calling code (``+4179*****67`` → ``CH``; the
    first region of a shared code, ``+1`` → ``US``); None for other recipients."""
    if channel != "SMS" or not masked or not masked.startswith("+"):
        return None
    digits = "".join(ch for ch in masked[1:4] if ch.isdigit())
    for n in range(1, len(digits) + 1):
        region = phonenumbers.region_code_for_country_code(int(digits[:n]))
        if region != "ZZ":
            return str(region)
    return None


def _utc(d: datetime | None) -> datetime | None:
    if d is None:
        return None
    return d.replace(tzinfo=UTC) if d.tzinfo is None else d.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class DayRows:
    """One (day, tenant)'s rows as read from the operational tables: each message's row and
    its events and attempts (by message id)."""

    day: date
    tenant_id: str
    messages: Sequence[Mapping[str, Any]]
    events: Mapping[str, Sequence[Mapping[str, Any]]]
    attempts: Mapping[str, Sequence[Mapping[str, Any]]]


def records(rows: DayRows, keys: CorrelationKeys) -> dict[str, list[dict[str, Any]]]:
    """The four datasets' records of ``rows`` (messages whose row has expired or belongs to
    another tenant are left out); a message's ``campaign_id`` is set when its id is a
    campaign row id whose tag ``keys`` made."""
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in DATASETS}
    for m in rows.messages:
        if m.get("tenant_id") != rows.tenant_id:
            continue
        mid = str(m["message_id"])
        key = {"day": rows.day, "tenant_id": rows.tenant_id, "message_id": mid}
        events = rows.events.get(mid, ())
        attempts = rows.attempts.get(mid, ())
        country = country_of(m.get("channel"), m.get("recipient_masked"))
        first: dict[str, datetime | None] = dict.fromkeys([*_FIRST_AT.values(), "failed_at"])
        for e in events:
            status, at = e.get("status"), _utc(e.get("occurred_at"))
            column = _FIRST_AT.get(status or "") or ("failed_at" if status in _FAILED else None)
            earliest = first.get(column) if column else None
            if column and at and (earliest is None or at < earliest):
                first[column] = at
            out["events"].append({**key, "occurred_at": at, "event_id": e.get("event_id"),
                                  "status": status, "attempt": e.get("attempt"),
                                  "reason": e.get("reason"), "source": e.get("source"),
                                  "applied": e.get("applied")})
            source = e.get("source") or ""
            if source.startswith(RECEIPT_SOURCE):
                provider, _, event_id = str(e.get("event_id") or "").partition(":")
                out["receipts"].append({
                    **key, "provider_id": source[len(RECEIPT_SOURCE):] or provider,
                    "provider_event_id": event_id or None, "status": status,
                    "occurred_at": at, "attempt": e.get("attempt"),
                    "error_code": e.get("reason"), "applied": e.get("applied")})
        for a in attempts:
            out["attempts"].append({
                **key, "attempt_no": a.get("attempt_no"), "channel": m.get("channel"),
                "tier": m.get("tier"), "country": country, "provider_id": a.get("provider_id"),
                "provider_message_id": a.get("provider_message_id"),
                "outcome": a.get("outcome"), "normalized_error": a.get("normalized_error"),
                "error_code": a.get("error_code"), "started_at": _utc(a.get("started_at")),
                "completed_at": _utc(a.get("completed_at"))})
        campaign = parse_row_message_id(keys, mid)
        out["messages"].append({
            **key, "campaign_id": campaign[0] if campaign else None,
            "channel": m.get("channel"), "tier": m.get("tier"), "category": m.get("category"),
            "template_id": m.get("template_id"), "template_version": m.get("template_version"),
            "country": country, "recipient_hash": m.get("recipient_hash"),
            "status": m.get("status"), "reason": m.get("reason"),
            "attempts": len(attempts) or m.get("attempt"), "provider_id": m.get("provider_id"),
            "accepted_at": _utc(m.get("accepted_at") or m.get("created_at")),
            **first, "updated_at": _utc(m.get("updated_at"))})
    return out


SPILL_BYTES: Final = 64 * 1024 * 1024
"""A dataset file stays in memory up to this size, then moves to a temporary file."""


class DatasetFile:
    """One dataset's Parquet file being written, a row group per :meth:`add` (zstd), in
    memory up to :data:`SPILL_BYTES` and in a temporary file beyond."""

    def __init__(self, dataset: str) -> None:
        self.dataset, self.rows = dataset, 0
        with needs("archive", _FEATURE):
            import pyarrow.parquet as pq
        self._sink = tempfile.SpooledTemporaryFile(max_size=SPILL_BYTES)  # noqa: SIM115
        self._writer = pq.ParquetWriter(self._sink, schemas()[dataset], compression="zstd")
        self.size = 0
        self.sha256 = ""

    def add(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            import pyarrow as pa

            self._writer.write_table(pa.Table.from_pylist(list(rows),
                                                          schema=schemas()[self.dataset]))
            self.rows += len(rows)

    def finish(self) -> None:
        """Close the Parquet file (one with no rows still has the schema); sets
        :attr:`size` and :attr:`sha256`."""
        self._writer.close()
        digest = hashlib.sha256()
        self._sink.seek(0)
        for chunk in iter(lambda: self._sink.read(CHUNK_BYTES), b""):
            digest.update(chunk)
            self.size += len(chunk)
        self.sha256 = digest.hexdigest()

    def chunks(self) -> Iterator[bytes]:
        """The finished file, from its start, :data:`CHUNK_BYTES` at a time."""
        self._sink.seek(0)
        yield from iter(lambda: self._sink.read(CHUNK_BYTES), b"")

    def close(self) -> None:
        self._sink.close()


CHUNK_BYTES: Final = 8 * 1024 * 1024


def manifest(day: date, tenant_id: str, files: Mapping[str, tuple[str, DatasetFile]],
             written_at: datetime) -> dict[str, Any]:
    """The manifest of an archived (day, tenant): ``files`` is dataset → (key, its finished
    file)."""
    return {"version": VERSION, "day": day.isoformat(), "tenant_id": tenant_id,
            "written_at": written_at.astimezone(UTC).isoformat(),
            "files": {name: {"key": key, "bytes": f.size, "rows": f.rows, "sha256": f.sha256}
                      for name, (key, f) in files.items()}}
