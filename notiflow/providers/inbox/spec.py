"""The inbox plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from typing import Final

from notiflow.adapters.providers.base import ProviderSpec
from notiflow.schemas.enums import Channel

SPEC: Final = ProviderSpec.of_package(__name__, Channel.INAPP, "InboxDelivery")
