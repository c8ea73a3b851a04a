"""Which of a user's channels and addresses a message goes to: :func:`choose`, a pure
function of the request's channels (the tenant's order), the user's addresses and what
blocks each address (its preferences and suppression, and whether the platform serves it).

Per channel, in order: no address → ``no_address`` (``in_app_off`` for an inbox the user
does not read); each blocked address → skipped with its reason; of the rest, a push message
goes to every device and any other channel to its first address. With ``deliver="first"``
the first channel that got an address ends the choice and every later one is skipped as
``not_needed``; with ``"every"`` each channel is tried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from notiflow.schemas.enums import Channel
from notiflow.schemas.user_sends import Decision, Deliver, Pick, Skip, SkipReason

Block = Callable[[Channel, str], "tuple[SkipReason | None, int]"]
"""``(channel, address) → (reason, preferences version)``: why the address may not get the
message (None: it may) and the version of the preferences that decided it (0: none)."""


def inbox_address(user_id: str) -> str:
    """The in-app recipient of a user."""
    return f"inapp:{user_id}"


def candidates(addresses: Mapping[Channel, Sequence[str]], user_id: str,
               in_app: bool) -> dict[Channel, tuple[str, ...]]:
    """Every channel's addresses, preferred first, the inbox included when the user reads
    one."""
    out = {channel: tuple(keys) for channel, keys in addresses.items() if keys}
    if in_app:
        out[Channel.INAPP] = (inbox_address(user_id),)
    return out


def choose(channels: Sequence[Channel], addresses: Mapping[Channel, Sequence[str]],
           block: Block, deliver: Deliver, *, in_app: bool = True) -> Decision:
    """The addresses a message goes to and what was skipped, in ``channels`` order
    (``addresses`` from :func:`candidates`)."""
    picks: list[Pick] = []
    skipped: list[Skip] = []
    for position, channel in enumerate(channels):
        keys = addresses.get(channel, ())
        if not keys:
            reason: SkipReason = ("in_app_off" if channel is Channel.INAPP and not in_app
                                  else "no_address")
            skipped.append(Skip(channel=channel, reason=reason))
            continue
        chosen = _usable(channel, keys, block, skipped)
        picks.extend(chosen)
        if chosen and deliver == "first":
            skipped.extend(Skip(channel=later, reason="not_needed")
                           for later in channels[position + 1:])
            break
    return Decision(picks=tuple(picks), skipped=tuple(skipped))


def _usable(channel: Channel, keys: Sequence[str], block: Block,
            skipped: list[Skip]) -> list[Pick]:
    chosen: list[Pick] = []
    for index, key in enumerate(keys):
        reason, version = block(channel, key)
        if reason is not None:
            skipped.append(Skip(channel=channel, index=index, reason=reason))
            continue
        chosen.append(Pick(channel=channel, index=index, preferences_version=version))
        if channel is not Channel.PUSH:
            break
    return chosen
