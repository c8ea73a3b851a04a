"""The shared per-worker consumer (adapters/kafka_group.py) against a scripted consumer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from bytewax.connectors.kafka import KafkaError, KafkaSourceMessage
from confluent_kafka import KafkaError as ConfluentKafkaError

from notiflow.adapters import kafka_group
from notiflow.adapters.kafka_group import GroupedPartition, WorkerConsumer


class Msg:
    def __init__(self, topic: str | None, partition: int | None, offset: int,
                 err: ConfluentKafkaError | None = None) -> None:
        self._t, self._p, self._o, self._e = topic, partition, offset, err

    def topic(self) -> str | None:
        return self._t

    def partition(self) -> int | None:
        return self._p

    def offset(self) -> int:
        return self._o

    def error(self) -> ConfluentKafkaError | None:
        return self._e

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return f"{self._t}/{self._p}/{self._o}".encode()

    def headers(self) -> None:
        return None

    def latency(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)


class FakeConsumer:
    """Hands out the scripted batches in order; records what was asked of it."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.batches: list[list[Msg]] = []
        self.waits: list[float] = []
        self.assigned: list[tuple[str, int, int]] = []
        self.paused: set[tuple[str, int]] = set()
        self.closed = False

    def incremental_assign(self, tps: list[Any]) -> None:
        self.assigned += [(tp.topic, tp.partition, tp.offset) for tp in tps]

    def consume(self, n: int, timeout: float) -> list[Msg]:
        self.waits.append(timeout)
        if not self.batches:
            return []
        got, self.batches[0] = self.batches[0][:n], self.batches[0][n:]
        if not self.batches[0]:
            self.batches.pop(0)
        return got

    def poll(self, timeout: float) -> Msg | None:
        got = self.consume(1, timeout)
        return got[0] if got else None

    def pause(self, tps: list[Any]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, tps: list[Any]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in tps}

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], FakeConsumer]]:
    made: list[FakeConsumer] = []

    def make(config: dict[str, Any]) -> FakeConsumer:
        made.append(FakeConsumer(config))
        return made[-1]

    monkeypatch.setattr(kafka_group, "Consumer", make)
    yield lambda: made[-1]


def group(batch: int = 10, wait: float = 0.01, lags: dict[Any, int] | None = None,
          closed: list[bool] | None = None) -> WorkerConsumer:
    return WorkerConsumer({}, batch, timedelta(seconds=wait),
                          lambda part, lag: (lags if lags is not None else {}).__setitem__(
                              part, lag),
                          lambda: (closed if closed is not None else []).append(True))


def values(batch: list[Any]) -> list[str]:
    return [(b.msg if isinstance(b, KafkaError) else b).value.decode() for b in batch]


def test_the_leader_emits_every_partitions_records_and_keeps_each_offset(
        consumer: Callable[[], FakeConsumer]) -> None:
    g = group(wait=0.25)
    a = GroupedPartition(g, ("t", 0), 5, timedelta(0))
    b = GroupedPartition(g, ("t", 1), -2, timedelta(0))
    fake = consumer()
    assert fake.assigned == [("t", 0, 5), ("t", 1, -2)]
    fake.batches = [[Msg("t", 0, 5), Msg("t", 1, 0), Msg("t", 0, 6)]]
    assert b.next_batch() == [] and b.next_awake() is not None  # a follower emits nothing
    assert fake.waits == []
    batch = a.next_batch()
    assert values(batch) == ["t/0/5", "t/1/0", "t/0/6"]
    assert all(isinstance(m, KafkaSourceMessage) for m in batch)
    assert (a.snapshot(), b.snapshot()) == (7, 1)
    assert fake.waits == [0.25, 0]  # waited for the first record only
    assert a.next_awake() is None  # records came: call again at once
    assert a.next_batch() == [] and fake.waits == [0.25, 0, 0.25]


