"""Route and quota: the provider accounts that can carry a message, ranked by the tier's
policy (``flows/routing.py``), then the first one its breaker admits with a capacity token
taken. No account serves the channel → DLQ (``channel_unavailable``); every breaker refuses
→ the message waits (same attempt) until one may admit it, or expires."""

from __future__ import annotations

from datetime import timedelta

from notiflow.flows.model import Out, Work
from notiflow.flows.routing import Choice, Unavailable, rank_routes, reserve
from notiflow.flows.sending.batch import Batch
from notiflow.flows.sending.context import SendContext
from notiflow.flows.sending.emit import finish, release
from notiflow.flows.steps import retry_record
from notiflow.schemas.enums import Status
from notiflow.settings import ProviderRoute


def candidates(ctx: SendContext, w: Work) -> list[ProviderRoute]:
    """The configured routes that serve ``w``, best first (the provider that just failed it
    last)."""
    ports = ctx.ports
    return rank_routes(ctx.settings.routes, tier=w.record.tier, channel=w.record.channel,
                       recipient=w.record.recipient, enabled=frozenset(ports.providers),
                       weight=ports.breakers.weight, avoid=w.record.avoid_provider)


class Routable:
    """Before anything is reserved: a message no configured account can carry → DLQ."""

    async def __call__(self, batch: Batch, ctx: SendContext) -> None:
        for w in batch.live:
            if not candidates(ctx, w):
                batch.decide(w, [ctx.dead_letter(
                    w, f"no provider for {w.record.channel}", "channel_unavailable",
                    "unavailable", batch.now)])
                await release(ctx, w)


class Quota:
    """Per message, just before its call: the provider chosen with its token taken, or the
    outputs of a message that waits for a breaker (or expires waiting)."""

    async def __call__(self, ctx: SendContext, w: Work) -> Choice | list[Out]:
        tenant = ctx.settings.tenant(w.record.tenant_id)
        ports = ctx.ports
        choice = await reserve(candidates(ctx, w), ports.breakers, ports.quota, w.record.tier,
                               tenant_id=w.record.tenant_id,
                               tenant_rate=tenant.rate_limit if tenant else None)
        if isinstance(choice, Choice):
            return choice
        return await all_unavailable(ctx, w, choice)


async def all_unavailable(ctx: SendContext, w: Work, choice: Unavailable | None) -> list[Out]:
    """Every provider of the channel is refused by its breaker: no attempt is spent; the
    message waits (same attempt) until a breaker may admit it, or expires."""
    now = ctx.clock()
    wait = timedelta(seconds=choice.retry_in if choice else 1.0)
    due = now + max(wait, timedelta(milliseconds=100))
    await release(ctx, w)
    assert w.record.expires_at is not None
    if due >= w.record.expires_at:
        return await finish(ctx, w, ctx.event(
            w, Status.EXPIRED, now, reason="all_providers_unavailable"))
    return [ctx.event(w, Status.RETRY_PENDING, now, reason="all_providers_unavailable",
                      next_attempt_at=due),
            retry_record(w, w.record.attempt, due)]
