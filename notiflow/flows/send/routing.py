"""Provider routing: which provider account sends one attempt of one message.

``rank_routes`` is pure: it filters the configured routes (channel, recipient country, push
platform, configured credentials) and orders them by the tier's policy:

- P0: best reliability first (reserved quota; the alternate provider at once on failure),
- P1: reliability with a small cost penalty (0.2 % of reliability per unit of cost),
- P2: cost per delivered message (``cost / reliability``),
- P3: cheapest healthy provider.

Health enters twice: an open circuit breaker removes a provider (the breaker admits the
occasional probe while half-open), and throttling (429) lowers a provider's route weight,
which scales its effective reliability down and its effective cost up. The provider that
just failed this message is tried last.

Quota enters for P0 (:func:`reserve`): P0's reservation is its share at every provider account
of the channel, so a candidate without a token for P0 right now is passed over for the next
admitted one that has one, and P0 waits only when no admitted candidate has a token (then on
the shortest wait, and chooses again). P1..P3 keep their ranked choice and wait for its token.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from notiflow.chat_hooks import served
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import ProviderRoute

P1_COST_WEIGHT = 0.002
"""P1 trades 0.2 % of reliability for one unit of relative cost."""


@functools.lru_cache(maxsize=4096)
def calling_code(number: str) -> str:
    """The E.164 country calling code of ``number`` (``"+14155550123"`` → ``"1"``); cached,
    since one attempt ranks routes twice and each SMS route with countries asks."""
    import phonenumbers

    try:
        return str(phonenumbers.parse(number, None).country_code)
    except phonenumbers.NumberParseException:
        return ""


def serves(route: ProviderRoute, channel: Channel, recipient: str | PushRecipient,
           prefixes: Mapping[str, tuple[str, ...]] | None = None) -> bool:
    """Whether ``route`` can carry a message to ``recipient``; a chat route only to a webhook
    URL under one of its provider's ``prefixes`` (:mod:`notiflow.chat_hooks`)."""
    if route.channel is not channel:
        return False
    if channel is Channel.CHAT:
        return isinstance(recipient, str) and served(
            recipient, (prefixes or {}).get(route.provider_id, ()))
    if isinstance(recipient, PushRecipient):
        return not route.platforms or recipient.platform in route.platforms
    if route.countries and channel is Channel.SMS:
        return calling_code(recipient) in route.countries
    return True


@dataclass(frozen=True, slots=True)
class Ranked:
    route: ProviderRoute
    score: tuple[float, ...]


def rank_routes(routes: Iterable[ProviderRoute], *, tier: Tier, channel: Channel,
                recipient: str | PushRecipient, enabled: frozenset[str],
                weight: Callable[[str], float] = lambda _p: 1.0,
                avoid: str | None = None,
                prefixes: Mapping[str, tuple[str, ...]] | None = None) -> list[ProviderRoute]:
    """Candidate routes for one attempt, best first (``prefixes``: the chat providers'
    webhook prefixes, :meth:`~notiflow.settings.Settings.webhook_prefixes`)."""
    ranked: list[Ranked] = []
    for r in routes:
        if r.provider_id not in enabled or not serves(r, channel, recipient, prefixes):
            continue
        w = min(1.0, max(1e-3, weight(r.provider_id)))
        reliability = r.reliability * w
        cost = r.cost / w
        if tier is Tier.P0:
            score: tuple[float, ...] = (-reliability, cost)
        elif tier is Tier.P1:
            score = (-(reliability - P1_COST_WEIGHT * cost), cost)
        elif tier is Tier.P2:
            score = (cost / max(reliability, 1e-6), -reliability)
        else:
            score = (cost, -reliability)
        ranked.append(Ranked(r, (1.0 if r.provider_id == avoid else 0.0, *score)))
    ranked.sort(key=lambda x: x.score)
    return [x.route for x in ranked]


class BreakerView(Protocol):
    """What the router asks of the circuit breakers (``adapters/breaker/facade.py``)."""

    async def allow(self, provider_id: str) -> Any: ...

    def weight(self, provider_id: str) -> float: ...


@dataclass(frozen=True, slots=True)
class Choice:
    """The provider chosen for an attempt; ``probe`` when admitted as a half-open probe;
    ``admission`` is the breaker's answer (its episode goes back with the outcome)."""

    provider_id: str
    probe: bool
    admission: Any = None
    last_resort: bool = False
    """Chosen although every breaker refused (``TierPolicy.last_resort``)."""
    endpoint: Any = None
    """The admission of the tenant's own endpoint breaker (chat), None for others."""


@dataclass(frozen=True, slots=True)
class Unavailable:
    """Every candidate is refused by its breaker; retry in ``retry_in`` seconds."""

    retry_in: float
    candidates: tuple[str, ...]


def admission_kind(admission: object) -> tuple[bool, bool, float]:
    """(admitted, probe, retry_in) of a breaker admission."""
    admitted = bool(getattr(admission, "admitted", False))
    probe = bool(getattr(admission, "probe", False))
    retry_in = float(getattr(admission, "retry_in", 0.0) or 0.0)
    return admitted, probe, retry_in


