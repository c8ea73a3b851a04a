"""A provider is one plug-in package and one registry entry: a plug-in added to a copy of
the registry (``tests/sample_provider``) is picked up by the settings (its section, read from
``NOTIFLOW_SAMPLE__...``; enabled providers; endpoints; routes), by ``open_provider``, by
``notiflow fakes``, by the API's receipt routes and by the development environment, and
nothing else names it. Every package of ``notiflow/providers`` is registered."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

import notiflow.providers
from notiflow.adapters.providers import open_provider, provider_kinds, provider_specs
from notiflow.adapters.providers.base import DevEndpoints, OutboundMessage, Outcome
from notiflow.devenv import dev_environment, provider_environment
from notiflow.fakes.server import build_app as build_fakes
from notiflow.fakes.server import emulators
from notiflow.gateway.app import build_app as build_api
from notiflow.gateway.app import max_any_body
from notiflow.gateway.batch import MAX_BATCH_BYTES
from notiflow.providers.registry import DEFAULT_ROUTES, ProviderSections
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings
from notiflow.settings.plugin import configured, plugins
from tests.sample_provider import spec as sample_spec
from tests.sample_provider.config import SamplePlugin, SampleSettings, SettingsWithSample


def test_the_section_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFLOW_SAMPLE__TOKEN", "t0ken")
    monkeypatch.setenv("NOTIFLOW_SAMPLE__PROVIDER_ID", "sample-eu")
    settings = SettingsWithSample()
    assert settings.sample.token == SecretStr("t0ken")
    assert settings.sample.provider_id == "sample-eu"
    assert "sample-eu" in settings.enabled_providers()
    assert provider_kinds(settings)["sample-eu"] == "sample"
    assert not hasattr(Settings(), "sample")


def test_enabled_providers_follow_the_plugins_own_rule() -> None:
    assert "sample" not in SettingsWithSample().enabled_providers()
    configured = SettingsWithSample(sample={"token": "x"})
    assert configured.enabled_providers() == Settings().enabled_providers() | {"sample"}


def test_configured_asks_every_field_to_be_set() -> None:
    enabled = configured("token", "base_url")
    assert enabled(SampleSettings(token=SecretStr("t")))
    assert not enabled(SampleSettings())
    assert not enabled(SampleSettings(token=SecretStr("")))
    assert not enabled(SampleSettings(token=SecretStr("t"), base_url=""))


def test_its_endpoints_are_held_to_https_outside_development() -> None:
    assert ("sample.base_url", "http://127.0.0.1:18090/sample") in (
        SettingsWithSample().provider_endpoints())
    with pytest.raises(ValidationError, match=r"sample\.base_url: plain http"):
        SettingsWithSample(environment="production", sample={"base_url": "http://sms.example"})


def test_the_registry_order_is_kept_and_the_plugin_comes_last() -> None:
    names = list(SettingsWithSample.section_specs())
    assert names == [*Settings.section_specs(), "sample"]
    assert plugins(SettingsWithSample)[-1] is SamplePlugin
    assert "sample" not in {route.provider_id for route in DEFAULT_ROUTES}


async def test_open_provider_opens_its_client() -> None:
    settings = SettingsWithSample(sample={"token": "x"})
    assert provider_specs(SettingsWithSample)["sample"] is sample_spec.SPEC
    client = await open_provider(settings, "sample", timeout=1.0)
    try:
        message = OutboundMessage("m1", 1, "t1", Channel.SMS, Tier.P1, "+15005550006", "hi")
        assert (await client.send(message)).outcome is Outcome.ACCEPTED
    finally:
        await client.aclose()


def test_notiflow_fakes_serves_its_emulator() -> None:
    settings = SettingsWithSample()
    assert list(emulators(settings)) == [*emulators(Settings()), "sample"]
    paths = {r.resource.canonical for r in build_fakes(settings).router.routes()
             if r.resource is not None}
    assert {"/sample/messages", "/_admin/sample/config"} <= paths


def test_the_api_mounts_its_receipt_route() -> None:
    doc = build_api(SettingsWithSample()).openapi()
    assert "/webhooks/sample" in doc["paths"]
    assert "/webhooks/sample" not in build_api(Settings()).openapi()["paths"]
    assert max_any_body(SettingsWithSample()) == 16 * 1024 * 1024
    assert max_any_body(Settings()) == MAX_BATCH_BYTES
    priority = build_api(SettingsWithSample(api_lane="priority")).openapi()["paths"]
    assert not any(path.startswith("/webhooks/") for path in priority)


def _owner(variable: str, names: Iterable[str]) -> str | None:
    """The plug-in whose ``NOTIFLOW_<NAME>__`` or ``NOTIFLOW_FAKES_<NAME>_`` ``variable`` is."""
    return next((name for name in names
                 if variable.startswith((f"NOTIFLOW_{name.upper()}__",
                                         f"NOTIFLOW_FAKES_{name.upper()}_"))), None)


def _endpoints(tmp_path: Path) -> DevEndpoints:
    return DevEndpoints.loopback(fakes_port=2, webhook_port=4, apns_port=3,
                                 tls_dir=tmp_path / "tls")


def test_the_dev_environment_is_the_union_of_the_plugins(tmp_path: Path) -> None:
    env, _ = dev_environment(api_port=1, fakes_port=2, apns_port=3, webhook_port=4,
                             tls_dir=tmp_path / "dev-tls",
                             extra={"NOTIFLOW_STACK_DIR": str(tmp_path / "stack")})
    names = list(Settings.section_specs())
    parts = {name: spec.dev_environment()(_endpoints(tmp_path))
             for name, spec in provider_specs(Settings).items()
             if spec.dev_environment is not None}
    for name, part in parts.items():
        assert {_owner(variable, names) for variable in part} == {name}
    assert {v for v in env if _owner(v, names)} == {v for part in parts.values() for v in part}
    receipts = [v for v in env.values() if "/webhooks/" in v]
    assert receipts and all(v.startswith("http://127.0.0.1:4/webhooks/") for v in receipts)


def test_a_plugins_dev_environment_is_picked_up(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    env = provider_environment(SettingsWithSample, _endpoints(tmp_path))
    assert env.keys() - provider_environment(Settings, _endpoints(tmp_path)).keys() == {
        "NOTIFLOW_SAMPLE__BASE_URL", "NOTIFLOW_SAMPLE__TOKEN"}
    monkeypatch.setenv("NOTIFLOW_SAMPLE__TOKEN", env["NOTIFLOW_SAMPLE__TOKEN"])
    monkeypatch.setenv("NOTIFLOW_SAMPLE__BASE_URL", env["NOTIFLOW_SAMPLE__BASE_URL"])
    settings = SettingsWithSample()
    assert "sample" in settings.enabled_providers()
    assert settings.sample.base_url == "http://127.0.0.1:2/sample"


def test_two_plugins_may_not_set_one_variable(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    class Clashing(SettingsWithSample):
        pass

    def clash(_endpoints: DevEndpoints) -> dict[str, str]:
        return {"NOTIFLOW_TWILIO__AUTH_TOKEN": "sample's"}

    monkeypatch.setattr(sample_spec, "SPEC", dataclasses.replace(
        sample_spec.SPEC, dev_environment=lambda: clash))
    with pytest.raises(ValueError, match=r"sample plug-in sets \['NOTIFLOW_TWILIO__AUTH_TOKEN'\]"):
        provider_environment(Clashing, _endpoints(tmp_path))


def test_every_provider_package_is_registered() -> None:
    packages = {m.name for m in pkgutil.iter_modules(notiflow.providers.__path__) if m.ispkg}
    registered = set(Settings.section_specs())
    assert packages == registered
    for name in registered:
        assert importlib.import_module(f"notiflow.providers.{name}.spec").SPEC.name == name
    assert set(provider_specs(Settings)) == registered
    assert {p.SECTION.name for p in plugins(ProviderSections)} == registered


def test_a_spec_that_does_not_match_its_plugin_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Renamed(SettingsWithSample):
        pass

    monkeypatch.setattr(sample_spec, "SPEC", sample_spec.SPEC.__class__(
        "other", Channel.SMS, sample_spec.SPEC.open))
    with pytest.raises(TypeError, match="not the ProviderSpec of 'sample'"):
        provider_specs(Renamed)


def test_env_names_of_the_registered_sections_are_unchanged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFLOW_TWILIO__AUTH_TOKEN", "t")
    monkeypatch.setenv("NOTIFLOW_SES__SNS_MAX_AGE", "PT30M")
    monkeypatch.setenv("NOTIFLOW_SLACK__PACE", '{"rate": 3, "burst": 2}')
    monkeypatch.setenv("NOTIFLOW_INBOX__PORT", "19999")
    settings = Settings()
    assert settings.twilio.auth_token == SecretStr("t")
    assert settings.ses.sns_max_age == timedelta(minutes=30)
    assert (settings.slack.pace.rate, settings.slack.pace.burst) == (3, 2)
    assert settings.inbox.port == 19999
