"""Classify: what a provider's answer means for the message. Accepted → PROVIDER_ACCEPTED;
permanent → FAILED; ambiguous on a tier that waits → UNKNOWN and a check record; otherwise
the tier's retry budget: the next attempt (RETRY_PENDING, or UNKNOWN if ambiguous) or the
end: FAILED ``retries_exhausted`` with a dead letter carrying every attempt, or EXPIRED
(with a dead letter when the last failure was unexplained). An account's ``Retry-After``
holds the next attempt only while no other account can carry the message
(``provider_waits``): P0's alternate provider is tried at once. An answer that says the
recipient is dead is written to the preference store before the outcome leaves
(:meth:`Classify._suppress`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import orjson

from notiflow.adapters.preferences import PREFERENCE_OUTAGE
from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.retrying import Monotonic, until_up
from notiflow.adapters.rows import AttemptRow
from notiflow.flows.common.items import Out, Retry, Work
from notiflow.flows.common.steps import retry_record
from notiflow.flows.send.policy import RetryDecision, RetryPolicy, held_for, provider_waits
from notiflow.flows.send.stages.context import INFRA_RETRY_FOR, InfraUnavailable, SendContext
from notiflow.flows.send.stages.emit import finish
from notiflow.flows.send.stages.metrics import metrics
from notiflow.flows.send.stages.route import candidates
from notiflow.flows.send.stages.send_batch import Prepared
from notiflow.redact import recipient_hashes
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import AttemptRecord, DlqRecord
from notiflow.schemas.preferences import Suppression

log = logging.getLogger("notiflow.flows.dispatch")


NO_ANSWER = frozenset({"connect_error", "connect_timeout", "timeout", "connection_lost"})
"""Transient reasons where no provider answered: an outage of the provider or of the path."""


EXHAUSTED = ("retries_exhausted", "provider_outage")
"""(error class, category) of a message whose retries a provider's failures used up: the
provider's fault, not the tenant's nor a flow fault (a bulk-replay candidate once the
provider is back; ``flows/common/guard.py`` counts it toward neither a halt nor, outside chat, a
quarantine)."""
UNEXPLAINED = ("exhausted_unexplained", "bug")
"""(error class, category) when the last failure was our own exception (escalate)."""


def exhaustion_letter(give_up: str | None, reason: str | None) -> tuple[str, str] | None:
    """The (error class, category) of the dead letter that ends a message whose retries
    ended with ``give_up`` after a failure with ``reason``, or None for no dead letter. An
    exhausted budget is always dead-lettered; a message that expires before its next
    attempt only when the last failure was unexplained (our exception, or no answer)."""
    if (reason or "").startswith("internal_error"):
        return UNEXPLAINED
    if give_up == "retries_exhausted" or reason in NO_ANSWER:
        return EXHAUSTED
    return None


def fails_over(decision: RetryDecision, ambiguous: bool, retry_after: timedelta | None) -> bool:
    """Whether the next attempt ranks the account that just failed last: the budget moves
    to the next vendor now, or the account may have the message already (ambiguous: send
    again elsewhere), or it asked to wait (its ``Retry-After`` binds that account)."""
    return decision.failover or ambiguous or retry_after is not None


def exhaustion_reason(give_up: str | None, tried: list[AttemptRecord], last: AttemptRecord,
                      started: datetime | None, now: datetime) -> str:
    """The dead letter's reason: how the retries ended, how many attempts over how long
    (from the budget's first failure), the last failure, the providers tried in order."""
    providers = list(dict.fromkeys(a.provider_id for a in tried))
    took = f" over {int((now - started).total_seconds())} s" if started else ""
    end = "expired before its next attempt" if give_up == "expires_before_retry" else \
        "retries exhausted"
    return (f"{end}: {len(tried)} attempts{took}, last {last.normalized_error or 'transient'}"
            f"; providers tried: {', '.join(providers)}")


def attempt_detail(work: Work, result: SendResult) -> AttemptRecord:
    """The attempt as events and Cassandra record it."""
    return AttemptRecord(
        attempt_no=work.record.attempt,
        provider_id=result.provider_id,
        outcome=result.outcome.value,
        provider_message_id=result.provider_message_id,
        normalized_error=result.reason,
        error_code=result.error_code,
        retry_after_s=result.retry_after_s,
        started_at=result.started_at,
        completed_at=result.completed_at,
    )


def attempt_from_row(row: AttemptRow) -> AttemptRecord | None:
    """A row of Cassandra ``attempts`` as an :class:`AttemptRecord` (None if incomplete)."""
    try:
        return AttemptRecord(
            attempt_no=row.attempt_no, provider_id=row.provider_id, outcome=row.outcome,
            provider_message_id=row.provider_message_id,
            normalized_error=row.normalized_error, error_code=row.error_code,
            started_at=row.started_at, completed_at=row.completed_at)
    except ValueError:
        return None


def suppression_of(reason: str, channel: Channel) -> Suppression:
    """What a provider's "this address is dead" answer suppresses the recipient for."""
    if reason == "unsubscribed":
        return "unsubscribed"
    if channel is Channel.CHAT:
        return "webhook_revoked"
    return "token_deactivated" if channel is Channel.PUSH else "hard_bounce"


class Classify:
    """Per message, last: the outputs of the attempt's ``item.result`` (its end recorded on
    its lease), from :meth:`classify`. ``retry_for``, ``sleep`` and ``monotonic``: how long
    a suppression write is retried, how it waits between tries and the clock ``retry_for``
    is measured on (tests pass a ``sleep`` that moves their clock)."""

    def __init__(self, retry_for: timedelta = INFRA_RETRY_FOR,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 monotonic: Monotonic = time.monotonic) -> None:
        self.retry_for = retry_for
        self.sleep = sleep
        self.monotonic = monotonic

    def __call__(self, item: Prepared, ctx: SendContext) -> Awaitable[list[Out]]:
        assert item.result is not None
        return self.classify(ctx, item.work, item.result, item.content_key, item.message)

    async def classify(self, ctx: SendContext, w: Work, result: SendResult,
                       content_key: str | None, msg: OutboundMessage | None = None
                       ) -> list[Out]:
        """``result`` of ``w``'s attempt → its outputs."""
        detail = attempt_detail(w, result)
        at = result.completed_at
        r = w.record
        lost = await self._suppress(ctx, w, result) if result.deactivate_recipient else []
        if result.outcome is Outcome.ACCEPTED:
            latency = max(0.0, (at - w.accepted_at).total_seconds())
            metrics.accept_to_provider.record(latency, {
                "tier": r.tier.value, "channel": r.channel.value,
                "provider": result.provider_id})
            if r.tier is Tier.P0:
                ctx.p0_latencies.add(latency)
            return await finish(ctx, w, ctx.event(w, Status.PROVIDER_ACCEPTED, at,
                                                  detail=detail), follow=lost)
        if result.outcome is Outcome.PERMANENT:
            return await finish(ctx, w, ctx.event(w, Status.FAILED, at, reason=result.reason,
                                                  detail=detail), content_key, follow=lost)
        if (result.outcome is Outcome.AMBIGUOUS
                and ctx.settings.policy(r.tier).on_ambiguous == "wait"):
            check_at = at + ctx.settings.scaled(ctx.settings.unknown_resolution)
            check = r.model_copy(update={"unknown_check": r.attempt, "not_before": check_at})
            return await finish(ctx, w, ctx.event(
                w, Status.UNKNOWN, at, reason=result.reason, detail=detail,
                next_attempt_at=check_at), follow=[*lost, Retry(w, check)])
        retry_after = timedelta(seconds=result.retry_after_s) if result.retry_after_s else None
        waits = provider_waits(r.provider_waits, result.provider_id, retry_after, at)
        hold = held_for(waits, (c.provider_id for c in candidates(ctx, w)), at)
        assert r.expires_at is not None
        decision = RetryPolicy.for_tier(ctx.settings, r.tier).after_failure(
            r.attempt, at, r.expires_at, hold, ctx.rng, budget_base=r.budget_base or 1,
            budget_started_at=r.budget_started_at)
        ambiguous = result.outcome is Outcome.AMBIGUOUS
        if decision.next_attempt is not None and decision.next_attempt_at is not None:
            metrics.retries.add(1, {"tier": r.tier.value, "channel": r.channel.value})
            nxt = retry_record(w, decision.next_attempt, decision.next_attempt_at)
            avoid = result.provider_id if fails_over(decision, ambiguous, retry_after) else None
            nxt = Retry(w, nxt.record.model_copy(update={
                "avoid_provider": avoid, "provider_waits": waits,
                "budget_started_at": decision.budget_started_at}))
            status = Status.UNKNOWN if ambiguous else Status.RETRY_PENDING
            return await finish(ctx, w, ctx.event(
                w, status, at, reason=result.reason, detail=detail,
                next_attempt_at=decision.next_attempt_at), follow=[*lost, nxt])
        status = Status.EXPIRED if decision.give_up == "expires_before_retry" else Status.FAILED
        kind = exhaustion_letter(decision.give_up, result.reason)
        dead = [await self._exhausted(ctx, w, detail, at, msg, kind, decision.give_up)] \
            if kind else []
        return await finish(ctx, w, ctx.event(w, status, at, reason=decision.give_up,
                                              detail=detail), content_key,
                            follow=[*lost, *dead])

    async def _suppress(self, ctx: SendContext, w: Work, result: SendResult) -> list[Out]:
        """The provider says the address or token is dead: suppress it for later messages;
        a dead push token's registered devices are also marked inactive
        (``<provider>:<reason>``). Done before the outcome leaves, never dropped: while the
        store or the preference topic is down (``preferences.PREFERENCE_OUTAGE``) the write
        is retried and the message waits, for ``retry_for``, then :class:`InfraUnavailable`
        stops the flow (the record is sent and written again after the restart: the writes
        are idempotent); any other failure is returned as a dead letter
        (``suppression_not_recorded``, category ``bug``) that leaves with the outcome."""
        reason = result.reason or "deactivated"
        suppression = suppression_of(reason, w.record.channel)
        tenant = w.record.tenant_id
        prefs = ctx.ports.preferences

        async def write() -> object:
            if suppression == "token_deactivated":
                current, *older = recipient_hashes(tenant, w.record.recipient_key())
                return await prefs.deactivate_token(tenant, current,
                                                    f"{result.provider_id}:{reason}",
                                                    older=tuple(older))
            return await prefs.suppress(tenant, w.recipient_hash, suppression)

        try:
            await until_up("suppression", write, log, first=0.2, most=5.0,
                           give_up_after=self.retry_for, on=PREFERENCE_OUTAGE, sleep=self.sleep,
                           monotonic=self.monotonic)
        except PREFERENCE_OUTAGE as exc:
            raise InfraUnavailable(f"suppression store unavailable for {self.retry_for}") \
                from exc
        except Exception as exc:
            log.error("suppression of %s not recorded: %r", w.message_id, exc)
            return [ctx.dead_letter(
                w, f"{suppression} not recorded ({type(exc).__name__})",
                "suppression_not_recorded", "bug", ctx.clock())]
        return []

    async def _exhausted(self, ctx: SendContext, w: Work, detail: AttemptRecord,
                         now: datetime, msg: OutboundMessage | None, kind: tuple[str, str],
                         give_up: str | None) -> DlqRecord:
        """The DLQ record of a message whose retries ran out: every attempt known to
        Cassandra plus the last one, a reason naming the attempts, the time they took, the
        last failure and the providers tried, and the rendered message (encrypted)."""
        attempts = {detail.attempt_no: detail}
        try:
            for row in await ctx.ports.messages.attempts(w.message_id):
                a = attempt_from_row(row)
                if a is not None:
                    attempts.setdefault(a.attempt_no, a)
        except Exception as exc:
            log.warning("attempts of %s not read for its dead letter: %r", w.message_id, exc)
        tried = [attempts[k] for k in sorted(attempts)]
        reason = exhaustion_reason(give_up, tried, detail, w.record.budget_started_at, now)
        rec = ctx.dead_letter(w, reason, *kind, now, attempts=tried)
        if msg is None:
            return rec
        rendered = orjson.dumps({"subject": msg.subject, "body": msg.body})
        return rec.model_copy(update={"rendered_encrypted": ctx.cipher.encrypt(rendered)})
