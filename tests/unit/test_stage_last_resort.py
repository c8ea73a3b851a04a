"""The LastResort stage on memory ports: a forced P0 send that failed transiently waits on
the same attempt, its lease and gate freed; any other answer passes on at once (no await)."""

from __future__ import annotations

from datetime import datetime, timedelta

from notiflow.adapters.cancel_gate import SENDING
from notiflow.adapters.providers.base import Outcome, SendResult
from notiflow.flows.common.items import Retry
from notiflow.flows.send.routing import Choice
from notiflow.flows.send.stages.confirm import Confirm
from notiflow.flows.send.stages.route import LastResort
from notiflow.flows.send.stages.send_batch import Prepared
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import StatusEvent
from tests.unit.memory_send import Setup, leased, prepared, setup, step, work


def answered(s: Setup, outcome: Outcome, last_resort: bool, n: int = 0, *,
             retry_after_s: float | None = None, accepted_at: datetime | None = None
             ) -> Prepared:
    extra = {"accepted_at": accepted_at.isoformat()} if accepted_at else {}
    item = prepared(work(s, n, Tier.P0, **extra))
    leased(s, item.work)
    assert step(Confirm(), item, s.ctx) is None
    now = s.clock()
    item.choice = Choice("twilio", False, last_resort=last_resort)
    item.result = SendResult(outcome, "twilio", now, now,
                             reason=None if outcome is Outcome.ACCEPTED else "server_error",
                             retry_after_s=retry_after_s)
    return item


def test_any_answer_but_a_failed_forced_send_passes_at_once() -> None:
    s = setup(Tier.P0)
    for n, (outcome, forced) in enumerate(((Outcome.ACCEPTED, True),
                                           (Outcome.PERMANENT, True),
                                           (Outcome.TRANSIENT, False))):
        assert LastResort()(answered(s, outcome, forced, n), s.ctx) is None


def test_a_failed_forced_send_waits_on_the_same_attempt_and_frees_the_gate() -> None:
    s = setup(Tier.P0)
    item = answered(s, Outcome.TRANSIENT, True)
    assert s.state.gate(item.work.message_id) == SENDING
    outs = step(LastResort(), item, s.ctx) or []
    [ev] = [o for o in outs if isinstance(o, StatusEvent)]
    assert ev.status is Status.RETRY_PENDING and ev.reason == "last_resort_failed:server_error"
    [again] = [o for o in outs if isinstance(o, Retry)]
    assert again.record.attempt == 1 and again.record.avoid_provider == "twilio"
    wait = s.settings.scaled(s.settings.policy(Tier.P0).last_resort_wait)
    assert again.record.not_before is not None
    assert again.record.not_before - ev.occurred_at >= max(wait, timedelta(milliseconds=100))
    assert s.state.gate(item.work.message_id) is None
    assert s.state.lease(item.work.message_id, 1) is None


def test_the_wait_grows_with_the_age_and_the_providers_retry_after() -> None:
    s = setup(Tier.P0)
    old = answered(s, Outcome.TRANSIENT, True, accepted_at=s.clock() - timedelta(seconds=40))
    [again] = [o for o in step(LastResort(), old, s.ctx) or [] if isinstance(o, Retry)]
    assert again.record.not_before is not None
    assert again.record.not_before - s.clock() >= timedelta(seconds=10)
    told = answered(s, Outcome.TRANSIENT, True, 1, retry_after_s=20.0)
    [later] = [o for o in step(LastResort(), told, s.ctx) or [] if isinstance(o, Retry)]
    assert later.record.not_before is not None
    assert later.record.not_before - s.clock() >= timedelta(seconds=20)


