"""The FCM plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from typing import Final

from notiflow.adapters.providers.base import ProviderSpec, imported, opener
from notiflow.schemas.enums import Channel

SPEC: Final = ProviderSpec(
    "fcm", Channel.PUSH, opener(f"{__package__}.client", "FcmPush"),
    emulator=imported(f"{__package__}.emulator", "FcmEmulator"),
    dev_environment=imported(f"{__package__}.dev", "environment"))
