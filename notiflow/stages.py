"""The latency budget: how long a message spent in each named stage of its way to the provider.

Durations go to one histogram, ``notiflow.stage.duration {tier, stage}`` (stages:
:class:`notiflow.names.Stage`); the API also returns a request's own stages as a W3C
``Server-Timing`` header (milliseconds), so a client sees where its request's time went.
Recording costs one histogram update per stage (nothing while telemetry export is off).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from notiflow import names, telemetry

_durations = names.STAGE_DURATION.create(telemetry.meter())


def record(tier: str, stage: names.Stage, seconds: float) -> None:
    """One stage of one message; negative durations (clock steps) count as 0."""
    _durations.record(max(0.0, seconds), {"tier": tier, "stage": stage.value})


class StageTimes:
    """The stages of one request, in the order they were timed."""

    def __init__(self, tier: str = "") -> None:
        self.tier = tier
        self.seconds: dict[names.Stage, float] = {}

    def add(self, stage: names.Stage, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + max(0.0, seconds)

    @contextlib.contextmanager
    def timing(self, stage: names.Stage) -> Iterator[None]:
        """Add the time spent inside the block to ``stage`` (also when it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - start)

    def record(self) -> None:
        """Record every stage timed so far (once per request: call it at the end)."""
        if self.tier:
            for stage, seconds in self.seconds.items():
                record(self.tier, stage, seconds)

    def server_timing(self) -> str:
        """``Server-Timing`` value: ``api.reserve;dur=3.1, api.write;dur=2.0, ...`` (ms)."""
        return ", ".join(f"{stage.value};dur={seconds * 1000:.1f}"
                         for stage, seconds in self.seconds.items())
