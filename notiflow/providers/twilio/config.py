"""The Twilio plug-in's settings section (``NOTIFLOW_TWILIO__...``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import SecretStr

from notiflow.schemas.enums import Channel
from notiflow.settings.plugin import ProviderPlugin, SectionSpec, configured, url_fields
from notiflow.settings.providers import ProviderRoute
from notiflow.settings.section import _Frozen


class TwilioSettings(_Frozen):
    """Twilio Messages API account; the base URL points at Twilio or at ``notiflow fakes``."""

    provider_id: str = "twilio"
    base_url: str = "http://127.0.0.1:18090/twilio"
    account_sid: str = "AC00000000000000000000000000000000"
    auth_token: SecretStr | None = None
    from_number: str = "+15005550006"
    status_callback_url: str | None = None
    inbound_url: str | None = None
    """The public URL of ``/webhooks/twilio/inbound`` as set on the account's numbers ("A
    message comes in"), which Twilio signs; unset: the URL the request arrived at."""


class TwilioPlugin(ProviderPlugin):
    """The plug-in's field of :class:`~notiflow.settings.Settings`."""

    SECTION: ClassVar[SectionSpec] = SectionSpec(
        "twilio", TwilioSettings, configured("auth_token"),
        ProviderRoute(provider_id="twilio", channel=Channel.SMS, cost=1.0, reliability=0.995),
        endpoints=url_fields("base_url"))
    twilio: TwilioSettings = TwilioSettings()
