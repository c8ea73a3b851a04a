"""``notify.delayed`` as the schedulers read it: one consumer group shared by every scheduler
process (partitions split among them), offsets committed by hand only after the records of
a batch are safe elsewhere (written to a bucket, or published to their ingest topic)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from confluent_kafka import Consumer, Message, TopicPartition

from notiflow.adapters.kafka_io import header, kafka_config
from notiflow.ingest_binding import binding_of
from notiflow.settings import Settings

log = logging.getLogger(__name__)
GROUP = "notiflow-scheduler-intake"


@dataclass(frozen=True, slots=True)
class Delayed:
    """One record of ``notify.delayed``: its bytes and where it came from."""

    value: bytes
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    traceparent: str | None
    binding: bytes | None = None
    """Its ``nf-binding`` header (``notiflow/ingest_binding.py``)."""


class DelayedIntake:
    """Reads ``notify.delayed`` in batches; :meth:`commit` records a batch as done."""

    def __init__(self, settings: Settings, group: str = GROUP) -> None:
        self._consumer = Consumer(kafka_config(settings, {
            "group.id": f"{settings.topic_prefix}{group}",
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "logger": logging.getLogger("notiflow.kafka.consumer")}))
        self._consumer.subscribe([settings.delayed_topic])

    async def batch(self, most: int, wait: float) -> list[Delayed]:
        """Up to ``most`` records, waiting up to ``wait`` seconds for the first."""
        msgs: list[Message] = await asyncio.to_thread(self._consumer.consume, most, wait)
        out = []
        for m in msgs:
            if m.error():
                log.warning("notify.delayed: %s", m.error())
                continue
            ts_type, ts = m.timestamp()
            headers = m.headers()
            out.append(Delayed(m.value() or b"", m.topic() or "", m.partition() or 0,
                               m.offset() or 0, ts if ts_type else None,
                               header(headers, "traceparent"),  # type: ignore[arg-type]  # list of (str, bytes) as produced
                               binding_of(headers)))  # type: ignore[arg-type]
        return out

    async def commit(self, records: list[Delayed]) -> None:
        """Commit past every record of ``records`` (synchronously: returns once Kafka has
        the offsets)."""
        last: dict[tuple[str, int], int] = {}
        for r in records:
            key = (r.topic, r.partition)
            last[key] = max(last.get(key, -1), r.offset)
        if last:
            parts = [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]
            await asyncio.to_thread(self._consumer.commit, offsets=parts, asynchronous=False)

    def rewind(self, records: list[Delayed]) -> None:
        """Read ``records`` again from the next batch on (a batch that could not be stored)."""
        first: dict[tuple[str, int], int] = {}
        for r in records:
            key = (r.topic, r.partition)
            first[key] = min(first.get(key, r.offset), r.offset)
        for (t, p), o in first.items():
            self._consumer.seek(TopicPartition(t, p, o))

    def close(self) -> None:
        self._consumer.close()
