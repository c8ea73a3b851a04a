"""Emit: how an attempt ends. Its outputs are recorded on its lease (so a replay re-emits
them and never calls the provider again) before they leave the step."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from notiflow.adapters.envelope import SEALED, EnvelopeError, Sealer, envelope
from notiflow.flows.common.items import Out, Retry, Work
from notiflow.flows.send.stages.context import SendContext
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import AttemptRecord, DlqRecord, IngestRecord, StatusEvent

log = logging.getLogger("notiflow.send")

NEVER_DELIVERED = frozenset({Status.FAILED, Status.EXPIRED, Status.CANCELLED})
"""Endings that free the message's content fingerprint."""


def lease_outcome(ev: StatusEvent, follow: Iterable[Out] = (),
                  sealer: Sealer | None = None) -> dict[str, object]:
    """What a finished lease records, so a replay can re-emit the outcome and what follows
    it (the retry or check record, sealed like an ingest record; the dead letter, whose
    payload is encrypted) exactly as the first run emitted them."""
    done: dict[str, object] = {"status": ev.status.value, "reason": ev.reason}
    if ev.attempt_detail is not None:
        done["detail"] = ev.attempt_detail.model_dump(mode="json")
    if ev.next_attempt_at is not None:
        done["next_attempt_at"] = ev.next_attempt_at.isoformat()
    for out in follow:
        if isinstance(out, Retry):
            retry = out.record.model_dump(mode="json", exclude_none=True)
            done["retry"] = sealer.seal(retry) if sealer is not None else retry
        elif isinstance(out, DlqRecord):
            done["dlq"] = out.model_dump(mode="json", exclude_none=True)
    return done


async def finish(ctx: SendContext, w: Work, ev: StatusEvent, content_key: str | None = None,
                 follow: Sequence[Out] = ()) -> list[Out]:
    """Record the attempt's end and what follows it on its lease, and free the content
    fingerprint of a message that will never be delivered. A RETRY_PENDING end also clears
    the cancel gate's ``sending`` in the same round trip (the message may be cancelled
    while it waits). Returns ``[ev, *follow]``."""
    leases = ctx.ports.leases
    key = ctx.lease_key(w)
    done = lease_outcome(ev, follow, envelope(ctx.settings))
    clear = [ctx.gate_key(w)] if ev.status is Status.RETRY_PENDING else []
    await ctx.redis(lambda: leases.finish([(key, done)], ctx.lease_ttl(w), clear), None)
    if content_key and ev.status in NEVER_DELIVERED:
        await ctx.redis(lambda: leases.release_content([(content_key, w.message_id)]), None)
    return [ev, *follow]


async def cancelled(ctx: SendContext, w: Work, content_key: str | None) -> list[Out]:
    """The gate said the message was cancelled: the attempt ends CANCELLED (recorded on its
    lease, so a replay re-emits it and never calls the provider)."""
    return await finish(ctx, w, ctx.event(w, Status.CANCELLED, ctx.clock(), reason="cancelled"),
                        content_key)


async def release(ctx: SendContext, w: Work) -> None:
    """Free the attempt's lease without an outcome (it was not sent and will be again)."""
    leases = ctx.ports.leases
    key = ctx.lease_key(w)
    await ctx.redis(lambda: leases.release([key]), None)


def replayed(ctx: SendContext, w: Work, done: dict[str, Any], now: datetime) -> list[Out]:
    """A record seen again after its attempt ended: re-emit the recorded outcome and what
    followed it (they may not have reached Kafka before a crash; a duplicate retry record
    is harmless, its own lease decides); never call the provider again."""
    detail = AttemptRecord.model_validate(done["detail"]) if done.get("detail") else None
    nxt = done.get("next_attempt_at")
    outs: list[Out] = [ctx.event(
        w, Status(str(done["status"])), now, reason=done.get("reason"), detail=detail,
        next_attempt_at=datetime.fromisoformat(nxt) if nxt else None)]
    retry = done.get("retry")
    if retry:
        try:
            if SEALED in retry:
                retry = envelope(ctx.settings).open(retry)
        except EnvelopeError as exc:
            log.error("message %s: the retry recorded on its lease does not open (%s); the "
                      "first run emitted it, not emitted again", w.message_id, exc)
        else:
            outs.append(Retry(w, IngestRecord.model_validate(retry)))
    if done.get("dlq"):
        outs.append(DlqRecord.model_validate(done["dlq"]))
    return outs
