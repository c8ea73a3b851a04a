"""SMTP email: ``client`` (:class:`~.client.SmtpEmail`, the pooled ESMTP sessions),
``message`` (the MIME message and its correlation headers), ``classify`` (reply and transport
tables), ``receipts`` (DSN bounces) and ``signature`` (the DSN webhook's bearer secret)."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.adapters.providers.smtp import receipts, signature
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.adapters.providers.smtp.client import SmtpEmail

    return await SmtpEmail.open(settings, timeout=timeout,
                                max_connections=settings.smtp.max_connections)


SPEC: Final = ProviderSpec("smtp", Channel.EMAIL, _open, receipts=receipts.dsn_receipts,
                           verify=signature.check_bearer)
