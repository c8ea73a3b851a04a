"""The memory Messages, Preferences and Boards ports, and the factory's port sets."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from notiflow.adapters.memory import memory_ports
from notiflow.adapters.memory.boards import BoardTable, MemoryBoards
from notiflow.adapters.memory.stores import MemoryMessages, MemoryPreferences
from notiflow.adapters.ports import SendPorts
from notiflow.adapters.pressure import STALE_AFTER_S
from notiflow.adapters.rows import AttemptRow, MessageRow
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.preferences import PreferenceState
from notiflow.schemas.status import rank
from tests.fakes import ManualClock
from tests.helpers import memory_settings

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def test_templates_heads_and_attempts() -> None:
    messages = MemoryMessages(ManualClock(T0))
    assert messages.put_template("acme", "otp", "SMS", "Code {{ code }}") == 1
    row = asyncio.run(messages.get_template("acme", "otp", 1))
    assert row is not None and row.channel == "SMS" and row.variables == ("code",)
    assert asyncio.run(messages.get_template("acme", "otp", 2)) is None
    assert asyncio.run(messages.message("m1")) is None
    messages.set_status("m1", Status.UNKNOWN, 1)
    head = asyncio.run(messages.message("m1"))
    assert head is not None and head.status_rank == rank(Status.UNKNOWN, 1)
    messages.add_attempt(AttemptRow("m1", 1, provider_id="twilio"))
    assert asyncio.run(messages.attempts("m1")) == [AttemptRow("m1", 1, provider_id="twilio")]


def test_message_rows_keep_their_columns_across_status_changes() -> None:
    messages = MemoryMessages(ManualClock(T0))
    messages.set_status("m1", Status.QUEUED, tenant_id="acme", channel="SMS", tier="P1",
                        accepted_at=T0)
    messages.set_status("m1", Status.FAILED, 2, reason="invalid_recipient")
    row = asyncio.run(messages.message("m1"))
    assert row == MessageRow("m1", tenant_id="acme", channel="SMS", tier="P1",
                             status="FAILED", status_rank=rank(Status.FAILED, 2),
                             reason="invalid_recipient", attempt=2, accepted_at=T0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.status = "QUEUED"  # type: ignore[misc]
    with pytest.raises(TypeError):
        messages.set_status("m1", Status.SENT, 1, no_such_column=1)


def test_preference_writes_make_new_versions() -> None:
    clock = ManualClock(T0)
    prefs = MemoryPreferences(clock)
    prefs.put(PreferenceState(tenant_id="acme", recipient_hash="h1", version=3,
                              updated_at=T0, timezone="UTC"))
    clock.advance(1)
    state = asyncio.run(prefs.suppress("acme", "h1", "hard_bounce"))
    assert (state.version, state.suppressed, state.timezone) == (4, "hard_bounce", "UTC")
    assert state.updated_at == T0 + timedelta(seconds=1)
    token = asyncio.run(prefs.deactivate_token("acme", "t1", "fcm:unregistered",
                                               older=("t0", "t1")))
    assert token.suppressed == "token_deactivated" and token.version == 1
    assert prefs.deactivated == [("acme", "t1", "fcm:unregistered"),
                                 ("acme", "t0", "fcm:unregistered")]
    got = asyncio.run(prefs.get_states([("acme", "h1"), ("acme", "none")]))
    assert list(got) == ["acme:h1"]


def test_boards_keep_fresh_p0_reports_only() -> None:
    clock = ManualClock(T0)
    table = BoardTable(clock)
    a, b = MemoryBoards(table, "a"), MemoryBoards(table, "b")
    asyncio.run(a.report_p0_worst(0.5))
    clock.advance(STALE_AFTER_S / 2)
    asyncio.run(b.report_p0_worst(0.2))
    assert asyncio.run(a.p0_worst()) == 0.5
    clock.advance(STALE_AFTER_S)
    assert asyncio.run(a.p0_worst()) == 0.2
    asyncio.run(a.report_backlog(Tier.P1, 12.0))
    assert table.backlog == {(Tier.P1, "a"): 12.0}


def test_each_opened_set_is_a_new_owner_over_one_state() -> None:
    state, open_ports = memory_ports(memory_settings(), Tier.P1)

    async def two() -> tuple[SendPorts, SendPorts]:
        first, second = await open_ports(), await open_ports()
        await first.close()
        return first, second

    a, b = asyncio.run(two())
    assert a.leases.owner != b.leases.owner and state.owners == [a.leases.owner,
                                                                 b.leases.owner]
    assert a.messages is b.messages and a.providers is b.providers
    assert state.cancel("m1") and state.gate("m1") == "cancelled"
