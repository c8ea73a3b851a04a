"""Twilio (SMS): its harness, and its status-callback signature checked against Twilio's
documented example by an independent implementation of the algorithm. Its status callbacks
(:class:`CallbackSpec`) are checked by the generic callback cases in ``test_contract_common.py``."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Mapping

import httpx
import pytest

from notiflow.adapters.providers.base import Outcome
from notiflow.providers.twilio.client import TwilioSms
from notiflow.providers.twilio.signature import signature
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings
from tests.integration.contract.harness import (
    CallbackSpec,
    Harness,
    Rejection,
    configure_section,
    raw_post,
)

pytestmark = pytest.mark.integration


# the harness ----------------------------------------------------------------------------------


async def _twilio_unauthorized(settings: Settings) -> httpx.Response:
    t = settings.twilio
    return await raw_post(f"{t.base_url}/2010-04-01/Accounts/{t.account_sid}/Messages.json",
                          data={"To": "+14155550100", "From": t.from_number, "Body": "hi"},
                          auth=(t.account_sid, "not-the-token"))


def twilio_documented_signature(token: str, url: str, params: Mapping[str, str]) -> str:
    """Twilio's documented algorithm, written independently of the code under test."""
    data = url
    for key in sorted(params):
        data += key + params[key]
    mac = hmac.new(token.encode("utf-8"), data.encode("utf-8"), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


def _twilio_verify(secret: str, url: str, params: Mapping[str, str],
                   headers: Mapping[str, str]) -> bool:
    given = headers.get("X-Twilio-Signature", "")
    return hmac.compare_digest(twilio_documented_signature(secret, url, params), given)


def _twilio_secret(settings: Settings) -> str:
    assert settings.twilio.auth_token is not None
    return settings.twilio.auth_token.get_secret_value()


TWILIO = Harness(
    name="twilio",
    sender=("+14155550111", "from", "+14155550111"),
    channel=Channel.SMS,
    recipients={"ok": "+14155550100", "invalid": "+15005550001",
                "unsubscribed": "+15005550004", "unreachable": "+15005550002",
                "not_mobile": "+15005550009", "region": "+15005550003"},
    rejections=(Rejection("invalid", "invalid_recipient"),
                Rejection("unsubscribed", "unsubscribed", deactivate=True),
                Rejection("unreachable", "unreachable_recipient"),
                Rejection("not_mobile", "not_mobile"),
                Rejection("region", "region_not_permitted")),
    configure=configure_section("twilio", {
        "base_url": "base_url", "secret": "auth_token", "callback_url": "status_callback_url",
        "sender": "from_number"}),
    adapter=TwilioSms,
    unauthorized=_twilio_unauthorized,
    unauthorized_body={"code": 20003, "message": "Authenticate",
                       "more_info": "https://www.twilio.com/docs/errors/20003", "status": 401},
    wrong_secret=lambda: "x" * 32,
    provider_message_id=re.compile(r"SM[0-9a-f]{32}"),
    empty_body_rule=(Outcome.PERMANENT, "invalid_content"),
    callbacks=CallbackSpec(verify=_twilio_verify, secret=_twilio_secret,
                           message_id_field="MessageSid", status_field="MessageStatus"),
)


# Twilio's own cases ---------------------------------------------------------------------------


def test_twilio_signature_matches_documented_example() -> None:
    url = "https://mycompany.com/myapp.php?foo=1&bar=2"
    params = {"CallSid": "CA1234567890ABCDE", "Caller": "+12349013030", "Digits": "1234",
              "From": "+12349013030", "To": "+18005551212"}
    assert signature("12345", url, params) == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
    assert twilio_documented_signature("12345", url, params) == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
