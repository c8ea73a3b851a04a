"""Waiting out an unavailable store: one retry rule (tenacity) for every flow and the API.

:func:`until_up` retries a call while it raises one of ``on`` (by default
:data:`~notiflow.adapters.outages.OUTAGE`: a Cassandra or Redis outage, never a bug),
doubling the wait from ``first`` up to ``most`` seconds, and gives up after
``give_up_after`` (seconds on ``monotonic``, from the first attempt's start) by raising what
the last attempt raised. ``sleep`` waits between attempts; tests pass a fake one and a
``monotonic`` that it moves on. :func:`every` repeats a background round forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    before_nothing,
    retry_if_exception_type,
    stop_never,
    wait_exponential,
)

from notiflow.adapters.outages import OUTAGE

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]
Monotonic = Callable[[], float]
"""Seconds on a clock that never goes back (``time.monotonic``)."""


def _logger(log: logging.Logger, what: str) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("%s failed (%r); retrying in %.1fs", what, exc, wait)

    return before_sleep


class _Deadline:
    """The stop rule for ``give_up_after``: true once ``seconds`` have passed on ``monotonic``
    since the first attempt of the current run started (:meth:`before` notes that start)."""

    def __init__(self, seconds: float, monotonic: Monotonic) -> None:
        self.seconds = seconds
        self.monotonic = monotonic
        self.started = 0.0

    def before(self, state: RetryCallState) -> None:
        if state.attempt_number == 1:
            self.started = self.monotonic()

    def __call__(self, state: RetryCallState) -> bool:
        return self.monotonic() - self.started >= self.seconds


def patience(what: str, log: logging.Logger, *, first: float = 0.5, most: float = 10.0,
             give_up_after: timedelta | None = None,
             on: tuple[type[BaseException], ...] = OUTAGE,
             sleep: Sleep = asyncio.sleep,
             monotonic: Monotonic = time.monotonic) -> AsyncRetrying:
    """The retrying controller of :func:`until_up` (``async for attempt in patience(...)``)."""
    stop: Callable[[RetryCallState], bool] = stop_never
    before: Callable[[RetryCallState], None] = before_nothing
    if give_up_after is not None:
        deadline = _Deadline(give_up_after.total_seconds(), monotonic)
        stop, before = deadline, deadline.before
    return AsyncRetrying(
        retry=retry_if_exception_type(on),
        wait=wait_exponential(multiplier=first, max=most),
        stop=stop,
        before=before,
        before_sleep=_logger(log, what),
        reraise=True,
        sleep=sleep,
    )


async def until_up(what: str, fn: Callable[[], Awaitable[T]], log: logging.Logger, *,
                   first: float = 0.5, most: float = 10.0,
                   give_up_after: timedelta | None = None,
                   on: tuple[type[BaseException], ...] = OUTAGE,
                   sleep: Sleep = asyncio.sleep, monotonic: Monotonic = time.monotonic) -> T:
    """``await fn()`` until it does not raise one of ``on`` (see the module docstring)."""
    retrying = patience(what, log, first=first, most=most, give_up_after=give_up_after, on=on,
                        sleep=sleep, monotonic=monotonic)

    async def attempt() -> T:
        return await fn()

    return await retrying(attempt)


async def every(what: str, interval_s: float, round_: Callable[[], Awaitable[int]],
                log: logging.Logger) -> None:
    """Run ``round_`` forever, ``interval_s`` apart: a round's count is logged when not
    zero, its failure logged and the next round tries again (cancellation ends it)."""
    while True:
        try:
            done = await round_()
            if done:
                log.info("%s: %d", what, done)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
        await asyncio.sleep(interval_s)
