"""Inbound SMS keywords at the API: a STOP, START or HELP a person texted to one of the
platform's numbers, taken from a provider's signed inbound webhook
(``/webhooks/twilio/inbound``, ``/webhooks/vonage/inbound``), changes that number's consent
for every tenant that sends from the number (:mod:`notiflow.sms_keywords`):

- STOP suppresses the sender's number (``unsubscribed``, as Twilio's error 21610 does):
  nothing more is sent to it by SMS, whatever the category, until START;
- START clears an ``unsubscribed`` suppression under every hash the number's state may be
  stored under, and no other (a number a provider called invalid stays suppressed);
- HELP changes nothing.

Each change is stored and published (``PreferenceStore``) before the webhook is answered, so
the next message the send flows take sees it. The answer names the reply to text back
(:func:`reply_for`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from notiflow import names, telemetry
from notiflow.adapters.ports import SmsConsent
from notiflow.redact import mask, recipient_hash, recipient_hashes
from notiflow.settings import Settings, TenantConfig
from notiflow.sms_keywords import InboundSms, Keyword, reply_for, tenants_of_number

log = logging.getLogger(__name__)
_keywords = names.SMS_KEYWORDS.create(telemetry.meter())


async def take_inbound(consent: SmsConsent, settings: Settings, sms: InboundSms,
                       account_numbers: Sequence[str]) -> str | None:
    """Apply ``sms``'s keyword to each tenant sending from its number; returns the text to
    answer it with (None: no answer). Raises what the consent store raises (the webhook
    answers ``503`` and the provider posts again; every change is idempotent)."""
    keyword = sms.keyword
    _keywords.add(1, {"provider": sms.provider_id,
                      "keyword": keyword.value if keyword else "none"})
    if keyword is None:
        return None
    ids = tenants_of_number(settings.tenants, sms.number, account_numbers)
    if not ids:
        log.warning("%s from %s to %s, a number no tenant sends from: nothing changed",
                    keyword.value, mask(sms.sender), sms.number)
    for tenant_id in ids:
        if keyword is Keyword.STOP:
            await consent.suppress(tenant_id, recipient_hash(tenant_id, sms.sender),
                                   "unsubscribed")
        elif keyword is Keyword.START:
            for h in recipient_hashes(tenant_id, sms.sender):
                await consent.unsuppress(tenant_id, h, only="unsubscribed")
    if ids:
        log.info("%s from %s to %s applied for %d tenant(s)", keyword.value,
                 mask(sms.sender), sms.number, len(ids))
    tenants: list[TenantConfig] = [t for t in map(settings.tenant, ids) if t is not None]
    return reply_for(keyword, tenants, settings.sms_replies)
