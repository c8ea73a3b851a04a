"""Consent join, quiet-hours deferral across a DST change and recipient caps, in the send
dataflow under TestingSource/TestingSink with 1 and 2 workers (real Redis, Cassandra and
provider emulator behind the send step)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from bytewax.testing import TestingSink, TestingSource

from notiflow.adapters.kafka_io import OutRecord
from notiflow.flows.send import build_send_flow
from notiflow.redact import recipient_hash
from notiflow.schemas.enums import Tier
from notiflow.schemas.preferences import PreferenceState
from notiflow.settings import Settings
from tests.flow.conftest import RUNNERS, decode, kmsg

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


def run(settings: Settings, runner: str, tier: Tier, items: list[Any], prefs: list[Any],
        clock: Any = None) -> list[OutRecord]:
    out: list[OutRecord] = []
    kw = {"clock": clock} if clock else {}
    RUNNERS[runner](build_send_flow(
        settings, tier, source=TestingSource([TestingSource.PAUSE(timedelta(milliseconds=300)),
                                              *items]),
        preferences=TestingSource(prefs), sink=TestingSink(out), **kw))
    return out


def daytime_zone() -> str:
    """A fixed-offset zone where it is about noon now (outside any default quiet hours)."""
    off = (12 - datetime.now(UTC).hour + 12) % 24 - 12
    return "UTC" if off == 0 else f"Etc/GMT{'-' if off > 0 else '+'}{abs(off)}"


def unique_number(seed: int) -> str:
    """One of 8 million Washington, DC numbers. The tests of a session share Redis and the
    recipient caps in it; drawn from 10,000 numbers (the other tests' `+1202555` range), the
    OTP-cap test once found its recipient already capped by another test's sends."""
    return f"+1202{200 + seed // 10_000 % 800:03d}{seed % 10_000:04d}"


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_consent_join_suppresses_opted_out_and_suppressed(stack: Settings, fakes: str,
                                                          template: int, runner: str) -> None:
    base = uuid.uuid4().int % 10**8
    opted, dead, free = (unique_number(base + i) for i in range(3))
    zone = daytime_zone()
    prefs = [pref_msg(stack, 0, opted, timezone=zone,
                      opt_outs=[{"channel": "SMS", "category": "marketing"}]),
             pref_msg(stack, 1, dead, suppressed="unsubscribed", timezone=zone),
             pref_msg(stack, 2, free, timezone=zone)]
    items = [kmsg(stack, message(f"a{base}", recipient=opted), base, Tier.P2),
             kmsg(stack, message(f"b{base}", recipient=opted, category="account"), base + 1,
                  Tier.P2),
             kmsg(stack, message(f"c{base}", recipient=dead, category="account"), base + 2,
                  Tier.P2),
             kmsg(stack, message(f"d{base}", recipient=free), base + 3, Tier.P2)]
    events, dlq, _ = decode(stack, run(stack, runner, Tier.P2, items, prefs))
    got = sorted((e.status.value, e.reason or "") for e in events)
    assert got == [("PROVIDER_ACCEPTED", ""), ("PROVIDER_ACCEPTED", ""),
                   ("SUPPRESSED", "opted_out"), ("SUPPRESSED", "unsubscribed")]
    assert dlq == []


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_quiet_hours_deferral_across_dst_change(stack: Settings, fakes: str, template: int,
                                                runner: str) -> None:
    """01:30 EST on the night the US springs forward: quiet until 08:00 EDT = 12:00 UTC
    (13:00 UTC would be the answer without the DST change). P1 is exempt and is sent."""
    base = uuid.uuid4().int % 10**8
    ny = unique_number(base)
    night = datetime(2026, 3, 8, 6, 30, tzinfo=UTC)
    prefs = [pref_msg(stack, 0, ny, timezone="America/New_York",
                      quiet_hours={"start": "22:00", "end": "08:00"})]
    items = [kmsg(stack, message(f"q{base}", recipient=ny, tier="P3",
                                 accepted_at=night.isoformat(), message_id=f"msg_q{base}"),
                  base, Tier.P3)]
    events, _, _ = decode(stack, run(stack, runner, Tier.P3, items, prefs,
                                     clock=lambda: night))
    [ev] = events
    assert (ev.status.value, ev.reason) == ("SCHEDULED", "quiet_hours")
    assert ev.next_attempt_at == datetime(2026, 3, 8, 12, 0, tzinfo=UTC)

    p1 = [kmsg(stack, message(f"t{base}", recipient=ny, tier="P1", category="transactional"),
               base + 1)]
    events, _, _ = decode(stack, run(stack, runner, Tier.P1, p1, prefs))
    assert [e.status.value for e in events] == ["PROVIDER_ACCEPTED"]


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_otp_cap_per_recipient_window(stack: Settings, fakes: str, template: int,
                                      runner: str) -> None:
    base = uuid.uuid4().int % 10**8
    who = unique_number(base)
    items = [kmsg(stack, message(f"o{base}-{i}", recipient=who, tier="P1", category="otp"),
                  base + i) for i in range(7)]
    items.append(kmsg(stack, message(f"x{base}", recipient=unique_number(base + 1), tier="P1",
                                     category="otp"), base + 10))
    events, _, _ = decode(stack, run(stack, runner, Tier.P1, items, []))
    to_who = [e for e in events if e.message is not None and e.message.recipient_hash ==
              recipient_hash("acme", who)]
    statuses = sorted(e.status.value for e in to_who)
    assert statuses == ["PROVIDER_ACCEPTED"] * 5 + ["SUPPRESSED"] * 2
    assert {e.reason for e in to_who if e.status.value == "SUPPRESSED"} == {"frequency_cap"}
    assert len(events) == 8


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_tenant_daily_marketing_cap_counts_across_workers(stack: Settings, fakes: str,
                                                          template: int, runner: str) -> None:
    """A tenant allowed 2 marketing messages a day: of 4 (to 4 recipients, so no recipient
    cap applies) exactly 2 are sent, whichever worker takes which; the count lives in
    Redis (``tcap:{tenant}:{day}``), so it is reset here for the run."""
    import redis

    acme = stack.tenant("acme")
    assert acme is not None
    settings = stack.model_copy(update={"tenants": tuple(
        t.model_copy(update={"daily_marketing_cap": 2}) if t.id == "acme" else t
        for t in stack.tenants)})
    with redis.Redis.from_url(stack.redis_url) as r:
        r.delete(f"{stack.topic_prefix}tcap:acme:{datetime.now(UTC).date().isoformat()}")
    base = uuid.uuid4().int % 10**8
    zone = daytime_zone()
    who = [unique_number(base + i) for i in range(4)]
    prefs = [pref_msg(stack, i, n, timezone=zone) for i, n in enumerate(who)]
    items = [kmsg(stack, message(f"m{base}-{i}", recipient=n, tier="P3"), base + i, Tier.P3)
             for i, n in enumerate(who)]
    events, dlq, _ = decode(settings, run(settings, runner, Tier.P3, items, prefs))
    got = sorted((e.status.value, e.reason or "") for e in events)
    assert got == [("PROVIDER_ACCEPTED", "")] * 2 + [("SUPPRESSED", "tenant_daily_cap")] * 2
    assert dlq == []
