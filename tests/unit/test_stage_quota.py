"""The Quota stage on memory ports: the account a message goes to, with its token taken, or
why it waits (same attempt) or expires."""

from __future__ import annotations

from datetime import timedelta

from notiflow.flows.common.items import Out, Retry
from notiflow.flows.send.stages.route import Quota
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import StatusEvent
from tests.unit.memory_send import prepared, setup, step, work


def events(outs: list[Out] | None) -> list[tuple[Status, str | None]]:
    return [(o.status, o.reason) for o in outs or () if isinstance(o, StatusEvent)]


def test_the_best_ranked_account_is_chosen_with_its_provider() -> None:
    s = setup()
    item = prepared(work(s))
    assert step(Quota(), item, s.ctx) is None
    assert item.choice is not None and not item.choice.last_resort
    assert item.provider is s.state.provider(item.choice.provider_id)


def test_an_open_breaker_sends_the_message_to_the_other_account() -> None:
    s = setup()
    first = prepared(work(s, 1))
    step(Quota(), first, s.ctx)
    assert first.choice is not None
    s.state.open_breaker(first.choice.provider_id)
    s.clock.advance(1)  # past the facade's cached state
    item = prepared(work(s, 2))
    assert step(Quota(), item, s.ctx) is None
    assert item.choice is not None and item.choice.provider_id != first.choice.provider_id


def test_every_breaker_open_p1_waits_on_the_same_attempt_or_expires() -> None:
    s = setup()
    for p in ("twilio", "vonage"):
        s.state.open_breaker(p)
    outs = step(Quota(), prepared(work(s)), s.ctx)
    assert events(outs) == [(Status.RETRY_PENDING, "all_providers_unavailable")]
    [again] = [o for o in outs or () if isinstance(o, Retry)]
    assert again.record.attempt == 1 and again.record.not_before is not None
    soon = work(s, 3, expires_at=(s.clock() + timedelta(seconds=1)).isoformat())
    assert events(step(Quota(), prepared(soon), s.ctx)) == [
        (Status.EXPIRED, "all_providers_unavailable")]


def test_every_breaker_open_p0_goes_to_the_best_ranked_account_anyway() -> None:
    s = setup(Tier.P0)
    for p in ("twilio", "vonage"):
        s.state.open_breaker(p)
    item = prepared(work(s, tier=Tier.P0))
    assert step(Quota(), item, s.ctx) is None
    assert item.choice is not None and item.choice.last_resort


def test_a_retry_after_of_every_account_holds_the_message() -> None:
    s = setup()
    until = (s.clock() + timedelta(seconds=30)).isoformat()
    w = work(s, provider_waits={"twilio": until, "vonage": until})
    outs = step(Quota(), prepared(w), s.ctx)
    assert events(outs) == [(Status.RETRY_PENDING, "provider_retry_after")]
    s.clock.advance(31)
    assert step(Quota(), prepared(w), s.ctx) is None
