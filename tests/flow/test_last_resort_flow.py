"""Every breaker of the channel open (memory ports, 1 and 2 workers): P0 is sent through the
best-ranked account anyway (``TierPolicy.last_resort``) and accepted when the account
answers; when that send fails transiently it waits on the same attempt (no retry budget
spent); P1 still waits for a breaker to admit it (here past its expiry)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest

from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import IngestRecord, StatusEvent
from notiflow.settings import Settings
from tests.flow.conftest import RUNNERS, MemorySend, kmsg, record

pytestmark = pytest.mark.flow

SMS = ("twilio", "vonage")


@pytest.fixture
def open_breakers(settings: Settings,
                  memory_send: Callable[..., MemorySend]) -> Callable[[Tier], MemorySend]:
    """Memory ports whose SMS breakers are open for an hour."""
    long = settings.model_copy(update={"breaker": settings.breaker.model_copy(update={
        "open_for": timedelta(hours=1) / settings.time_scale})})

    def make(tier: Tier) -> MemorySend:
        mem = memory_send(tier, long)
        for provider in SMS:
            mem.state.open_breaker(provider)
        return mem

    return make


def run(mem: MemorySend, runner: str, code: str) -> tuple[list[StatusEvent],
                                                        list[IngestRecord]]:
    base = uuid.uuid4().int % 10**8
    items = [kmsg(mem.settings, record(code, tier=mem.tier.value), base, mem.tier)]
    events, _, retries = mem.run(runner, items)
    return events, retries


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_p0_is_sent_through_open_breakers(open_breakers: Callable[[Tier], MemorySend],
                                          runner: str) -> None:
    events, retries = run(open_breakers(Tier.P0), runner, "lr1")
    assert [e.status for e in events] == [Status.PROVIDER_ACCEPTED]
    assert events[0].attempt_detail is not None
    assert events[0].attempt_detail.provider_id in SMS and not retries


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_p1_waits_for_its_breakers(open_breakers: Callable[[Tier], MemorySend],
                                   runner: str) -> None:
    """The breakers stay open past P1's expiry, so the wait ends it EXPIRED at once."""
    mem = open_breakers(Tier.P1)
    events, retries = run(mem, runner, "lr2")
    assert [(e.status, e.reason) for e in events] == [
        (Status.EXPIRED, "all_providers_unavailable")]
    assert events[0].attempt_detail is None and not retries
    assert all(mem.state.provider(p).sent() == [] for p in SMS)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_a_failed_last_resort_waits_on_the_same_attempt(
        open_breakers: Callable[[Tier], MemorySend], runner: str) -> None:
    mem = open_breakers(Tier.P0)
    for p in SMS:
        mem.state.provider(p).outage()
    events, retries = run(mem, runner, "lr3")
    [ev] = events
    assert ev.status is Status.RETRY_PENDING
    assert ev.reason is not None and ev.reason.startswith("last_resort_failed:")
    [again] = retries
    assert again.attempt == 1 and again.not_before is not None
    assert again.avoid_provider in SMS
    assert again.not_before - ev.occurred_at >= timedelta(milliseconds=100)
