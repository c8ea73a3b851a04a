"""One Kafka consumer per source step and worker, shared by the Kafka partitions it reads.

Bytewax's ``KafkaSource`` opens a consumer per partition and polls each with a 1 ms wait: a
send flow reading twelve ingest partitions and four preference partitions waited 16 ms per
round (P0's ``kafka`` stage: 21 ms at p50 under the flood), ran about 70 threads, sent the
broker two idle fetches a second per partition and used 5 % of a core while idle
(``docs/decisions/2026-12-02-kafka-consumer-per-worker.md``). Here the partitions one worker
reads share
one consumer, and its first partition leads: each of its calls emits up to a batch of every
partition's records, waiting up to ``wait`` in librdkafka when there are none (the wait ends
when a record of any partition arrives: a ``poll`` for the first record, then a ``consume``
without waiting for the rest of the batch); the other partitions emit nothing and are called
rarely. Letting every partition poll the shared consumer instead cost the idle P0 flow 11 %
of a core (Bytewax's cost per partition call, at 2 ms).

Kafka partitions stay Bytewax partitions and each snapshot is the partition's next offset,
exactly as ``KafkaSource`` keeps it, so recovery stores written by either resume in the
other; the leader's records advance their own partition's offset, and Bytewax snapshots all
of a worker's partitions at the same epoch boundary. A partition paused by backpressure is
paused at the consumer, so nothing more of it is fetched; what was fetched stays buffered.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bytewax.connectors.kafka import KafkaError, KafkaSourceMessage
from bytewax.inputs import StatefulSourcePartition
from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka import KafkaError as ConfluentKafkaError

PAUSED_CHECK = timedelta(milliseconds=20)
"""How often a consumer whose partitions are all paused checks whether one may resume."""

Item = KafkaSourceMessage[bytes | None, bytes | None] | KafkaError[bytes | None, bytes | None]
Part = tuple[str, int]
LagReport = Callable[[Part, int], None]

FOLLOWER_IDLE = timedelta(milliseconds=100)
"""How often Bytewax calls a partition that is not its consumer's leader (it returns nothing:
the leader emits every partition's records)."""


def _headers(msg: Message) -> list[tuple[str, bytes]]:
    """A record's headers as Bytewax types them (a null header value → ``b""``)."""
    raw = msg.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return [(k, v.encode() if isinstance(v, str) else v or b"") for k, v in pairs]


def _item(msg: Message) -> Item:
    kafka_msg: KafkaSourceMessage[bytes | None, bytes | None] = KafkaSourceMessage(
        key=msg.key(), value=msg.value(), topic=msg.topic(), headers=_headers(msg),
        latency=msg.latency(), offset=msg.offset(), partition=msg.partition(),
        timestamp=msg.timestamp())
    err = msg.error()
    return kafka_msg if err is None else KafkaError(err, kafka_msg)


class _PartState:
    __slots__ = ("buffer", "is_paused", "offset", "paused")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.buffer: collections.deque[Item] = collections.deque()
        self.paused: Callable[[], bool] = _never
        self.is_paused = False


def _never() -> bool:
    return False


def _emit(state: _PartState, item: Item, out: list[Item]) -> None:
    """Append ``item`` to ``out``; its partition's next offset follows it."""
    out.append(item)
    offset = (item.msg if isinstance(item, KafkaError) else item).offset
    if offset is not None and offset >= 0:
        state.offset = offset + 1


