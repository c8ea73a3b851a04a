"""Bulk work yields to P0: the AIMD window (``flows/common/yielding.py``), its resizable slots, and
the latency window the P0 flow reports from (``adapters/pressure.py``)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notiflow.adapters.pressure import LatencyWindow
from notiflow.flows.common.yielding import Slots, YieldWindow
from notiflow.settings import YieldRule
from tests.helpers import loop_turns

RULE = YieldRule()


def window(ceiling: int = 64, rule: YieldRule = RULE) -> YieldWindow:
    return YieldWindow(rule, sla_s=1.0, ceiling=ceiling)


def test_starts_slow() -> None:
    w = window()
    assert w.limit == 6 and w.yielding
    assert [w.step(None) for _ in range(3)] == [9, 12, 16]


def test_halves_while_p0_is_slow_and_grows_back_while_calm() -> None:
    w = window(rule=YieldRule(start=1.0, floor=1))
    assert [w.step(0.9) for _ in range(7)] == [32, 16, 8, 4, 2, 1, 1]
    assert w.yielding
    assert w.step(0.3) == 1
    grown = [w.step(None) for _ in range(20)]
    assert grown[0] == 4 and grown[-1] == 64 and not w.yielding
    assert grown == sorted(grown)


def test_disabled_rule_never_yields() -> None:
    w = window(rule=YieldRule(enabled=False))
    assert w.step(10.0) == 64 and not w.yielding


@given(st.lists(st.one_of(st.none(), st.floats(0, 5)), max_size=200),
       st.integers(1, 500))
def test_the_limit_stays_within_floor_and_ceiling(signals: list[float | None],
                                                  ceiling: int) -> None:
    w = window(ceiling)
    for s in signals:
        before = w.limit
        after = w.step(s)
        assert RULE.floor <= after <= ceiling
        if s is not None and s > RULE.high:
            assert after <= before
        if s is None or s < RULE.low:
            assert after >= before


def test_low_must_not_exceed_high() -> None:
    with pytest.raises(ValueError):
        YieldRule(low=0.5, high=0.3)


async def test_slots_shrink_without_preempting_and_serve_in_order() -> None:
    slots = Slots(2)
    await slots.acquire()
    await slots.acquire()
    order: list[int] = []

    async def wait(i: int) -> None:
        async with slots:
            order.append(i)
            await loop_turns()

    waiting = [asyncio.create_task(wait(i)) for i in range(3)]
    await loop_turns()
    slots.resize(1)
    slots.release()
    await loop_turns()
    assert order == [] and slots.used == 1
    slots.release()
    await asyncio.gather(*waiting)
    assert order == [0, 1, 2] and slots.used == 0
    slots.resize(3)
    for _ in range(3):
        await slots.acquire()
    assert slots.used == 3


async def test_a_cancelled_waiter_gives_its_place_up() -> None:
    slots = Slots(1)
    await slots.acquire()
    waiter = asyncio.create_task(slots.acquire())
    await loop_turns()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    slots.release()
    assert slots.used == 0
    await slots.acquire()
    assert slots.used == 1


def test_latency_window_forgets_after_a_second_and_counts_what_is_held() -> None:
    now = [100.0]
    lw = LatencyWindow(window_s=1.0, clock=lambda: now[0])
    assert lw.worst() is None
    lw.add(0.2)
    now[0] += 0.5
    lw.add(0.1)
    assert lw.worst() == 0.2
    assert lw.worst(holding_s=0.7) == 0.7
    now[0] += 0.6
    assert lw.worst() == 0.1
    now[0] += 1.0
    assert lw.worst() is None and lw.worst(holding_s=0.05) == 0.05


def test_floor_zero_pauses_while_p0_is_slow_and_resumes_below_high() -> None:
    w = window(rule=YieldRule(start=1.0, floor=0))
    assert [w.step(0.9) for _ in range(8)][-2:] == [0, 0]
    assert w.yielding
    assert w.step(0.3) == 3
    assert w.step(0.3) == 3
    assert w.step(0.9) == 1


async def test_slots_of_limit_zero_admit_nobody_until_resized() -> None:
    slots = Slots(0)
    task = asyncio.create_task(slots.acquire())
    await loop_turns()
    assert not task.done()
    slots.resize(1)
    await loop_turns()
    assert task.done() and slots.used == 1
