"""Bytewax Kafka source and a sink that confirms every delivery.

:class:`ConfirmingSink` produces each batch with acks=all and the idempotent producer, waits
for every delivery report and raises if any failed. Bytewax only commits an epoch (source
offsets + state) after the sink returned, so a failed write is never committed as progress:
the flow stops and resumes from the last committed epoch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from bytewax.connectors.kafka import KafkaSource
from bytewax.inputs import FixedPartitionedSource
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka.admin import AdminClient
from opentelemetry.metrics import CallbackOptions, Observation

from notiflow import names, stages
from notiflow.adapters.kafka_group import (
    REGISTRY,
    GroupedPartition,
    WorkerConsumer,
)
from notiflow.adapters.kafka_io import OutRecord, SyncProducer, kafka_config
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


FETCH_WAIT_MS = 500
"""How long the broker may hold a fetch that found no record (librdkafka's default). It does
not delay records: a waiting fetch is answered as soon as a record arrives (at 10 ms the
idle fetches of a few flows kept the broker busy; ``notiflow bench throughput``: Kafka's CPU
per message)."""

DEFAULT_WAIT = timedelta(milliseconds=20)
"""How long a worker's consumer waits for a record when it has none (a send flow: its tier's
``poll_wait``). The worker does nothing else meanwhile, so it bounds how late the worker's
timers and outcomes can be while its sources are idle."""

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


class GroupedKafkaSource(KafkaSource):
    """:class:`KafkaSource` whose partitions share one consumer per worker
    (``adapters/kafka_group.py``: the leader waits up to ``wait`` for a record, then Bytewax
    calls it again after ``idle``) and report their lag (see :func:`observe_lag`). It always
    tails and delivers consumer errors as items (``tail`` and ``raise_on_errors`` are not
    used)."""

    def __init__(self, *args: Any, admin_config: Mapping[str, Any], topic_prefix: str = "",
                 wait: timedelta = DEFAULT_WAIT, idle: timedelta = timedelta(0),
                 require: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._admin_config = admin_config
        self._prefix = topic_prefix
        self._wait = wait
        self._idle = idle
        self._require = [*self._topics, *require]

    def list_parts(self) -> list[str]:
        """Fail fast when Kafka or a topic is missing (checked when the flow runs, so
        building the flow opens nothing), then Bytewax's listing."""
        check_topics(self._admin_config, self._require)
        return super().list_parts()

    def build_part(  # type: ignore[override]  # bytewax types it as its own partition class
            self, step_id: str, for_part: str, resume_state: int | None) -> GroupedPartition:
        idx, topic = for_part.split("-", 1)
        assert topic in self._topics, "Can't resume from different set of Kafka topics"
        flow = step_id.split(".", 1)[0]

        def report(part: tuple[str, int], lag: int) -> None:
            with _lags_lock:
                _lags[self._lag_key(flow, part)] = lag

        def make(on_close: Callable[[], None]) -> WorkerConsumer:
            config: dict[str, Any] = {
                "group.id": "BYTEWAX_IGNORED",
                "enable.auto.commit": "false",
                "enable.partition.eof": "false",
                "statistics.interval.ms": 1000,
                **self._add_config,
            }
            return WorkerConsumer(config, self._batch_size, self._wait, report, on_close)

        group = REGISTRY.get(step_id, make)
        offset = self._starting_offset if resume_state is None else resume_state
        part = (topic, int(idx))
        return _LagPartition(group, part, offset, self._idle, self._lag_key(flow, part))

    def _lag_key(self, flow: str, part: tuple[str, int]) -> _LagKey:
        return (flow, part[0].removeprefix(self._prefix), part[1])


class _LagPartition(GroupedPartition):
    """A grouped partition whose lag leaves ``notiflow.consumer.lag`` when it closes."""

    def __init__(self, group: WorkerConsumer, part: tuple[str, int], offset: int,
                 idle: timedelta, lag_key: _LagKey) -> None:
        super().__init__(group, part, offset, idle)
        self._lag_key = lag_key

    def close(self) -> None:
        with _lags_lock:
            _lags.pop(self._lag_key, None)
        super().close()


def kafka_source(settings: Settings, topics: list[str], batch_size: int,
                 wait: timedelta = DEFAULT_WAIT, idle: timedelta = timedelta(0),
                 require: Sequence[str] = ()) -> GroupedKafkaSource:
    """Tail ``topics`` from the beginning on first start; offsets live in Bytewax recovery.
    Consumer errors are delivered as items (never silently dropped). A worker waits up to
    ``wait`` for a record; after finding none it polls again ``idle`` later (a second
    source of the same flow waits 0 and sets ``idle``: only one of a worker's sources should
    wait). Partitions report ``notiflow.consumer.lag``. ``require``: other topics the flow
    needs (its sinks'), checked with the source's when the flow starts. Every client of the
    source (Bytewax's listing, the workers' consumers) is configured by :func:`kafka_config`."""
    client = kafka_config(settings, {"logger": logging.getLogger("notiflow.kafka")})
    return GroupedKafkaSource(
        [settings.kafka_bootstrap],
        topics,
        tail=True,
        starting_offset=OFFSET_BEGINNING,
        batch_size=batch_size,
        raise_on_errors=False,
        add_config={**client, "fetch.wait.max.ms": str(FETCH_WAIT_MS),
                    "queued.max.messages.kbytes": "8192"},
        admin_config=client,
        topic_prefix=settings.topic_prefix,
        wait=wait,
        idle=idle,
        require=require,
    )


class PausableKafkaSource(FixedPartitionedSource[Any, Any]):
    """A Kafka source whose partitions stop reading while ``paused(topic)`` is true:
    backpressure by signal (its records are not emitted and it is paused at its consumer, so
    nothing more of it is fetched; what was fetched stays buffered)."""

    def __init__(self, inner: GroupedKafkaSource, paused: Callable[[str], bool]) -> None:
        self.inner = inner
        self.is_paused = paused

    def list_parts(self) -> list[str]:
        return self.inner.list_parts()

    def build_part(self, step_id: str, for_part: str,
                   resume_state: Any | None) -> GroupedPartition:
        topic = for_part.split("-", 1)[1]
        part = self.inner.build_part(step_id, for_part, resume_state)
        part.pause_when(lambda: self.is_paused(topic))
        return part


def check_topics(config: Mapping[str, Any], topics: Sequence[str],
                 timeout: float = 15.0) -> None:
    """Fail fast (Bytewax's source would hang forever) when Kafka or a topic is missing;
    ``config``: an admin client's :func:`kafka_config`."""
    bootstrap = config.get("bootstrap.servers")
    try:
        md = AdminClient(dict(config)).list_topics(timeout=timeout)
    except Exception as exc:
        raise SystemExit(f"Kafka at {bootstrap} is unreachable: {exc}. "
                         "Is the stack up (`notiflow stack up`)?") from exc
    missing = [t for t in topics if t not in md.topics]
    if missing:
        raise SystemExit(f"missing Kafka topics {missing}; run `notiflow stack up`")