async def choose(candidates: Sequence[ProviderRoute],
                 breakers: BreakerView | None) -> Choice | Unavailable | None:
    """The first candidate its breaker admits; None when there is no candidate at all."""
    if not candidates:
        return None
    if breakers is None:
        return Choice(candidates[0].provider_id, False)
    waits = []
    for r in candidates:
        admission = await breakers.allow(r.provider_id)
        admitted, probe, retry_in = admission_kind(admission)
        if admitted:
            return Choice(r.provider_id, probe, admission)
        waits.append(retry_in)
    return Unavailable(min(waits) if waits else 1.0, tuple(r.provider_id for r in candidates))


QUOTA_ROUTED: frozenset[Tier] = frozenset({Tier.P0})
"""Tiers whose choice moves to the candidate with a token (see :func:`reserve`)."""
MIN_WAIT = 0.001
"""Floor of one wait between two choices (seconds)."""


class QuotaView(Protocol):
    """What the router asks of the capacity limiter (``adapters/ratelimit/limiter.py``)."""

    async def acquire(self, provider_id: str, tier: Tier, tenant_id: str | None = None,
                      tenant_rate: float | None = None) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Waiting:
    """No admitted candidate has a token now; ``choice`` may have one in ``retry_in``
    seconds, the shortest wait; ``admitted``: every admitted candidate, in rank order."""

    retry_in: float
    choice: Choice
    admitted: tuple[Choice, ...]


async def choose_with_quota(candidates: Sequence[ProviderRoute], breakers: BreakerView | None,
                            quota: QuotaView, tier: Tier, *, tenant_id: str | None = None,
                            tenant_rate: float | None = None,
                            held: Mapping[str, Choice] | None = None,
                            ) -> Choice | Waiting | Unavailable | None:
    """One pass in rank order: the first candidate its breaker admits and that has a token
    (the token is taken; no later candidate is asked anything), else :class:`Waiting` on the
    admitted candidate with the shortest wait (the first in rank order among equal waits),
    else :class:`Unavailable` when every breaker refuses; None without candidates.

    The breaker is asked before the quota, so no token is spent on a provider its breaker
    refuses. ``held``: probe admissions of earlier passes, reused instead of asking the
    breaker again. An admitted probe that ends up unused is dropped unrecorded: the breaker
    only keeps the time of the last probe admission, so this delays the next gap probe by at
    most ``probe_gap`` and never miscounts probes."""
    if not candidates:
        return None
    held = held or {}
    waits: list[tuple[float, Choice]] = []
    refusals: list[float] = []
    for r in candidates:
        choice = held.get(r.provider_id)
        if choice is None:
            choice = await _admit(r.provider_id, breakers, refusals)
            if choice is None:
                continue
        wait = await quota.acquire(r.provider_id, tier, tenant_id, tenant_rate)
        if wait is None:
            return choice
        waits.append((wait, choice))
    if waits:
        retry_in, choice = min(waits, key=lambda x: x[0])
        return Waiting(retry_in, choice, tuple(c for _, c in waits))
    return Unavailable(min(refusals) if refusals else 1.0,
                       tuple(r.provider_id for r in candidates))


async def _admit(provider_id: str, breakers: BreakerView | None,
                 refusals: list[float]) -> Choice | None:
    if breakers is None:
        return Choice(provider_id, False)
    admission = await breakers.allow(provider_id)
    admitted, probe, retry_in = admission_kind(admission)
    if not admitted:
        refusals.append(retry_in)
        return None
    return Choice(provider_id, probe, admission)


async def reserve(candidates: Sequence[ProviderRoute], breakers: BreakerView | None,
                  quota: QuotaView, tier: Tier, *, tenant_id: str | None = None,
                  tenant_rate: float | None = None,
                  sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                  ) -> Choice | Unavailable | None:
    """The provider of one attempt with its capacity token taken (waits go through
    ``sleep`` on the caller's loop), or :class:`Unavailable` / None as :func:`choose` answers.

    :data:`QUOTA_ROUTED` tiers (P0) pass over a candidate without a token for the next
    admitted one that has one (:func:`choose_with_quota`); when none has, they wait the
    shortest wait and choose again, holding probe admissions. A refused P0 request still
    counts as P0 demand at that provider, so a share lower tiers borrowed there comes back
    while P0 is served elsewhere.

    Other tiers take the first candidate their breakers admit and wait for its token: a P1
    spilling to the secondary would also borrow the secondary's idle P0 share, the room a P0
    moves to when its primary is full; P2/P3 are bulk and cost-ranked, and spilling to a
    dearer vendor whenever the cheap one is full would defeat that ranking while their SLA
    absorbs the wait."""
    if tier not in QUOTA_ROUTED:
        first = await choose(candidates, breakers)
        if isinstance(first, Choice):
            while (wait := await quota.acquire(first.provider_id, tier, tenant_id,
                                               tenant_rate)) is not None:
                await sleep(max(wait, MIN_WAIT))
        return first
    held: dict[str, Choice] = {}
    while True:
        picked = await choose_with_quota(candidates, breakers, quota, tier,
                                         tenant_id=tenant_id, tenant_rate=tenant_rate,
                                         held=held)
        if not isinstance(picked, Waiting):
            return picked
        held.update((c.provider_id, c) for c in picked.admitted if c.probe)
        await sleep(max(picked.retry_in, MIN_WAIT))
