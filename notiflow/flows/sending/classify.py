"""Classify: what a provider's answer means for the message. Accepted → PROVIDER_ACCEPTED;
permanent → FAILED; ambiguous on a tier that waits → UNKNOWN and a check record; otherwise
the tier's retry policy: the next attempt (RETRY_PENDING, or UNKNOWN if ambiguous) or the
end (FAILED / EXPIRED, with a dead letter when the failures were unexplained). An account's
``Retry-After`` holds the next attempt only while no other account can carry the message
(``provider_waits``): P0's alternate provider is tried at once."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.flows.model import Out, Retry, Work
from notiflow.flows.policy import RetryPolicy, held_for, provider_waits
from notiflow.flows.sending.context import SendContext
from notiflow.flows.sending.emit import finish
from notiflow.flows.sending.metrics import metrics
from notiflow.flows.sending.route import candidates
from notiflow.flows.steps import retry_record
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import AttemptRecord, DlqRecord
from notiflow.schemas.preferences import Suppression

log = logging.getLogger("notiflow.flows.dispatch")

NO_ANSWER = frozenset({"connect_error", "connect_timeout", "timeout", "connection_lost"})
"""Transient reasons where no provider answered: an outage of the provider or of the path."""


def unexplained_category(reason: str | None) -> str | None:
    """The DLQ category of a budget that ran out on ``reason``, or None when the last failure
    was a provider's answer (FAILED only, no dead letter): our own exception → ``bug``
    (escalate); no answer at all → ``provider_outage`` (a bulk-replay candidate)."""
    if (reason or "").startswith("internal_error"):
        return "bug"
    return "provider_outage" if reason in NO_ANSWER else None


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


def attempt_from_row(row: dict[str, Any]) -> AttemptRecord | None:
    """A row of Cassandra ``attempts`` as an :class:`AttemptRecord` (None if incomplete)."""
    def aware(d: datetime | None) -> datetime | None:
        return d.replace(tzinfo=UTC) if d is not None and d.tzinfo is None else d

    try:
        return AttemptRecord(
            attempt_no=row["attempt_no"], provider_id=row["provider_id"],
            outcome=row["outcome"], provider_message_id=row.get("provider_message_id"),
            normalized_error=row.get("normalized_error"), error_code=row.get("error_code"),
            started_at=aware(row.get("started_at")), completed_at=aware(row.get("completed_at")))
    except (KeyError, ValueError):
        return None


def suppression_of(reason: str, channel: Channel) -> Suppression:
    """What a provider's "this address is dead" answer suppresses the recipient for."""
    if reason == "unsubscribed":
        return "unsubscribed"
    if channel is Channel.CHAT:
        return "webhook_revoked"
    return "token_deactivated" if channel is Channel.PUSH else "hard_bounce"


