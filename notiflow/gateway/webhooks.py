"""The shared HTTP side of the provider receipt routes: delivery receipts in, normalised
:class:`Receipt` records out.

Each provider plug-in with delivery webhooks declares its routes in its ``routes`` module
(``notiflow.providers.<name>.routes``: ``/webhooks/twilio``, ``/webhooks/sendgrid``,
``/webhooks/vonage``, ``/webhooks/smtp-dsn``, ``/webhooks/ses``), which the API mounts for
every registered plug-in (``ProviderSpec.receipt_routes``); they use this module's
:func:`read_body`, :func:`precheck`, :func:`verified`, :func:`publish` and :func:`refused`.

Every receiver keeps one contract: a forged, unsigned or stale post is refused with ``403``
and nothing is written; a genuine one is normalised into receipts, each produced to
``notify.receipts`` (key = provider message id) and confirmed by the broker before the ``200``
(a failed produce is a ``503``, the provider retries, the reconciler drops the duplicates by
``(provider_id, provider_event_id)``). Reports that carry no status (SendGrid ``processed`` /
``deferred``, DSN ``delayed``, Vonage ``unknown``) produce nothing. Correlation hints the
adapters put into the message (Twilio's signed callback query, SendGrid ``custom_args``,
Vonage ``client-ref``, the SMTP bounce address's keyed tag) become ``message_id`` /
``attempt``; the reconciler applies a receipt only to the attempt its provider and provider
message id were recorded for. ``docs/api.md`` has the status mapping tables.

The payload parsers and signature checks are the plug-ins' ``receipts`` and ``signature``
modules, which raise :class:`~notiflow.adapters.providers.webhook.WebhookRefused` for a
``403``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fastapi import Request
from pydantic import ValidationError

from notiflow import names, telemetry
from notiflow.adapters.kafka_io import OutRecord, make_headers
from notiflow.adapters.providers.webhook import WebhookRefused
from notiflow.gateway.bodies import read_limited
from notiflow.gateway.errors import ApiError, forbidden
from notiflow.gateway.runtime import Runtime
from notiflow.schemas.messages import Receipt

log = logging.getLogger("notiflow.gateway.webhooks")
T = TypeVar("T")
_receipts = names.RECEIPTS.create(telemetry.meter())

MAX_BODY = 64 * 1024
"""The body limit of a receipt route with small posts (one receipt each)."""


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body; ``413`` as soon as it exceeds ``limit`` bytes (declared or streamed),
    ``408`` when it is too slow (:func:`~notiflow.gateway.bodies.read_limited`)."""
    return await read_limited(request, limit)


def precheck(check: Callable[[], T]) -> T:
    """``check()``, a plug-in's look at a post's headers before its body is read (e.g.
    ``providers/twilio/signature.check_headers``: the receiver configured, the signature
    headers present and shaped, a fresh timestamp), so that a post no provider sent is
    refused for the price of its headers; ``403`` when it refuses. The full check on the
    body still runs afterwards."""
    try:
        return check()
    except WebhookRefused as exc:
        raise refused(exc) from None


async def publish(runtime: Runtime, receipts: Sequence[Receipt],
                  traces: Sequence[str | None] = ()) -> None:
    """Produce every receipt to ``notify.receipts``; returns once the broker acknowledged all
    of them, raises :class:`~notiflow.adapters.kafka_io.DeliveryFailed` otherwise.

    Each receipt gets a ``notiflow.receipt`` span: a child of the provider call whose
    ``traceparent`` the provider echoed (``traces[i]``: Twilio's signed callback URL,
    SendGrid ``custom_args``), linked to this HTTP request's span; without one, a child of
    the request span. The record's ``traceparent`` header is that span's."""
    if not receipts:
        return
    producer = runtime.producer()
    topic = runtime.settings.receipts_topic
    request = telemetry.link_to(telemetry.current_traceparent())
    records = []
    for i, r in enumerate(receipts):
        trace = traces[i] if i < len(traces) else None
        attrs = {names.ATTR_MESSAGE_ID: r.message_id, names.ATTR_PROVIDER: r.provider_id,
                 names.ATTR_STATUS: r.status.value}
        with telemetry.span(names.RECEIPT, attrs, parent=trace,
                            links=[request] if telemetry.context_of(trace) else []):
            records.append(OutRecord(
                topic, r.provider_message_id.encode(),
                r.model_dump_json(exclude_none=True).encode(),
                make_headers(r.message_id or "", None, None, telemetry.current_traceparent())))
    outcomes = await asyncio.gather(*(producer.produce(rec) for rec in records),
                                    return_exceptions=True)
    failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failed is not None:
        raise failed
    channels = {route.provider_id: route.channel.value for route in runtime.settings.routes}
    for r in receipts:
        _receipts.add(1, {"provider": r.provider_id, "status": r.status.value,
                          "channel": channels.get(r.provider_id, "")})


def refused(exc: WebhookRefused) -> ApiError:
    """The ``403`` of a post a provider's signature check refused."""
    return forbidden(exc.reason, exc.message)


def verified(runtime: Runtime, section: str, check: Callable[[Any], T]) -> T:
    """``check(config)`` with the provider account's settings ``section`` as configured now,
    then as configured before a credential reload whose rotation window is still open
    (``notiflow/secrets.py``): the first that does not refuse wins; otherwise ``403`` with
    the current configuration's reason."""
    first: WebhookRefused | None = None
    for config in runtime.keyring.sections(section):
        try:
            return check(config)
        except WebhookRefused as exc:
            first = first or exc
    assert first is not None
    raise refused(first) from None


def problem(exc: Exception) -> str:
    """What is wrong with a payload, for an answer or a log line."""
    if isinstance(exc, ValidationError):
        return "invalid " + ", ".join(".".join(str(p) for p in e["loc"])
                                      for e in exc.errors(include_input=False))
    return str(exc)
