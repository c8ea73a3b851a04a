"""A provider's "this recipient is dead" (APNs 410, FCM UNREGISTERED, a hard bounce, an
unsubscribe): what the send step records, and what the preference store writes for a dead
push token."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from notiflow.adapters.preferences import PreferenceStore
from notiflow.adapters.providers.base import Outcome, SendResult
from notiflow.flows.common.items import SourceRef, Work
from notiflow.flows.send.stages.classifying import Classify
from notiflow.flows.send.stages.context import InfraUnavailable
from notiflow.redact import recipient_hash
from notiflow.schemas.messages import IngestRecord
from notiflow.schemas.preferences import PreferenceState
from tests.fakes import Producer, SleepingClock
from tests.helpers import partial_ports

NOW = datetime(2026, 12, 6, 5, 0, tzinfo=UTC)
TOKEN = "f" * 64


def work(channel: str, recipient: Any) -> Work:
    doc = {"channel": channel, "tier": "P1", "recipient": recipient, "template_id": "t",
           "template_version": 1, "tenant_id": "acme", "category": "transactional",
           "message_id": "msg_1", "accepted_at": "2026-12-06T05:00:00Z"}
    return Work(IngestRecord.model_validate(doc), SourceRef("t", 0, 0), b"", None)


def dead(provider: str, reason: str) -> SendResult:
    return SendResult(Outcome.PERMANENT, provider, NOW, NOW, reason=reason,
                      deactivate_recipient=True)


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = fail

    async def suppress(self, tenant_id: str, recipient_hash: str, reason: str) -> None:
        self.calls.append(("suppress", tenant_id, recipient_hash, reason))
        if self.fail:
            raise ConnectionError("cassandra down")

    async def deactivate_token(self, tenant_id: str, token_hash: str, reason: str, *,
                               older: tuple[str, ...] = ()) -> None:
        self.calls.append(("deactivate_token", tenant_id, token_hash, reason))
        if self.fail:
            raise ConnectionError("cassandra down")


def ctx(prefs: Recorder) -> Any:
    return SimpleNamespace(ports=partial_ports(preferences=prefs))


@pytest.mark.parametrize(("platform", "provider"), [("ios", "apns"), ("android", "fcm")])
async def test_a_dead_push_token_is_deactivated_with_its_provider(platform: str,
                                                                  provider: str) -> None:
    prefs = Recorder()
    w = work("PUSH", {"device_token": TOKEN, "platform": platform})
    await Classify()._suppress(ctx(prefs), w, dead(provider, "unregistered"))
    token_hash = recipient_hash("acme", f"{platform}:{TOKEN}")
    assert prefs.calls == [("deactivate_token", "acme", token_hash,
                            f"{provider}:unregistered")]


@pytest.mark.parametrize(("channel", "recipient", "reason", "suppression"), [
    ("EMAIL", "gone@example.com", "invalid_recipient", "hard_bounce"),
    ("SMS", "+14155550123", "deactivated_recipient", "hard_bounce"),
    ("SMS", "+14155550123", "unsubscribed", "unsubscribed"),
])
async def test_a_dead_address_is_suppressed(channel: str, recipient: str, reason: str,
                                            suppression: str) -> None:
    prefs = Recorder()
    w = work(channel, recipient)
    await Classify()._suppress(ctx(prefs), w, dead("p", reason))
    assert prefs.calls == [("suppress", "acme", w.recipient_hash, suppression)]


async def test_a_store_failure_is_retried_then_stops_the_flow(
        caplog: pytest.LogCaptureFixture) -> None:
    """Never only logged: retried for ``retry_for`` on the step's clock, then the flow stops
    (tests/unit/test_suppression_writes.py has the whole contract)."""
    prefs = Recorder(fail=True)
    clock = SleepingClock()
    budget = 60.0

    async def sleep(seconds: float) -> None:
        if clock.now > 10 * budget:
            pytest.fail(f"still retrying after {clock.now:.0f} s of a {budget:.0f} s budget")
        clock.sleep(seconds)

    step = Classify(retry_for=timedelta(seconds=budget), sleep=sleep, monotonic=clock)
    with caplog.at_level(logging.WARNING), pytest.raises(InfraUnavailable):
        await step._suppress(ctx(prefs), work("PUSH", {"device_token": TOKEN, "platform": "ios"}),
                             dead("apns", "unregistered"))
    assert len(prefs.calls) == len(clock.slept) + 1 > 2
    assert sum(clock.slept[:-1]) < budget <= sum(clock.slept)


class FakeStore:
    def __init__(self, fail_devices: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_devices = fail_devices

    async def suppress(self, tenant_id: str, recipient_hash: str, reason: str,
                       now: datetime | None) -> PreferenceState:
        self.calls.append(("suppress", recipient_hash, reason))
        return PreferenceState(tenant_id=tenant_id, recipient_hash=recipient_hash, version=2,
                               suppressed=reason, updated_at=NOW)

    async def get_state(self, tenant_id: str, recipient_hash: str) -> None:
        return None

    async def deactivate_token(self, tenant_id: str, token_hash: str, reason: str,
                               now: datetime) -> int:
        self.calls.append(("deactivate_token", token_hash, reason, now))
        if self.fail_devices:
            raise ConnectionError("cassandra down")
        return 1


@pytest.mark.parametrize("fail_devices", [False, True])
async def test_the_store_suppresses_and_publishes_before_marking_devices(
        fail_devices: bool) -> None:
    store, producer = FakeStore(fail_devices), Producer()
    prefs = PreferenceStore(store, producer, topic="notify.preferences")  # type: ignore[arg-type]
    if fail_devices:
        with pytest.raises(ConnectionError):
            await prefs.deactivate_token("acme", "h1", "fcm:unregistered")
    else:
        state = await prefs.deactivate_token("acme", "h1", "fcm:unregistered")
        assert state.suppressed == "token_deactivated"
    assert store.calls == [("suppress", "h1", "token_deactivated"),
                           ("deactivate_token", "h1", "fcm:unregistered", NOW)]
    assert len(producer.records) == 1