def test_an_idle_leader_is_called_again_after_idle(consumer: Callable[[], FakeConsumer]
                                                    ) -> None:
    g = group(wait=0)
    a = GroupedPartition(g, ("t", 0), 0, timedelta(milliseconds=100))
    assert a.next_batch() == []
    assert a.next_awake() is not None


def test_a_paused_partition_is_paused_at_the_consumer_and_keeps_what_was_fetched(
        consumer: Callable[[], FakeConsumer]) -> None:
    g = group()
    a = GroupedPartition(g, ("sms", 0), 0, timedelta(0))
    b = GroupedPartition(g, ("email", 0), 0, timedelta(0))
    sms_paused = [False]
    a.pause_when(lambda: sms_paused[0])
    b.pause_when(lambda: False)
    fake = consumer()
    sms_paused[0] = True
    fake.batches = [[Msg("sms", 0, 0), Msg("email", 0, 0), Msg("sms", 0, 1)]]
    assert values(a.next_batch()) == ["email/0/0"]  # the leader still serves email
    assert fake.paused == {("sms", 0)}
    assert a.snapshot() == 0  # buffered, not emitted
    sms_paused[0] = False
    assert values(a.next_batch()) == ["sms/0/0", "sms/0/1"]
    assert fake.paused == set() and a.snapshot() == 2


def test_when_every_partition_is_paused_the_leader_does_not_wait(
        consumer: Callable[[], FakeConsumer]) -> None:
    g = group(wait=5)
    a = GroupedPartition(g, ("t", 0), 0, timedelta(0))
    a.pause_when(lambda: True)
    assert a.next_batch() == []
    assert consumer().waits == [] and a.next_awake() is not None


def test_errors_are_items_and_partition_eof_is_not(
        consumer: Callable[[], FakeConsumer]) -> None:
    g = group()
    a = GroupedPartition(g, ("t", 0), 0, timedelta(0))
    down = ConfluentKafkaError(ConfluentKafkaError._TRANSPORT)
    consumer().batches = [[Msg(None, None, -1, down),
                           Msg("t", 0, 3, ConfluentKafkaError(
                               ConfluentKafkaError._PARTITION_EOF)),
                           Msg("t", 0, 0)]]
    batch = a.next_batch()
    errors = [b for b in batch if isinstance(b, KafkaError)]
    assert len(batch) == 2 and len(errors) == 1 and errors[0].err.code() == down.code()
    assert a.snapshot() == 1


def test_a_batch_is_bounded(consumer: Callable[[], FakeConsumer]) -> None:
    g = group(batch=2)
    a = GroupedPartition(g, ("t", 0), 0, timedelta(0))
    b = GroupedPartition(g, ("t", 1), 0, timedelta(0))
    paused = [True]
    b.pause_when(lambda: paused[0])
    consumer().batches = [[Msg("t", 1, 0), Msg("t", 1, 1), Msg("t", 1, 2)]]
    assert a.next_batch() == []  # fetched for b (at most one batch), which is paused
    paused[0] = False
    assert values(a.next_batch()) == ["t/1/0", "t/1/1"]
    assert values(a.next_batch()) == ["t/1/2"]


def test_lag_per_partition_and_the_last_close_closes_the_consumer(
        consumer: Callable[[], FakeConsumer]) -> None:
    lags: dict[Any, int] = {}
    closed: list[bool] = []
    g = group(lags=lags, closed=closed)
    a = GroupedPartition(g, ("t", 0), 40, timedelta(0))
    b = GroupedPartition(g, ("t", 1), -2, timedelta(0))
    g._stats('{"topics": {"t": {"partitions": {"0": {"ls_offset": 55, "hi_offset": 55}, '
             '"1": {"ls_offset": -1, "hi_offset": 9, "lo_offset": 2}}}}}')
    assert lags == {("t", 0): 15, ("t", 1): 7}
    g._stats("not json")
    a.close()
    assert g.leads(("t", 1)) and not closed  # the next partition leads
    b.close()
    assert closed == [True] and consumer().closed
