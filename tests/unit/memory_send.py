"""A send step's context on memory ports with a hand-moved clock, for the per-message stage
tests: one prepared SMS message and the state behind its ports."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from cryptography.fernet import Fernet

from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.memory import MemoryState, memory_ports
from notiflow.adapters.providers.base import OutboundMessage
from notiflow.flows.common.items import Out, SourceRef, Work
from notiflow.flows.send.stages.context import SendContext
from notiflow.flows.send.stages.send_batch import Prepared
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import IngestRecord
from notiflow.settings import Settings
from tests.fakes import ManualClock
from tests.helpers import memory_settings

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
T = TypeVar("T")


@dataclass
class Setup:
    settings: Settings
    clock: ManualClock[datetime]
    state: MemoryState
    ctx: SendContext


def setup(tier: Tier = Tier.P1, **update: Any) -> Setup:
    """A send context of ``tier`` on freshly opened memory ports (settings ``update``d)."""
    settings = memory_settings(**update)
    clock = ManualClock(T0)
    state, _ = memory_ports(settings, tier, clock=clock)
    ctx = SendContext(settings, tier, settings.policy(tier), DlqCipher(Fernet.generate_key()),
                      clock, random.Random(1), f"send.{tier.value.lower()}")
    ctx.attach(state.open())
    return Setup(settings, clock, state, ctx)


def work(s: Setup, n: int = 0, tier: Tier = Tier.P1, **extra: Any) -> Work:
    doc: dict[str, Any] = {
        "channel": "SMS", "tier": tier.value, "tenant_id": "acme",
        "recipient": "+14155552671", "template_id": "otp", "template_version": 1,
        "variables": {"code": str(n)}, "message_id": f"msg_{n}",
        "accepted_at": s.clock().isoformat(),
        "expires_at": (s.clock() + timedelta(hours=1)).isoformat(), **extra}
    record = IngestRecord.model_validate(doc)
    return Work(record, SourceRef(s.settings.ingest_topic(Channel.SMS, tier), 0, n),
                record.model_dump_json().encode(), None)


def prepared(w: Work) -> Prepared:
    r = w.record
    assert isinstance(r.recipient, str)
    return Prepared(w, OutboundMessage(w.message_id, r.attempt, r.tenant_id, r.channel, r.tier,
                                       r.recipient, f"code {r.variables}"), None)


def leased(s: Setup, w: Work) -> None:
    """Take ``w``'s lease as the Lease stage does."""
    leases = s.ctx.ports.leases
    [got] = run(leases.acquire([s.ctx.lease_key(w)], s.ctx.lease_ttl(w)))
    assert got.acquired


def step(stage: Any, item: Prepared, ctx: SendContext) -> list[Out] | None:
    """Run one per-message stage as the dispatcher does."""
    answer = stage(item, ctx)
    return None if answer is None else run(answer)


def run(aw: Awaitable[T]) -> T:
    async def wait() -> T:
        return await aw

    return asyncio.run(wait())
