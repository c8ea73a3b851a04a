"""``notiflow.adapters.providers.open_provider``: provider id → the configured adapter."""

from __future__ import annotations

import importlib
import sys

import pytest
from pydantic import SecretStr

from notiflow.adapters.providers import (
    open_provider,
    open_providers,
    provider_kinds,
    provider_specs,
)
from notiflow.providers.sendgrid.client import SendGridEmail
from notiflow.providers.sendgrid.config import SendGridSettings
from notiflow.providers.slack.client import SlackWebhook
from notiflow.providers.smtp.client import SmtpEmail
from notiflow.providers.smtp.config import SmtpSettings
from notiflow.providers.teams.client import TeamsWebhook
from notiflow.providers.twilio.client import TwilioSms
from notiflow.providers.twilio.config import TwilioSettings
from notiflow.providers.vonage.client import VonageSms
from notiflow.providers.vonage.config import VonageSettings
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings

OPENERS = provider_specs(Settings)


def _settings(**kw: object) -> Settings:
    base: dict[str, object] = {
        "twilio": TwilioSettings(auth_token=SecretStr("t")),
        "vonage": VonageSettings(api_key="k", api_secret=SecretStr("s")),
        "sendgrid": SendGridSettings(api_key=SecretStr("SG.x")),
        "smtp": SmtpSettings(username="u", password=SecretStr("p")),
    }
    base.update(kw)
    return Settings(**base)


def test_every_settings_section_has_an_opener() -> None:
    assert set(OPENERS) == {"twilio", "vonage", "sendgrid", "ses", "smtp", "fcm", "apns",
                            "slack", "teams", "inbox"}
    assert provider_kinds(Settings()) == {k: k for k in OPENERS}


def test_provider_ids_follow_the_settings() -> None:
    settings = _settings(vonage=VonageSettings(provider_id="vonage-eu", api_key="k",
                                               api_secret=SecretStr("s")))
    assert provider_kinds(settings)["vonage-eu"] == "vonage"
    assert "vonage" not in provider_kinds(settings)


def test_duplicate_provider_ids_are_refused() -> None:
    settings = _settings(smtp=SmtpSettings(provider_id="sendgrid"))
    with pytest.raises(ValueError, match="both sendgrid and smtp"):
        provider_kinds(settings)


@pytest.mark.parametrize(("provider_id", "kind", "channel"), [
    ("twilio", TwilioSms, Channel.SMS),
    ("vonage", VonageSms, Channel.SMS),
    ("sendgrid", SendGridEmail, Channel.EMAIL),
    ("smtp", SmtpEmail, Channel.EMAIL),
    ("slack", SlackWebhook, Channel.CHAT),
    ("teams", TeamsWebhook, Channel.CHAT),
])
async def test_open_provider(provider_id: str, kind: type, channel: Channel) -> None:
    client = await open_provider(_settings(), provider_id, timeout=1.5)
    try:
        assert isinstance(client, kind)
        assert (client.provider_id, client.channel) == (provider_id, channel)
    finally:
        await client.aclose()


async def test_unknown_and_unconfigured_providers() -> None:
    with pytest.raises(ValueError, match="unknown provider id"):
        await open_provider(_settings(), "nexmo", timeout=1.0)
    with pytest.raises(ValueError, match="api_key"):
        await open_provider(Settings(), "vonage", timeout=1.0)


async def test_apns_without_its_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "notiflow.providers.apns.client", None)
    with pytest.raises(ValueError, match="APNs adapter is not installed"):
        await open_provider(Settings(), "apns", timeout=1.0)


async def test_open_providers_closes_on_failure() -> None:
    opened = await open_providers(_settings(), ["twilio", "smtp", "twilio"], timeout=1.0)
    assert set(opened) == {"twilio", "smtp"}
    for client in opened.values():
        await client.aclose()
    with pytest.raises(ValueError, match="unknown provider id"):
        await open_providers(_settings(), ["twilio", "nope"], timeout=1.0)


def test_registry_holds_each_package_spec_once() -> None:
    for name, spec in OPENERS.items():
        assert spec.name == name
        assert importlib.import_module(f"notiflow.providers.{name}.spec").SPEC is spec
    with_receipts = {name for name, spec in OPENERS.items() if spec.receipts is not None}
    with_checks = {name for name, spec in OPENERS.items() if spec.verify is not None}
    assert with_receipts == with_checks == {"twilio", "vonage", "sendgrid", "smtp"}
    assert {spec.channel for spec in OPENERS.values()} == set(Channel)


def test_each_spec_loads_the_modules_of_its_own_package() -> None:
    assert {n for n, s in OPENERS.items() if s.receipt_routes is not None} == {
        "twilio", "vonage", "sendgrid", "smtp", "ses"}
    assert {n for n, s in OPENERS.items() if s.emulator is None} == {"inbox"}
    assert {n for n, s in OPENERS.items() if s.dev_environment is None} == {"inbox"}
    for name, spec in OPENERS.items():
        package = f"notiflow.providers.{name}"
        if spec.receipt_routes is not None:
            assert spec.receipt_routes() is importlib.import_module(f"{package}.routes").ROUTES
        if spec.dev_environment is not None:
            dev = importlib.import_module(f"{package}.dev")
            assert spec.dev_environment() is dev.environment
        if spec.emulator is not None:
            assert spec.emulator().__module__ == f"{package}.emulator"
