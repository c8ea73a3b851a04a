"""Provider routing by tier policy, recipient country, platform, health and throttling."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notiflow.flows.send.routing import (
    Choice,
    Unavailable,
    Waiting,
    calling_code,
    choose,
    choose_with_quota,
    rank_routes,
    reserve,
)
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


# capacity quota (P0's reservation spans every provider of the channel) ----------------------

SMS_P0 = rank_routes(DEFAULT_ROUTES, tier=Tier.P0, channel=Channel.SMS, recipient=US,
                     enabled=ALL)
SMS_P3 = rank_routes(DEFAULT_ROUTES, tier=Tier.P3, channel=Channel.SMS, recipient=US,
                     enabled=ALL)


class Quota:
    """Per provider, the answers of successive ``acquire`` calls (the last one repeats)."""

    def __init__(self, answers: dict[str, list[float | None]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, Tier, str | None, float | None]] = []

    async def acquire(self, provider_id: str, tier: Tier, tenant_id: str | None = None,
                      tenant_rate: float | None = None) -> float | None:
        self.asked.append((provider_id, tier, tenant_id, tenant_rate))
        queue = self.answers[provider_id]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    def providers(self) -> list[str]:
        return [a[0] for a in self.asked]


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


OPEN = Admission(False, retry_in=30)
PROBE = Admission(True, probe=True)


async def test_p0_with_its_primary_out_of_tokens_goes_to_the_secondary_at_once() -> None:
    b = Breakers({"twilio": Admission(True), "vonage": Admission(True)})
    q = Quota({"twilio": [0.4], "vonage": [None]})
    sleep = Sleeps()
    got = await reserve(SMS_P0, b, q, Tier.P0, tenant_id="acme", tenant_rate=5.0, sleep=sleep)
    assert got == Choice("vonage", False, Admission(True))
    assert sleep.waits == []
    assert q.asked == [("twilio", Tier.P0, "acme", 5.0), ("vonage", Tier.P0, "acme", 5.0)]


async def test_p0_primary_with_a_token_is_used_and_nothing_else_is_asked() -> None:
    b = Breakers({"twilio": Admission(True), "vonage": Admission(True)})
    q = Quota({"twilio": [None], "vonage": [None]})
    assert await reserve(SMS_P0, b, q, Tier.P0) == Choice("twilio", False, Admission(True))
    assert q.providers() == ["twilio"] and b.asked == ["twilio"]


async def test_p0_with_no_token_anywhere_waits_the_shortest_then_chooses_again() -> None:
    b = Breakers({"twilio": Admission(True), "vonage": Admission(True)})
    passed = await choose_with_quota(SMS_P0, b, Quota({"twilio": [0.7], "vonage": [0.1]}),
                                     Tier.P0)
    assert isinstance(passed, Waiting)
    assert (passed.retry_in, passed.choice.provider_id) == (0.1, "vonage")
    assert [c.provider_id for c in passed.admitted] == ["twilio", "vonage"]
    q = Quota({"twilio": [0.7, 0.6], "vonage": [0.1, None]})
    sleep = Sleeps()
    assert await reserve(SMS_P0, b, q, Tier.P0, sleep=sleep) == Choice("vonage", False,
                                                                       Admission(True))
    assert sleep.waits == [0.1]
    assert q.providers() == ["twilio", "vonage", "twilio", "vonage"]


async def test_p0_moves_to_whichever_provider_gets_room_first() -> None:
    b = Breakers({"twilio": Admission(True), "vonage": Admission(True)})
    q = Quota({"twilio": [0.2, None], "vonage": [0.9, 0.7]})
    sleep = Sleeps()
    got = await reserve(SMS_P0, b, q, Tier.P0, sleep=sleep)
    assert isinstance(got, Choice) and got.provider_id == "twilio"
    assert sleep.waits == [0.2]


async def test_p0_skips_a_refused_breaker_and_never_asks_its_quota() -> None:
    b = Breakers({"twilio": OPEN, "vonage": Admission(True)})
    q = Quota({"twilio": [None], "vonage": [0.3, None]})
    sleep = Sleeps()
    assert await reserve(SMS_P0, b, q, Tier.P0, sleep=sleep) == Choice("vonage", False,
                                                                       Admission(True))
    assert "twilio" not in q.providers() and sleep.waits == [0.3]
    b = Breakers({"twilio": OPEN, "vonage": Admission(False, retry_in=12)})
    assert await reserve(SMS_P0, b, q, Tier.P0) == Unavailable(12.0, ("twilio", "vonage"))
    assert await reserve([], b, q, Tier.P0) is None


async def test_p0_holds_a_probe_admission_while_it_waits() -> None:
    b = Breakers({"twilio": PROBE, "vonage": Admission(True)})
    q = Quota({"twilio": [0.2, None], "vonage": [0.5]})
    sleep = Sleeps()
    assert await reserve(SMS_P0, b, q, Tier.P0, sleep=sleep) == Choice("twilio", True, PROBE)
    assert b.asked == ["twilio", "vonage"] and sleep.waits == [0.2]


async def test_p3_waits_for_its_cost_ranked_provider_as_before() -> None:
    b = Breakers({"twilio": Admission(True), "vonage": Admission(True)})
    q = Quota({"twilio": [None], "vonage": [0.5, 0.25, None]})
    sleep = Sleeps()
    assert await reserve(SMS_P3, b, q, Tier.P3, sleep=sleep) == Choice("vonage", False,
                                                                       Admission(True))
    assert sleep.waits == [0.5, 0.25] and q.providers() == ["vonage"] * 3
    b = Breakers({"twilio": OPEN, "vonage": OPEN})
    assert await reserve(SMS_P3, b, q, Tier.P3) == Unavailable(30.0, ("vonage", "twilio"))


async def test_p1_keeps_its_ranked_provider_too() -> None:
    routes = rank_routes(DEFAULT_ROUTES, tier=Tier.P1, channel=Channel.SMS, recipient=US,
                         enabled=ALL)
    b = Breakers({"twilio": Admission(True), "vonage": Admission(True)})
    q = Quota({"twilio": [0.3, None], "vonage": [None]})
    got = await reserve(routes, b, q, Tier.P1, sleep=Sleeps())
    assert isinstance(got, Choice) and got.provider_id == "twilio"
    assert q.providers() == ["twilio", "twilio"]


async def test_without_breakers_every_candidate_is_admitted() -> None:
    q = Quota({"twilio": [0.3], "vonage": [None]})
    assert await reserve(SMS_P0, None, q, Tier.P0) == Choice("vonage", False)


# one pass, any breakers and quota: the rule of choose_with_quota ----------------------------

PROVIDERS = [f"p{i}" for i in range(5)]
ADMISSIONS = st.sampled_from([Admission(True), PROBE, Admission(False, retry_in=3.0),
                              Admission(False, retry_in=0.5)])
WAITS = st.one_of(st.none(), st.sampled_from([0.001, 0.1, 0.1, 0.5, 1.0]))


@given(st.lists(st.tuples(ADMISSIONS, WAITS), min_size=1, max_size=5))
def test_one_pass_takes_the_first_admitted_token_else_the_shortest_wait(
        plan: list[tuple[Admission, float | None]]) -> None:
    routes = [ProviderRoute(provider_id=PROVIDERS[i], channel=Channel.SMS)
              for i in range(len(plan))]
    b = Breakers({PROVIDERS[i]: adm for i, (adm, _) in enumerate(plan)})
    q = Quota({PROVIDERS[i]: [wait] for i, (_, wait) in enumerate(plan)})
    got = asyncio.run(choose_with_quota(routes, b, q, Tier.P0))

    admitted = [i for i, (adm, _) in enumerate(plan) if adm.admitted]
    with_token = [i for i in admitted if plan[i][1] is None]
    if with_token:
        first = with_token[0]
        assert got == Choice(PROVIDERS[first], plan[first][0].probe, plan[first][0])
        assert b.asked == PROVIDERS[:first + 1]
        assert q.providers() == [PROVIDERS[i] for i in admitted if i <= first]
    elif admitted:
        assert isinstance(got, Waiting)
        shortest = min(admitted, key=lambda i: plan[i][1] or 0.0)
        assert got.choice.provider_id == PROVIDERS[shortest]
        assert got.retry_in == plan[shortest][1]
        assert [c.provider_id for c in got.admitted] == [PROVIDERS[i] for i in admitted]
        assert q.providers() == [PROVIDERS[i] for i in admitted]
    else:
        assert got == Unavailable(min(adm.retry_in for adm, _ in plan),
                                  tuple(PROVIDERS[:len(plan)]))
        assert q.asked == []
