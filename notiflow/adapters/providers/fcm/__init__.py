"""FCM push: ``client`` (:class:`~.client.FcmPush`, the wire format), ``classify`` (its
tables), ``tokens`` (the service-account assertion and the cached access token). FCM posts no
delivery receipts, so there are no ``receipts`` or ``signature`` modules."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.adapters.providers.fcm.client import FcmPush

    return await FcmPush.open(settings, timeout=timeout)


SPEC: Final = ProviderSpec("fcm", Channel.PUSH, _open)
