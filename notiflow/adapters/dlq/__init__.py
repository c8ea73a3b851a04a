"""Reading the dead-letter topics for operators (``notiflow dlq``, the depth alert).

Contracts:

- Every partition of a DLQ topic is read from its low watermark up to the high watermark
  taken when the read starts (records appended meanwhile wait for the next run). The
  consumer is assigned partitions explicitly and never commits offsets: reading a DLQ leaves
  no trace in Kafka.
- Records stream: a read holds at most one lookup chunk (:data:`LOOKUP_CHUNK` records) at a
  time, so counting or filtering a DLQ of millions needs no more memory than a small one.
- A dead letter an operator replayed or purged is *resolved*: its ``dlq_id`` is in the
  Cassandra table ``dlq_resolved`` (``schemas/cql/0003_dlq.cql``) and every read skips it
  unless asked otherwise. Kafka keeps the record until retention or ``purge --before``.
- Every operator action leaves a row in ``dlq_audit`` (who, when, what, why).
- A replay may *reopen* the message it belongs to: a message that ended FAILED or EXPIRED
  is set back to QUEUED (``reason=dlq_replay``, a compare-and-set on the status rank it was
  read with, plus a ``message_events`` row), so the statuses of the new attempts can apply.
  This is the one status write outside the API and the reconcile flow.
- :class:`DepthMonitor` counts unresolved dead letters incrementally and raises the depth
  alert (log line ``DLQ_DEPTH_ALERT`` + gauge ``notiflow.dlq.depth``);
  :func:`watch_depth` runs it periodically inside a long-running process (``notiflow api``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
import zlib
from collections import defaultdict
from collections.abc import AsyncGenerator, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from typing import Any, Protocol

import orjson
from cassandra.cluster import Session
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from opentelemetry import metrics
from pydantic import ValidationError

from notiflow import names
from notiflow.adapters.cassandra_store import aio, connect, utc
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.kafka_io import kafka_config
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import DlqRecord
from notiflow.schemas.status import rank
from notiflow.settings import Settings

log = logging.getLogger("notiflow.dlq")

SELECTORS: tuple[str, ...] = (*(t.value for t in Tier), "reconcile", "webhooks")
"""Names of the DLQs: one per tier, the reconciler's and the client webhooks'."""
TIER_SELECTORS: tuple[str, ...] = tuple(t.value for t in Tier)
RESOLVED_SHARDS = 32
LOOKUP_CHUNK = 500
IDLE_TIMEOUT_S = 20.0
"""A read that gets no record for this long before reaching the high watermark fails."""
DEPTH_INTERVAL_S = 60.0
"""How often :func:`watch_depth` checks the depth of every DLQ."""

PartitionKey = tuple[str, int]


class DlqReadError(RuntimeError):
    """A DLQ topic cannot be read (missing topic, broker unreachable, read stalled)."""


def dlq_topics(settings: Settings, selector: str | None = None) -> dict[str, str]:
    """``{selector: topic}`` of every DLQ, or of the one ``selector`` names (P0..P3,
    reconcile, webhooks; case-insensitive). Raises ValueError for an unknown name."""
    topics = {t.value: settings.dlq_topic(t) for t in Tier}
    topics["reconcile"] = settings.dlq_topic(None)
    topics["webhooks"] = settings.webhooks_dlq_topic
    if selector is None:
        return topics
    name = selector.upper() if selector.upper() in TIER_SELECTORS else selector.lower()
    if name not in topics:
        raise ValueError(f"unknown DLQ {selector!r}: choose one of {', '.join(SELECTORS)}")
    return {name: topics[name]}


def selector_of(settings: Settings, topic: str) -> str:
    """The DLQ name of ``topic`` (``P1``, ``reconcile``, ...); the topic itself if unknown."""
    return next((s for s, t in dlq_topics(settings).items() if t == topic), topic)


def ingest_channels(settings: Settings) -> dict[str, Channel]:
    """Ingest topic → its channel (tiered topic names, whatever the current mode)."""
    return {settings.topic(f"ingest.{c.value.lower()}.{t.value.lower()}"): c
            for c in Channel for t in Tier}


@dataclass(frozen=True, slots=True)
class DlqEntry:
    """A dead letter and where it lives in its DLQ topic."""

    record: DlqRecord
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None

    @property
    def dlq_id(self) -> str:
        return self.record.dlq_id


@dataclass
class ReadStats:
    """What a read met besides dead letters (values that are not a :class:`DlqRecord`)."""

    unreadable: int = 0
    undecidable_channel: int = 0


def _consumer(settings: Settings) -> Consumer:
    return Consumer(kafka_config(settings, {
        "group.id": f"notiflow-dlq-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "queued.max.messages.kbytes": 16_384,
        "logger": logging.getLogger("notiflow.kafka.dlq-reader"),
    }))


def watermarks(settings: Settings, topics: Iterable[str],
               timeout: float = 10.0) -> dict[PartitionKey, tuple[int, int]]:
    """``{(topic, partition): (low, high)}`` of every partition of ``topics``."""
    c = _consumer(settings)
    try:
        out: dict[PartitionKey, tuple[int, int]] = {}
        for topic in topics:
            try:
                md = c.list_topics(topic, timeout=timeout).topics.get(topic)
            except KafkaException as exc:
                raise DlqReadError(f"cannot reach Kafka at {settings.kafka_bootstrap}: "
                                   f"{exc}") from None
            if md is None or md.error is not None or not md.partitions:
                raise DlqReadError(f"DLQ topic {topic} does not exist (run `notiflow stack "
                                   "init`)")
            for p in sorted(md.partitions):
                out[(topic, p)] = _watermark(c, TopicPartition(topic, p), timeout)
        return out
    finally:
        c.close()


def _watermark(c: Consumer, tp: TopicPartition, timeout: float) -> tuple[int, int]:
    """(low, high) of one partition; retriable broker errors (a leader moving, as just after a
    topic is created) are retried for a few seconds."""
    for attempt in range(10):
        try:
            lo, hi = c.get_watermark_offsets(tp, timeout=timeout)
            return lo, hi
        except KafkaException as exc:
            if attempt == 9 or not exc.args[0].retriable():
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def offsets_at(settings: Settings, topics: Iterable[str], at: datetime,
               timeout: float = 10.0) -> dict[PartitionKey, int]:
    """Per partition: the first offset whose Kafka timestamp is at or after ``at``; the high
    watermark when there is none (every record is older)."""
    marks = watermarks(settings, topics, timeout)
    ms = int(at.timestamp() * 1000)
    c = _consumer(settings)
    try:
        found = c.offsets_for_times([TopicPartition(t, p, ms) for t, p in marks],
                                    timeout=timeout)
    finally:
        c.close()
    out: dict[PartitionKey, int] = {}
    for tp in found:
        lo, hi = marks[(tp.topic, tp.partition)]
        out[(tp.topic, tp.partition)] = hi if tp.offset < 0 else max(lo, min(tp.offset, hi))
    return out


def read_dlq(settings: Settings, ranges: Mapping[PartitionKey, tuple[int, int]],
             stats: ReadStats | None = None,
             idle_timeout: float = IDLE_TIMEOUT_S) -> Generator[DlqEntry, None, None]:
    """Dead letters of the given ``{(topic, partition): (start, end)}`` offset ranges, in
    offset order per partition (end exclusive). Values that are not DLQ records are skipped,
    counted in ``stats`` and logged. Raises :class:`DlqReadError` when the read stalls."""
    remaining = {k: end for k, (start, end) in ranges.items() if end > start}
    if not remaining:
        return
    c = _consumer(settings)
    try:
        c.assign([TopicPartition(t, p, ranges[(t, p)][0]) for t, p in remaining])
        last = time.monotonic()
        while remaining:
            batch = c.consume(num_messages=LOOKUP_CHUNK, timeout=0.5)
            if not batch:
                if time.monotonic() - last > idle_timeout:
                    raise DlqReadError(f"no record for {idle_timeout:.0f}s before the end of "
                                       f"{sorted(remaining)}")
                continue
            last = time.monotonic()
            for m in batch:
                key = (m.topic() or "", m.partition() or 0)
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        remaining.pop(key, None)
                        continue
                    raise DlqReadError(f"reading {key[0]}[{key[1]}]: {err}")
                end = remaining.get(key)
                offset = m.offset() or 0
                if end is None or offset >= end:
                    remaining.pop(key, None)
                    continue
                if offset + 1 >= end:
                    remaining.pop(key, None)
                entry = _entry(m, key, offset, stats)
                if entry is not None:
                    yield entry
    finally:
        c.close()


def _entry(m: Any, key: PartitionKey, offset: int, stats: ReadStats | None) -> DlqEntry | None:
    try:
        record = DlqRecord.model_validate_json(m.value() or b"")
    except ValidationError as exc:
        if stats is not None:
            stats.unreadable += 1
        log.warning("%s[%d]@%d is not a DLQ record (%d errors); skipped", key[0], key[1],
                    offset, exc.error_count())
        return None
    kind, ts = m.timestamp()
    return DlqEntry(record, key[0], key[1], offset, ts if kind else None)


def channel_of(entry: DlqEntry, channels: Mapping[str, Channel],
               cipher: DlqCipher | None) -> Channel | None:
    """The channel of a dead letter: from its source topic, a ``channel`` header, or (with
    the key) the decrypted payload; None when none of them tells."""
    rec = entry.record
    if rec.source_topic in channels:
        return channels[rec.source_topic]
    hdr = rec.headers.get("channel")
    if hdr and hdr.upper() in Channel.__members__:
        return Channel(hdr.upper())
    if cipher is None:
        return None
    try:
        doc = orjson.loads(cipher.decrypt(rec.payload_encrypted))
    except (ValueError, orjson.JSONDecodeError):
        return None
    value = doc.get("channel") if isinstance(doc, dict) else None
    return Channel(value) if isinstance(value, str) and value in Channel.__members__ else None


@dataclass(frozen=True)
class DlqFilter:
    """Which dead letters an operator means; every given criterion must hold."""

    ids: frozenset[str] = frozenset()
    channel: Channel | None = None
    reason: str | None = None
    """Case-insensitive substring of the reason."""
    error_class: str | None = None
    category: str | None = None
    message_id: str | None = None
    tenant: str | None = None
    since: datetime | None = None
    """``failed_at >= since``."""
    until: datetime | None = None
    """``failed_at < until``."""

    def matches(self, record: DlqRecord) -> bool:
        """Every criterion except the channel (which may need the payload)."""
        if self.ids and record.dlq_id not in self.ids:
            return False
        if self.reason and self.reason.lower() not in record.reason.lower():
            return False
        if self.error_class and record.error_class != self.error_class:
            return False
        if self.category and record.category != self.category:
            return False
        if self.message_id and record.message_id != self.message_id:
            return False
        if self.tenant and record.tenant_id != self.tenant:
            return False
        if self.since and record.failed_at < self.since:
            return False
        return not (self.until and record.failed_at >= self.until)

    @property
    def narrows(self) -> bool:
        """True when anything beyond the DLQ choice is filtered on."""
        return any((self.ids, self.channel, self.reason, self.error_class, self.category,
                    self.message_id, self.tenant, self.since, self.until))


REOPEN_REASON = "dlq_replay"
REPLAY_SOURCE = "dlq.replay"
"""``source`` of the ``message_events`` rows a replay writes."""


@dataclass(frozen=True)
class MessageState:
    """What Cassandra knows of the message a dead letter belongs to."""

    status: Status | None
    """None: no row (not written yet, a direct producer's record, or expired by TTL)."""
    status_rank: int
    attempt: int
    """The attempt of the current status."""
    reason: str | None
    expires_at: datetime | None
    highest_attempt: int
    """The highest attempt number the row and the ``attempts`` table know."""


@dataclass(frozen=True)
class Resolution:
    """A ``dlq_resolved`` row."""

    dlq_id: str
    state: str
    at: datetime
    actor: str
    reason: str
    message_id: str | None
    attempt: int | None
    detail: dict[str, Any]


@dataclass(frozen=True)
class AuditRow:
    """A ``dlq_audit`` row: ``tier`` is the DLQ the record lives in (P0..P3, reconcile,
    webhooks); ``day`` is the UTC date of ``at``."""

    tier: str
    at: datetime
    dlq_id: str
    action: str
    actor: str
    reason: str
    message_id: str | None
    detail: dict[str, Any] = field(default_factory=dict)


def resolved_shard(dlq_id: str) -> int:
    return zlib.crc32(dlq_id.encode()) % RESOLVED_SHARDS


def _resolution(row: dict[str, Any]) -> Resolution:
    return Resolution(
        dlq_id=row["dlq_id"], state=row["state"], at=utc(row["at"]) or datetime.now(UTC),
        actor=row.get("actor") or "", reason=row.get("reason") or "",
        message_id=row.get("message_id"), attempt=row.get("attempt"),
        detail=orjson.loads(row["detail"]) if row.get("detail") else {})


_COLUMNS = "dlq_id, state, at, actor, reason, message_id, attempt, detail"
_LEDGER: dict[str, str] = {
    "lookup": f"SELECT {_COLUMNS} FROM dlq_resolved WHERE topic = ? AND shard = ? "
    "AND dlq_id IN ?",
    "get": f"SELECT {_COLUMNS} FROM dlq_resolved WHERE topic = ? AND shard = ? AND dlq_id = ?",
    "claim": "INSERT INTO dlq_resolved (topic, shard, dlq_id, state, at, actor, reason, "
    "message_id, attempt, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    "reclaim": "UPDATE dlq_resolved SET state = ?, at = ?, actor = ?, reason = ?, "
    "message_id = ?, attempt = ?, detail = ? WHERE topic = ? AND shard = ? AND dlq_id = ? "
    "IF state = ? AND at = ?",
    "unclaim": "DELETE FROM dlq_resolved WHERE topic = ? AND shard = ? AND dlq_id = ? "
    "IF state = ?",
    "message": "SELECT status, status_rank, reason, attempt, expires_at FROM messages "
    "WHERE message_id = ?",
    "attempts": "SELECT attempt_no FROM attempts WHERE message_id = ?",
    "set_status": "UPDATE messages SET status = ?, status_rank = ?, reason = ?, "
    "next_attempt_at = ?, expires_at = ?, updated_at = ? WHERE message_id = ? "
    "IF status_rank = ?",
    "event": "INSERT INTO message_events (message_id, occurred_at, event_id, status, attempt, "
    "reason, source, applied) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    "audit": "INSERT INTO dlq_audit (tier, day, at, dlq_id, action, actor, reason, "
    "message_id, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
}


class DlqLedger:
    """The resolved set and the audit trail in Cassandra (``dlq_resolved``, ``dlq_audit``).

    State changes of one dead letter are lightweight transactions, so two operators never
    both replay it."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._stmts = {name: session.prepare(cql) for name, cql in _LEDGER.items()}

    def _run(self, name: str, params: tuple[Any, ...]) -> asyncio.Future[list[dict[str, Any]]]:
        return aio(self.session.execute_async(self._stmts[name], params))

    async def resolutions(self, topic: str, ids: Iterable[str]) -> dict[str, Resolution]:
        """The resolutions among ``ids`` of dead letters of ``topic``."""
        by_shard: dict[int, list[str]] = defaultdict(list)
        for i in set(ids):
            by_shard[resolved_shard(i)].append(i)
        found = await asyncio.gather(*(self._run("lookup", (topic, shard, chunk))
                                       for shard, chunk in by_shard.items()))
        return {row["dlq_id"]: _resolution(row) for rows in found for row in rows}

    async def resolution(self, topic: str, dlq_id: str) -> Resolution | None:
        rows = await self._run("get", (topic, resolved_shard(dlq_id), dlq_id))
        return _resolution(rows[0]) if rows else None

    async def claim(self, topic: str, dlq_id: str, state: str, at: datetime, actor: str,
                    reason: str, message_id: str | None, attempt: int | None,
                    detail: Mapping[str, Any], previous: Resolution | None = None) -> bool:
        """Set the resolution of ``dlq_id`` if it is still ``previous`` (None: unresolved);
        False when someone else changed it first."""
        doc = orjson.dumps(dict(detail)).decode()
        shard = resolved_shard(dlq_id)
        if previous is None:
            rows = await self._run("claim", (topic, shard, dlq_id, state, at, actor, reason,
                                             message_id, attempt, doc))
        else:
            rows = await self._run("reclaim", (state, at, actor, reason, message_id, attempt,
                                               doc, topic, shard, dlq_id, previous.state,
                                               previous.at))
        return bool(rows and rows[0].get("[applied]"))

    async def restore(self, topic: str, dlq_id: str, current: Resolution,
                      previous: Resolution | None) -> None:
        """Undo a claim (``current``) that could not be completed."""
        if previous is None:
            await self._run("unclaim", (topic, resolved_shard(dlq_id), dlq_id, current.state))
            return
        await self.claim(topic, dlq_id, previous.state, previous.at, previous.actor,
                         previous.reason, previous.message_id, previous.attempt,
                         previous.detail, previous=current)

    async def message_state(self, message_id: str) -> MessageState:
        """The message's row (if any) and the highest attempt it and its ``attempts`` rows
        know."""
        rows, attempts = await asyncio.gather(self._run("message", (message_id,)),
                                              self._run("attempts", (message_id,)))
        row = rows[0] if rows else {}
        status = row.get("status")
        attempt = int(row.get("attempt") or 0)
        highest = max([attempt, *(int(a["attempt_no"]) for a in attempts)])
        return MessageState(Status(status) if status else None, int(row.get("status_rank") or 0),
                            attempt, row.get("reason"), utc(row.get("expires_at")), highest)

    async def reopen(self, message_id: str, state: MessageState, *, attempt: int,
                     expires_at: datetime, at: datetime, dlq_id: str) -> bool:
        """Set a message that ended (``state``) back to QUEUED for the replay of ``dlq_id``
        as ``attempt``, if its status is still the one read; False when it changed."""
        return await self._set_status(message_id, state.status_rank, Status.QUEUED,
                                      rank(Status.QUEUED), REOPEN_REASON, expires_at, at,
                                      attempt,
                                      f"{message_id}:dlq_replay:{dlq_id}:{attempt}")

    async def undo_reopen(self, message_id: str, state: MessageState, *, attempt: int,
                          at: datetime, dlq_id: str) -> bool:
        """Put back the status :meth:`reopen` replaced (the replay was not produced)."""
        assert state.status is not None
        return await self._set_status(message_id, rank(Status.QUEUED), state.status,
                                      state.status_rank, state.reason, state.expires_at, at,
                                      state.attempt,
                                      f"{message_id}:dlq_replay_undone:{dlq_id}:{attempt}")

    async def _set_status(self, message_id: str, expected_rank: int, status: Status,
                          new_rank: int, reason: str | None, expires_at: datetime | None,
                          at: datetime, attempt: int, event_id: str) -> bool:
        rows = await self._run("set_status", (status.value, new_rank, reason, None, expires_at,
                                              at, message_id, expected_rank))
        if not (rows and rows[0].get("[applied]")):
            return False
        await self._run("event", (message_id, at, event_id, status.value, attempt, reason,
                                  REPLAY_SOURCE, True))
        return True

    async def audit(self, row: AuditRow) -> None:
        at = row.at.astimezone(UTC)
        await self._run("audit", (row.tier, at.date(), at, row.dlq_id, row.action, row.actor,
                                  row.reason, row.message_id,
                                  orjson.dumps(row.detail).decode()))


@dataclass(frozen=True)
class Found:
    """A dead letter that passed a filter, with its channel (if known) and resolution."""

    entry: DlqEntry
    channel: Channel | None
    resolution: Resolution | None


async def scan(settings: Settings, ledger: DlqLedger, topics: Iterable[str], flt: DlqFilter,
               cipher: DlqCipher | None = None, *, include_resolved: bool = False,
               stats: ReadStats | None = None) -> AsyncGenerator[Found, None]:
    """Stream the dead letters of ``topics`` that match ``flt`` (unresolved ones only unless
    ``include_resolved``). The channel filter decrypts a payload only when neither the
    source topic nor a header tells the channel, and only with ``cipher``."""
    channels = ingest_channels(settings)
    stats = stats if stats is not None else ReadStats()
    marks = await asyncio.to_thread(watermarks, settings, list(topics))
    records = read_dlq(settings, marks, stats)
    try:
        while True:
            chunk = await asyncio.to_thread(take, records, LOOKUP_CHUNK)
            if not chunk:
                return
            wanted = [e for e in chunk if flt.matches(e.record)]
            resolved = await resolved_of(ledger, wanted)
            for e in wanted:
                res = resolved.get((e.topic, e.dlq_id))
                if res is not None and not include_resolved:
                    continue
                ch = channel_of(e, channels, cipher)
                if flt.channel is not None:
                    if ch is None:
                        stats.undecidable_channel += 1
                    if ch is not flt.channel:
                        continue
                yield Found(e, ch, res)
    finally:
        with contextlib.suppress(ValueError):
            records.close()


def take(it: Iterator[DlqEntry], n: int) -> list[DlqEntry]:
    """The next ``n`` entries of ``it`` (fewer at its end)."""
    return list(islice(it, n))


async def resolved_of(ledger: DlqLedger,
                      entries: list[DlqEntry]) -> dict[tuple[str, str], Resolution]:
    """``{(topic, dlq_id): resolution}`` of the resolved ones among ``entries``."""
    by_topic: dict[str, list[str]] = defaultdict(list)
    for e in entries:
        by_topic[e.topic].append(e.dlq_id)
    found = await asyncio.gather(*(ledger.resolutions(t, ids) for t, ids in by_topic.items()))
    return {(t, i): r for t, res in zip(by_topic, found, strict=True) for i, r in res.items()}


@dataclass
class LedgerSession:
    """A Cassandra connection with a :class:`DlqLedger`; close it with :meth:`close`."""

    cluster: Any
    session: Session
    ledger: DlqLedger

    @classmethod
    async def open(cls, settings: Settings) -> LedgerSession:
        try:
            cluster, session = await asyncio.to_thread(connect, settings)
        except Exception as exc:
            raise DlqReadError(f"cannot connect to Cassandra keyspace "
                               f"{settings.cassandra_keyspace}: {exc}") from None
        try:
            ledger = await asyncio.to_thread(DlqLedger, session)
        except Exception as exc:
            cluster.shutdown()
            raise DlqReadError(f"DLQ tables missing or Cassandra unreachable ({exc}); run "
                               "`notiflow stack migrate`") from None
        return cls(cluster, session, ledger)

    def close(self) -> None:
        self.cluster.shutdown()


def alert_line(dlq: str, topic: str, depth: int, threshold: int) -> str:
    """The log line of the depth alert (log-based alert rules match ``DLQ_DEPTH_ALERT``)."""
    return f"DLQ_DEPTH_ALERT dlq={dlq} topic={topic} depth={depth} threshold={threshold}"


class Gauge(Protocol):
    """What :class:`DepthMonitor` needs of an OpenTelemetry gauge."""

    def set(self, amount: int | float, attributes: dict[str, str] | None = None) -> None: ...


class DepthMonitor:
    """Unresolved dead letters per DLQ topic, kept current incrementally.

    Each :meth:`check` reads only the records appended since the previous one, forgets the
    ones Kafka deleted (retention, ``purge --before``) and asks the ledger which of those
    still open were resolved meanwhile; a dead letter written twice (at-least-once sinks)
    counts once. Memory: one entry per unresolved dead letter. Above ``dlq.depth_alert``
    a check logs :func:`alert_line` at ERROR for that topic (every check while it stays
    above; one ``DLQ_DEPTH_OK`` line when it drops back) and sets the gauge
    ``notiflow.dlq.depth`` (attribute ``dlq``) for every topic."""

    def __init__(self, settings: Settings, ledger: DlqLedger, selector: str | None = None,
                 gauge: Gauge | None = None) -> None:
        self.settings = settings
        self.ledger = ledger
        self.topics = dlq_topics(settings, selector)
        self.gauge: Gauge = gauge if gauge is not None else _depth_gauge()
        self.stats = ReadStats()
        self.alerting: set[str] = set()
        self._next: dict[PartitionKey, int] = {}
        self._open: dict[PartitionKey, dict[str, int]] = defaultdict(dict)

    async def check(self) -> dict[str, int]:
        """One pass: ``{topic: unresolved dead letters}``; sets the gauge, logs alerts."""
        marks = await asyncio.to_thread(watermarks, self.settings, list(self.topics.values()))
        for key in set(self._open) - set(marks):
            del self._open[key]
        ranges: dict[PartitionKey, tuple[int, int]] = {}
        for key, (lo, hi) in marks.items():
            start = self._next.get(key, lo)
            if start > hi:
                self._open.pop(key, None)
                start = lo
            opened = self._open.get(key)
            if opened:
                for dlq_id in [i for i, offset in opened.items() if offset < lo]:
                    del opened[dlq_id]
            ranges[key] = (max(start, lo), hi)
        records = read_dlq(self.settings, ranges, self.stats)
        try:
            while chunk := await asyncio.to_thread(take, records, LOOKUP_CHUNK):
                for e in chunk:
                    self._open[(e.topic, e.partition)][e.dlq_id] = e.offset
        finally:
            with contextlib.suppress(ValueError):
                records.close()
        self._next.update({key: hi for key, (_lo, hi) in ranges.items()})
        await self._forget_resolved()
        counts = dict.fromkeys(self.topics.values(), 0)
        for (topic, _partition), ids in self._open.items():
            counts[topic] = counts.get(topic, 0) + len(ids)
        self._report(counts)
        return counts

    async def _forget_resolved(self) -> None:
        by_topic: dict[str, list[str]] = defaultdict(list)
        for (topic, _partition), opened_ids in self._open.items():
            by_topic[topic].extend(opened_ids)
        for topic, ids in by_topic.items():
            for i in range(0, len(ids), LOOKUP_CHUNK):
                resolved = await self.ledger.resolutions(topic, ids[i:i + LOOKUP_CHUNK])
                if not resolved:
                    continue
                for (t, _partition), opened in self._open.items():
                    if t == topic:
                        for dlq_id in resolved.keys() & opened.keys():
                            del opened[dlq_id]

    def _report(self, counts: Mapping[str, int]) -> None:
        threshold = self.settings.dlq.depth_alert
        for dlq, topic in self.topics.items():
            n = counts[topic]
            self.gauge.set(n, {"dlq": dlq})
            if n > threshold:
                self.alerting.add(topic)
                log.error(alert_line(dlq, topic, n, threshold))
            elif topic in self.alerting:
                self.alerting.discard(topic)
                log.warning("DLQ_DEPTH_OK dlq=%s topic=%s depth=%d threshold=%d", dlq, topic,
                            n, threshold)


@functools.cache
def _depth_gauge() -> Gauge:
    gauge: Gauge = names.DLQ_DEPTH.create(metrics.get_meter(names.METER))
    return gauge


async def watch_depth(settings: Settings, interval_s: float = DEPTH_INTERVAL_S, *,
                      gauge: Gauge | None = None) -> None:
    """Run a :class:`DepthMonitor` over every DLQ every ``interval_s`` until cancelled. It
    opens its own Cassandra connection (retried each interval until it succeeds); a failed
    check is logged and tried again at the next interval."""
    ls: LedgerSession | None = None
    monitor: DepthMonitor | None = None
    log.info("DLQ depth monitor: every %.0fs, alert above %d", interval_s,
             settings.dlq.depth_alert)
    try:
        while True:
            try:
                if ls is None:
                    ls = await LedgerSession.open(settings)
                if monitor is None:
                    monitor = DepthMonitor(settings, ls.ledger, gauge=gauge)
                await monitor.check()
            except Exception as exc:
                log.warning("DLQ depth check failed: %s", exc)
            await asyncio.sleep(interval_s)
    finally:
        if ls is not None:
            await asyncio.to_thread(ls.close)


def dlq_depth(settings: Settings, selector: str | None = None) -> dict[str, int]:
    """``{topic: unresolved dead letters}`` of every DLQ (or the one ``selector`` names);
    blocking, opens its own connections (call it from a thread when a loop is running)."""

    async def run() -> dict[str, int]:
        ls = await LedgerSession.open(settings)
        try:
            return await DepthMonitor(settings, ls.ledger, selector).check()
        finally:
            ls.close()

    return asyncio.run(run())
