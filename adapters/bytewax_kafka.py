"""Bytewax Kafka source and a sink that confirms every delivery.

:class:`ConfirmingSink` produces each batch with acks=all and the idempotent producer, waits
for every delivery report and raises if any failed. Bytewax only commits an epoch (source
offsets + state) after the sink returned, so a failed write is never committed as progress:
the flow stops and resumes from the last committed epoch.
"""

from __future__ import annotations

import logging

from bytewax.connectors.kafka import KafkaSource
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
        add_config={"fetch.wait.max.ms": "10", "logger": logging.getLogger("notiflow.kafka")},
    )


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
