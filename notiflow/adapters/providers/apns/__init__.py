"""APNs push: ``client`` (:class:`~.client.ApnsPush`, the HTTP/2 wire format), ``classify``
(its tables), ``tokens`` (the ES256 provider token). APNs posts no delivery receipts, so there
are no ``receipts`` or ``signature`` modules.

The client is imported behind a guard: a build without ``apns.client`` keeps the registry
working and :data:`SPEC` ``.open`` raises ``ValueError``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings

CLIENT_MODULE: Final = "notiflow.adapters.providers.apns.client"


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    try:
        from notiflow.adapters.providers.apns.client import ApnsPush
    except ModuleNotFoundError as exc:
        if exc.name != CLIENT_MODULE:
            raise
        raise ValueError("the APNs adapter is not installed in this build") from exc
    client: ProviderClient = await ApnsPush.open(settings, timeout=timeout)
    return client


SPEC: Final = ProviderSpec("apns", Channel.PUSH, _open)
