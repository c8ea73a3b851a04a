"""A message to a user, resolved to addresses: :func:`resolve` reads the user and the stored
state of each of their addresses (through two small ports) and decides with
:func:`notiflow.user_choice.choose`. The API (``POST /v1/messages`` to ``user:<id>``) and the
campaign expander (a topic's subscribers) both resolve through it.

What blocks an address, first match wins: the platform cannot serve it
(:func:`~notiflow.recipient_checks.recipient_problem`), its suppression (bounce, STOP, dead
token), the user's own opt-out of the category on the channel, the address's own opt-out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

from notiflow.recipient_checks import recipient_problem
from notiflow.redact import recipient_hashes, user_hash, user_recipient_key
from notiflow.schemas.enums import Category, Channel
from notiflow.schemas.messages import UserStamp
from notiflow.schemas.preferences import PreferenceState, combined_state, state_key
from notiflow.schemas.user_sends import Decision, Deliver, Skip, SkipReason
from notiflow.schemas.users import UserView
from notiflow.settings import Settings, TenantConfig
from notiflow.user_choice import candidates, choose


class UserLookup(Protocol):
    async def get(self, tenant_id: str, user_id: str) -> UserView | None: ...


class StateLookup(Protocol):
    async def get_states(self, keys: Iterable[tuple[str, str]]
                         ) -> Mapping[str, PreferenceState]: ...


class Resolved(NamedTuple):
    """The decision, the addresses its picks index, the stamp of the user's messages and the
    user's own locale."""

    decision: Decision
    addresses: dict[Channel, tuple[str, ...]]
    stamp: UserStamp
    locale: str | None


async def address_states(prefs: StateLookup, tenant_id: str, keys: Sequence[str]
                         ) -> dict[str, PreferenceState | None]:
    """The stored state of each address, combined over its hashes (one read of all)."""
    wanted = {k: recipient_hashes(tenant_id, k) for k in keys}
    found = await prefs.get_states(
        (tenant_id, h) for hashes in wanted.values() for h in hashes)
    return {k: combined_state([found.get(state_key(tenant_id, h)) for h in hashes])
            for k, hashes in wanted.items()}


async def resolve(settings: Settings, tenant: TenantConfig, users: UserLookup,
                  prefs: StateLookup, user_id: str, channels: Sequence[Channel],
                  category: Category, deliver: Deliver, topic: str | None = None
                  ) -> Resolved | None:
    """Where a message of ``category`` to ``user_id`` goes among ``channels`` (the tenant's
    order); None when the tenant has no such user. A send to a ``topic`` the user muted
    goes nowhere: every channel is skipped as ``topic_muted``."""
    user = await users.get(tenant.id, user_id)
    if user is None:
        return None
    addresses = candidates(user.addresses(), user_id, user.in_app)
    keys = [k for c in channels for k in addresses.get(c, ())]
    own = user_recipient_key(user_id)
    states = await address_states(prefs, tenant.id, [*keys, own])
    mine = states.get(own)

    def block(channel: Channel, key: str) -> tuple[SkipReason | None, int]:
        problem = recipient_problem(settings, tenant, channel, key)
        if problem is not None:
            return problem.code, 0  # type: ignore[return-value]  # codes are skip reasons
        state = states.get(key)
        version = state.version if state is not None else 0
        if state is not None and state.suppressed is not None:
            return state.suppressed, version
        if mine is not None and (reason := mine.blocks(channel, category)):
            return reason, version  # type: ignore[return-value]
        if state is None:
            return None, 0
        return state.blocks(channel, category), version  # type: ignore[return-value]

    stamp = UserStamp(user_hash=user_hash(tenant.id, user_id), timezone=user.timezone)
    if topic is not None and mine is not None and topic in mine.muted_topics:
        decision = Decision(picks=(), skipped=tuple(
            Skip(channel=c, reason="topic_muted") for c in channels))
    else:
        decision = choose(channels, addresses, block, deliver, in_app=user.in_app)
    return Resolved(decision.model_copy(update={
        "user_preferences_version": mine.version if mine is not None else 0}),
        addresses, stamp, user.locale)
