"""Senders: the forms a message's ``sender`` takes per channel, what a tenant may name, what
a JWT's ``senders`` claim narrows, the idempotency hash of requests without one, and what
each provider adapter puts on the wire."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import aiohttp
import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from sendgrid.helpers.mail import From, Mail

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.gateway.acceptance import request_hash
from notiflow.gateway.checks import check_sender
from notiflow.gateway.errors import ApiError
from notiflow.gateway.jwt_auth import principal
from notiflow.providers.sendgrid.client import SendGridEmail
from notiflow.providers.twilio.client import TwilioSms
from notiflow.providers.vonage.client import VonageSms
from notiflow.redact import hasher
from notiflow.schemas.campaigns import CampaignRequest
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import SendRequest, sender_for
from notiflow.settings import (
    JwtAuth,
    Settings,
    TenantConfig,
    narrowed_senders,
    normalised_senders,
    sender_matches,
)

SMS = {"channel": "SMS", "tier": "P1", "recipient": "+14155552671", "template_id": "otp",
       "template_version": 1, "variables": {"code": "123456"}}
EMAIL = {**SMS, "channel": "EMAIL", "recipient": "ana@example.com"}
NOW = datetime(2026, 12, 6, tzinfo=UTC)
PUSH = {**SMS, "channel": "PUSH", "recipient": {"device_token": "a" * 64, "platform": "ios"}}


@pytest.mark.parametrize(("channel", "value", "expected"), [
    (Channel.SMS, "+14155550100", "+14155550100"),
    (Channel.SMS, "12345", "12345"),
    (Channel.SMS, "ACME", "ACME"),
    (Channel.SMS, "Acme Bank 1", "Acme Bank 1"),
    (Channel.EMAIL, "Billing@ACME.example", "Billing@acme.example"),
])
def test_the_forms_a_sender_takes(channel: Channel, value: str, expected: str) -> None:
    assert sender_for(channel, value) == expected


@pytest.mark.parametrize(("channel", "value", "fragment"), [
    (Channel.SMS, "ACME BANK LTD", "an SMS sender is"),
    (Channel.SMS, "12", "an SMS sender is"),
    (Channel.SMS, "ACME-BANK", "an SMS sender is"),
    (Channel.SMS, "+1415", "E.164"),
    (Channel.SMS, "+19999999999", "not a valid number for its country code"),
    (Channel.EMAIL, "not an address", "invalid email address"),
    (Channel.PUSH, "ACME", "PUSH messages have no sender"),
])
def test_forms_a_channel_does_not_take_are_refused(channel: Channel, value: str,
                                                   fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        sender_for(channel, value)


def test_send_requests_and_campaigns_check_their_sender_against_the_channel() -> None:
    assert SendRequest.model_validate({**SMS, "sender": "ACME"}).sender == "ACME"
    assert SendRequest.model_validate({**EMAIL, "sender": "A@B.example"}).sender == "A@b.example"
    assert SendRequest.model_validate(PUSH).sender is None
    for bad in ({**PUSH, "sender": "ACME"}, {**EMAIL, "sender": "ACME"},
                {**SMS, "sender": "ana@example.com"}):
        with pytest.raises(ValidationError, match="sender"):
            SendRequest.model_validate(bad)
    campaign = {"name": "winter", "channel": "SMS", "template_id": "winter",
                "template_version": 1, "manifest": "s3://b/rows.csv",
                "mapping": {"recipient": "phone"}}
    assert CampaignRequest.model_validate({**campaign, "sender": "ACME"}).sender == "ACME"
    with pytest.raises(ValidationError, match="sender"):
        CampaignRequest.model_validate({**campaign, "sender": "not-an-id-at-all"})


def test_a_request_without_a_sender_keeps_the_hash_it_had_before_senders() -> None:
    req = SendRequest.model_validate(SMS)
    fields = req.model_dump(mode="json")
    del fields["sender"]
    before = hasher().digest(json.dumps(fields, sort_keys=True, separators=(",", ":"),
                                        ensure_ascii=False).encode())
    assert request_hash(req) == before
    assert request_hash(SendRequest.model_validate({**SMS, "sender": "ACME"})) != before


def test_what_a_tenant_may_name() -> None:
    tenant = TenantConfig(id="acme", senders=frozenset({"ACME", "+14155550100",
                                                         "Alerts@Acme.example", "@News.example"}))
    assert tenant.senders == {"ACME", "+14155550100", "alerts@acme.example", "@news.example"}
    for sender in (None, "ACME", "+14155550100", "alerts@acme.example", "ALERTS@acme.example",
                   "anyone@news.example", "Anyone@NEWS.example"):
        assert tenant.allows_sender(sender), sender
    for sender in ("acme", "+14155550101", "billing@acme.example", "x@sub.news.example",
                   "x@news.example.org"):
        assert not tenant.allows_sender(sender), sender
    assert not TenantConfig(id="plain").allows_sender("ACME")


def _settings() -> Settings:
    return Settings(_env_file=None, twilio={"auth_token": "t"})  # type: ignore[call-arg]


def test_check_sender_refuses_a_sender_the_tenant_may_not_use() -> None:
    tenant = TenantConfig(id="acme", senders=frozenset({"ACME"}))
    check_sender(_settings(), tenant, SendRequest.model_validate({**SMS, "sender": "ACME"}))
    with pytest.raises(ApiError) as refused:
        check_sender(_settings(), tenant, SendRequest.model_validate({**SMS, "sender": "BANK"}))
    assert (refused.value.status, refused.value.reason) == (403, "sender_not_allowed")


ENTRY = st.one_of(
    st.sampled_from(["ACME", "BANK", "+14155550100", "12345"]),
    st.builds(lambda local, domain: f"{local}@{domain}",
              st.sampled_from(["ana", "Ana", "bo"]), st.sampled_from(["a.example", "B.example"])),
    st.builds(lambda domain: f"@{domain}", st.sampled_from(["a.example", "b.example"])),
)
SENDER = st.one_of(
    st.sampled_from(["ACME", "acme", "BANK", "+14155550100", "12345"]),
    st.builds(lambda local, domain: f"{local}@{domain}",
              st.sampled_from(["ana", "ANA", "bo", "cy"]),
              st.sampled_from(["a.example", "A.example", "b.example", "c.example"])),
)


@given(st.frozensets(ENTRY, max_size=5), st.frozensets(ENTRY, max_size=5), SENDER)
def test_a_claim_narrows_to_exactly_what_both_lists_allow(tenant: frozenset[str],
                                                         claim: frozenset[str],
                                                         sender: str) -> None:
    t, c = normalised_senders(tenant), normalised_senders(claim)
    both = sender_matches(t, sender) and sender_matches(c, sender)
    assert sender_matches(narrowed_senders(t, c), sender) is both


def test_a_tokens_senders_claim_narrows_its_tenant() -> None:
    tenant = TenantConfig(id="acme", senders=frozenset({"ACME", "@acme.example"}))
    rule = JwtAuth(scope=None)
    narrowed = principal({"tenant": "acme", "senders": ["alerts@ACME.example", "EVIL"]}, rule,
                         lambda _: tenant)
    assert narrowed.allows_sender("alerts@acme.example")
    assert not narrowed.allows_sender("ACME") and not narrowed.allows_sender("EVIL")
    assert not narrowed.allows_sender("billing@acme.example")
    assert principal({"tenant": "acme"}, rule, lambda _: tenant).allows_sender("ACME")


def message(channel: Channel, recipient: str, sender: str | None) -> OutboundMessage:
    return OutboundMessage("msg_1", 1, "acme", channel, Tier.P1, recipient, "hello",
                           subject="Hi" if channel is Channel.EMAIL else None, sender=sender)


async def test_each_adapter_puts_the_sender_on_the_wire() -> None:
    settings = Settings(_env_file=None, twilio={"auth_token": "t"},  # type: ignore[call-arg]
                        vonage={"api_key": "k", "api_secret": "s"},
                        sendgrid={"api_key": "SG.k.s"})
    async with aiohttp.ClientSession() as session:
        twilio = TwilioSms(settings.twilio, session, timeout=1)
        vonage = VonageSms(settings.vonage, session, timeout=1)
        sendgrid = SendGridEmail(settings.sendgrid, session, timeout=1)
        sms = message(Channel.SMS, "+14155552671", "+14155550100")
        assert twilio.form(sms)["From"] == "+14155550100"
        assert vonage.form(sms)["from"] == "14155550100"
        assert vonage.form(message(Channel.SMS, "+14155552671", "ACME"))["from"] == "ACME"
        own = message(Channel.SMS, "+14155552671", None)
        assert twilio.form(own)["From"] == settings.twilio.from_number
        assert vonage.form(own)["from"] == settings.vonage.from_name
        mail = message(Channel.EMAIL, "ana@example.com", "billing@acme.example")
        assert sendgrid.payload(mail)["from"] == {"email": "billing@acme.example"}
        assert sendgrid.payload(message(Channel.EMAIL, "ana@example.com", None))["from"][
            "email"] == settings.sendgrid.from_email
        batch = [message(Channel.EMAIL, f"u{i}@example.com", "billing@acme.example")
                 for i in range(2)]
        sdk = Mail()
        sdk.from_email = From("billing@acme.example")
        assert sendgrid.batch_payload(batch, [None, None])["from"] == dict(sdk.get())["from"]


async def test_sendgrid_batches_never_mix_senders(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(_env_file=None, twilio={"auth_token": "t"},  # type: ignore[call-arg]
                        sendgrid={"api_key": "SG.k.s", "max_personalizations": 2})
    chunks: list[list[str | None]] = []

    async def chunk(self: SendGridEmail, messages: list[OutboundMessage],
                    traces: list[str | None]) -> list[SendResult]:
        chunks.append([m.sender for m in messages])
        return [SendResult(Outcome.ACCEPTED, "sendgrid", NOW, NOW) for _ in messages]

    monkeypatch.setattr(SendGridEmail, "_chunk", chunk)
    senders = ["a@acme.example", None, "a@acme.example", "b@acme.example", None,
               "a@acme.example"]
    messages = [message(Channel.EMAIL, f"u{i}@example.com", s) for i, s in enumerate(senders)]
    async with aiohttp.ClientSession() as session:
        results = await SendGridEmail(settings.sendgrid, session, timeout=1).send_batch(
            messages, [None] * len(messages))
    assert len(results) == len(messages)
    assert all(len(set(c)) == 1 and len(c) <= 2 for c in chunks), chunks
    assert sorted(s or "" for c in chunks for s in c) == sorted(s or "" for s in senders)


@pytest.mark.parametrize(("body", "sender"), [
    (SMS, "ACME"), (SMS, "12345"), (SMS, "+14155550100"), (SMS, "ACME BANK LTD"),
    (SMS, "a@example.com"), (SMS, "AC-ME"), (EMAIL, "b@example.com"), (EMAIL, "ACME"),
    (PUSH, "ACME"), (PUSH, None), (SMS, None),
])
def test_the_published_schema_states_the_same_sender_rule(body: dict[str, object],
                                                          sender: str | None) -> None:
    schema = SendRequest.model_json_schema()
    doc = {**body, "sender": sender}
    by_schema = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.FormatChecker()).is_valid(doc)
    try:
        SendRequest.model_validate(doc)
        by_model = True
    except ValidationError:
        by_model = False
    assert by_schema is by_model
