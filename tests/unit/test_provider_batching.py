"""The coalescer: sends that meet within the linger share one ``send_batch``; each caller gets
its own message's result; a raising batch fails each caller; closing sends what waits."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.batching import Coalescer, coalesced
from notiflow.schemas.enums import Channel, Tier
from tests.helpers import loop_turns, wait_until

AT = datetime(2026, 12, 4, tzinfo=UTC)


def message(i: int) -> OutboundMessage:
    return OutboundMessage(f"msg_{i}", 1, "mkt", Channel.EMAIL, Tier.P3, f"u{i}@example.com",
                           f"body {i}", "subject")


class Batches:
    """A batch sender that records each batch and accepts all but ``refuse``."""

    provider_id = "bulk"
    channel = Channel.EMAIL

    def __init__(self, max_batch: int = 1000, refuse: frozenset[str] = frozenset(),
                 raises: bool = False, held: bool = False) -> None:
        self.max_batch = max_batch
        self.refuse = refuse
        self.raises = raises
        self.release = asyncio.Event()
        if not held:
            self.release.set()
        self.batches: list[list[str]] = []
        self.closed = False

    async def send_batch(self, messages: Sequence[OutboundMessage],
                         traceparents: Sequence[str | None]) -> list[SendResult]:
        assert len(traceparents) == len(messages)
        self.batches.append([m.message_id for m in messages])
        await loop_turns()
        await self.release.wait()
        if self.raises:
            raise RuntimeError("adapter bug")
        return [SendResult(Outcome.PERMANENT, self.provider_id, AT, AT,
                           reason="invalid_recipient") if m.message_id in self.refuse else
                SendResult(Outcome.ACCEPTED, self.provider_id, AT, AT,
                           provider_message_id=f"x#{k}") for k, m in enumerate(messages)]

    async def send(self, message: OutboundMessage) -> SendResult:
        raise AssertionError("a coalesced client never sends alone")

    async def aclose(self) -> None:
        self.closed = True


async def gather(c: Coalescer, ids: range) -> list[SendResult]:
    return list(await asyncio.gather(*(c.send(message(i)) for i in ids)))


async def test_concurrent_sends_share_a_request_and_keep_their_own_results() -> None:
    inner = Batches(refuse=frozenset({"msg_3"}))
    results = await gather(Coalescer(inner, 64, 0.01), range(10))
    assert inner.batches == [[f"msg_{i}" for i in range(10)]]
    assert [r.outcome for r in results] == [Outcome.ACCEPTED] * 3 + [Outcome.PERMANENT] + [
        Outcome.ACCEPTED] * 6
    assert results[4].provider_message_id == "x#4"


async def test_a_full_batch_goes_at_once_and_the_rest_after_the_linger() -> None:
    inner = Batches()
    c = Coalescer(inner, 4, 0.05)
    started = asyncio.get_running_loop().time()
    await gather(c, range(10))
    assert [len(b) for b in inner.batches] == [4, 4, 2]
    assert asyncio.get_running_loop().time() - started >= 0.05


async def test_the_provider_limit_caps_the_batch() -> None:
    inner = Batches(max_batch=3)
    c = Coalescer(inner, 64, 0.01)
    assert c.size == 3
    await gather(c, range(7))
    assert [len(b) for b in inner.batches] == [3, 3, 1]


async def test_sends_apart_by_more_than_the_linger_go_apart() -> None:
    inner = Batches()
    c = Coalescer(inner, 64, 0.005)
    await c.send(message(1))
    await c.send(message(2))
    assert inner.batches == [["msg_1"], ["msg_2"]]


async def test_a_raising_batch_fails_each_of_its_callers() -> None:
    c = Coalescer(Batches(raises=True), 64, 0.01)
    outcomes = await asyncio.gather(*(c.send(message(i)) for i in range(3)),
                                    return_exceptions=True)
    assert all(isinstance(o, RuntimeError) for o in outcomes)


async def test_a_cancelled_caller_leaves_the_others_their_results() -> None:
    inner = Batches(held=True)
    c = Coalescer(inner, 64, 0.0)
    tasks = [asyncio.create_task(c.send(message(i))) for i in range(3)]
    await wait_until(lambda: inner.batches, what="the batch sent")
    tasks[0].cancel()
    inner.release.set()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert [r.outcome for r in done[1:]] == [Outcome.ACCEPTED] * 2  # type: ignore[union-attr]


async def test_closing_sends_what_waits_then_closes_the_client() -> None:
    inner = Batches()
    c = Coalescer(inner, 64, 60.0, close=inner)  # type: ignore[arg-type]
    pending = asyncio.create_task(c.send(message(1)))
    await loop_turns()
    await c.aclose()
    assert (await pending).outcome is Outcome.ACCEPTED
    assert inner.closed and inner.batches == [["msg_1"]]


def test_only_batch_senders_of_a_batching_tier_are_wrapped() -> None:
    class Single:
        provider_id, channel = "one", Channel.SMS

        async def send(self, message: OutboundMessage) -> SendResult:
            raise NotImplementedError

        async def aclose(self) -> None: ...

    batcher, single = Batches(), Single()
    wrapped = coalesced({"bulk": batcher, "one": single}, 64, 0.02)  # type: ignore[dict-item]
    assert isinstance(wrapped["bulk"], Coalescer) and wrapped["one"] is single
    assert coalesced({"bulk": batcher}, 1, 0.02)["bulk"] is batcher  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        Coalescer(batcher, 1, 0.02)
