"""Send: one provider call inside its span, counted, timed, and told to the breakers
:func:`~notiflow.flows.send.stages.endpoints.reports` names (the provider's; a chat post's
tenant endpoint's). A provider adapter that raises (a bug: adapters answer with a result)
becomes a transient ``internal_error`` result that no breaker counts; the provider's does
not count a last-resort send either (its breaker had refused it:
``flows/send/stages/route.py``)."""

from __future__ import annotations

import logging
import time

from notiflow import names, stages, telemetry
from notiflow.adapters.providers.base import Outcome, SendResult
from notiflow.flows.send.stages.context import SendContext
from notiflow.flows.send.stages.endpoints import reports
from notiflow.flows.send.stages.metrics import metrics
from notiflow.flows.send.stages.send_batch import Prepared
from notiflow.names import Stage

log = logging.getLogger("notiflow.flows.dispatch")


class Call:
    """Per message, inside its channel's slot and once confirmed: the provider's
    :class:`SendResult` for ``item.message``, kept as ``item.result``; never ends the
    message."""

    async def __call__(self, item: Prepared, ctx: SendContext) -> None:
        w, msg, choice, provider = item.work, item.message, item.choice, item.provider
        assert choice is not None and provider is not None
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
        for report in reports(w, choice, result, time.monotonic() - started,
                              ctx.webhook_prefixes):
            await ctx.ports.breakers.record(report.breaker_id, report.outcome, report.reason,
                                            report.latency_s, report.probe,
                                            episode=report.episode)
        item.result = result
