"""Admission control: bucket parameters, shedding bounds, reasons, Redis-down policy, the
backlog cache (the Lua buckets themselves run against real Redis in the integration tests)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import SecretStr

from notiflow.adapters.admission import (
    AdmissionStore,
    AdmissionUnavailable,
    Bucket,
    Verdict,
    one_second_bucket,
    retry_after_s,
)
from notiflow.gateway.admission import (
    Admission,
    backlog_bound_s,
    channel_providers,
    p0_rate,
    shed_retry_after_s,
)
from notiflow.gateway.errors import ApiError
from notiflow.providers.apns.config import ApnsSettings
from notiflow.providers.fcm.config import FcmSettings
from notiflow.providers.sendgrid.config import SendGridSettings
from notiflow.providers.smtp.config import SmtpSettings
from notiflow.providers.twilio.config import TwilioSettings
from notiflow.providers.vonage.config import VonageSettings
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import SendRequest
from notiflow.settings import ProviderRoute, Settings, TenantConfig


def tenant(rate_limit: float | None = None) -> TenantConfig:
    return TenantConfig(id="acme", token="t" * 32, rate_limit=rate_limit)


def request(tier: str = "P1", channel: str = "SMS") -> SendRequest:
    recipient = "+14155550123" if channel == "SMS" else "a@example.com"
    return SendRequest.model_validate({"channel": channel, "tier": tier, "recipient": recipient,
                                       "template_id": "otp", "template_version": 1})


class StubStore(AdmissionStore):
    """No Redis: canned verdicts and backlog ages, records what was asked."""

    def __init__(self, *, verdict: Verdict | None = None, age: float | None = None,
                 down: bool = False, p0: float | None = None) -> None:
        self.prefix = "p."
        self.verdict = verdict or Verdict(None, 0.0)
        self.age = age
        self.down = down
        self.p0 = p0
        self.taken: list[list[Bucket]] = []
        self.asked: list[Tier] = []

    async def take(self, buckets: Sequence[Bucket], cost: float = 1.0) -> Verdict:
        if self.down:
            raise AdmissionUnavailable("down")
        self.taken.append(list(buckets))
        return self.verdict

    async def backlog_age(self, tier: Tier) -> float | None:
        if self.down:
            raise AdmissionUnavailable("down")
        self.asked.append(tier)
        return self.age

    async def p0_worst(self) -> float | None:
        if self.down:
            raise AdmissionUnavailable("down")
        return self.p0


@pytest.mark.parametrize(("tier", "p0", "refused"), [
    ("P3", 0.9, True), ("P2", 0.36, True), ("P3", 0.3, False), ("P3", None, False),
    ("P0", 5.0, False), ("P1", 5.0, False)])
async def test_bulk_acceptance_yields_while_p0_is_slow(tier: str, p0: float | None,
                                                       refused: bool) -> None:
    admission = Admission(Settings(), StubStore(p0=p0))
    if not refused:
        await admission.check(tenant(), request(tier))
        return
    with pytest.raises(ApiError) as err:
        await admission.check(tenant(), request(tier))
    assert (err.value.status, err.value.reason) == (429, "priority_pressure")
    assert err.value.headers["Retry-After"] == "1"


async def test_bulk_yield_can_be_switched_off() -> None:
    s = Settings(bulk_yield={"enabled": False})
    await Admission(s, StubStore(p0=5.0)).check(tenant(), request("P3"))


@pytest.mark.parametrize(("wait", "expected"), [(0.0, 1), (0.01, 1), (1.0, 1), (1.2, 2),
                                                (29.5, 30)])
def test_retry_after_is_whole_seconds_rounded_up(wait: float, expected: int) -> None:
    assert retry_after_s(wait) == expected


def test_one_second_bucket_holds_at_least_one_token() -> None:
    assert one_second_bucket("k", 0.5) == Bucket("k", 0.5, 1.0)
    assert one_second_bucket("k", 50) == Bucket("k", 50, 50)


ALL_PROVIDERS: dict[str, Any] = {
    "twilio": TwilioSettings(auth_token=SecretStr("t")),
    "vonage": VonageSettings(api_key="k", api_secret=SecretStr("s")),
    "sendgrid": SendGridSettings(api_key=SecretStr("SG.x")),
    "smtp": SmtpSettings(username="u", password=SecretStr("p")),
    "fcm": FcmSettings(client_email="sa@example.com", private_key=SecretStr("k")),
    "apns": ApnsSettings(team_id="T", key_id="K", private_key=SecretStr("k")),
}


def configured(*providers: str, **kw: Any) -> Settings:
    """Settings whose ``providers`` have credentials (every one when none is named)."""
    return Settings(**{p: ALL_PROVIDERS[p] for p in providers or ALL_PROVIDERS}, **kw)


def test_p0_envelope_is_share_of_provider_rate_plus_emergency() -> None:
    s = configured("twilio", provider_rates={"twilio": 100.0})
    assert p0_rate(s, Channel.SMS) == pytest.approx(20.0)
    s = configured("twilio", provider_rates={"twilio": 100.0}, p0_emergency_rate=5.0)
    assert p0_rate(s, Channel.SMS) == pytest.approx(25.0)
    assert p0_rate(configured(provider_rates={}), Channel.SMS) is None
    assert p0_rate(configured(provider_rates={"sendgrid": 10.0}), Channel.EMAIL) == \
        pytest.approx(2.0)


def test_p0_envelope_counts_every_enabled_provider_of_the_channel() -> None:
    rates = {"twilio": 100.0, "vonage": 50.0, "fcm": 1000.0, "apns": 400.0, "smtp": 20.0}
    s = configured(provider_rates=rates, p0_emergency_rate=1.0)
    assert channel_providers(s, Channel.SMS) == {"twilio", "vonage"}
    assert p0_rate(s, Channel.SMS) == pytest.approx(0.2 * 150.0 + 1.0)
    assert p0_rate(s, Channel.PUSH) == pytest.approx(0.2 * 1400.0 + 1.0)
    assert p0_rate(s, Channel.EMAIL) == pytest.approx(0.2 * 20.0 + 1.0)
    only_twilio = configured("twilio", "fcm", "apns", provider_rates=rates)
    assert p0_rate(only_twilio, Channel.SMS) == pytest.approx(20.0)
    assert p0_rate(configured(provider_rates={"smtp": 20.0}), Channel.SMS) is None
    assert p0_rate(Settings(provider_rates=rates), Channel.SMS) is None


def test_p0_envelope_follows_configured_routes_and_provider_ids() -> None:
    routes = (ProviderRoute(provider_id="vonage-eu", channel=Channel.SMS),
              ProviderRoute(provider_id="vonage-eu", channel=Channel.SMS,
                            countries=frozenset({"44"})),
              ProviderRoute(provider_id="twilio", channel=Channel.SMS))
    s = configured("twilio", routes=routes,
                   vonage=VonageSettings(provider_id="vonage-eu", api_key="k",
                                         api_secret=SecretStr("s")),
                   provider_rates={"twilio": 100.0, "vonage-eu": 10.0, "vonage": 1000.0})
    assert channel_providers(s, Channel.SMS) == {"twilio", "vonage-eu"}
    assert p0_rate(s, Channel.SMS) == pytest.approx(0.2 * 110.0)
    assert p0_rate(s, Channel.PUSH) is None


def test_backlog_bounds_are_scaled() -> None:
    s = Settings(time_scale=0.01)
    assert backlog_bound_s(s, Tier.P3) == pytest.approx(18.0)
    assert backlog_bound_s(s, Tier.P2) == pytest.approx(2.4)
    assert backlog_bound_s(s, Tier.P0) is None
    assert backlog_bound_s(s, Tier.P1) is None
    assert shed_retry_after_s(s) == 1.0
    assert shed_retry_after_s(Settings()) == 30.0


async def test_unlimited_tenant_on_p1_needs_no_redis() -> None:
    store = StubStore(down=True)
    await Admission(Settings(), store).check(tenant(), request("P1"))
    assert store.taken == [] and store.asked == []


async def test_backlogged_tier_is_shed_with_retry_after() -> None:
    store = StubStore(age=3600.0)
    with pytest.raises(ApiError) as err:
        await Admission(Settings(), store).check(tenant(), request("P3"))
    assert (err.value.status, err.value.reason) == (429, "backlog")
    assert err.value.headers["Retry-After"] == "30"
    await Admission(Settings(), StubStore(age=60.0)).check(tenant(), request("P3"))


async def test_buckets_and_reasons() -> None:
    s = configured("twilio", provider_rates={"twilio": 10.0})
    store = StubStore()
    await Admission(s, store).check(tenant(5.0), request("P0"))
    assert store.taken == [[Bucket("p.admission:tenant:acme", 5.0, 5.0),
                            Bucket("p.admission:p0:SMS", 2.0, 2.0)]]

    for denied, reason in ((0, "tenant_rate"), (1, "p0_capacity")):
        with pytest.raises(ApiError) as err:
            await Admission(s, StubStore(verdict=Verdict(denied, 1.5))).check(
                tenant(5.0), request("P0"))
        assert (err.value.status, err.value.error, err.value.reason) == (
            429, "rate_limited", reason)
        assert err.value.headers["Retry-After"] == "2"

    with pytest.raises(ApiError) as err:
        await Admission(s, StubStore(verdict=Verdict(0, 0.2))).check(tenant(), request("P0"))
    assert err.value.reason == "p0_capacity"


async def test_redis_down_fails_open_for_p0_p1_and_closed_for_p2_p3() -> None:
    admission = Admission(Settings(), StubStore(down=True))
    for tier in ("P0", "P1"):
        await admission.check(tenant(5.0), request(tier))
    for tier in ("P2", "P3"):
        with pytest.raises(ApiError) as err:
            await admission.check(tenant(), request(tier))
        assert (err.value.status, err.value.reason) == (503, "admission_unavailable")
        assert err.value.headers["Retry-After"] == "5"


class FakeRedis:
    """Just enough of ``redis.asyncio.Redis`` for the backlog read."""

    def __init__(self) -> None:
        self.reads = 0
        self.fail = False

    def register_script(self, _script: str) -> Any:
        return None

    async def hgetall(self, _key: str) -> dict[str, str]:
        self.reads += 1
        if self.fail:
            raise ConnectionError("refused")
        return {}


async def test_backlog_signal_is_cached_and_redis_failures_back_off() -> None:
    now = [100.0]
    fake = FakeRedis()
    store = AdmissionStore(fake, "p.", clock=lambda: now[0])  # type: ignore[arg-type]
    assert await store.backlog_age(Tier.P3) is None
    assert await store.backlog_age(Tier.P3) is None
    assert fake.reads == 1
    now[0] += 1.0
    await store.backlog_age(Tier.P3)
    assert fake.reads == 2

    fake.fail = True
    now[0] += 1.0
    with pytest.raises(AdmissionUnavailable):
        await store.backlog_age(Tier.P3)
    with pytest.raises(AdmissionUnavailable):
        await store.backlog_age(Tier.P2)
    assert fake.reads == 3
    fake.fail = False
    now[0] += 1.0
    assert await store.backlog_age(Tier.P2) is None
    assert fake.reads == 4
