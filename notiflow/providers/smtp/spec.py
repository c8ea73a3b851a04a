"""The SMTP plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.providers.smtp import receipts, signature
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.providers.smtp.client import SmtpEmail

    return await SmtpEmail.open(settings, timeout=timeout,
                                max_connections=settings.smtp.max_connections)


SPEC: Final = ProviderSpec.of_package(__name__, Channel.EMAIL, _open, emulator="SmtpEmulator",
                                      dev=True, routes=True, receipts=receipts.dsn_receipts,
                                      verify=signature.check_bearer)
