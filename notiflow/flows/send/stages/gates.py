"""Gates: the reasons a leased attempt is not sent. Expired → EXPIRED; over a recipient or
tenant cap → SUPPRESSED; the same content sent to the same recipient within the window →
SUPPRESSED; a strong-consent category (marketing) opted out in Cassandra, or a category the
user a message was sent to opted out of → SUPPRESSED."""

from __future__ import annotations

import functools
from datetime import timedelta

import orjson

from notiflow.adapters.ports import Verdict
from notiflow.flows.common.items import Work
from notiflow.flows.common.steps import is_expired, retry_record
from notiflow.flows.send.cap_rules import cap_check
from notiflow.flows.send.stages.context import SendContext
from notiflow.flows.send.stages.emit import finish
from notiflow.flows.send.stages.send_batch import Batch, attempt_key
from notiflow.redact import hasher, recipient_hashes
from notiflow.schemas.enums import Status
from notiflow.schemas.preferences import (
    REQUIRED_CATEGORIES,
    PreferenceState,
    combined_state,
    state_key,
)

REDIS_CLOSED_WAIT = timedelta(seconds=30)
"""How long a fail-closed cap check waits for Redis before it is tried again."""


def content_fingerprint(work: Work) -> str:
    """Same recipient, channel, template, version and variables → same fingerprint (the
    tenant is part of the Redis key); keyed like recipient hashes, so a fingerprint cannot be
    matched to a recipient by enumeration."""
    r = work.record
    doc = orjson.dumps(
        [r.recipient_key(), r.channel.value, r.template_id, r.template_version, r.variables],
        option=orjson.OPT_SORT_KEYS,
    )
    return hasher().digest(doc)


class Expiry:
    """Past ``expires_at`` → EXPIRED (``ttl``)."""

    async def __call__(self, batch: Batch, ctx: SendContext) -> None:
        for w in batch.live:
            if is_expired(w, batch.now):
                batch.decide(w, await finish(ctx, w, ctx.event(
                    w, Status.EXPIRED, batch.now, reason="ttl")))


class Caps:
    """Recipient and tenant caps (``flows/send/cap_rules.py``), counted in Redis; over a cap →
    SUPPRESSED. Redis down on a tier that keeps sending: the process's share of each limit
    in memory (``LocalCaps``), except that marketing waits (fails closed)."""

    async def __call__(self, batch: Batch, ctx: SendContext) -> None:
        now = batch.now
        checked = [(w, c) for w in batch.live
                   if (c := cap_check(w, ctx.settings, now)) is not None]
        if not checked:
            return
        caps = ctx.ports.caps
        checks = [c for _, c in checked]
        counted: list[Verdict] | None = await ctx.redis(lambda: caps.admit(checks, now), None)
        verdicts: list[Verdict | None] = (
            list(counted) if counted is not None
            else [None if c.fail_closed else ctx.local_caps.admit(c, now) for c in checks])
        waiting: list[str] = []
        for (w, _), verdict in zip(checked, verdicts, strict=True):
            if verdict is None:
                batch.decide(w, [retry_record(w, w.record.attempt, now + REDIS_CLOSED_WAIT)])
                waiting.append(ctx.lease_key(w))
            elif verdict is not Verdict.OK:
                batch.decide(w, await finish(ctx, w, ctx.event(
                    w, Status.SUPPRESSED, now, reason=verdict.value)))
        if waiting:
            leases = ctx.ports.leases
            await ctx.redis(lambda: leases.release(waiting), None)


class ContentDedup:
    """A message without an idempotency key claims its content fingerprint for the window;
    a fingerprint another message holds → SUPPRESSED (``duplicate_content_of:<id>``)."""

    async def __call__(self, batch: Batch, ctx: SendContext) -> None:
        leases = ctx.ports.leases
        fresh = [w for w in batch.live if w.record.idempotency_key is None]
        if not fresh:
            return
        claims = [(leases.content_key(w.record.tenant_id, content_fingerprint(w)),
                   w.message_id) for w in fresh]
        unclaimed: list[str | None] = [None] * len(claims)
        holders = await ctx.redis(lambda: leases.claim_content(claims, ctx.content_window),
                                  unclaimed)
        for w, (ckey, _), holder in zip(fresh, claims, holders, strict=True):
            if holder:
                batch.decide(w, await finish(ctx, w, ctx.event(
                    w, Status.SUPPRESSED, batch.now, reason=f"duplicate_content_of:{holder}")))
            else:
                batch.content_keys[attempt_key(w)] = ckey


def _own(w: Work) -> tuple[str, str] | None:
    """The key of the preferences of the user a message was sent to, when they apply."""
    r = w.record
    if r.user is None or r.category in REQUIRED_CATEGORIES:
        return None
    return r.tenant_id, r.user.user_hash


class StrongConsent:
    """Re-read from Cassandra the preferences of strong-consent categories (marketing) and,
    for a message sent to a user, the user's own, so an opt-out acknowledged by the API
    applies to every later send; a recipient's state is combined from those under each of
    its hashes (``redact.recipient_hashes``, ``combined_state``)."""

    async def __call__(self, batch: Batch, ctx: SendContext) -> None:
        categories = ctx.settings.strong_consent_categories
        strong = [w for w in batch.live
                  if w.record.category in categories or _own(w) is not None]
        if not strong:
            return
        hashes = {id(w): recipient_hashes(w.record.tenant_id, w.record.recipient_key())
                  if w.record.category in categories else () for w in strong}
        keys = sorted({(w.record.tenant_id, h) for w in strong for h in hashes[id(w)]}
                      | {own for w in strong if (own := _own(w)) is not None})
        states: dict[str, PreferenceState] = {}
        step = ctx.policy.store_concurrency
        for i in range(0, len(keys), step):
            chunk = keys[i:i + step]
            states.update(await ctx.infra(
                "cassandra", functools.partial(ctx.ports.preferences.get_states, chunk)))
        for w in strong:
            r = w.record
            state = combined_state([states.get(state_key(r.tenant_id, h))
                                    for h in hashes[id(w)]])
            reason = state.blocks(r.channel, r.category) if state else None
            own = _own(w)
            mine = states.get(state_key(*own)) if own is not None else None
            reason = reason or (mine.blocks(r.channel, r.category) if mine else None)
            if reason:
                batch.decide(w, await finish(ctx, w, ctx.event(
                    w, Status.SUPPRESSED, batch.now, reason=reason)))
