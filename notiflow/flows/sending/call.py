"""Send: one provider call inside its span, counted, timed, and told to the provider's
breaker. A provider adapter that raises (a bug: adapters answer with a result) becomes a
transient ``internal_error`` result that the breaker does not count; nor does it count a
last-resort send (its breaker had refused it: ``flows/sending/route.py``)."""

from __future__ import annotations

import logging
import time

from notiflow import names, stages, telemetry
from notiflow.adapters.providers.base import (
    OutboundMessage,
    Outcome,
    ProviderClient,
    SendResult,
)
from notiflow.flows.model import Work
from notiflow.flows.routing import Choice
from notiflow.flows.sending.context import SendContext
from notiflow.flows.sending.metrics import metrics
from notiflow.names import Stage

log = logging.getLogger("notiflow.flows.dispatch")


class Call:
    """``await Call()(ctx, w, provider, msg, choice)`` → the provider's :class:`SendResult`."""

    async def __call__(self, ctx: SendContext, w: Work, provider: ProviderClient,
                       msg: OutboundMessage, choice: Choice) -> SendResult:
        started = time.monotonic()
        with telemetry.span(names.PROVIDER_CALL, {
                names.ATTR_MESSAGE_ID: w.message_id,
                names.ATTR_PROVIDER: provider.provider_id,
                names.ATTR_CHANNEL: w.record.channel.value,
                names.ATTR_ATTEMPT: w.record.attempt}) as span:
            try:
                result = await provider.send(msg)
            except Exception as exc:
                log.error("provider call raised for %s: %r", w.message_id, exc)
                at = ctx.clock()
                result = SendResult(Outcome.TRANSIENT, provider.provider_id, at, at,
                                    reason=f"internal_error:{type(exc).__name__}")
            elapsed = time.monotonic() - started
            metrics.provider_call(span, w, result, elapsed)
            stages.record(w.record.tier.value, Stage.PROVIDER, elapsed)
        if not choice.last_resort and not (result.reason or "").startswith("internal_error"):
            await ctx.ports.breakers.record(
                provider.provider_id, result.outcome, result.reason,
                time.monotonic() - started, choice.probe,
                episode=getattr(choice.admission, "episode", None))
        return result
