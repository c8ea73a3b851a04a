"""``adapters/retrying.py``: an outage is retried with doubling waits capped at ``most``, a bug
stops at once, ``give_up_after`` re-raises the last error, and each retry is logged; the
reconciler and the webhook resolver retry outages (and contention) only."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from cassandra import OperationTimedOut
from cassandra.cluster import NoHostAvailable
from hypothesis import given
from hypothesis import strategies as st
from redis.exceptions import ConnectionError as RedisConnectionError

from notiflow.adapters.cassandra.recipients import StateContention
from notiflow.adapters.kafka_io import DeliveryFailed
from notiflow.adapters.outages import OUTAGE
from notiflow.adapters.preferences import PREFERENCE_OUTAGE
from notiflow.adapters.retrying import patience, until_up
from notiflow.flows.receipts.reconcile import ApplyStep
from notiflow.flows.webhooks.status_webhooks import Resolver
from tests.fakes import SleepingClock

log = logging.getLogger("test.retrying")


class Flaky:
    """Raises ``errors`` one per call, then returns ``"ok"``; counts its calls."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


class FakeSleep:
    """Records the waits asked for instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def test_an_outage_is_retried_with_doubling_waits() -> None:
    errors = [NoHostAvailable("down", {}), OperationTimedOut(), TimeoutError(),
              RedisConnectionError("refused"), OSError("reset")]
    fn, sleep = Flaky(*errors), FakeSleep()
    assert await until_up("read", fn, log, first=0.01, most=1.0, sleep=sleep) == "ok"
    assert fn.calls == len(errors) + 1
    assert sleep.waits == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16])


async def test_waits_stop_growing_at_most() -> None:
    fn, sleep = Flaky(*(OSError() for _ in range(6))), FakeSleep()
    await until_up("read", fn, log, first=1.0, most=4.0, sleep=sleep)
    assert sleep.waits == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]


@pytest.mark.parametrize("bug", [ValueError("bad"), KeyError("tenant_id"), RuntimeError("x"),
                                 StateContention("contended"), DeliveryFailed("no ack")])
async def test_a_non_outage_stops_at_once(bug: Exception) -> None:
    fn, sleep = Flaky(bug), FakeSleep()
    with pytest.raises(type(bug)) as raised:
        await until_up("read", fn, log, sleep=sleep, give_up_after=timedelta(minutes=5))
    assert raised.value is bug
    assert fn.calls == 1 and sleep.waits == []


async def test_on_chooses_what_is_retried() -> None:
    fn = Flaky(StateContention("contended"))
    on = (*OUTAGE, StateContention)
    assert await until_up("read", fn, log, on=on, sleep=FakeSleep()) == "ok"
    assert fn.calls == 2


async def test_gives_up_after_give_up_after_raising_the_last_error() -> None:
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        raise OSError(f"attempt {calls}")

    started = time.monotonic()
    with pytest.raises(OSError) as raised:
        await until_up("read", down, log, first=0.01, most=0.02,
                       give_up_after=timedelta(milliseconds=100))
    elapsed = time.monotonic() - started
    assert calls > 1
    assert str(raised.value) == f"attempt {calls}"
    assert 0.1 <= elapsed < 2.0


async def test_give_up_after_runs_on_monotonic_from_each_runs_first_attempt() -> None:
    """The budget is read on the injected clock: the last attempt is the first to fail at or
    after ``give_up_after``; a controller used again starts a budget of its own."""
    clock = SleepingClock(1000.0)

    async def sleep(seconds: float) -> None:
        clock.sleep(seconds)

    down = Flaky(*(OSError() for _ in range(100)))
    retrying = patience("read", log, first=1.0, most=4.0, give_up_after=timedelta(seconds=10),
                        sleep=sleep, monotonic=clock)
    with pytest.raises(OSError):
        await retrying(down)
    assert (down.calls, clock.slept) == (5, [1.0, 2.0, 4.0, 4.0])
    clock.now += 3600
    with pytest.raises(OSError):
        await retrying(down)
    assert down.calls == 10


async def test_each_retry_is_logged_with_what_failed(caplog: pytest.LogCaptureFixture) -> None:
    fn = Flaky(OSError("reset"), NoHostAvailable("down", {}))
    with caplog.at_level(logging.WARNING, logger=log.name):
        await until_up("webhook URL lookup", fn, log, first=0.5, sleep=FakeSleep())
    lines = [r.getMessage() for r in caplog.records if r.name == log.name]
    assert lines == [
        "webhook URL lookup failed (OSError('reset')); retrying in 0.5s",
        "webhook URL lookup failed (NoHostAvailable('down', {})); retrying in 1.0s",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == log.name)


@given(first=st.floats(0.001, 5.0), most=st.floats(0.001, 20.0), failures=st.integers(1, 30))
def test_waits_are_non_decreasing_and_never_exceed_most(first: float, most: float,
                                                        failures: int) -> None:
    fn, sleep = Flaky(*(OSError() for _ in range(failures))), FakeSleep()
    asyncio.run(until_up("read", fn, log, first=first, most=most, sleep=sleep))
    assert len(sleep.waits) == failures
    assert sleep.waits[0] == pytest.approx(min(first, most))
    assert all(w <= most for w in sleep.waits)
    assert all(a <= b for a, b in zip(sleep.waits, sleep.waits[1:], strict=False))


class FakeApply:
    """Stands in for an :class:`ApplyStep` whose ``_apply`` raises ``errors`` first."""

    def __init__(self, *errors: BaseException) -> None:
        self.flaky = Flaky(*errors)

    async def _apply(self, batch: list[Any], store: Any) -> list[Any]:
        await self.flaky()
        return []

    async def _lookup(self, changes: list[Any], store: Any) -> None:
        await self.flaky()


def test_the_reconciler_retries_outages_and_contention_only() -> None:
    assert set(OUTAGE) <= set(PREFERENCE_OUTAGE)
    assert StateContention in PREFERENCE_OUTAGE and DeliveryFailed in PREFERENCE_OUTAGE
    assert not any(issubclass(e, t) for e in (ValueError, KeyError, TypeError, AssertionError)
                   for t in PREFERENCE_OUTAGE)


async def test_a_reconcile_batch_is_retried_after_contention() -> None:
    step = FakeApply(StateContention("contended"))
    assert await ApplyStep._with_retries(step, [], None) == []  # type: ignore[arg-type]
    assert step.flaky.calls == 2


async def test_a_bug_in_a_reconcile_batch_stops_the_flow_at_once() -> None:
    step = FakeApply(ValueError("bug"))
    with pytest.raises(ValueError, match="bug"):
        await ApplyStep._with_retries(step, [], None)  # type: ignore[arg-type]
    assert step.flaky.calls == 1


async def test_the_webhook_lookup_retries_an_outage_and_stops_on_a_bug() -> None:
    down = FakeApply(NoHostAvailable("down", {}))
    await Resolver._with_retries(down, [], None)  # type: ignore[arg-type]
    assert down.flaky.calls == 2
    for bug in (KeyError("tenant_id"), StateContention("not a lookup error")):
        broken = FakeApply(bug)
        with pytest.raises(type(bug)):
            await Resolver._with_retries(broken, [], SimpleNamespace())  # type: ignore[arg-type]
        assert broken.flaky.calls == 1