class Classify:
    """``await Classify()(ctx, w, result, content_key, msg)`` → the attempt's outputs (its
    end recorded on its lease)."""

    async def __call__(self, ctx: SendContext, w: Work, result: SendResult,
                       content_key: str | None, msg: OutboundMessage | None = None
                       ) -> list[Out]:
        detail = attempt_detail(w, result)
        at = result.completed_at
        r = w.record
        if result.deactivate_recipient:
            await self._suppress(ctx, w, result)
        if result.outcome is Outcome.ACCEPTED:
            latency = max(0.0, (at - w.accepted_at).total_seconds())
            metrics.accept_to_provider.record(latency, {
                "tier": r.tier.value, "channel": r.channel.value,
                "provider": result.provider_id})
            if r.tier is Tier.P0:
                ctx.p0_latencies.add(latency)
            return await finish(ctx, w, ctx.event(w, Status.PROVIDER_ACCEPTED, at,
                                                  detail=detail))
        if result.outcome is Outcome.PERMANENT:
            return await finish(ctx, w, ctx.event(w, Status.FAILED, at, reason=result.reason,
                                                  detail=detail), content_key)
        if (result.outcome is Outcome.AMBIGUOUS
                and ctx.settings.policy(r.tier).on_ambiguous == "wait"):
            check_at = at + ctx.settings.scaled(ctx.settings.unknown_resolution)
            check = r.model_copy(update={"unknown_check": r.attempt, "not_before": check_at})
            return await finish(ctx, w, ctx.event(
                w, Status.UNKNOWN, at, reason=result.reason, detail=detail,
                next_attempt_at=check_at), follow=[Retry(w, check)])
        retry_after = timedelta(seconds=result.retry_after_s) if result.retry_after_s else None
        waits = provider_waits(r.provider_waits, result.provider_id, retry_after, at)
        hold = held_for(waits, (c.provider_id for c in candidates(ctx, w)), at)
        assert r.expires_at is not None
        decision = RetryPolicy.for_tier(ctx.settings, r.tier).after_failure(
            r.attempt, at, r.expires_at, hold, ctx.rng, budget_base=r.budget_base or 1)
        if decision.next_attempt is not None and decision.next_attempt_at is not None:
            metrics.retries.add(1, {"tier": r.tier.value, "channel": r.channel.value})
            nxt = retry_record(w, decision.next_attempt, decision.next_attempt_at)
            nxt = Retry(w, nxt.record.model_copy(update={"avoid_provider": result.provider_id,
                                                         "provider_waits": waits}))
            status = Status.UNKNOWN if result.outcome is Outcome.AMBIGUOUS else \
                Status.RETRY_PENDING
            return await finish(ctx, w, ctx.event(
                w, status, at, reason=result.reason, detail=detail,
                next_attempt_at=decision.next_attempt_at), follow=[nxt])
        status = Status.EXPIRED if decision.give_up == "expires_before_retry" else Status.FAILED
        category = unexplained_category(result.reason)
        dead = [await self._unexplained(ctx, w, detail, at, msg, category)] if category else []
        return await finish(ctx, w, ctx.event(w, status, at, reason=decision.give_up,
                                              detail=detail), content_key, follow=dead)

    async def _suppress(self, ctx: SendContext, w: Work, result: SendResult) -> None:
        """The provider says the address or token is dead: suppress it for later messages;
        a dead push token's registered devices are also marked inactive
        (``<provider>:<reason>``)."""
        reason = result.reason or "deactivated"
        suppression = suppression_of(reason, w.record.channel)
        tenant = w.record.tenant_id
        try:
            if suppression == "token_deactivated":
                await ctx.ports.preferences.deactivate_token(
                    tenant, w.recipient_hash, f"{result.provider_id}:{reason}")
            else:
                await ctx.ports.preferences.suppress(tenant, w.recipient_hash, suppression)
        except Exception as exc:
            log.warning("could not record suppression for %s: %r", w.message_id, exc)

    async def _unexplained(self, ctx: SendContext, w: Work, detail: AttemptRecord,
                           now: datetime, msg: OutboundMessage | None,
                           category: str) -> DlqRecord:
        """The DLQ record of a message whose budget ran out on unexplained failures: every
        attempt known to Cassandra plus the last one, and the rendered message (encrypted)."""
        attempts = {detail.attempt_no: detail}
        try:
            for row in await ctx.ports.messages.attempts(w.message_id):
                a = attempt_from_row(row)
                if a is not None:
                    attempts.setdefault(a.attempt_no, a)
        except Exception as exc:
            log.warning("attempts of %s not read for its dead letter: %r", w.message_id, exc)
        rec = ctx.dead_letter(w, "retries exhausted after unexplained failures "
                              f"({detail.normalized_error})", "exhausted_unexplained",
                              category, now, attempts=(attempts[k] for k in sorted(attempts)))
        if msg is None:
            return rec
        rendered = orjson.dumps({"subject": msg.subject, "body": msg.body})
        return rec.model_copy(update={"rendered_encrypted": ctx.cipher.encrypt(rendered)})
