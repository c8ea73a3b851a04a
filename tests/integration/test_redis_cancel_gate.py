"""The cancel gate against real Redis: each Lua script answers and leaves the keys exactly as
the reference model (``cancel_gate.GateModel``) on generated sequences, and concurrent cancels
and confirms of many messages end each message in exactly one outcome."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import timedelta

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notiflow.adapters.cancel_gate import (
    CANCEL,
    CANCELLED,
    CLEAR,
    CONFIRM,
    SENDING,
    CancelGate,
    GateModel,
)
from notiflow.adapters.ports import Confirm
from notiflow.adapters.redis_dedup import DedupStore
from notiflow.correlation import CorrelationKeys
from notiflow.schemas.campaigns import row_message_id
from tests.helpers import loop_turns

KEYS = CorrelationKeys((b"g" * 32,))

pytestmark = pytest.mark.integration

PX = 60_000
OWNERS = ("pending:us:", "pending:them:")
ops = st.lists(st.tuples(st.sampled_from(["cancel", "confirm", "clear", "lease", "drop",
                                          "done"]), st.integers(0, 1)), max_size=25)


def namespace() -> str:
    return f"gate{uuid.uuid4().hex[:10]}."


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=ops)
async def test_scripts_answer_exactly_like_the_model(client: aioredis.Redis,
                                                     steps: list[tuple[str, int]]) -> None:
    ns = namespace()
    lease, gate = f"{ns}lease:m:1", f"{ns}gate:m"
    model = GateModel()
    try:
        for n, (op, who) in enumerate(steps):
            prefix = OWNERS[who]
            if op == "cancel":
                got = bool(await client.eval(CANCEL, 1, gate, CANCELLED, PX))
                assert got is model.cancel(gate)
            elif op == "confirm":
                value = f"{prefix}{n}"
                answer = Confirm(int(await client.eval(CONFIRM, 2, lease, gate, prefix, value,
                                                       PX, CANCELLED, SENDING)))
                assert answer is model.confirm(lease, gate, prefix, value)
            elif op == "clear":
                assert bool(await client.eval(CLEAR, 1, gate, SENDING)) is model.clear(gate)
            elif op == "drop":
                await client.delete(lease)
                model.kv.pop(lease, None)
            else:
                value = f"{prefix}{n}" if op == "lease" else 'done:{"status":"SENT"}'
                await client.set(lease, value, px=PX)
                model.kv[lease] = value
            assert await client.get(lease) == model.kv.get(lease), (op, who)
            assert await client.get(gate) == model.kv.get(gate), (op, who)
        if gate in model.kv:
            assert 0 < await client.pttl(gate) <= PX
    finally:
        await client.delete(lease, gate)


async def test_concurrent_cancels_and_sends_end_each_message_once(
        client: aioredis.Redis) -> None:
    """Per message: a sender confirms and a client cancels at once, in random order; exactly
    one of them wins. Senders that lost to a cancel see CANCELLED; a RETRY_PENDING end clears
    the gate so the message becomes cancellable; any other end keeps it refused."""
    ns = namespace()
    sender, api = DedupStore(client, "us", ns, keys=KEYS), CancelGate(client, ns)
    ttl = timedelta(minutes=1)
    ids = [f"m{i}" for i in range(200)]
    keys = [sender.lease_key(m, 1) for m in ids]
    try:
        assert all(s.acquired for s in await sender.acquire(keys, ttl))
        order = [(kind, i) for i in range(len(ids)) for kind in ("confirm", "cancel")]
        random.shuffle(order)
        started: dict[tuple[str, int], asyncio.Future[object]] = {}
        for kind, i in order:
            call = (sender.confirm(keys[i], sender.gate_key(ids[i]), ttl) if kind == "confirm"
                    else api.cancel(ids[i], ttl))
            started[kind, i] = asyncio.ensure_future(call)
            if random.random() < 0.3:
                await loop_turns()
        await asyncio.gather(*started.values())
        outcomes = [(started["confirm", i].result(), started["cancel", i].result())
                    for i in range(len(ids))]
        assert all(o in ((Confirm.OURS, False), (Confirm.CANCELLED, True)) for o in outcomes)
        sent = [m for m, (c, _) in zip(ids, outcomes, strict=True) if c is Confirm.OURS]
        assert 0 < len(sent) < len(ids), "the race was not mixed: both outcomes expected"
        assert all([await client.get(sender.gate_key(m)) == SENDING for m in sent])
        retried, final = sent[: len(sent) // 2], sent[len(sent) // 2:]
        await sender.finish([(sender.lease_key(m, 1), {"status": "RETRY_PENDING"})
                             for m in retried], ttl, [sender.gate_key(m) for m in retried])
        await sender.finish([(sender.lease_key(m, 1), {"status": "PROVIDER_ACCEPTED"})
                             for m in final], ttl)
        assert all([await api.cancel(m, ttl) for m in retried])
        assert not any([await api.cancel(m, ttl) for m in final])
    finally:
        await client.delete(*keys, *(sender.gate_key(m) for m in ids))


async def test_a_campaign_cancel_stops_every_message_of_the_campaign(
        client: aioredis.Redis) -> None:
    """One key cancels the campaign's messages not yet confirmed; a message of another
    campaign, or of none, still goes; the model agrees."""
    ns = namespace()
    sender, api = DedupStore(client, "us", ns, keys=KEYS), CancelGate(client, ns)
    ours, theirs = "cmp_" + "a" * 32, "cmp_" + "b" * 32
    first, second, other = (row_message_id(KEYS, ours, 1), row_message_id(KEYS, ours, 2),
                            row_message_id(KEYS, theirs, 1))
    ids = [first, second, other, "msg_plain"]
    keys = {m: sender.lease_key(m, 1) for m in ids}
    assert all(s.acquired for s in await sender.acquire(list(keys.values()),
                                                        timedelta(minutes=1)))
    await api.cancel_campaign(ours, timedelta(minutes=5))
    answers = {m: await sender.confirm(keys[m], sender.gate_key(m), timedelta(minutes=1),
                                       sender.campaign_gate_key(m)) for m in ids}
    assert answers == {first: Confirm.CANCELLED, second: Confirm.CANCELLED,
                       other: Confirm.OURS, "msg_plain": Confirm.OURS}
    assert sender.campaign_gate_key("msg_plain") is None
    model = GateModel()
    campaign = f"{ns}campaign-gate:{ours}"
    model.kv[campaign] = CANCELLED
    model.kv["lease"] = "pending:us:1"
    assert model.confirm("lease", "gate", "pending:us:", "pending:us:2",
                         campaign) is Confirm.CANCELLED
