"""Bytewax Kafka source and a sink that confirms every delivery.

:class:`ConfirmingSink` produces each batch with acks=all and the idempotent producer, waits
for every delivery report and raises if any failed. Bytewax only commits an epoch (source
offsets + state) after the sink returned, so a failed write is never committed as progress:
the flow stops and resumes from the last committed epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bytewax.connectors.kafka import KafkaSource
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka.admin import AdminClient

from notiflow.adapters.kafka_io import OutRecord, SyncProducer
from notiflow.settings import Settings

log = logging.getLogger(__name__)


class _Partition(StatelessSinkPartition[OutRecord]):
    def __init__(self, settings: Settings) -> None:
        self._producer = SyncProducer(settings)

    def write_batch(self, items: list[OutRecord]) -> None:
        self._producer.send_all(items)

    def close(self) -> None:
        self._producer.close()


class ConfirmingSink(DynamicSink[OutRecord]):
    """Writes :class:`OutRecord` items to their own topics; raises on any failed delivery."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Partition:
        return _Partition(self.settings)


def kafka_source(settings: Settings, topics: list[str], batch_size: int) -> KafkaSource:
    """Tail ``topics`` from the beginning on first start; offsets live in Bytewax recovery.
    Consumer errors are delivered as items (never silently dropped)."""
    return KafkaSource(
        [settings.kafka_bootstrap],
        topics,
        tail=True,
        starting_offset=OFFSET_BEGINNING,
        batch_size=batch_size,
        raise_on_errors=False,
        add_config={"fetch.wait.max.ms": "10", "queued.max.messages.kbytes": "8192",
                    "logger": logging.getLogger("notiflow.kafka")},
    )


PAUSE_CHECK = timedelta(milliseconds=20)


class _PausablePartition(StatefulSourcePartition[Any, Any]):
    def __init__(self, inner: StatefulSourcePartition[Any, Any],
                 paused: Callable[[], bool]) -> None:
        self.inner = inner
        self.paused = paused
        self._awake: datetime | None = None

    def next_batch(self) -> list[Any]:
        if self.paused():
            self._awake = datetime.now(UTC) + PAUSE_CHECK
            return []
        self._awake = None
        return list(self.inner.next_batch())

    def next_awake(self) -> datetime | None:
        return self._awake

    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def close(self) -> None:
        self.inner.close()


class PausableKafkaSource(FixedPartitionedSource[Any, Any]):
    """A Kafka source whose partitions stop reading while ``paused(topic)`` is true:
    backpressure by signal (the consumer is simply not polled; librdkafka's prefetch is
    bounded by ``queued.max.messages.kbytes``)."""

    def __init__(self, inner: KafkaSource, paused: Callable[[str], bool]) -> None:
        self.inner = inner
        self.is_paused = paused

    def list_parts(self) -> list[str]:
        return self.inner.list_parts()

    def build_part(self, step_id: str, for_part: str,
                   resume_state: Any | None) -> _PausablePartition:
        topic = for_part.split("-", 1)[1]
        part = self.inner.build_part(step_id, for_part, resume_state)
        return _PausablePartition(part, lambda: self.is_paused(topic))


def check_topics(settings: Settings, topics: list[str], timeout: float = 15.0) -> None:
    """Fail fast (Bytewax's source would hang forever) when Kafka or a topic is missing."""
    try:
        md = AdminClient({"bootstrap.servers": settings.kafka_bootstrap,
                          "logger": logging.getLogger("notiflow.kafka")}
                         ).list_topics(timeout=timeout)
    except Exception as exc:
        raise SystemExit(f"Kafka at {settings.kafka_bootstrap} is unreachable: {exc}. "
                         "Is the stack up (`notiflow stack up`)?") from exc
    missing = [t for t in topics if t not in md.topics]
    if missing:
        raise SystemExit(f"missing Kafka topics {missing}; run `notiflow stack up`")
