"""The rows of a topic send: the snapshot of a topic's subscribers, and each subscriber
resolved to messages (pure but for the ports the caller passes).

The snapshot is JSON Lines, one ``{"user_id": ...}`` per subscriber, bucket by bucket in id
order (:func:`snapshot_lines`). A row maps to one message per address the user's
resolution picked (:func:`map_member`), or to a rejection naming why nothing was sent
(the user was erased since the snapshot, or every channel was skipped, with each skip's
reason; never an address).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import orjson
from pydantic import ValidationError

from notiflow.correlation import CorrelationKeys
from notiflow.flows.campaigns.manifest import (
    CampaignSpec,
    ManifestError,
    ManifestRow,
    Mapped,
    Rejected,
    zone_of,
)
from notiflow.preference_links import LINK_VARIABLE
from notiflow.schemas.campaigns import row_leg_message_id
from notiflow.schemas.enums import Channel
from notiflow.schemas.messages import IngestRecord
from notiflow.schemas.topic_sends import MEMBER_COLUMN, TopicAudience
from notiflow.settings import Settings, TenantConfig
from notiflow.user_resolution import Resolved, StateLookup, UserLookup, resolve

PAGE = 1000
"""Subscribers read per request while writing a snapshot."""
LOOKUPS = 32
"""Users resolved at once."""


class SubscriberPages(Protocol):
    """Read access to a topic's subscribers (``adapters/ports.py``, ``TopicSubscriptions``)."""

    async def subscribers(self, tenant_id: str, topic: str, bucket: int,
                          after: str | None, limit: int) -> list[str]: ...


async def snapshot_lines(topics: SubscriberPages, tenant_id: str, topic: str, buckets: int,
                         page: int = PAGE) -> AsyncIterator[bytes]:
    """The snapshot's bytes, a page of subscribers at a time."""
    for bucket in range(buckets):
        after: str | None = None
        while True:
            ids = await topics.subscribers(tenant_id, topic, bucket, after, page)
            if ids:
                yield b"".join(orjson.dumps({MEMBER_COLUMN: u}) + b"\n" for u in ids)
            if len(ids) < page:
                break
            after = ids[-1]


@dataclass(frozen=True, slots=True)
class People:
    """What a topic send reads: users, their addresses' stored state and the topics'
    subscribers (in ``buckets`` buckets)."""

    users: UserLookup
    prefs: StateLookup
    topics: SubscriberPages
    buckets: int


def member_of(row: ManifestRow) -> str | Rejected:
    """The row's user id, or why the row is unusable."""
    if row.fields is None:
        return Rejected(row.number, row.error or "unreadable row")
    user_id = row.fields.get(MEMBER_COLUMN)
    if not isinstance(user_id, str) or not user_id:
        return Rejected(row.number, f"missing column {MEMBER_COLUMN!r}")
    return user_id


async def resolve_rows(settings: Settings, tenant: TenantConfig, people: People,
                       audience: TopicAudience, spec: CampaignSpec,
                       rows: Sequence[ManifestRow]) -> list[Resolved | Rejected | None]:
    """Each row's resolution (None: the tenant has no such user any more), ``LOOKUPS`` at
    a time."""
    gate = asyncio.Semaphore(LOOKUPS)
    channels = [o.channel for o in audience.channels]

    async def one(row: ManifestRow) -> Resolved | Rejected | None:
        user_id = member_of(row)
        if isinstance(user_id, Rejected):
            return user_id
        async with gate:
            return await resolve(settings, tenant, people.users, people.prefs, user_id,
                                 channels, spec.category, audience.deliver, audience.topic)

    return list(await asyncio.gather(*(one(r) for r in rows)))


def _recipient(channel: Channel, address: str) -> Any:
    if channel is Channel.PUSH:
        platform, _, token = address.partition(":")
        return {"device_token": token, "platform": platform}
    return address


def map_member(spec: CampaignSpec, audience: TopicAudience, row: ManifestRow,
               found: Resolved | Rejected | None, now: datetime, keys: CorrelationKeys,
               link: str | None = None) -> list[Mapped] | Rejected:
    """The messages of one subscriber row, due in the user's window (their own zone, else
    the spec's default), or why the row sends nothing; ``link``: the user's preference
    page link, given to the templates as ``preferences_url``."""
    if isinstance(found, Rejected):
        return found
    if found is None:
        return Rejected(row.number, "unknown_user: no such user (erased since the snapshot)")
    if not found.decision.picks:
        skips = ", ".join(f"{s.channel.value.lower()} {s.reason}"
                          for s in found.decision.skipped)
        return Rejected(row.number, f"nothing_sent: {skips}")
    due = now
    if spec.window is not None:
        zone = zone_of(found.stamp.timezone) or zone_of(spec.default_zone)
        if zone is None:
            raise ManifestError(f"unknown time zone {spec.default_zone!r}")
        due = spec.window.next_open(now, zone)
    if due >= spec.ends_at:
        return Rejected(row.number, "no send window before the campaign ends")
    options = {o.channel: o for o in audience.channels}
    variables = (audience.variables if link is None
                 else {**audience.variables, LINK_VARIABLE: link})
    out: list[Mapped] = []
    for pick in found.decision.picks:
        option = options[pick.channel]
        address = found.addresses[pick.channel][pick.index]
        try:
            record = IngestRecord.model_validate({
                "channel": pick.channel, "tier": spec.tier,
                "recipient": _recipient(pick.channel, address),
                "template_id": option.template_id,
                "template_version": option.template_version,
                "variables": variables, "category": spec.category,
                "expires_at": spec.ends_at, "tenant_id": spec.tenant_id,
                "sender": option.sender, "locale": found.locale, "user": found.stamp,
                "message_id": row_leg_message_id(keys, spec.campaign_id, row.number,
                                                 pick.channel, pick.index),
                "accepted_at": now})
        except (ValidationError, ValueError) as exc:
            return Rejected(row.number, f"invalid_message: {type(exc).__name__}")
        out.append(Mapped(row.number, record, due))
    return out
