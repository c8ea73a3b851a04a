"""Recipient and tenant caps against real Redis: the Lua script answers exactly as the
in-memory model (``LocalCaps``) for generated sequences with replays, counts across
concurrent callers without ever exceeding a limit, and leaves nothing behind after its
windows (keys expire)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notiflow.adapters.redis_caps import CapStore
from notiflow.correlation import CorrelationKeys
from notiflow.flows.send.cap_rules import CapCheck, LocalCaps, Verdict
from tests.helpers import no_ports, partial_ports, wait_until

KEYS = CorrelationKeys((b"g" * 32,))

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, 23, 50, tzinfo=UTC)


def namespace() -> str:
    return f"caps{uuid.uuid4().hex[:10]}."


def check(recipient: int, member: int, at: datetime, limit: int | None,
          tenant_cap: int | None, window: timedelta) -> CapCheck:
    return CapCheck(recipient_key=f"acme:r{recipient}:otp", member=f"m{member}",
                    window=window, limit=limit,
                    tenant_key=f"acme:{at.date().isoformat()}" if tenant_cap is not None
                    else None, tenant_cap=tenant_cap)


step_st = st.tuples(st.integers(0, 400_000), st.integers(0, 2), st.integers(0, 6))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit=st.sampled_from([None, 0, 1, 2, 3]),
       tenant_cap=st.sampled_from([None, 0, 2, 5]),
       steps=st.lists(step_st, min_size=1, max_size=50))
async def test_lua_answers_exactly_like_the_model(
        client: aioredis.Redis, limit: int | None, tenant_cap: int | None,
        steps: list[tuple[int, int, int]]) -> None:
    """Steps: (ms later, recipient, message id); ids repeat (replays, retries), the window is
    10 minutes and the run crosses a UTC midnight (the tenant's day changes)."""
    if limit is None and tenant_cap is None:
        tenant_cap = 1
    store, model = CapStore(client, namespace()), LocalCaps(sweep_every=5)
    window = timedelta(minutes=10)
    at = T0
    for dt, recipient, member in steps:
        at += timedelta(milliseconds=dt)
        c = check(recipient, member, at, limit, tenant_cap, window)
        [got] = await store.admit([c], at)
        assert got is model.admit(c, at), (c, at)


async def test_one_batch_is_one_round_trip_of_independent_answers(
        client: aioredis.Redis) -> None:
    store = CapStore(client, namespace())
    window = timedelta(minutes=10)
    checks = [check(i % 3, i, T0, 2, None, window) for i in range(9)]
    got = await store.admit(checks, T0)
    assert got == [Verdict.OK] * 6 + [Verdict.RECIPIENT] * 3
    later = [check(0, 100, T0, 2, None, window)]
    assert await store.admit(later, T0 + window - timedelta(milliseconds=1)) == [
        Verdict.RECIPIENT]
    assert await store.admit(later, T0 + window) == [Verdict.OK]


async def test_concurrent_senders_never_exceed_the_limit(redis_url: str) -> None:
    """Four clients (four processes of a tier) race for one recipient: exactly the limit
    passes, whatever the interleaving."""
    ns = namespace()
    clients = [aioredis.Redis.from_url(redis_url, decode_responses=True) for _ in range(4)]
    try:
        stores = [CapStore(c, ns) for c in clients]
        window = timedelta(minutes=10)

        async def send(k: int) -> list[Verdict]:
            return [v for i in range(10)
                    for v in await stores[k].admit([check(0, k * 100 + i, T0, 5, None,
                                                          window)], T0)]

        results = await asyncio.gather(*(send(k) for k in range(4)))
        assert sum(r.count(Verdict.OK) for r in results) == 5
    finally:
        for c in clients:
            await c.aclose()


async def test_keys_expire_with_their_windows(client: aioredis.Redis) -> None:
    ns = namespace()
    store = CapStore(client, ns)
    c = check(0, 1, T0, 3, 10, timedelta(milliseconds=300))
    assert await store.admit([c], datetime.now(UTC)) == [Verdict.OK]
    rkey, tkey = store.recipient_key(c), store.tenant_key(c)
    assert tkey is not None
    assert 0 < await client.pttl(rkey) <= 300
    assert 0 < await client.pttl(tkey) <= 2 * 86_400_000
    assert await client.get(tkey) == "1"

    async def expired() -> bool:
        return await client.exists(rkey) == 0

    await wait_until(expired, timeout=5, interval=0.05, what="the recipient key expired")
    assert await client.exists(rkey) == 0


async def test_redis_down_p0_caps_locally_and_marketing_waits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis unreachable: a tier that keeps sending (P0) counts OTP caps in process memory
    with its share of the limit (2 processes, limit 5 → 2 here); a marketing message on that
    tier is not sent and not suppressed: it is re-published to wait (fails closed)."""
    from notiflow.adapters.dlq_crypto import DlqCipher
    from notiflow.adapters.redis_dedup import DedupStore
    from notiflow.devenv import free_port
    from notiflow.flows.common.items import Retry, SourceRef, Work
    from notiflow.flows.send.dispatch import ChannelPressure, Dispatcher
    from notiflow.flows.send.flow import send_stages
    from notiflow.flows.send.stages.gates import Caps
    from notiflow.flows.send.stages.send_batch import Batch, attempt_key
    from notiflow.schemas.enums import Tier
    from notiflow.schemas.messages import IngestRecord, StatusEvent
    from notiflow.settings import CapRule, Settings

    monkeypatch.setenv("NOTIFLOW_TENANTS", '[{"id": "acme", "token": "%s"}]' % ("t" * 32))
    from cryptography.fernet import Fernet

    s = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0",
                 dlq_key=Fernet.generate_key().decode(),
                 caps={"otp": CapRule(limit=5, window=timedelta(minutes=10)),
                       "marketing": CapRule(limit=3, window=timedelta(days=7))})
    policy = s.policy(Tier.P0)
    assert policy.redis_down == "local"
    d = Dispatcher(s, Tier.P0, policy, DlqCipher.from_settings(s), ChannelPressure(10),
                   lambda: T0, no_ports, "test:p0", send_stages(), workers=2)
    client = aioredis.Redis.from_url(s.redis_url, socket_connect_timeout=0.2)
    d.ctx.attach(partial_ports(leases=DedupStore(client, d.owner, keys=KEYS),
                               caps=CapStore(client)))

    def work(i: int, category: str) -> Work:
        rec = IngestRecord.model_validate({
            "channel": "SMS", "tier": "P0", "recipient": "+12025550143", "tenant_id": "acme",
            "template_id": "t", "template_version": 1, "category": category,
            "message_id": f"msg_{category}{i}", "accepted_at": T0.isoformat()})
        return Work(rec, SourceRef("t", 0, i), b"", None)

    try:
        batch = [work(i, "otp") for i in range(4)] + [work(0, "marketing")]
        prepared = Batch(list(batch), T0)
        await Caps()(prepared, d.ctx)
        prepared.settle()
        live = prepared.live
        plan = {id(w): prepared.decided.get(attempt_key(w)) for w in batch}
        assert [w.message_id for w in live] == ["msg_otp0", "msg_otp1"]
        assert not d.redis_ok
        for w in batch[2:4]:
            [ev] = plan[id(w)]  # type: ignore[misc]
            assert isinstance(ev, StatusEvent) and ev.reason == "frequency_cap"
        [retry] = plan[id(batch[4])]  # type: ignore[misc]
        assert isinstance(retry, Retry) and retry.record.attempt == batch[4].record.attempt
        assert retry.record.not_before is not None and retry.record.not_before > T0
    finally:
        await client.aclose()
