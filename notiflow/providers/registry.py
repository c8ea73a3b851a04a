"""The provider registry: the one list of provider plug-ins.

A provider is registered by naming its ``config`` module's plug-in class among the bases of
:class:`ProviderSections` (one import and one base). Everything that enumerates providers
derives from this class: :class:`~notiflow.settings.Settings` (it derives from it, so each
plug-in's section is a settings field) and its ``enabled_providers()``, the default routes,
the adapters' specs (:func:`notiflow.adapters.providers.provider_specs`), the emulators of
``notiflow fakes`` and the API's receipt routes (docs/providers.md, "Adding a provider").

This module and the ``config`` modules belong to the settings layer: they import no adapter.
"""

from __future__ import annotations

from typing import Final

from notiflow.providers.apns.config import ApnsPlugin
from notiflow.providers.fcm.config import FcmPlugin
from notiflow.providers.inbox.config import InboxPlugin
from notiflow.providers.sendgrid.config import SendGridPlugin
from notiflow.providers.ses.config import SesPlugin
from notiflow.providers.slack.config import SlackPlugin
from notiflow.providers.smtp.config import SmtpPlugin
from notiflow.providers.teams.config import TeamsPlugin
from notiflow.providers.twilio.config import TwilioPlugin
from notiflow.providers.vonage.config import VonagePlugin
from notiflow.settings.plugin import plugins
from notiflow.settings.providers import ProviderRoute


class ProviderSections(
    TwilioPlugin,
    SendGridPlugin,
    VonagePlugin,
    SmtpPlugin,
    SesPlugin,
    FcmPlugin,
    ApnsPlugin,
    SlackPlugin,
    TeamsPlugin,
    InboxPlugin,
):
    """Every registered provider plug-in, one base each, in registry order."""


DEFAULT_ROUTES: Final[tuple[ProviderRoute, ...]] = tuple(
    plugin.SECTION.route for plugin in plugins(ProviderSections))
"""The default ``settings.routes``: each registered provider's route."""
