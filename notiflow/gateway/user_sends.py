"""``POST /v1/messages`` to a user (``recipient: "user:<id>"``) and its ``GET``.

After the checks every send request passes (lane, tenant policy and every channel's
template, 403/421/422), the API resolves the user to addresses
(:func:`notiflow.user_resolution.resolve`) and accepts one message per
chosen address exactly as ``POST /v1/messages`` accepts one (admission, outbox, Kafka), with
the id ``{message_id}-{channel}{index}``. The decision is then stored under the request's
``message_id`` (``user_sends``) and answered ``202``; a request whose every channel is
skipped is answered ``SUPPRESSED`` and sends nothing.

With an ``Idempotency-Key`` the request's id and each message's key derive from it, so a
retry after a failure part-way accepts the missing messages and replays the others; a retry
after the ``202`` is answered from the stored decision. The send flow checks each address's
preferences again when it sends.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from fastapi import Response

from notiflow.adapters.outages import CASSANDRA_DOWN
from notiflow.adapters.rows import MessageRow
from notiflow.gateway.acceptance import (
    accept,
    check_kafka_window,
    check_policy,
    effective_expiry,
    request_hash,
)
from notiflow.gateway.checks import check_lane, check_sender, check_template
from notiflow.gateway.egress_check import check_webhook_url
from notiflow.gateway.errors import (
    idempotency_conflict,
    store_unavailable,
    unprocessable,
    validated,
)
from notiflow.gateway.outbox import traceparent
from notiflow.gateway.runtime import Runtime, now_ms
from notiflow.preference_links import LINK_VARIABLE, preference_link
from notiflow.redact import hasher, mask
from notiflow.schemas.enums import Category, Channel, Status, Tier
from notiflow.schemas.messages import derived_message_id, new_message_id
from notiflow.schemas.status import rank
from notiflow.schemas.user_sends import (
    ChannelOption,
    LegView,
    UserMessageView,
    UserSendRecord,
    UserSendRequest,
)
from notiflow.settings import TenantConfig
from notiflow.user_resolution import Resolved, resolve

JSON: Final = "application/json"
KEY_PREFIX: Final = "user-send:"
"""Start of the ``Idempotency-Key`` of each message of a keyed user send."""


@dataclass(frozen=True, slots=True)
class Option:
    """A channel of a user send as the checks see a request (tier, channel, template)."""

    tier: Tier
    channel: Channel
    category: Category
    template_id: str
    template_version: int
    sender: str | None

    @classmethod
    def of(cls, req: UserSendRequest, option: ChannelOption) -> Option:
        return cls(req.tier, option.channel, req.category, option.template_id,
                   option.template_version, option.sender)


def _hashes(req: UserSendRequest) -> tuple[str, ...]:
    canonical = json.dumps(req.model_dump(mode="json"), sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False).encode()
    return hasher().digests(canonical)


def leg_key(key: str | None, channel: Channel, index: int) -> str | None:
    """The ``Idempotency-Key`` of one message of a user send (None without a client key)."""
    if key is None:
        return None
    digest = hashlib.sha256(key.encode()).hexdigest()[:48]
    return f"{KEY_PREFIX}{digest}:{channel.value.lower()}{index}"


def leg_id(message_id: str, channel: Channel, index: int) -> str:
    return f"{message_id}-{channel.value.lower()}{index}"


def _shown(channel: Channel, address: str) -> str:
    return "inapp:…" if channel is Channel.INAPP else mask(address)


async def decide(rt: Runtime, tenant: TenantConfig, req: UserSendRequest) -> Resolved:
    """The decision for ``req`` and what its messages need (``422 unknown_user`` when the
    tenant has no such user)."""
    found = await resolve(rt.settings, tenant, rt.users(), rt.preferences(), req.user_id,
                          [o.channel for o in req.channels], req.category, req.deliver)
    if found is None:
        raise unprocessable("unknown_user", f"tenant {tenant.id} has no user {req.user_id}",
                            field="recipient")
    return found


def _replayed(record: UserSendRecord, hashes: tuple[str, ...]) -> Response:
    if record.request_hash not in hashes:
        raise idempotency_conflict()
    return _answer(record, replayed=True)


def _answer(record: UserSendRecord, *, replayed: bool = False) -> Response:
    headers = {"Location": f"/v1/messages/{record.message_id}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return Response(record.accepted().model_dump_json(), status_code=202, media_type=JSON,
                    headers=headers)


async def with_link(rt: Runtime, tenant_id: str, req: UserSendRequest) -> dict[str, Any]:
    """The request's variables with ``preferences_url``, the user's preference page link
    (the template helper), when one of its templates reads it, the request does not set it
    and the deployment has a page."""
    if LINK_VARIABLE in req.variables:
        return req.variables
    rows = [await rt.template(tenant_id, o.template_id, o.template_version)
            for o in req.channels]
    if not any(row is not None and LINK_VARIABLE in row.variables for row in rows):
        return req.variables
    link = preference_link(rt.settings, tenant_id, req.user_id)
    return req.variables if link is None else {**req.variables, LINK_VARIABLE: link.url}


async def accept_user_request(rt: Runtime, tenant: TenantConfig, data: Any,
                              key: str | None, incoming_trace: str | None,
                              labels: dict[str, str]) -> Response:
    """A send request to a user from its JSON body to its ``202``; raises
    :class:`~notiflow.gateway.errors.ApiError` for a refusal."""
    req = validated(UserSendRequest, data)
    labels.update(tier=req.tier.value)
    options = [Option.of(req, o) for o in req.channels]
    check_lane(rt.settings, options[0])
    for option in options:
        check_sender(rt.settings, tenant, option)
    await check_webhook_url(rt, req.status_webhook, "status_webhook")
    hashes = _hashes(req)
    store = rt.store()
    message_id = (derived_message_id(tenant.id, "user-send", key) if key is not None
                  else new_message_id())
    try:
        if key is not None and (earlier := await store.user_sends.get(message_id)):
            return _replayed(earlier, hashes)
        variables = await with_link(rt, tenant.id, req)
        for option in options:
            await check_template(rt, tenant, option, variables)
        decision, addresses, stamp, user_locale = await decide(rt, tenant, req)
    except CASSANDRA_DOWN as exc:
        raise store_unavailable(exc) from None
    accepted_at = now_ms()
    by_channel = {o.channel: o for o in req.channels}
    legs = []
    trace = traceparent(incoming_trace)
    for pick in decision.picks:
        address = addresses[pick.channel][pick.index]
        asked = req.leg(by_channel[pick.channel], address, user_locale)
        leg = asked.model_copy(update={"variables": variables})
        check_policy(rt.settings, tenant, leg)
        expires_at = effective_expiry(rt.settings, leg, accepted_at)
        await rt.admission.check(tenant, leg)
        check_kafka_window(rt, leg.tier)
        child = leg_id(message_id, pick.channel, pick.index)
        await accept(rt, tenant, leg, leg_key(key, pick.channel, pick.index),
                     request_hash(asked), accepted_at, expires_at, trace,
                     message_id=child, user=stamp)
        legs.append(LegView(channel=pick.channel, address=_shown(pick.channel, address),
                            message_id=child))
    record = UserSendRecord(
        message_id=message_id, tenant_id=tenant.id, request_hash=hashes[0], tier=req.tier,
        category=req.category, deliver=req.deliver, accepted_at=accepted_at,
        status=_status(req, accepted_at, bool(legs)), picks=decision.picks,
        messages=tuple(legs), skipped=decision.skipped,
        user_preferences_version=decision.user_preferences_version)
    try:
        await store.user_sends.put(record)
    except CASSANDRA_DOWN as exc:
        raise store_unavailable(exc) from None
    return _answer(record)


def _status(req: UserSendRequest, accepted_at: datetime, sent: bool) -> Status:
    if not sent:
        return Status.SUPPRESSED
    if req.scheduled_at is not None and req.scheduled_at > accepted_at:
        return Status.SCHEDULED
    return Status.QUEUED


def furthest(statuses: list[Status | None], fallback: Status) -> Status:
    """The furthest of the messages' statuses (:func:`~notiflow.schemas.status.rank`);
    ``fallback`` when none is known."""
    known = [s for s in statuses if s is not None]
    return max(known, key=rank) if known else fallback


async def user_send_view(rt: Runtime, tenant_id: str, message_id: str
                         ) -> UserMessageView | None:
    """The decision of a send to a user of ``tenant_id`` with each message's current
    status; None when there is no such send."""
    record = await rt.store().user_sends.get(message_id)
    if record is None or record.tenant_id != tenant_id:
        return None
    rows = await asyncio.gather(*(rt.store().messages.get_message(leg.message_id)
                                  for leg in record.messages))
    legs = tuple(leg.model_copy(update={"status": _current(row)})
                 for leg, row in zip(record.messages, rows, strict=True))
    return UserMessageView(
        message_id=record.message_id, status=furthest([leg.status for leg in legs],
                                                      record.status),
        tier=record.tier, category=record.category, deliver=record.deliver,
        accepted_at=record.accepted_at, messages=legs, skipped=record.skipped,
        user_preferences_version=record.user_preferences_version)


def _current(row: MessageRow | None) -> Status | None:
    return Status(row.status) if row is not None and row.status is not None else None
