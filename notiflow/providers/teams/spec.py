"""The Teams plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from typing import Final

from notiflow.adapters.providers.base import ProviderSpec, imported, opener
from notiflow.schemas.enums import Channel

SPEC: Final = ProviderSpec(
    "teams", Channel.CHAT, opener(f"{__package__}.client", "TeamsWebhook"),
    emulator=imported(f"{__package__}.emulator", "TeamsEmulator"),
    dev_environment=imported(f"{__package__}.dev", "environment"))
