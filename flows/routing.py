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
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

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


def serves(route: ProviderRoute, channel: Channel, recipient: str | PushRecipient) -> bool:
    if route.channel is not channel:
        return False
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
                avoid: str | None = None) -> list[ProviderRoute]:
    """Candidate routes for one attempt, best first."""
    ranked: list[Ranked] = []
    for r in routes:
        if r.provider_id not in enabled or not serves(r, channel, recipient):
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
    """What the router asks of the circuit breakers (``adapters/breaker.py``)."""

    async def allow(self, provider_id: str) -> Any: ...

    def weight(self, provider_id: str) -> float: ...


@dataclass(frozen=True, slots=True)
class Choice:
    """The provider chosen for an attempt; ``probe`` when admitted as a half-open probe;
    ``admission`` is the breaker's answer (its episode goes back with the outcome)."""

    provider_id: str
    probe: bool
    admission: Any = None


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
