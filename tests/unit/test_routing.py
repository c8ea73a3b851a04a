"""Provider routing by tier policy, recipient country, platform, health and throttling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from notiflow.flows.routing import Choice, Unavailable, calling_code, choose, rank_routes
from notiflow.schemas.enums import Channel, PushPlatform, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import DEFAULT_ROUTES, ProviderRoute

ALL = frozenset({"twilio", "vonage", "sendgrid", "smtp", "fcm", "apns"})
US = "+14155552671"


def ids(routes: list[ProviderRoute]) -> list[str]:
    return [r.provider_id for r in routes]


def rank(tier: Tier, channel: Channel = Channel.SMS, recipient: Any = US, **kw: Any) -> list[str]:
    kw.setdefault("enabled", ALL)
    return ids(rank_routes(DEFAULT_ROUTES, tier=tier, channel=channel, recipient=recipient,
                           **kw))


def test_tier_policies_order_sms_providers() -> None:
    assert rank(Tier.P0) == ["twilio", "vonage"]
    assert rank(Tier.P1) == ["twilio", "vonage"]
    assert rank(Tier.P2) == ["vonage", "twilio"]
    assert rank(Tier.P3) == ["vonage", "twilio"]
    assert rank(Tier.P3, Channel.EMAIL, "a@example.com") == ["smtp", "sendgrid"]
    assert rank(Tier.P0, Channel.EMAIL, "a@example.com") == ["sendgrid", "smtp"]


def test_failed_provider_is_tried_last() -> None:
    assert rank(Tier.P0, avoid="twilio") == ["vonage", "twilio"]
    assert rank(Tier.P3, avoid="vonage") == ["twilio", "vonage"]


def test_only_configured_providers() -> None:
    assert rank(Tier.P3, enabled=frozenset({"twilio"})) == ["twilio"]
    assert rank(Tier.P3, enabled=frozenset()) == []


def test_country_and_platform_filters() -> None:
    uk_only = (ProviderRoute(provider_id="vonage", channel=Channel.SMS, cost=0.1,
                             countries=frozenset({"44"})),
               ProviderRoute(provider_id="twilio", channel=Channel.SMS, cost=1.0))
    us = rank_routes(uk_only, tier=Tier.P3, channel=Channel.SMS, recipient=US, enabled=ALL)
    uk = rank_routes(uk_only, tier=Tier.P3, channel=Channel.SMS, recipient="+447911123456",
                     enabled=ALL)
    assert ids(us) == ["twilio"] and ids(uk) == ["vonage", "twilio"]
    ios = PushRecipient(device_token="ab" * 32, platform=PushPlatform.IOS)
    android = PushRecipient(device_token="t" * 64, platform=PushPlatform.ANDROID)
    assert rank(Tier.P0, Channel.PUSH, ios) == ["apns"]
    assert rank(Tier.P0, Channel.PUSH, android) == ["fcm"]
    assert calling_code("+447911123456") == "44" and calling_code("nonsense") == ""


def test_throttling_lowers_a_providers_place() -> None:
    assert rank(Tier.P0, weight=lambda p: 0.5 if p == "twilio" else 1.0) == ["vonage", "twilio"]
    assert rank(Tier.P3, weight=lambda p: 0.5 if p == "vonage" else 1.0) == ["twilio", "vonage"]


@dataclass
class Admission:
    admitted: bool
    probe: bool = False
    retry_in: float = 0.0


class Breakers:
    def __init__(self, states: dict[str, Admission]) -> None:
        self.states = states
        self.asked: list[str] = []

    async def allow(self, provider_id: str) -> Admission:
        self.asked.append(provider_id)
        return self.states[provider_id]

    def weight(self, provider_id: str) -> float:
        return 1.0


@pytest.mark.asyncio
async def test_choose_skips_open_breakers_and_reports_when_all_are_open() -> None:
    routes = rank_routes(DEFAULT_ROUTES, tier=Tier.P0, channel=Channel.SMS, recipient=US,
                         enabled=ALL)
    b = Breakers({"twilio": Admission(False, retry_in=30), "vonage": Admission(True)})
    assert await choose(routes, b) == Choice("vonage", False, Admission(True))
    b = Breakers({"twilio": Admission(True, probe=True), "vonage": Admission(True)})
    assert await choose(routes, b) == Choice("twilio", True, Admission(True, probe=True))
    b = Breakers({"twilio": Admission(False, retry_in=30), "vonage": Admission(False,
                                                                             retry_in=12)})
    assert await choose(routes, b) == Unavailable(12.0, ("twilio", "vonage"))
    assert await choose([], b) is None
    assert await choose(routes, None) == Choice("twilio", False)
