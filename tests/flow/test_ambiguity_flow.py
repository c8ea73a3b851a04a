"""Ambiguous provider outcomes by tier policy: P0 sends again at once through the other
vendor; P3 waits (UNKNOWN) and a check later ends it FAILED ``ambiguous`` unless a receipt
resolved it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from bytewax.testing import TestingSource, run_main

from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.kafka_io import OutRecord
from notiflow.flows.steps import snapshot_of
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import IngestRecord
from notiflow.settings import Settings
from tests.flow.conftest import decode, kmsg, record, send_flow

pytestmark = pytest.mark.flow


@pytest.fixture
def hanging_sms(fakes: str) -> Iterator[None]:
    """Both SMS vendors accept every message and then never answer in time."""
    for p in ("twilio", "vonage"):
        httpx.post(f"{fakes}/_admin/{p}/config",
                   json={"timeout_rate": 1.0, "hang_s": 5}).raise_for_status()
    yield
    for p in ("twilio", "vonage"):
        httpx.post(f"{fakes}/_admin/{p}/config", json={"timeout_rate": 0.0}).raise_for_status()


def quick(settings: Settings, tier: Tier) -> Settings:
    tiers = dict(settings.tiers)
    tiers[tier] = tiers[tier].model_copy(update={"provider_timeout": timedelta(seconds=0.3)})
    return settings.model_copy(update={"tiers": tiers})


def test_p0_resends_at_once_through_the_other_vendor(stack: Settings, fakes: str,
                                                      template: int, hanging_sms: None) -> None:
    base = uuid.uuid4().int % 10**8
    items = [kmsg(stack, record(f"u{base}", tier="P0"), base, Tier.P0)]
    out: list[OutRecord] = []
    run_main(send_flow(quick(stack, Tier.P0), Tier.P0, TestingSource(items), out))
    events, _, retries = decode(stack, out)
    [ev] = events
    assert ev.status is Status.UNKNOWN and ev.attempt == 1
    assert ev.attempt_detail is not None and ev.attempt_detail.outcome == "ambiguous"
    [nxt] = retries
    assert nxt.attempt == 2 and nxt.avoid_provider == ev.attempt_detail.provider_id
    assert nxt.unknown_check is None
    assert nxt.not_before is not None and nxt.not_before - ev.occurred_at < timedelta(seconds=1)


def test_p3_waits_for_a_receipt_instead_of_resending(stack: Settings, fakes: str,
                                                     template: int, hanging_sms: None) -> None:
    base = uuid.uuid4().int % 10**8
    items = [kmsg(stack, record(f"w{base}", tier="P3", category="account"), base, Tier.P3)]
    out: list[OutRecord] = []
    run_main(send_flow(quick(stack, Tier.P3), Tier.P3, TestingSource(items), out))
    events, _, checks = decode(stack, out)
    [ev] = events
    assert ev.status is Status.UNKNOWN and ev.next_attempt_at is not None
    [check] = checks
    assert check.unknown_check == 1 and check.attempt == 1
    assert check.not_before == ev.next_attempt_at
    assert ev.next_attempt_at - ev.occurred_at == stack.scaled(stack.unknown_resolution)


@pytest.mark.parametrize(("current", "expected"), [
    (Status.UNKNOWN, [("FAILED", "ambiguous")]),
    (Status.DELIVERED, []),
])
def test_check_fails_unresolved_unknowns_only(stack: Settings, fakes: str, template: int,
                                              current: Status,
                                              expected: list[tuple[str, str]]) -> None:
    base = uuid.uuid4().int % 10**8
    now = datetime.now(UTC)
    rec = IngestRecord.model_validate_json(record(
        f"c{base}", tier="P3", message_id=f"msg_chk{base}", accepted_at=now.isoformat(),
        expires_at=(now + timedelta(hours=1)).isoformat(), unknown_check=1))
    cluster, session = connect(stack)
    store = CassandraStore(session, stack)

    async def prepare() -> None:
        await store.messages.create_message(rec.message_id, snapshot_of(rec), Status.QUEUED, now)
        await store.messages.transition(rec.message_id, current, 1, None, now)

    asyncio.run(prepare())
    cluster.shutdown()
    out: list[OutRecord] = []
    run_main(send_flow(stack, Tier.P3, TestingSource(
        [kmsg(stack, rec.model_dump_json().encode(), base, Tier.P3)]), out))
    events, _, _ = decode(stack, out)
    assert [(e.status.value, e.reason) for e in events] == expected
