"""Route and quota: the provider accounts that can carry a message, ranked by the tier's
policy (``flows/send/routing.py``), less the accounts whose ``Retry-After`` for the message is
still running (``provider_waits``: the message waits for the first to end when that is all
of them), then the first one its breaker admits with a capacity token taken. No account
serves the channel → DLQ (``channel_unavailable``); every breaker refuses → the message
waits (same attempt) until one may admit it, or expires; a tier with ``last_resort`` (P0) is
sent through the best-ranked account anyway, and waits only when that send fails
transiently (:func:`last_resort_failed`). A chat message's own endpoint (its tenant's
webhook) is asked first (:func:`endpoint_gate`): while its breaker refuses, the message
waits, whatever its tier."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from notiflow.adapters.providers.base import Outcome, SendResult
from notiflow.flows.common.items import Out, Retry, Work
from notiflow.flows.common.steps import retry_record
from notiflow.flows.send.policy import held_for, waiting
from notiflow.flows.send.routing import Choice, Unavailable, admission_kind, rank_routes, reserve
from notiflow.flows.send.stages.context import SendContext
from notiflow.flows.send.stages.emit import finish, release
from notiflow.flows.send.stages.endpoints import endpoint_of
from notiflow.flows.send.stages.send_batch import Batch, Prepared
from notiflow.schemas.enums import Channel, Status
from notiflow.settings import ProviderRoute


def candidates(ctx: SendContext, w: Work) -> list[ProviderRoute]:
    """The configured routes that serve ``w``, best first (the provider that just failed it
    last)."""
    ports = ctx.ports
    return rank_routes(ctx.settings.routes, tier=w.record.tier, channel=w.record.channel,
                       recipient=w.record.recipient, enabled=frozenset(ports.providers),
                       weight=ports.breakers.weight, avoid=w.record.avoid_provider,
                       prefixes=ctx.webhook_prefixes)


class Routable:
    """Before anything is reserved: a message no configured account can carry → DLQ."""

    async def __call__(self, batch: Batch, ctx: SendContext) -> None:
        for w in batch.live:
            if not candidates(ctx, w):
                chat = w.record.channel is Channel.CHAT
                batch.decide(w, [ctx.dead_letter(
                    w, "no chat provider posts to this webhook URL" if chat
                    else f"no provider for {w.record.channel}",
                    "recipient_not_served" if chat else "channel_unavailable",
                    "unavailable", batch.now)])
                await release(ctx, w)


class Quota:
    """Per message, before its channel's in-flight slot: the provider chosen with its token
    taken (``item.choice``, ``item.provider``), or the outputs of a message that waits for a
    breaker (or expires waiting)."""

    async def __call__(self, item: Prepared, ctx: SendContext) -> list[Out] | None:
        w = item.work
        tenant = ctx.settings.tenant(w.record.tenant_id)
        ports = ctx.ports
        routes = candidates(ctx, w)
        now = ctx.clock()
        hold = held_for(w.record.provider_waits, (r.provider_id for r in routes), now)
        if hold is not None:
            return await all_unavailable(ctx, w, Unavailable(hold.total_seconds(), ()),
                                         reason="provider_retry_after")
        routes = [r for r in routes if not waiting(w.record.provider_waits, r.provider_id, now)]
        gate = await endpoint_gate(ctx, w)
        if isinstance(gate, Unavailable):
            return await all_unavailable(ctx, w, gate, reason="endpoint_breaker_open")
        choice = await reserve(routes, ports.breakers, ports.quota, w.record.tier,
                               tenant_id=w.record.tenant_id,
                               tenant_rate=tenant.rate_limit if tenant else None)
        if isinstance(choice, Choice):
            return routed(item, ctx, await paced(ctx, w, replace(choice, endpoint=gate)))
        if isinstance(choice, Unavailable) and ctx.settings.policy(w.record.tier).last_resort:
            forced = await last_resort(ctx, w, routes, tenant.rate_limit if tenant else None)
            if forced is not None:
                return routed(item, ctx, await paced(ctx, w, replace(forced, endpoint=gate)))
        return await all_unavailable(ctx, w, choice)


def routed(item: Prepared, ctx: SendContext, choice: Choice | list[Out]) -> list[Out] | None:
    """Record ``choice`` and its provider client on ``item``; the outputs of a message that
    waits instead."""
    if not isinstance(choice, Choice):
        return choice
    item.choice = choice
    item.provider = ctx.ports.providers[choice.provider_id]
    return None


class LastResort:
    """After the call: a last-resort send (``Choice.last_resort``) that failed transiently
    waits on the same attempt (:func:`last_resort_failed`); any other answer goes on to
    classify, at no await."""

    def __call__(self, item: Prepared, ctx: SendContext) -> Awaitable[list[Out]] | None:
        choice, result = item.choice, item.result
        assert choice is not None and result is not None
        if choice.last_resort and result.outcome is Outcome.TRANSIENT:
            return last_resort_failed(ctx, item.work, result)
        return None


async def endpoint_gate(ctx: SendContext, w: Work) -> Any:
    """The admission of the tenant endpoint ``w`` posts to (``flows/send/stages/endpoints.py``):
    None when it has none; :class:`Unavailable` while its breaker refuses (the message waits,
    as for a refusing provider, and no last resort overrides the tenant's own endpoint)."""
    endpoint = endpoint_of(w)
    if endpoint is None:
        return None
    admission = await ctx.ports.breakers.allow(endpoint)
    admitted, _, retry_in = admission_kind(admission)
    return admission if admitted else Unavailable(retry_in, ())


async def paced(ctx: SendContext, w: Work, choice: Choice) -> Choice | list[Out]:
    """``choice``, unless its provider paces each webhook (chat) and this message's slot is
    later: then it waits for the slot (``RETRY_PENDING`` ``webhook_paced``, same attempt),
    holding it. Slots are the tenant's own (another tenant posting to the same URL takes
    none of them). A message back at its held slot takes no other; Redis down: not
    paced."""
    rule = ctx.settings.pace(choice.provider_id)
    pace = ctx.ports.pace
    r = w.record
    recipient = r.recipient
    if rule is None or pace is None or not isinstance(recipient, str):
        return choice
    if r.paced_until is not None and ctx.clock() >= r.paced_until:
        return choice
    slot = await ctx.redis(lambda: pace.reserve(choice.provider_id, recipient, rule,
                                                tenant_id=r.tenant_id), None)
    if slot is None or slot.wait_us <= 0:
        return choice
    return await all_unavailable(ctx, w, Unavailable(slot.wait, (choice.provider_id,)),
                                 reason="webhook_paced", hold_slot=slot.reserved)


async def last_resort(ctx: SendContext, w: Work, routes: Sequence[ProviderRoute],
                      tenant_rate: float | None) -> Choice | None:
    """The best-ranked of ``routes`` for a message every breaker refused, with its capacity
    token taken; None when it has no token now (the message waits as any refused one
    does)."""
    if not routes:
        return None
    provider_id = routes[0].provider_id
    wait = await ctx.ports.quota.acquire(provider_id, w.record.tier, w.record.tenant_id,
                                         tenant_rate)
    return Choice(provider_id, False, last_resort=True) if wait is None else None


async def last_resort_failed(ctx: SendContext, w: Work, result: SendResult) -> list[Out]:
    """A last-resort send failed transiently: the message waits on the same attempt, as if
    the breakers had refused it, for ``last_resort_wait`` or a quarter of its age, whichever
    is longer (an outage is not hammered), or the provider's ``Retry-After``, and then tries
    the other account first. Its lease and the cancel gate's ``sending`` are freed."""
    policy = ctx.settings.policy(w.record.tier)
    age = (ctx.clock() - w.accepted_at).total_seconds()
    wait = max(ctx.settings.scaled(policy.last_resort_wait).total_seconds(), age / 4,
               result.retry_after_s or 0.0)
    leases = ctx.ports.leases
    await ctx.redis(lambda: leases.finish([], ctx.lease_ttl(w), [ctx.gate_key(w)]), None)
    return await all_unavailable(ctx, w, Unavailable(wait, (result.provider_id,)),
                                 reason=f"last_resort_failed:{result.reason or 'transient'}",
                                 avoid=result.provider_id)


async def all_unavailable(ctx: SendContext, w: Work, choice: Unavailable | None, *,
                          reason: str = "all_providers_unavailable",
                          avoid: str | None = None, hold_slot: bool = False) -> list[Out]:
    """Every provider of the channel is refused by its breaker: no attempt is spent; the
    message waits (same attempt) until a breaker may admit it, or expires (``avoid``: the
    account ranked last when it is tried again; ``hold_slot``: it holds its webhook's slot
    from when it is due, :func:`paced`)."""
    now = ctx.clock()
    wait = timedelta(seconds=choice.retry_in if choice else 1.0)
    due = now + max(wait, timedelta(milliseconds=100))
    await release(ctx, w)
    assert w.record.expires_at is not None
    if due >= w.record.expires_at:
        return await finish(ctx, w, ctx.event(w, Status.EXPIRED, now, reason=reason))
    again = retry_record(w, w.record.attempt, due)
    if avoid is not None:
        again = Retry(w, again.record.model_copy(update={"avoid_provider": avoid}))
    if hold_slot:
        again = Retry(w, again.record.model_copy(update={"paced_until": due}))
    return [ctx.event(w, Status.RETRY_PENDING, now, reason=reason, next_attempt_at=due), again]
