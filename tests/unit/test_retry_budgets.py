"""Retry budgets per tier, driven through the clock: P0 two attempts on one vendor within
seconds, then one failover attempt, then the DLQ; P1 five attempts over 30 minutes
alternating vendors; P2 three over 4 hours; P3 four as before. Each retry falls in its own
window of the budget (full jitter within it, so no draw ends a budget early), a P1 message
outlives a 3-minute outage, and an exhausted budget ends FAILED ``retries_exhausted`` with a
dead letter that carries every attempt and re-enters the flow with a fresh budget."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.fernet import Fernet
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.providers.base import Outcome, SendResult
from notiflow.adapters.rows import AttemptRow
from notiflow.flows.common.guard import DlqGuard
from notiflow.flows.common.items import Retry, SourceRef, Work
from notiflow.flows.send.policy import RetryPolicy
from notiflow.flows.send.stages.classifying import Classify
from notiflow.flows.send.stages.context import SendContext
from notiflow.flows.send.stages.route import candidates
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import DlqRecord, IngestRecord, StatusEvent
from notiflow.settings import DlqRule, RetryBudget, Settings, TierPolicy
from tests.fakes import ManualClock
from tests.helpers import partial_ports

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
SETTINGS = Settings()
SEEDS = st.integers(0, 2**32 - 1)


class Leases:
    def lease_key(self, message_id: str, attempt: int) -> str:
        return f"lease:{message_id}:{attempt}"

    def gate_key(self, message_id: str) -> str:
        return f"gate:{message_id}"

    async def finish(self, items: list[Any], ttl: timedelta, clear: list[str]) -> None:
        return None

    async def release_content(self, items: list[tuple[str, str]]) -> None:
        return None


@dataclass
class Attempts:
    """Cassandra's ``attempts`` rows of the message, as the reconciler writes them."""

    rows: list[AttemptRow] = field(default_factory=list)

    async def attempts(self, message_id: str) -> list[AttemptRow]:
        return list(self.rows)


class Breakers:
    def weight(self, provider_id: str) -> float:
        return 1.0


@dataclass
class Run:
    """One message driven through its budget: each attempt's start and account, every
    output, and the clock when it ended."""

    tries: list[tuple[datetime, str]]
    outs: list[Any]
    ended_at: datetime

    @property
    def end(self) -> StatusEvent:
        return [o for o in self.outs if isinstance(o, StatusEvent)][-1]

    @property
    def letters(self) -> list[DlqRecord]:
        return [o for o in self.outs if isinstance(o, DlqRecord)]

    def offsets(self) -> list[timedelta]:
        """Each attempt's start after the first attempt failed."""
        first = self.tries[0][0]
        return [t - first for t, _ in self.tries]


def record(tier: Tier, **extra: Any) -> IngestRecord:
    return IngestRecord.model_validate({
        "channel": "SMS", "tier": tier.value, "recipient": "+14155550100",
        "template_id": "otp", "template_version": 1, "tenant_id": "acme",
        "category": "transactional", "message_id": "msg_budget",
        "accepted_at": NOW.isoformat(),
        "expires_at": (NOW + SETTINGS.tier_ttl(tier)).isoformat(), **extra})


def failing(t: datetime, provider: str) -> SendResult:
    return SendResult(Outcome.TRANSIENT, provider, t, t, reason="server_error",
                      error_code="503")


def drive(tier: Tier, seed: int, answer: Any = failing, rec: IngestRecord | None = None,
          settings: Settings = SETTINGS, start: datetime = NOW) -> Run:
    """Send ``rec`` (a fresh message of ``tier``) until its outcome has no retry: each
    attempt goes to the account the router ranks first, at the time its record is due, and
    ``answer(t, provider)`` is what that account answers."""
    clock = ManualClock(start)
    attempts = Attempts()
    ctx = SendContext(settings, tier, settings.policy(tier), DlqCipher(Fernet.generate_key()),
                      clock, random.Random(seed), f"send.{tier.value.lower()}")
    ctx.attach(partial_ports(leases=Leases(), messages=attempts, breakers=Breakers(),
                             providers={"twilio": object(), "vonage": object()}))
    step = Classify()
    r = rec or record(tier)
    tries: list[tuple[datetime, str]] = []
    outs: list[Any] = []
    while True:
        w = Work(r, SourceRef(settings.ingest_topic(Channel.SMS, tier), 0, len(tries)),
                 r.model_dump_json().encode(), None)
        provider = candidates(ctx, w)[0].provider_id
        tries.append((clock.now, provider))
        result = answer(clock.now, provider)
        clock.now = result.completed_at
        out = asyncio.run(step.classify(ctx, w, result, None))
        outs += out
        ev = out[0]
        assert isinstance(ev, StatusEvent) and ev.attempt_detail is not None
        d = ev.attempt_detail
        attempts.rows.append(AttemptRow(
            w.message_id, d.attempt_no, d.provider_id, d.provider_message_id, d.outcome,
            d.normalized_error, d.error_code, d.started_at, d.completed_at))
        retries = [o for o in out if isinstance(o, Retry)]
        if not retries:
            return Run(tries, outs, clock.now)
        r = retries[0].record
        assert r.not_before is not None and r.not_before >= clock.now
        clock.now = r.not_before