class WorkerConsumer:
    """The consumer of one source step on one worker. Its first partition leads: each call of
    the leader emits up to a batch of every unpaused partition's records (waiting up to
    ``wait`` when there are none); the others emit nothing. Each partition's next offset is
    kept here, so every partition's snapshot covers what the leader emitted for it. Only the
    worker's thread calls it (Bytewax builds and polls a worker's partitions there)."""

    def __init__(self, config: dict[str, Any], batch_size: int, wait: timedelta,
                 on_lag: LagReport, on_close: Callable[[], None]) -> None:
        self._consumer = Consumer({**config, "stats_cb": self._stats})
        self._batch_size = batch_size
        self._wait = wait.total_seconds()
        self._parts: dict[Part, _PartState] = {}
        self._stray: collections.deque[Item] = collections.deque()
        self._on_lag = on_lag
        self._on_close = on_close

    def add(self, part: Part, offset: int) -> None:
        self._parts[part] = _PartState(offset)
        self._consumer.incremental_assign([TopicPartition(part[0], part[1], offset)])

    def pause_when(self, part: Part, paused: Callable[[], bool]) -> None:
        """``part`` stops being fetched while ``paused()`` is true (checked on each poll)."""
        self._parts[part].paused = paused

    def leads(self, part: Part) -> bool:
        return next(iter(self._parts), None) == part

    def offset(self, part: Part) -> int:
        return self._parts[part].offset

    def poll(self) -> list[Item] | None:
        """The leader's call: up to a batch of records; None when every partition is paused
        (nothing was waited for)."""
        if not self._sync_pauses():
            return None
        out: list[Item] = []
        for state in self._parts.values():
            while not state.is_paused and state.buffer and len(out) < self._batch_size:
                _emit(state, state.buffer.popleft(), out)
        if not out and not self._stray:
            for msg in self._fetch():
                err = msg.error()
                if err is not None and err.code() == ConfluentKafkaError._PARTITION_EOF:
                    continue
                topic, partition = msg.topic(), msg.partition()
                found = (self._parts.get((topic, partition))
                         if topic is not None and partition is not None else None)
                if found is None:
                    if err is not None:
                        self._stray.append(_item(msg))
                elif found.is_paused:
                    found.buffer.append(_item(msg))
                else:
                    _emit(found, _item(msg), out)
        while self._stray and len(out) < self._batch_size:
            out.append(self._stray.popleft())
        return out

    def _fetch(self) -> list[Message]:
        """Up to a batch; waits up to ``wait`` for the first record only (``consume`` with a
        timeout would wait for a whole batch)."""
        if not self._wait:
            return self._consumer.consume(self._batch_size, 0)
        first = self._consumer.poll(self._wait)
        if first is None:
            return []
        return [first, *self._consumer.consume(self._batch_size - 1, 0)] \
            if self._batch_size > 1 else [first]

    def _sync_pauses(self) -> bool:
        """Pause and resume partitions at the consumer; whether any partition is unpaused."""
        active = False
        for part, state in self._parts.items():
            paused = state.paused()
            if paused != state.is_paused:
                tp = [TopicPartition(part[0], part[1])]
                (self._consumer.pause if paused else self._consumer.resume)(tp)
                state.is_paused = paused
            active = active or not paused
        return active

    def _stats(self, json_stats: str) -> None:
        """librdkafka's statistics (served by ``consume`` on the worker's thread)."""
        try:
            topics = json.loads(json_stats)["topics"]
        except (KeyError, TypeError, ValueError):
            return
        for part, state in self._parts.items():
            try:
                p = topics[part[0]]["partitions"][str(part[1])]
                high = int(p["ls_offset"] if p.get("ls_offset", -1) >= 0 else p["hi_offset"])
                start = state.offset if state.offset >= 0 else int(p.get("lo_offset", 0))
            except (KeyError, TypeError, ValueError):
                continue
            if high >= 0:
                self._on_lag(part, max(0, high - max(0, start)))

    def remove(self, part: Part) -> None:
        self._parts.pop(part, None)
        if not self._parts:
            self._consumer.close()
            self._on_close()


class GroupedPartition(StatefulSourcePartition[Item, int]):
    """One Kafka partition read through its worker's :class:`WorkerConsumer`. Snapshot: the
    next offset to read (as Bytewax's ``KafkaSource``)."""

    def __init__(self, group: WorkerConsumer, part: Part, offset: int,
                 idle: timedelta) -> None:
        self._group = group
        self._part = part
        self._idle = idle
        self._awake: datetime | None = None
        group.add(part, offset)

    def pause_when(self, paused: Callable[[], bool]) -> None:
        self._group.pause_when(self._part, paused)

    def next_batch(self) -> list[Item]:
        if not self._group.leads(self._part):
            self._awake = datetime.now(UTC) + FOLLOWER_IDLE
            return []
        batch = self._group.poll()
        if batch is None:
            self._awake = datetime.now(UTC) + PAUSED_CHECK
            return []
        self._awake = None if batch or not self._idle else datetime.now(UTC) + self._idle
        return batch

    def next_awake(self) -> datetime | None:
        return self._awake

    def snapshot(self) -> int:
        return self._group.offset(self._part)

    def close(self) -> None:
        self._group.remove(self._part)


class ConsumerRegistry:
    """The :class:`WorkerConsumer` of each (source step, worker thread) in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, int], WorkerConsumer] = {}

    def get(self, step_id: str, make: Callable[[Callable[[], None]], WorkerConsumer]
            ) -> WorkerConsumer:
        key = (step_id, threading.get_ident())
        with self._lock:
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = make(lambda: self._drop(key))
            return group

    def _drop(self, key: tuple[str, int]) -> None:
        with self._lock:
            self._groups.pop(key, None)


REGISTRY = ConsumerRegistry()
