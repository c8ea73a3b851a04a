"""The Classify stage on memory ports: what the provider's answer means for the message,
recorded on the attempt's lease before the outputs leave."""

from __future__ import annotations

from datetime import timedelta

import orjson

from notiflow.adapters.cancel_gate import SENDING
from notiflow.adapters.memory import Answer
from notiflow.adapters.providers.base import Outcome
from notiflow.flows.common.items import Out, Retry
from notiflow.flows.send.stages.call import Call
from notiflow.flows.send.stages.classifying import Classify
from notiflow.flows.send.stages.confirm import Confirm
from notiflow.flows.send.stages.route import Quota
from notiflow.flows.send.stages.send_batch import Prepared
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import StatusEvent
from tests.unit.memory_send import Setup, leased, prepared, setup, step, work


def attempt(s: Setup, answer: Answer, n: int = 0, tier: Tier = Tier.P1,
            **extra: object) -> tuple[Prepared, list[Out]]:
    """One message through quota, confirm and call, its provider answering ``answer``; the
    outputs of Classify."""
    item = prepared(work(s, n, tier, **extra))
    leased(s, item.work)
    for stage in (Quota(), Confirm()):
        assert step(stage, item, s.ctx) is None
    assert item.provider is not None
    s.state.provider(item.provider.provider_id).script(answer)
    step(Call(), item, s.ctx)
    return item, step(Classify(), item, s.ctx) or []


def events(outs: list[Out]) -> list[tuple[Status, str | None]]:
    return [(o.status, o.reason) for o in outs if isinstance(o, StatusEvent)]


def done(s: Setup, item: Prepared) -> dict[str, object]:
    lease = s.state.lease(item.work.message_id, item.work.record.attempt)
    assert lease is not None and lease.startswith("done:")
    value = orjson.loads(lease[5:])
    assert isinstance(value, dict)
    return value


def test_accepted_ends_provider_accepted_on_the_lease_and_keeps_the_gate() -> None:
    s = setup()
    item, outs = attempt(s, Answer())
    assert events(outs) == [(Status.PROVIDER_ACCEPTED, None)]
    assert done(s, item)
    assert s.state.gate(item.work.message_id) == SENDING


def test_permanent_fails_the_message() -> None:
    s = setup()
    _, outs = attempt(s, Answer(Outcome.PERMANENT, "invalid_recipient"))
    assert events(outs) == [(Status.FAILED, "invalid_recipient")]


def test_transient_schedules_the_next_attempt_and_clears_the_gate() -> None:
    s = setup()
    item, outs = attempt(s, Answer(Outcome.TRANSIENT, "server_error"))
    [(status, _)] = events(outs)
    assert status is Status.RETRY_PENDING
    [again] = [o for o in outs if isinstance(o, Retry)]
    assert again.record.attempt == 2 and again.record.not_before is not None
    assert done(s, item) and s.state.gate(item.work.message_id) is None
    assert s.state.cancel(item.work.message_id)


def test_ambiguous_p3_waits_for_a_receipt_with_a_check_record() -> None:
    s = setup(Tier.P3)
    _, outs = attempt(s, Answer(Outcome.AMBIGUOUS, "timeout"), tier=Tier.P3,
                      category="account")
    [ev] = [o for o in outs if isinstance(o, StatusEvent)]
    assert ev.status is Status.UNKNOWN and ev.next_attempt_at is not None
    [check] = [o for o in outs if isinstance(o, Retry)]
    assert check.record.unknown_check == 1 and check.record.attempt == 1
    assert ev.next_attempt_at - ev.occurred_at == s.settings.scaled(
        s.settings.unknown_resolution)


def test_ambiguous_p0_sends_again_at_once_elsewhere() -> None:
    s = setup(Tier.P0)
    item, outs = attempt(s, Answer(Outcome.AMBIGUOUS, "timeout"), tier=Tier.P0)
    [ev] = [o for o in outs if isinstance(o, StatusEvent)]
    assert ev.status is Status.UNKNOWN
    [nxt] = [o for o in outs if isinstance(o, Retry)]
    assert item.provider is not None
    assert nxt.record.attempt == 2 and nxt.record.avoid_provider == item.provider.provider_id
    assert nxt.record.not_before is not None
    assert nxt.record.not_before - ev.occurred_at < timedelta(seconds=1)


def test_a_throttled_account_holds_only_its_own_next_use() -> None:
    s = setup(Tier.P0)
    item, outs = attempt(s, Answer(Outcome.TRANSIENT, "rate_limited", retry_after_s=5.0),
                         tier=Tier.P0)
    assert events(outs) == [(Status.RETRY_PENDING, "rate_limited")]
    [again] = [o for o in outs if isinstance(o, Retry)]
    assert item.provider is not None
    pid = item.provider.provider_id
    assert again.record.avoid_provider == pid and again.record.provider_waits is not None
    assert again.record.provider_waits[pid] - s.clock() >= timedelta(seconds=4.5)
    assert again.record.not_before is not None
    assert again.record.not_before - s.clock() < timedelta(seconds=1)


def test_a_dead_address_is_suppressed_before_the_outcome_leaves() -> None:
    s = setup()
    item, outs = attempt(s, Answer(Outcome.PERMANENT, "unsubscribed",
                                   deactivate_recipient=True))
    assert events(outs) == [(Status.FAILED, "unsubscribed")]
    state = s.state.preferences.get("acme", item.work.recipient_hash)
    assert state is not None and state.suppressed == "unsubscribed"
