"""Copies of one (message, attempt) delivered together to the send step (a replay after a
crash: the retry record re-read from Kafka plus the one re-emitted from the dedup lease, both
held until the same ``not_before`` and released in one batch), on memory ports. The attempt
is sent once and its outcome is emitted; a copy must never replace the attempt's outcome
with its own empty one (the message would stay RETRY_PENDING forever)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from bytewax.testing import TestingSource

from notiflow.settings import Settings
from tests.flow.conftest import RUNNERS, MemorySend, kmsg, record

pytestmark = pytest.mark.flow


@pytest.mark.parametrize("held", [False, True], ids=["due-now", "held"])
@pytest.mark.parametrize("runner", list(RUNNERS))
def test_copies_of_an_attempt_in_one_batch_emit_its_outcome_once(
        settings: Settings, memory_send: Callable[..., MemorySend], runner: str,
        held: bool) -> None:
    mem = memory_send()
    base = uuid.uuid4().int % 10**9
    now = datetime.now(UTC)
    mids = [f"msg_dup_{base}_{i}" for i in range(3)]
    extra: dict[str, Any] = {"attempt": 2, "accepted_at": now.isoformat()}
    if held:
        extra["not_before"] = (now + timedelta(milliseconds=500)).isoformat()
    items: list[Any] = [
        kmsg(settings, record(f"{mid}-code", message_id=mid, **extra), base + 10 * i + copy)
        for i, mid in enumerate(mids) for copy in range(3)]
    batch = len(items)
    if held:
        items.append(TestingSource.PAUSE(timedelta(seconds=2)))  # the hold releases meanwhile
    events, dlq, retries = mem.run(runner, items, batch_size=batch)
    assert dlq == [] and retries == []
    accepted = sorted(e.message_id for e in events if e.status.value == "PROVIDER_ACCEPTED")
    assert accepted == mids, f"outcomes lost: {sorted((e.message_id, e.status) for e in events)}"
    counts = mem.state.accepted_counts()
    assert all(counts.get(mid) == 1 for mid in mids), "an attempt was sent more than once"
