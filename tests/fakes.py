"""Fakes shared by the unit and integration tests: clocks a test moves by hand and a
producer that keeps what it is given."""

from __future__ import annotations

from typing import Any

from notiflow.adapters.kafka_io import DeliveryFailed
from notiflow.clocks import ManualClock

__all__ = ["ManualClock", "Producer", "SleepingClock"]


class SleepingClock(ManualClock[float]):
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
