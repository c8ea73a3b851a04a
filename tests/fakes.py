"""Fakes shared by the unit and integration tests: clocks a test moves by hand and a
producer that keeps what it is given."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from notiflow.adapters.kafka_io import DeliveryFailed

T = TypeVar("T")


class Clock(Generic[T]):
    """An injected clock that stands still until the test moves ``now`` (seconds,
    microseconds or a datetime, whatever the code under test reads)."""

    def __init__(self, now: T) -> None:
        self.now = now

    def __call__(self) -> T:
        return self.now


class SleepingClock(Clock[float]):
    """A seconds clock with the ``sleep`` to inject beside it: sleeping moves the clock on at
    once and is noted in ``slept``."""

    def __init__(self, now: float = 0.0) -> None:
        super().__init__(now)
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Producer:
    """A producer port that keeps every record in ``records``; while ``up`` is False it fails
    them as an unreachable broker does."""

    def __init__(self) -> None:
        self.up = True
        self.records: list[Any] = []

    async def produce(self, record: Any) -> None:
        if not self.up:
            raise DeliveryFailed("Local: Message timed out")
        self.records.append(record)
