"""Category → tier: marketing is never P0 or P1. The rule is one settings value object,
enforced by the API (422 ``category_tier_not_allowed`` for single sends, batch items,
schedules and campaigns) and by the send flow for records produced straight onto an ingest
topic (a dead letter charged to the tenant)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from bytewax.connectors.kafka import KafkaSourceMessage
from cryptography.fernet import Fernet
from pydantic import ValidationError

from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.flows.common.guard import charged_to_tenant, source_of
from notiflow.flows.common.items import Work
from notiflow.flows.common.steps import IngestParser
from notiflow.gateway.acceptance import check_policy
from notiflow.gateway.checks import check_sender
from notiflow.gateway.errors import ApiError
from notiflow.schemas.campaigns import CampaignRequest
from notiflow.schemas.enums import Category, Tier
from notiflow.schemas.messages import DlqRecord, SendRequest
from notiflow.settings import CategoryTiers, Settings, TenantConfig

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
KEY = Fernet.generate_key()
TOKEN = "t" * 40
SMS: dict[str, Any] = {"channel": "SMS", "recipient": "+14155552671", "template_id": "promo",
                       "template_version": 1, "variables": {}}


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("NOTIFLOW_TENANTS", json.dumps([{"id": "acme", "token": TOKEN}]))
    monkeypatch.setenv("NOTIFLOW_TWILIO__AUTH_TOKEN", "secret")
    monkeypatch.setenv("NOTIFLOW_TOPIC_PREFIX", "")
    monkeypatch.setenv("NOTIFLOW_INGEST_BINDING__REQUIRED", "false")  # test_ingest_binding.py
    return Settings(dlq_key=KEY.decode())


def tenant(settings: Settings) -> TenantConfig:
    found = settings.tenant("acme")
    assert found is not None
    return found


@pytest.mark.parametrize(("category", "tier", "allowed"), [
    (Category.MARKETING, Tier.P0, False),
    (Category.MARKETING, Tier.P1, False),
    (Category.MARKETING, Tier.P2, True),
    (Category.MARKETING, Tier.P3, True),
    (Category.OTP, Tier.P0, True),
    (Category.TRANSACTIONAL, Tier.P1, True),
    (Category.ACCOUNT, Tier.P3, True),
    (Category.SECURITY, Tier.P0, True),
])
def test_default_rule(category: Category, tier: Tier, allowed: bool) -> None:
    assert CategoryTiers().allows(category, tier) is allowed


def test_configuration_narrows_but_never_lets_marketing_be_urgent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFLOW_CATEGORY_TIERS__ALLOWED",
                       '{"marketing": ["P3"], "otp": ["P0", "P1"]}')
    rule = Settings().category_tiers
    assert not rule.allows(Category.MARKETING, Tier.P2)
    assert not rule.allows(Category.OTP, Tier.P3)
    assert rule.allows(Category.ACCOUNT, Tier.P0)
    assert not CategoryTiers(allowed={Category.OTP: frozenset({Tier.P0})}).allows(
        Category.MARKETING, Tier.P1)
    with pytest.raises(ValidationError, match="marketing may not use P0, P1"):
        CategoryTiers(allowed={Category.MARKETING: frozenset(Tier)})


@pytest.mark.parametrize("tier", ["P0", "P1"])
def test_the_api_refuses_marketing_at_p0_and_p1(settings: Settings, tier: str) -> None:
    req = SendRequest.model_validate({**SMS, "tier": tier, "category": "marketing"})
    with pytest.raises(ApiError) as err:
        check_policy(settings, tenant(settings), req)
    e = err.value
    assert (e.status, e.reason, e.extra) == (422, "category_tier_not_allowed", {"field": "tier"})
    assert f"tier {tier}" in (e.message or "") and "P2, P3" in (e.message or "")


def test_the_api_accepts_what_the_rule_allows(settings: Settings) -> None:
    for tier, category in (("P2", "marketing"), ("P0", "otp"), ("P1", "transactional")):
        check_policy(settings, tenant(settings),
                     SendRequest.model_validate({**SMS, "tier": tier, "category": category}))


def test_a_campaign_follows_the_configured_rule(settings: Settings) -> None:
    campaign = CampaignRequest.model_validate({
        "name": "sale", "channel": "SMS", "tier": "P2", "template_id": "promo",
        "template_version": 1, "manifest": "s3://notiflow/tenants/acme/m.csv",
        "mapping": {"recipient": "phone"}})
    check_sender(settings, tenant(settings), campaign)
    narrowed = settings.model_copy(update={"category_tiers": CategoryTiers(
        allowed={Category.MARKETING: frozenset({Tier.P3})})})
    with pytest.raises(ApiError) as err:
        check_sender(narrowed, tenant(narrowed), campaign)
    assert err.value.reason == "category_tier_not_allowed"


def kmsg(doc: dict[str, Any], topic: str) -> KafkaSourceMessage[bytes | None, bytes | None]:
    return KafkaSourceMessage(key=b"k", value=orjson.dumps(doc), topic=topic, headers=[],
                              latency=None, offset=3, partition=0,
                              timestamp=(1, 1_780_000_000_000))


@pytest.mark.parametrize("tier", [Tier.P0, Tier.P1])
def test_a_direct_producers_marketing_record_at_p0_p1_is_dead_lettered_to_its_tenant(
        settings: Settings, tier: Tier) -> None:
    doc = {**SMS, "tier": tier.value, "category": "marketing", "tenant_id": "acme"}
    parse = IngestParser(settings, tier, DlqCipher(KEY), lambda: NOW)
    out = parse(kmsg(doc, f"ingest.sms.{tier.value.lower()}"))
    assert isinstance(out, DlqRecord)
    assert (out.error_class, out.category, out.tenant_id, out.tier) == (
        "category_tier_not_allowed", "invalid_data", "acme", tier)
    assert out.message_id and "marketing" in out.reason
    assert charged_to_tenant(out) and source_of(out) == "tenant:acme"


def test_a_direct_producers_marketing_record_at_p2_is_work(settings: Settings) -> None:
    doc = {**SMS, "tier": "P2", "category": "marketing", "tenant_id": "acme"}
    out = IngestParser(settings, Tier.P2, DlqCipher(KEY), lambda: NOW)(
        kmsg(doc, "ingest.sms.p2"))
    assert isinstance(out, Work)
