"""Consent join, quiet-hours deferral across a DST change and recipient caps, in the send
dataflow under TestingSource/TestingSink with 1 and 2 workers, on memory ports (the caps'
Redis script is checked against the same rule in ``tests/integration/test_redis_caps.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from bytewax.testing import TestingSource

from notiflow.adapters.kafka_io import OutRecord
from notiflow.redact import recipient_hash
from notiflow.schemas.enums import Tier
from notiflow.schemas.preferences import PreferenceState
from notiflow.settings import Settings
from tests.flow.conftest import RUNNERS, MemorySend, decode, kmsg

pytestmark = pytest.mark.flow


def message(code: str, *, tier: str = "P2", category: str = "marketing",
            recipient: str = "+12025550143", **extra: object) -> bytes:
    doc: dict[str, object] = {"channel": "SMS", "tier": tier, "tenant_id": "acme",
                              "recipient": recipient, "template_id": "flow-otp",
                              "template_version": 1, "category": category,
                              "variables": {"code": code}}
    doc.update(extra)
    return orjson.dumps(doc)


def pref_msg(settings: Settings, offset: int, recipient: str, **fields: Any) -> Any:
    state = PreferenceState.model_validate({
        "tenant_id": "acme", "recipient_hash": recipient_hash("acme", recipient),
        "version": 1, "updated_at": datetime.now(UTC).isoformat(), **fields})
    from bytewax.connectors.kafka import KafkaSourceMessage

    return KafkaSourceMessage(key=state.key.encode(), value=state.model_dump_json().encode(),
                              topic=settings.preferences_topic, headers=[], latency=None,
                              offset=offset, partition=0, timestamp=(1, 0))


def run(mem: MemorySend, runner: str, tier: Tier, items: list[Any], prefs: list[Any],
        clock: Any = None) -> list[OutRecord]:
    out: list[OutRecord] = []
    kw = {"clock": clock} if clock else {}
    RUNNERS[runner](mem.flow(
        TestingSource([TestingSource.PAUSE(timedelta(milliseconds=300)), *items]), out,
        tier=tier, preferences=TestingSource(prefs), **kw))
    return out


def daytime_zone() -> str:
    """A fixed-offset zone where it is about noon now (outside any default quiet hours)."""
    off = (12 - datetime.now(UTC).hour + 12) % 24 - 12
    return "UTC" if off == 0 else f"Etc/GMT{'-' if off > 0 else '+'}{abs(off)}"


def unique_number(seed: int) -> str:
    """One of 8 million Washington, DC numbers, outside the other tests' ``+1202555`` range."""
    return f"+1202{200 + seed // 10_000 % 800:03d}{seed % 10_000:04d}"


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_consent_join_suppresses_opted_out_and_suppressed(
        settings: Settings, memory_send: Callable[..., MemorySend], runner: str) -> None:
    mem = memory_send(Tier.P2)
    base = uuid.uuid4().int % 10**8
    opted, dead, free = (unique_number(base + i) for i in range(3))
    zone = daytime_zone()
    prefs = [pref_msg(settings, 0, opted, timezone=zone,
                      opt_outs=[{"channel": "SMS", "category": "marketing"}]),
             pref_msg(settings, 1, dead, suppressed="unsubscribed", timezone=zone),
             pref_msg(settings, 2, free, timezone=zone)]
    items = [kmsg(settings, message(f"a{base}", recipient=opted), base, Tier.P2),
             kmsg(settings, message(f"b{base}", recipient=opted, category="account"), base + 1,
                  Tier.P2),
             kmsg(settings, message(f"c{base}", recipient=dead, category="account"), base + 2,
                  Tier.P2),
             kmsg(settings, message(f"d{base}", recipient=free), base + 3, Tier.P2)]
    events, dlq, _ = decode(settings, run(mem, runner, Tier.P2, items, prefs))
    got = sorted((e.status.value, e.reason or "") for e in events)
    assert got == [("PROVIDER_ACCEPTED", ""), ("PROVIDER_ACCEPTED", ""),
                   ("SUPPRESSED", "opted_out"), ("SUPPRESSED", "unsubscribed")]
    assert dlq == []


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_quiet_hours_deferral_across_dst_change(
        settings: Settings, memory_send: Callable[..., MemorySend], runner: str) -> None:
    """01:30 EST on the night the US springs forward: quiet until 08:00 EDT = 12:00 UTC
    (13:00 UTC would be the answer without the DST change). P1 is exempt and is sent."""
    mem = memory_send(Tier.P3)
    base = uuid.uuid4().int % 10**8
    ny = unique_number(base)
    night = datetime(2026, 3, 8, 6, 30, tzinfo=UTC)
    prefs = [pref_msg(settings, 0, ny, timezone="America/New_York",
                      quiet_hours={"start": "22:00", "end": "08:00"})]
    items = [kmsg(settings, message(f"q{base}", recipient=ny, tier="P3",
                                 accepted_at=night.isoformat(), message_id=f"msg_q{base}"),
                  base, Tier.P3)]
    events, _, _ = decode(settings, run(mem, runner, Tier.P3, items, prefs,
                                     clock=lambda: night))
    [ev] = events
    assert (ev.status.value, ev.reason) == ("SCHEDULED", "quiet_hours")
    assert ev.next_attempt_at == datetime(2026, 3, 8, 12, 0, tzinfo=UTC)

    p1 = [kmsg(settings, message(f"t{base}", recipient=ny, tier="P1", category="transactional"),
               base + 1)]
    events, _, _ = decode(settings, run(mem, runner, Tier.P1, p1, prefs))
    assert [e.status.value for e in events] == ["PROVIDER_ACCEPTED"]


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_otp_cap_per_recipient_window(settings: Settings,
                                      memory_send: Callable[..., MemorySend],
                                      runner: str) -> None:
    mem = memory_send()
    base = uuid.uuid4().int % 10**8
    who = unique_number(base)
    items = [kmsg(settings, message(f"o{base}-{i}", recipient=who, tier="P1", category="otp"),
                  base + i) for i in range(7)]
    items.append(kmsg(settings, message(f"x{base}", recipient=unique_number(base + 1), tier="P1",
                                     category="otp"), base + 10))
    events, _, _ = decode(settings, run(mem, runner, Tier.P1, items, []))
    to_who = [e for e in events if e.message is not None and e.message.recipient_hash ==
              recipient_hash("acme", who)]
    statuses = sorted(e.status.value for e in to_who)
    assert statuses == ["PROVIDER_ACCEPTED"] * 5 + ["SUPPRESSED"] * 2
    assert {e.reason for e in to_who if e.status.value == "SUPPRESSED"} == {"frequency_cap"}
    assert len(events) == 8


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_tenant_daily_marketing_cap_counts_across_workers(
        settings: Settings, memory_send: Callable[..., MemorySend], runner: str) -> None:
    """A tenant allowed 2 marketing messages a day: of 4 (to 4 recipients, so no recipient
    cap applies) exactly 2 are sent, whichever worker takes which (the count is the caps
    port's, shared by every worker)."""
    acme = settings.tenant("acme")
    assert acme is not None
    capped = settings.model_copy(update={"tenants": tuple(
        t.model_copy(update={"daily_marketing_cap": 2}) if t.id == "acme" else t
        for t in settings.tenants)})
    mem = memory_send(Tier.P3, capped)
    base = uuid.uuid4().int % 10**8
    zone = daytime_zone()
    who = [unique_number(base + i) for i in range(4)]
    prefs = [pref_msg(settings, i, n, timezone=zone) for i, n in enumerate(who)]
    items = [kmsg(settings, message(f"m{base}-{i}", recipient=n, tier="P3"), base + i, Tier.P3)
             for i, n in enumerate(who)]
    events, dlq, _ = decode(capped, run(mem, runner, Tier.P3, items, prefs))
    got = sorted((e.status.value, e.reason or "") for e in events)
    assert got == [("PROVIDER_ACCEPTED", "")] * 2 + [("SUPPRESSED", "tenant_daily_cap")] * 2
    assert dlq == []
