"""The DLQ topics and their dead letters, read without a trace in Kafka.

Contracts:

- Every partition of a DLQ topic is read from its low watermark up to the high watermark
  taken when the read starts (records appended meanwhile wait for the next run). The
  consumer is assigned partitions explicitly and never commits offsets: reading a DLQ leaves
  no trace in Kafka.
- Records stream: a read holds at most one lookup chunk (:data:`LOOKUP_CHUNK` records) at a
  time (:func:`take`), so counting or filtering a DLQ of millions needs no more memory than a
  small one.
- Values that are not a :class:`~notiflow.schemas.messages.DlqRecord` are skipped, counted in
  :class:`ReadStats` and logged on the logger ``notiflow.dlq``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pydantic import ValidationError

from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.kafka_io import kafka_config
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import DlqRecord
from notiflow.settings import Settings

log = logging.getLogger("notiflow.dlq")

SELECTORS: tuple[str, ...] = (*(t.value for t in Tier), "reconcile", "webhooks")
"""Names of the DLQs: one per tier, the reconciler's and the client webhooks'."""
TIER_SELECTORS: tuple[str, ...] = tuple(t.value for t in Tier)
LOOKUP_CHUNK = 500
IDLE_TIMEOUT_S = 20.0
"""A read that gets no record for this long before reaching the high watermark fails."""

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


def take(it: Iterator[DlqEntry], n: int) -> list[DlqEntry]:
    """The next ``n`` entries of ``it`` (fewer at its end)."""
    return list(islice(it, n))
