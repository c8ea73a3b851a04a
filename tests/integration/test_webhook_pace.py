"""The per-webhook pace's Lua script decides as its Python reference model does
(``adapters/webhook_pace.py``), on the real Redis, with the clock given."""

from __future__ import annotations

import random
import uuid

import pytest

from notiflow.adapters.webhook_pace import WebhookPace, decide
from notiflow.settings import PaceRule, Settings

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("seed", range(12))
async def test_lua_and_model_give_the_same_slots(stack: Settings, seed: int) -> None:
    rng = random.Random(seed)
    rule = PaceRule(rate=rng.choice([0.5, 1.0, 2.0, 7.3, 40.0]), burst=rng.randint(1, 5))
    horizon_s = rng.choice([2.0, 3600.0])
    pace = WebhookPace.open(stack)
    pace.horizon_us = int(horizon_s * 1e6)
    webhook = f"https://hooks.example/{uuid.uuid4().hex}"
    now = 1_700_000_000_000_000
    tat: int | None = None
    try:
        for _ in range(40):
            now += rng.choice([0, 0, 1, 50_000, 400_000, 1_000_000, 3_000_000])
            expected_tat, expected = decide(tat, now, rule, pace.horizon_us)
            got = await pace.reserve("slack", webhook, rule, tenant_id="acme", now_us=now)
            assert got == expected, (rule, now, tat)
            tat = expected_tat if expected_tat is not None else tat
    finally:
        await pace.aclose()


async def test_webhooks_providers_and_tenants_have_their_own_slots(stack: Settings) -> None:
    rule = PaceRule(rate=1.0, burst=1)
    pace = WebhookPace.open(stack)
    now = 1_700_000_000_000_000
    hook = f"https://hooks.example/{uuid.uuid4().hex}"
    try:
        first = await pace.reserve("slack", hook, rule, tenant_id="acme", now_us=now)
        second = await pace.reserve("slack", hook, rule, tenant_id="acme", now_us=now)
        other_hook = await pace.reserve("slack", hook + "x", rule, tenant_id="acme",
                                        now_us=now)
        other_provider = await pace.reserve("teams", hook, rule, tenant_id="acme",
                                            now_us=now)
        other_tenant = await pace.reserve("slack", hook, rule, tenant_id="globex",
                                          now_us=now)
        assert [s.wait_us for s in (first, second, other_hook, other_provider,
                                    other_tenant)] == [0, 1_000_000, 0, 0, 0]
        keys = [k async for k in pace.r.scan_iter(match=f"{stack.topic_prefix}pace:*")]
        assert keys and all("hooks.example" not in str(k) for k in keys)
    finally:
        await pace.aclose()
