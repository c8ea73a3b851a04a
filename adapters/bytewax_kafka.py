"""Bytewax Kafka source and a sink that confirms every delivery.

:class:`ConfirmingSink` produces each batch with acks=all and the idempotent producer, waits
for every delivery report and raises if any failed. Bytewax only commits an epoch (source
offsets + state) after the sink returned, so a failed write is never committed as progress:
the flow stops and resumes from the last committed epoch.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from bytewax.connectors.kafka import KafkaSource, _KafkaSourcePartition
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka.admin import AdminClient
from opentelemetry.metrics import CallbackOptions, Observation

from notiflow import names, stages
from notiflow.adapters.kafka_io import OutRecord, SyncProducer
from notiflow.names import Stage
from notiflow.settings import Settings
from notiflow.telemetry import meter

log = logging.getLogger(__name__)


class _Partition(StatelessSinkPartition[OutRecord]):
    def __init__(self, settings: Settings, tier: str | None) -> None:
        self._producer = SyncProducer(settings)
        self._tier = tier

    def write_batch(self, items: list[OutRecord]) -> None:
        start = time.perf_counter()
        self._producer.send_all(items)
        if self._tier:
            stages.record(self._tier, Stage.SINK, time.perf_counter() - start)

    def close(self) -> None:
        self._producer.close()


class ConfirmingSink(DynamicSink[OutRecord]):
    """Writes :class:`OutRecord` items to their own topics; raises on any failed delivery.
    ``tier``: the send flow's tier, whose latency budget gets the ``sink`` stage (the
    worker waits for the acknowledgements)."""

    def __init__(self, settings: Settings, tier: str | None = None) -> None:
        self.settings = settings
        self.tier = tier

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Partition:
        return _Partition(self.settings, self.tier)


_LagKey = tuple[str, str, int]
_lags: dict[_LagKey, int] = {}
_lags_lock = threading.Lock()


def observe_lag(options: CallbackOptions | None = None) -> Iterable[Observation]:
    """``notiflow.consumer.lag`` per flow, topic (without the prefix) and partition this
    process reads: high watermark - the next offset, from librdkafka's statistics."""
    with _lags_lock:
        items = list(_lags.items())
    for (flow, topic, partition), lag in items:
        yield Observation(lag, {"flow": flow, "topic": topic, "partition": partition})


names.CONSUMER_LAG.create(meter(), callbacks=[observe_lag])


class _LagPartition(_KafkaSourcePartition):
    """Bytewax's partition that also keeps its lag for ``notiflow.consumer.lag`` (librdkafka
    calls :meth:`_process_stats` every ``statistics.interval.ms``; no extra broker calls)."""

    def __init__(self, lag_key: _LagKey, *args: Any) -> None:
        self._lag_key = lag_key
        super().__init__(*args)

    def _process_stats(self, json_stats: str) -> None:
        try:
            stats = json.loads(json_stats)
            part = stats["topics"][self._topic]["partitions"][str(self._part_idx)]
            high = int(part["ls_offset"] if part.get("ls_offset", -1) >= 0
                       else part["hi_offset"])
        except (KeyError, TypeError, ValueError):
            return
        # before the first record the next offset is a sentinel (OFFSET_BEGINNING): then the
        # whole retained partition is behind
        start = self._offset if self._offset >= 0 else int(part.get("lo_offset", 0))
        if high >= 0:
            with _lags_lock:
                _lags[self._lag_key] = max(0, high - max(0, start))

    def close(self) -> None:
        with _lags_lock:
            _lags.pop(self._lag_key, None)
        super().close()


class _LagKafkaSource(KafkaSource):
    """:class:`KafkaSource` whose partitions report their lag (see :func:`observe_lag`)."""

    def __init__(self, *args: Any, topic_prefix: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._prefix = topic_prefix

    def build_part(self, step_id: str, for_part: str,
                   resume_state: int | None) -> _KafkaSourcePartition:
        idx, topic = for_part.split("-", 1)
        assert topic in self._topics, "Can't resume from different set of Kafka topics"
        config: dict[str, Any] = {
            "group.id": "BYTEWAX_IGNORED",
            "enable.auto.commit": "false",
            "bootstrap.servers": ",".join(self._brokers),
            "enable.partition.eof": str(not self._tail),
            "statistics.interval.ms": 1000,
        }
        config.update(self._add_config)
        short = topic.removeprefix(self._prefix) if self._prefix else topic
        key = (step_id.split(".", 1)[0], short, int(idx))
        return _LagPartition(key, step_id, config, topic, int(idx), self._starting_offset,
                             resume_state, self._batch_size, self._raise_on_errors)


FETCH_WAIT_MS = 500
"""How long the broker may hold a fetch that found no record (librdkafka's default). It does
not delay records: a waiting fetch is answered as soon as a record arrives. Bytewax opens one
consumer per partition, so at 10 ms the idle fetches of a few flows kept the broker busy
(``notiflow bench throughput``: Kafka's CPU per message)."""


def kafka_source(settings: Settings, topics: list[str], batch_size: int) -> KafkaSource:
    """Tail ``topics`` from the beginning on first start; offsets live in Bytewax recovery.
    Consumer errors are delivered as items (never silently dropped). Partitions report
    ``notiflow.consumer.lag``."""
    return _LagKafkaSource(
        [settings.kafka_bootstrap],
        topics,
        tail=True,
        starting_offset=OFFSET_BEGINNING,
        batch_size=batch_size,
        raise_on_errors=False,
        add_config={"fetch.wait.max.ms": str(FETCH_WAIT_MS),
                    "queued.max.messages.kbytes": "8192",
                    "logger": logging.getLogger("notiflow.kafka")},
        topic_prefix=settings.topic_prefix,
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
