"""Amazon SES v2 email: ``client`` (:class:`~.client.SesEmail`, ``SendEmail`` signed with
AWS Signature Version 4 by botocore, the ``ses`` extra) and ``classify`` (its error types)."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.extras import needs
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    with needs("ses", "the SES adapter (SigV4 signing)"):
        from notiflow.adapters.providers.ses.client import SesEmail

    return await SesEmail.open(settings, timeout=timeout)


SPEC: Final = ProviderSpec("ses", Channel.EMAIL, _open)
