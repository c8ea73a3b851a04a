"""Every breaker of the channel open: P0 is sent through the best-ranked account anyway
(``TierPolicy.last_resort``) and accepted when the account answers; when that send fails
transiently it waits on the same attempt (no retry budget spent); P1 still waits for a
breaker to admit it (here past its expiry)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from bytewax.testing import TestingSource, run_main

from notiflow.adapters.breaker_lanes import lane_breakers
from notiflow.adapters.kafka_io import OutRecord
from notiflow.adapters.providers.base import Outcome
from notiflow.schemas.enums import Status, Tier
from notiflow.settings import Settings
from tests.flow.conftest import decode, kmsg, record, send_flow

pytestmark = pytest.mark.flow

SMS = ("twilio", "vonage")


@pytest.fixture
def open_breakers(stack: Settings) -> Settings:
    """Settings of a namespace of its own whose SMS breakers are open for an hour."""
    ns = stack.model_copy(update={
        "topic_prefix": f"{stack.topic_prefix}lr{uuid.uuid4().hex[:6]}.",
        "breaker": stack.breaker.model_copy(update={
            "open_for": timedelta(hours=1) / stack.time_scale})})

    async def trip() -> None:
        breakers = lane_breakers(ns, "priority")
        for provider in SMS:
            for _ in range(ns.breaker.failure_threshold):
                await breakers.record(provider, Outcome.TRANSIENT, "server_error", 0.01)
        await breakers.flush()
        for provider in SMS:
            assert not (await breakers.allow(provider)).admitted
        await breakers.aclose()

    asyncio.run(trip())
    return ns


@pytest.fixture
def sms_outage(fakes: str) -> Iterator[None]:
    for p in SMS:
        httpx.post(f"{fakes}/_admin/{p}/config", json={"outage": True}).raise_for_status()
    yield
    for p in SMS:
        httpx.post(f"{fakes}/_admin/{p}/config", json={"outage": False}).raise_for_status()


def run(settings: Settings, tier: Tier, code: str) -> tuple[list, list]:
    base = uuid.uuid4().int % 10**8
    items = [kmsg(settings, record(code, tier=tier.value), base, tier)]
    out: list[OutRecord] = []
    run_main(send_flow(settings, tier, TestingSource(items), out))
    events, _, retries = decode(settings, out)
    return events, retries


def test_p0_is_sent_through_open_breakers(open_breakers: Settings, fakes: str,
                                          template: int) -> None:
    events, retries = run(open_breakers, Tier.P0, "lr1")
    assert [e.status for e in events] == [Status.PROVIDER_ACCEPTED]
    assert events[0].attempt_detail is not None
    assert events[0].attempt_detail.provider_id in SMS and not retries


def test_p1_waits_for_its_breakers(open_breakers: Settings, fakes: str,
                                   template: int) -> None:
    """The breakers stay open past P1's expiry, so the wait ends it EXPIRED at once."""
    events, retries = run(open_breakers, Tier.P1, "lr2")
    assert [(e.status, e.reason) for e in events] == [
        (Status.EXPIRED, "all_providers_unavailable")]
    assert events[0].attempt_detail is None and not retries


def test_a_failed_last_resort_waits_on_the_same_attempt(open_breakers: Settings, fakes: str,
                                                        template: int,
                                                        sms_outage: None) -> None:
    events, retries = run(open_breakers, Tier.P0, "lr3")
    [ev] = events
    assert ev.status is Status.RETRY_PENDING
    assert ev.reason is not None and ev.reason.startswith("last_resort_failed:")
    [again] = retries
    assert again.attempt == 1 and again.not_before is not None
    assert again.avoid_provider in SMS
    assert again.not_before - ev.occurred_at >= timedelta(milliseconds=100)
