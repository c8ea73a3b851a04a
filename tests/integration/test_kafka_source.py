"""The send flows' Kafka source against the real broker: one consumer per worker shared by its
partitions (adapters/kafka_group.py), offsets per partition, pausing, the leader's wait."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from notiflow.adapters.bytewax_kafka import PausableKafkaSource, kafka_source
from notiflow.settings import Settings
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def topics(stack: Settings) -> Iterator[list[str]]:
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    names = [f"{stack.topic_prefix}source-{uuid.uuid4().hex[:8]}-{i}" for i in range(2)]
    for f in admin.create_topics([NewTopic(n, 3, 1) for n in names]).values():
        f.result(timeout=30)
    wait_for(lambda: set(names) <= set(admin.list_topics(timeout=10).topics), timeout=30,
             interval=0.2, what="the new topics listed")
    yield names
    for f in admin.delete_topics(names).values():
        f.result(timeout=30)


def produce(settings: Settings, topic: str, values: list[tuple[int, bytes]]) -> None:
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for partition, value in values:
        p.produce(topic, value, partition=partition)
    assert p.flush(30) == 0


def drain(part: Any, want: int, timeout: float = 30.0) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += [m.value for m in part.next_batch()]
    return got


def test_one_consumer_reads_every_partition_and_snapshots_each_offset(
        stack: Settings, topics: list[str]) -> None:
    topic = topics[0]
    produce(stack, topic, [(i % 3, f"a{i}".encode()) for i in range(30)])
    src = kafka_source(stack, [topic], 100, wait=timedelta(milliseconds=200))
    parts = [src.build_part("t.in", f"{i}-{topic}", None) for i in range(3)]
    try:
        assert all(p._group is parts[0]._group for p in parts)
        assert parts[1].next_batch() == [] and parts[2].next_batch() == []
        got = drain(parts[0], 30)
        assert sorted(got) == sorted(f"a{i}".encode() for i in range(30))
        assert [p.snapshot() for p in parts] == [10, 10, 10]
    finally:
        for p in parts:
            p.close()
    produce(stack, topic, [(i, f"b{i}".encode()) for i in range(3)])
    resumed = [src.build_part("t.in", f"{i}-{topic}", 10) for i in range(3)]
    try:
        assert sorted(drain(resumed[0], 3)) == [b"b0", b"b1", b"b2"]
        assert [p.snapshot() for p in resumed] == [11, 11, 11]
    finally:
        for p in resumed:
            p.close()


def test_a_paused_topic_is_not_read_while_the_others_are(stack: Settings,
                                                         topics: list[str]) -> None:
    held, free = topics
    paused = {held: True}
    src = PausableKafkaSource(kafka_source(stack, [held, free], 100,
                                           wait=timedelta(milliseconds=100)),
                              lambda t: paused.get(t, False))
    parts = [src.build_part("t.pause", f"{i}-{t}", None) for t in (held, free) for i in range(3)]
    leader = parts[0]  # a partition of the paused topic leads
    try:
        produce(stack, held, [(0, b"h0"), (1, b"h1")])
        produce(stack, free, [(2, b"f2")])
        assert drain(leader, 1) == [b"f2"]
        assert drain(leader, 1, timeout=1.5) == []
        unread = OFFSET_BEGINNING  # nothing emitted yet: the start offset, as KafkaSource
        assert [p.snapshot() for p in parts[:3]] == [unread] * 3
        paused[held] = False
        assert sorted(drain(leader, 2)) == [b"h0", b"h1"]
        assert [p.snapshot() for p in parts[:3]] == [1, 1, unread]
    finally:
        for p in parts:
            p.close()


def test_the_leaders_wait_ends_when_a_record_arrives(stack: Settings,
                                                     topics: list[str]) -> None:
    topic = topics[0]
    src = kafka_source(stack, [topic], 100, wait=timedelta(seconds=20))
    parts = [src.build_part("t.wait", f"{i}-{topic}", None) for i in range(3)]
    try:
        later = threading.Timer(0.5, produce, (stack, topic, [(2, b"late")]))
        later.start()
        started = time.monotonic()
        got = drain(parts[0], 1, timeout=25)
        took = time.monotonic() - started
        later.join()
        assert got == [b"late"]
        assert took < 10, f"the wait did not end when the record arrived ({took:.1f} s)"
    finally:
        for p in parts:
            p.close()
