"""The Call stage on memory ports: the provider's answer kept on the item, told to the
breakers (except for a last-resort send), and a raising adapter turned into a transient
``internal_error``."""

from __future__ import annotations

from dataclasses import replace

from notiflow.adapters.breaker import State
from notiflow.adapters.memory import Answer
from notiflow.adapters.providers.base import OutboundMessage, Outcome
from notiflow.flows.send.stages.call import Call
from notiflow.flows.send.stages.route import Quota
from notiflow.flows.send.stages.send_batch import Prepared
from notiflow.schemas.enums import Tier
from tests.unit.memory_send import Setup, prepared, setup, step, work


def routed(s: Setup, n: int, tier: Tier = Tier.P1) -> Prepared:
    item = prepared(work(s, n, tier))
    assert step(Quota(), item, s.ctx) is None and item.choice is not None
    return item


def test_the_answer_is_kept_and_the_message_reached_the_provider() -> None:
    s = setup()
    item = routed(s, 1)
    assert step(Call(), item, s.ctx) is None
    assert item.result is not None and item.result.outcome is Outcome.ACCEPTED
    assert item.choice is not None
    [call] = s.state.provider(item.choice.provider_id).sent()
    assert call.message == item.message and call.result == item.result


def test_failures_are_told_to_the_breaker() -> None:
    s = setup()
    first = routed(s, 0)
    assert first.choice is not None
    pid = first.choice.provider_id
    s.state.provider(pid).outage()
    for n in range(s.settings.breaker.failure_threshold):
        item = routed(s, n)
        step(Call(), item, s.ctx)
        assert item.result is not None and item.result.reason == "connect_error"
    assert s.ctx.ports.breakers.state(pid) is State.OPEN


def test_a_last_resort_send_is_not_counted_by_its_breaker() -> None:
    s = setup(Tier.P0)
    item = routed(s, 0, Tier.P0)
    assert item.choice is not None
    pid = item.choice.provider_id
    s.state.provider(pid).script(*[Answer(Outcome.TRANSIENT, "server_error")] * 10)
    for n in range(s.settings.breaker.failure_threshold + 1):
        forced = routed(s, n, Tier.P0)
        forced.choice = replace(item.choice, last_resort=True)
        step(Call(), forced, s.ctx)
    assert s.ctx.ports.breakers.state(pid) is State.CLOSED


def test_a_raising_adapter_is_a_transient_internal_error() -> None:
    s = setup()
    item = routed(s, 1)
    assert item.choice is not None

    async def boom(message: OutboundMessage) -> None:
        raise RuntimeError("adapter bug")

    provider = s.state.provider(item.choice.provider_id)
    provider.send = boom  # type: ignore[method-assign,assignment]
    step(Call(), item, s.ctx)
    assert item.result is not None and item.result.outcome is Outcome.TRANSIENT
    assert item.result.reason == "internal_error:RuntimeError"