def budget(tier: Tier) -> RetryBudget:
    return SETTINGS.policy(tier).retry


# the schedules, per tier --------------------------------------------------------------------


@pytest.mark.parametrize(("tier", "attempts", "span"), [
    (Tier.P0, 3, timedelta(seconds=60)),
    (Tier.P1, 5, timedelta(minutes=30)),
    (Tier.P2, 3, timedelta(hours=4)),
    (Tier.P3, 4, timedelta(hours=2, minutes=35)),
])
def test_tier_budgets_are_the_designs(tier: Tier, attempts: int, span: timedelta) -> None:
    b = budget(tier)
    assert (b.attempts, b.span) == (attempts, span)
    assert sum(b.caps, timedelta(0)) <= b.span <= SETTINGS.policy(tier).ttl


@given(seed=SEEDS, tier=st.sampled_from(list(Tier)))
def test_every_attempt_falls_in_its_window_within_the_span(seed: int, tier: Tier) -> None:
    """A budget that fails throughout: exactly ``attempts`` attempts, retry ``n`` inside its
    window ``[S(n-1), S(n))`` after the first failure, the last within the span, then FAILED
    ``retries_exhausted`` and one dead letter."""
    run = drive(tier, seed)
    b = budget(tier)
    policy = RetryPolicy.for_tier(SETTINGS, tier)
    offsets = run.offsets()
    assert len(offsets) == b.attempts
    for n, offset in enumerate(offsets[1:], start=1):
        lo, hi = policy.window(n)
        assert lo <= offset <= hi
    assert offsets[-1] <= b.span
    assert (run.end.status, run.end.reason) == (Status.FAILED, "retries_exhausted")
    assert len(run.letters) == 1


@given(seed=SEEDS)
def test_p0_fails_over_after_its_second_attempt_then_dead_letters(seed: int) -> None:
    run = drive(Tier.P0, seed)
    [(_, first), (_, second), (_, third)] = run.tries
    assert first == second and third != first
    assert run.offsets()[-1] < timedelta(seconds=3)
    assert run.end.status is Status.FAILED
    [letter] = run.letters
    assert letter.tier is Tier.P0
    assert [a.provider_id for a in letter.attempts] == [first, first, third]


@given(seed=SEEDS)
def test_p1_alternates_vendors_and_spreads_over_thirty_minutes(seed: int) -> None:
    run = drive(Tier.P1, seed)
    providers = [p for _, p in run.tries]
    assert all(a != b for a, b in itertools.pairwise(providers))
    assert set(providers) == {"twilio", "vonage"}
    assert timedelta(minutes=6) <= run.offsets()[-1] <= timedelta(minutes=28)


@given(seed=SEEDS)
def test_p2_makes_three_attempts_over_four_hours(seed: int) -> None:
    offsets = drive(Tier.P2, seed).offsets()
    assert len(offsets) == 3
    assert timedelta(minutes=30) <= offsets[-1] <= timedelta(hours=3, minutes=30)


@given(seed=SEEDS)
def test_a_p1_message_outlives_a_three_minute_outage(seed: int) -> None:
    """Both vendors fail for 3 minutes from the first attempt: at minute 3 the message is
    still waiting for a retry (not FAILED), and it is accepted after the outage."""
    outage_ends = NOW + timedelta(minutes=3)

    def answer(t: datetime, provider: str) -> SendResult:
        if t < outage_ends:
            return failing(t, provider)
        return SendResult(Outcome.ACCEPTED, provider, t, t, provider_message_id="pm_1")

    run = drive(Tier.P1, seed, answer)
    before = [o for o in run.outs if isinstance(o, StatusEvent)
              and o.occurred_at <= outage_ends]
    assert before and before[-1].status is Status.RETRY_PENDING
    assert run.end.status is Status.PROVIDER_ACCEPTED and not run.letters


def test_time_scale_shrinks_the_schedule_with_the_ttl() -> None:
    s = Settings(time_scale=0.01)
    ttl = s.tier_ttl(Tier.P1)
    run = drive(Tier.P1, 3, settings=s, rec=record(Tier.P1, expires_at=(NOW + ttl).isoformat()))
    assert len(run.tries) == 5
    assert run.offsets()[-1] <= budget(Tier.P1).span * 0.01


def test_a_retry_that_would_land_after_expiry_ends_expired_without_a_dead_letter() -> None:
    rec = record(Tier.P1, expires_at=(NOW + timedelta(seconds=70)).isoformat())
    run = drive(Tier.P1, 5, rec=rec)
    assert (run.end.status, run.end.reason) == (Status.EXPIRED, "expires_before_retry")
    assert run.letters == []


