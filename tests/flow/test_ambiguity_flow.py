"""Ambiguous provider outcomes by tier policy (memory ports, 1 and 2 workers): P0 sends
again at once through the other vendor; P3 waits (UNKNOWN) and a check later ends it
FAILED ``ambiguous`` unless a receipt resolved it. How a provider that never answers in
time becomes ``ambiguous`` is the adapters' (``classify_exception``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from notiflow.adapters.memory import Answer
from notiflow.adapters.providers.base import Outcome
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import IngestRecord
from notiflow.settings import Settings
from tests.flow.conftest import RUNNERS, MemorySend, kmsg, record

pytestmark = pytest.mark.flow

HANG = Answer(Outcome.AMBIGUOUS, "timeout")


def hanging(mem: MemorySend) -> MemorySend:
    """Both SMS vendors take every message and never answer in time."""
    for p in ("twilio", "vonage"):
        mem.state.provider(p).default = HANG
    return mem


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_p0_resends_at_once_through_the_other_vendor(
        settings: Settings, memory_send: Callable[..., MemorySend], runner: str) -> None:
    mem = hanging(memory_send(Tier.P0))
    base = uuid.uuid4().int % 10**8
    events, _, retries = mem.run(runner, [kmsg(settings, record(f"u{base}", tier="P0"), base,
                                               Tier.P0)])
    [ev] = events
    assert ev.status is Status.UNKNOWN and ev.attempt == 1
    assert ev.attempt_detail is not None and ev.attempt_detail.outcome == "ambiguous"
    [nxt] = retries
    assert nxt.attempt == 2 and nxt.avoid_provider == ev.attempt_detail.provider_id
    assert nxt.unknown_check is None
    assert nxt.not_before is not None and nxt.not_before - ev.occurred_at < timedelta(seconds=1)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_p3_waits_for_a_receipt_instead_of_resending(
        settings: Settings, memory_send: Callable[..., MemorySend], runner: str) -> None:
    mem = hanging(memory_send(Tier.P3))
    base = uuid.uuid4().int % 10**8
    items = [kmsg(settings, record(f"w{base}", tier="P3", category="account"), base, Tier.P3)]
    events, _, checks = mem.run(runner, items)
    [ev] = events
    assert ev.status is Status.UNKNOWN and ev.next_attempt_at is not None
    [check] = checks
    assert check.unknown_check == 1 and check.attempt == 1
    assert check.not_before == ev.next_attempt_at
    assert ev.next_attempt_at - ev.occurred_at == settings.scaled(settings.unknown_resolution)


@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize(("current", "expected"), [
    (Status.UNKNOWN, [("FAILED", "ambiguous")]),
    (Status.DELIVERED, []),
])
def test_check_fails_unresolved_unknowns_only(
        settings: Settings, memory_send: Callable[..., MemorySend], runner: str,
        current: Status, expected: list[tuple[str, str]]) -> None:
    mem = memory_send(Tier.P3)
    base = uuid.uuid4().int % 10**8
    now = datetime.now(UTC)
    rec = IngestRecord.model_validate_json(record(
        f"c{base}", tier="P3", message_id=f"msg_chk{base}", accepted_at=now.isoformat(),
        expires_at=(now + timedelta(hours=1)).isoformat(), unknown_check=1))
    assert rec.message_id is not None
    mem.state.messages.set_status(rec.message_id, current, 1)
    events, _, _ = mem.run(runner, [kmsg(settings, rec.model_dump_json().encode(), base,
                                         Tier.P3)])
    assert [(e.status.value, e.reason) for e in events] == expected
