"""The in-memory provider account: it records every message and answers from its script."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from notiflow.adapters.memory import Answer, MemoryProvider
from notiflow.adapters.providers.base import OutboundMessage, Outcome
from notiflow.schemas.enums import Channel, Tier
from tests.fakes import ManualClock

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def msg(mid: str, attempt: int = 1) -> OutboundMessage:
    return OutboundMessage(mid, attempt, "acme", Channel.SMS, Tier.P1, "+14155552671", "hi")


def send(p: MemoryProvider, mid: str, attempt: int = 1) -> tuple[Outcome, str | None]:
    r = asyncio.run(p.send(msg(mid, attempt)))
    return r.outcome, r.reason


def test_accepts_by_default_with_a_provider_message_id() -> None:
    p = MemoryProvider("twilio", Channel.SMS, ManualClock(T0))
    r = asyncio.run(p.send(msg("m1")))
    assert r.outcome is Outcome.ACCEPTED and r.provider_message_id == "twilio-1"
    assert r.started_at == r.completed_at == T0
    assert [c.message.message_id for c in p.sent()] == ["m1"]


def test_scripted_answers_then_the_default() -> None:
    p = MemoryProvider("twilio", Channel.SMS)
    p.script(Outcome.TRANSIENT, Answer(Outcome.TRANSIENT, "rate_limited", retry_after_s=5.0),
             Outcome.PERMANENT, Outcome.AMBIGUOUS)
    assert [send(p, f"m{i}") for i in range(5)] == [
        (Outcome.TRANSIENT, "server_error"), (Outcome.TRANSIENT, "rate_limited"),
        (Outcome.PERMANENT, "invalid_recipient"), (Outcome.AMBIGUOUS, "timeout"),
        (Outcome.ACCEPTED, None)]
    assert p.sent("m1")[0].result.retry_after_s == 5.0


def test_an_outage_and_a_rule_of_the_message() -> None:
    p = MemoryProvider("vonage", Channel.SMS)
    p.outage()
    assert send(p, "m1") == (Outcome.TRANSIENT, "connect_error")
    p.outage(False)
    p.script(rule=lambda m: Answer(Outcome.TRANSIENT, "http_503") if m.attempt == 1 else None)
    assert send(p, "m2") == (Outcome.TRANSIENT, "http_503")
    assert send(p, "m2", 2) == (Outcome.ACCEPTED, None)
