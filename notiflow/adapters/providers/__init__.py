"""Provider adapters and the registry that opens them by provider id.

:func:`open_provider` opens the client of one configured provider account: the id is matched
against ``settings.{twilio,vonage,sendgrid,smtp,fcm,apns}.provider_id``. Adapter modules are
imported on first use, so importing this package stays cheap.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient
from notiflow.settings import Settings

Opener = Callable[[Settings, float | timedelta], Awaitable[ProviderClient]]


async def _twilio(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.adapters.providers.twilio import TwilioSms

    return await TwilioSms.open(settings, timeout=timeout)


async def _vonage(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.adapters.providers.vonage import VonageSms

    return await VonageSms.open(settings, timeout=timeout)


async def _sendgrid(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.adapters.providers.sendgrid import SendGridEmail

    return await SendGridEmail.open(settings, timeout=timeout)


async def _smtp(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.adapters.providers.smtp import SmtpEmail

    return await SmtpEmail.open(settings, timeout=timeout,
                                max_connections=settings.smtp.max_connections)


async def _fcm(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.adapters.providers.fcm import FcmPush

    return await FcmPush.open(settings, timeout=timeout)


APNS_MODULE: Final = "notiflow.adapters.providers.apns"


async def _apns(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    try:
        from notiflow.adapters.providers.apns import ApnsPush
    except ModuleNotFoundError as exc:
        if exc.name != APNS_MODULE:
            raise
        raise ValueError("the APNs adapter is not installed in this build") from exc
    client: ProviderClient = await ApnsPush.open(settings, timeout=timeout)
    return client


OPENERS: Final[Mapping[str, Opener]] = {
    "twilio": _twilio,
    "vonage": _vonage,
    "sendgrid": _sendgrid,
    "smtp": _smtp,
    "fcm": _fcm,
    "apns": _apns,
}
"""Settings section (= adapter kind) → opener."""


def provider_kinds(settings: Settings) -> dict[str, str]:
    """Configured provider id → settings section (``{"twilio": "twilio", ...}``); raises
    ``ValueError`` when two sections share a provider id."""
    kinds: dict[str, str] = {}
    for kind in OPENERS:
        provider_id = getattr(settings, kind).provider_id
        if provider_id in kinds:
            raise ValueError(f"provider id {provider_id!r} is configured for both "
                             f"{kinds[provider_id]} and {kind}")
        kinds[provider_id] = kind
    return kinds


async def open_provider(settings: Settings, provider_id: str, *,
                        timeout: float | timedelta) -> ProviderClient:
    """Open the client of provider account ``provider_id`` inside the running loop.

    ``timeout`` bounds each ``send`` of the client (the tier's ``provider_timeout``). Raises
    ``ValueError`` for an unknown provider id, for duplicate provider ids, and (from the
    adapter) when the account's credentials are not configured. The caller owns the client
    and must ``aclose()`` it.
    """
    kind = provider_kinds(settings).get(provider_id)
    if kind is None:
        raise ValueError(f"unknown provider id {provider_id!r}")
    return await OPENERS[kind](settings, timeout)


async def open_providers(settings: Settings, provider_ids: Iterable[str], *,
                         timeout: float | timedelta) -> dict[str, ProviderClient]:
    """Open several provider accounts (provider id → client); if one fails, those already
    open are closed and the error is raised."""
    clients: dict[str, ProviderClient] = {}
    try:
        for provider_id in provider_ids:
            if provider_id not in clients:
                clients[provider_id] = await open_provider(settings, provider_id,
                                                           timeout=timeout)
    except BaseException:
        for client in clients.values():
            await client.aclose()
        raise
    return clients