def test_a_retry_held_past_its_window_keeps_the_cap_as_its_spacing() -> None:
    """A retry that waited past its whole window (breakers, ``Retry-After``) is drawn from
    ``[now, now + cap)`` instead of being sent at once with the next one."""
    p = RetryPolicy.for_tier(SETTINGS, Tier.P1)
    first = NOW - timedelta(hours=1)
    for seed in range(50):
        d = p.after_failure(3, NOW, NOW + timedelta(days=1), rng=random.Random(seed),
                            budget_started_at=first)
        assert d.next_attempt_at is not None and d.budget_started_at == first
        assert NOW <= d.next_attempt_at <= NOW + p.caps[2]


def test_a_longer_retry_after_still_wins() -> None:
    p = RetryPolicy.for_tier(SETTINGS, Tier.P1)
    d = p.after_failure(2, NOW, NOW + timedelta(days=1), timedelta(minutes=5),
                        random.Random(1), budget_started_at=NOW - timedelta(seconds=5))
    assert d.next_attempt_at == NOW + timedelta(minutes=5)


# exhaustion --------------------------------------------------------------------------------


def test_exhaustion_is_a_dead_letter_with_full_context_and_a_failed_status() -> None:
    run = drive(Tier.P1, 11)
    assert (run.end.status, run.end.reason) == (Status.FAILED, "retries_exhausted")
    [letter] = run.letters
    assert (letter.error_class, letter.category) == ("retries_exhausted", "provider_outage")
    assert (letter.tier, letter.tenant_id, letter.message_id) == (Tier.P1, "acme",
                                                                    "msg_budget")
    assert [a.attempt_no for a in letter.attempts] == [1, 2, 3, 4, 5]
    assert letter.headers["channel"] == "SMS"
    assert "5 attempts over" in letter.reason and "last server_error" in letter.reason
    assert "twilio" in letter.reason and "vonage" in letter.reason
    assert "+1415" not in letter.reason


def test_a_replayed_exhaustion_gets_a_fresh_budget_from_its_own_first_failure() -> None:
    """``notiflow dlq replay`` sends the record with ``attempt = budget_base = 6``; the old
    budget's ``budget_started_at`` it still carries is ignored: five more attempts, spread
    from the replay's first failure."""
    stale = NOW - timedelta(hours=2)
    later = NOW + timedelta(hours=1)
    rec = record(Tier.P1, attempt=6, budget_base=6, budget_started_at=stale.isoformat(),
                 expires_at=(later + timedelta(minutes=30)).isoformat())
    run = drive(Tier.P1, 4, rec=rec, start=later)
    assert len(run.tries) == 5
    assert run.offsets()[-1] >= timedelta(minutes=6)
    assert run.end.reason == "retries_exhausted" and len(run.letters) == 1


def test_an_internal_error_stays_an_unexplained_bug() -> None:
    def raising(t: datetime, provider: str) -> SendResult:
        return SendResult(Outcome.TRANSIENT, provider, t, t, reason="internal_error:KeyError")

    [letter] = drive(Tier.P1, 2, raising).letters
    assert (letter.error_class, letter.category) == ("exhausted_unexplained", "bug")


def test_a_provider_outage_exhausting_many_budgets_does_not_halt_the_tier() -> None:
    """Every tenant's P1 messages exhaust during an outage of both vendors: 1,000 dead
    letters in a row from 40 tenants neither halt the flow nor quarantine anyone."""
    letter = drive(Tier.P1, 7).letters[0]
    guard = DlqGuard(DlqRule(), "send.p1")
    for i in range(1000):
        guard(letter.model_copy(update={"tenant_id": f"t{i % 40}", "dlq_id": f"d{i}"}))
    assert guard.quarantined == frozenset()


# configuration -----------------------------------------------------------------------------


def test_a_budget_is_configured_per_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    p1 = SETTINGS.policy(Tier.P1).model_dump(mode="json")
    p1["retry"] = {"attempts": 3, "caps": [60, 600], "span": 900, "failover_after": 2}
    monkeypatch.setenv("NOTIFLOW_TIERS", json.dumps({"P1": p1}))
    s = Settings()
    assert s.policy(Tier.P1).retry == RetryBudget(
        attempts=3, caps=(timedelta(minutes=1), timedelta(minutes=10)),
        span=timedelta(minutes=15), failover_after=2)
    assert s.policy(Tier.P0).retry == budget(Tier.P0)
    assert len(drive(Tier.P1, 1, settings=s).tries) == 3


@pytest.mark.parametrize(("retry", "why"), [
    ({"attempts": 3, "caps": [1], "span": 60}, "need 2 caps"),
    ({"attempts": 2, "caps": [-1], "span": 60}, "negative"),
    ({"attempts": 3, "caps": [50, 50], "span": 60}, "sum to more than the span"),
])
def test_a_budget_that_does_not_add_up_is_refused(retry: dict[str, Any], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        RetryBudget.model_validate(retry)


def test_a_budget_longer_than_the_ttl_is_refused() -> None:
    p0 = SETTINGS.policy(Tier.P0).model_dump()
    p0["retry"] = {"attempts": 2, "caps": [90], "span": 90}
    with pytest.raises(ValidationError, match="exceeds the tier's ttl"):
        TierPolicy.model_validate(p0)
