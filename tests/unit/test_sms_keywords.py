"""Inbound SMS keywords: which texts are STOP, START or HELP, whose consent they change, what
the platform answers, and the signature of Twilio's incoming-message webhook checked against
Twilio's own ``RequestValidator``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twilio.request_validator import RequestValidator

from notiflow.adapters.memory.stores import MemoryPreferences
from notiflow.adapters.providers.webhook import WebhookRefused
from notiflow.gateway.inbound_sms import take_inbound
from notiflow.providers.twilio import signature as twilio_signature
from notiflow.providers.twilio.config import TwilioSettings
from notiflow.providers.twilio.routes import inbound_sms as twilio_inbound
from notiflow.providers.twilio.routes import twiml
from notiflow.providers.vonage.routes import account_numbers
from notiflow.providers.vonage.routes import inbound_sms as vonage_inbound
from notiflow.redact import recipient_hash
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings, SmsReplies, TenantConfig
from notiflow.sms_keywords import (
    HELP_WORDS,
    START_WORDS,
    STOP_WORDS,
    InboundSms,
    Keyword,
    e164,
    keyword_of,
    reply_for,
    tenants_of_number,
)

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
SHARED, ACME_NUMBER, PERSON = "+15005550006", "+14155550100", "+33612345678"
WORDS = {**dict.fromkeys(STOP_WORDS, Keyword.STOP), **dict.fromkeys(START_WORDS, Keyword.START),
         **dict.fromkeys(HELP_WORDS, Keyword.HELP)}


@pytest.mark.parametrize(("body", "expected"), [
    ("STOP", Keyword.STOP), (" stop\n", Keyword.STOP), ("Stop.", Keyword.STOP),
    ("unsubscribe!", Keyword.STOP), ("Cancel", Keyword.STOP), ("END", Keyword.STOP),
    ("quit", Keyword.STOP), ("START", Keyword.START), ("unstop", Keyword.START),
    ("HELP", Keyword.HELP), ("info", Keyword.HELP),
    ("please stop", None), ("STOP it", None), ("stopp", None), ("", None), ("!", None),
])
def test_a_text_is_a_keyword_only_when_it_is_the_whole_text(body: str,
                                                            expected: Keyword | None) -> None:
    assert keyword_of(body) is expected


@given(st.sampled_from(sorted(WORDS)), st.text(" \t\r\n", max_size=3),
       st.text(" \t\r\n", max_size=3), st.text(".!", max_size=2))
def test_any_case_spacing_and_final_punctuation_keep_the_keyword(
        word: str, before: str, after: str, stop: str) -> None:
    mixed = "".join(c.lower() if i % 2 else c for i, c in enumerate(word))
    assert keyword_of(before + mixed + stop + after) is WORDS[word]


@given(st.text(max_size=40))
def test_any_other_text_is_no_keyword(body: str) -> None:
    if body.strip().rstrip(".!").strip().upper() not in WORDS:
        assert keyword_of(body) is None


def test_the_providers_own_verdict_wins() -> None:
    assert keyword_of("arrête", "STOP") is Keyword.STOP
    assert keyword_of("STOP", "start") is Keyword.START
    assert keyword_of("STOP", "OTHER") is Keyword.STOP


def tenants() -> tuple[TenantConfig, ...]:
    return (TenantConfig(id="acme", senders=frozenset({ACME_NUMBER}), sms_help="Acme: 0800 1"),
            TenantConfig(id="globex"),
            TenantConfig(id="mailer", channels=frozenset({Channel.EMAIL})))


def test_a_number_belongs_to_the_tenants_that_send_from_it() -> None:
    assert tenants_of_number(tenants(), ACME_NUMBER, (SHARED,)) == ("acme",)
    assert tenants_of_number(tenants(), SHARED, (SHARED,)) == ("acme", "globex")
    assert tenants_of_number(tenants(), "+14155550199", (SHARED,)) == ()


def test_help_is_answered_by_the_numbers_one_tenant_else_by_the_platform() -> None:
    acme, globex, _ = tenants()
    replies = SmsReplies()
    assert reply_for(Keyword.HELP, [acme], replies) == "Acme: 0800 1"
    assert reply_for(Keyword.HELP, [acme, globex], replies) == replies.help
    assert reply_for(Keyword.HELP, [globex], replies) == replies.help
    assert reply_for(Keyword.STOP, [acme], replies) == replies.stop
    assert reply_for(Keyword.START, [], SmsReplies(start=None)) is None


def settings() -> Settings:
    return Settings(tenants=tenants())


def inbound(body: str, number: str = SHARED) -> InboundSms:
    return InboundSms("twilio", PERSON, number, body, keyword_of(body))


def test_stop_suppresses_the_number_for_each_tenant_of_the_number_and_start_restores_it(
) -> None:
    prefs = MemoryPreferences(lambda: T0)
    assert asyncio.run(take_inbound(prefs, settings(), inbound("STOP"), (SHARED,))) == (
        SmsReplies().stop)
    for tenant in ("acme", "globex"):
        state = prefs.get(tenant, recipient_hash(tenant, PERSON))
        assert state is not None and state.suppressed == "unsubscribed"
    assert prefs.get("mailer", recipient_hash("mailer", PERSON)) is None

    asyncio.run(take_inbound(prefs, settings(), inbound("STOP"), (SHARED,)))
    asyncio.run(take_inbound(prefs, settings(), inbound("start"), (SHARED,)))
    for tenant in ("acme", "globex"):
        state = prefs.get(tenant, recipient_hash(tenant, PERSON))
        assert state is not None and state.suppressed is None


def test_start_never_clears_a_suppression_of_another_reason() -> None:
    prefs = MemoryPreferences(lambda: T0)
    asyncio.run(prefs.suppress("acme", recipient_hash("acme", PERSON), "hard_bounce"))
    asyncio.run(take_inbound(prefs, settings(), inbound("START", ACME_NUMBER), (SHARED,)))
    state = prefs.get("acme", recipient_hash("acme", PERSON))
    assert state is not None and state.suppressed == "hard_bounce"


def test_help_other_texts_and_unknown_numbers_change_nothing() -> None:
    prefs = MemoryPreferences(lambda: T0)
    assert asyncio.run(take_inbound(prefs, settings(), inbound("HELP", ACME_NUMBER),
                                    (SHARED,))) == "Acme: 0800 1"
    assert asyncio.run(take_inbound(prefs, settings(), inbound("where is my parcel?"),
                                    (SHARED,))) is None
    asyncio.run(take_inbound(prefs, settings(), inbound("STOP", "+14155550199"), (SHARED,)))
    assert prefs.states == {}


def test_the_webhooks_read_as_texts() -> None:
    sms = twilio_inbound({"MessageSid": "SM1", "From": PERSON, "To": SHARED, "Body": "Stop",
                          "OptOutType": ""}, "twilio")
    assert sms == InboundSms("twilio", PERSON, SHARED, "Stop", Keyword.STOP)
    with pytest.raises(ValueError, match="From"):
        twilio_inbound({"MessageSid": "SM1", "To": SHARED, "Body": "STOP"}, "twilio")
    sms = vonage_inbound({"msisdn": "33612345678", "to": "447700900000", "messageId": "x",
                          "text": "HELP", "type": "text"}, "vonage")
    assert (sms.sender, sms.number, sms.keyword) == (PERSON, "+447700900000", Keyword.HELP)
    with pytest.raises(ValueError, match="msisdn"):
        vonage_inbound({"to": "447700900000", "messageId": "x", "text": "STOP"}, "vonage")
    assert account_numbers("447700900000") == ("+447700900000",)
    assert account_numbers("Notiflow") == ()
    assert e164("447700900000") == "+447700900000" and e164(PERSON) == PERSON


def test_the_answer_is_twiml_with_the_reply_escaped() -> None:
    assert twiml("Reply <STOP> & go").body == (
        b'<?xml version="1.0" encoding="UTF-8"?><Response><Message>Reply &lt;STOP&gt; '
        b'&amp; go</Message></Response>')
    assert twiml(None).body == b'<?xml version="1.0" encoding="UTF-8"?><Response></Response>'


def test_an_incoming_message_signed_by_twilios_validator_is_taken_and_a_forgery_refused(
) -> None:
    token = "f" * 32
    config = TwilioSettings(auth_token=token,
                            inbound_url="https://notify.example.com/webhooks/twilio/inbound",
                            status_callback_url="https://notify.example.com/webhooks/twilio")
    params = {"MessageSid": "SM1", "AccountSid": "AC1", "From": PERSON, "To": SHARED,
              "Body": "STOP", "NumSegments": "1"}
    oracle = RequestValidator(token)
    header = oracle.compute_signature(config.inbound_url, params)
    assert twilio_signature.signature(token, config.inbound_url or "", params) == header
    behind_proxy = "http://127.0.0.2:8000/webhooks/twilio/inbound"
    twilio_signature.check_callback(config, behind_proxy, params, header, inbound=True)
    assert oracle.validate(config.inbound_url, params, header)
    with pytest.raises(WebhookRefused):
        twilio_signature.check_callback(config, behind_proxy, params, header)
    with pytest.raises(WebhookRefused):
        twilio_signature.check_callback(config, behind_proxy, {**params, "Body": "START"},
                                        header, inbound=True)
