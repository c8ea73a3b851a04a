"""One-click unsubscribe links (``notiflow/unsubscribe.py``): the signed token, which emails
carry the headers, and the headers as each email provider puts them on the wire, read back
by Python's ``email`` package (RFC 2369 / RFC 8058)."""

from __future__ import annotations

import email
import email.message
import email.policy
import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from urllib.parse import urlsplit

import aiohttp
import jwt
import pytest

from notiflow.adapters.providers.base import OutboundMessage
from notiflow.correlation import CorrelationKeys
from notiflow.flows.common.items import SourceRef, Work
from notiflow.flows.send.stages.render import with_unsubscribe
from notiflow.providers.sendgrid.client import SendGridEmail
from notiflow.providers.sendgrid.emulator import _validate
from notiflow.providers.ses.client import send_email_body
from notiflow.providers.ses.emulator import _valid_headers
from notiflow.providers.smtp.message import build_message, wire_bytes
from notiflow.schemas.enums import Category, Channel, Tier
from notiflow.schemas.messages import IngestRecord
from notiflow.settings import Settings
from notiflow.unsubscribe import (
    AUDIENCE,
    ONE_CLICK,
    InvalidToken,
    UnsubscribeKeys,
    Unsubscription,
    list_unsubscribe,
    mailed_token,
    wants_unsubscribe,
)

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
OLD, NEW = b"o" * 32, b"n" * 32
U = Unsubscription("acme", "ab" * 32, Category.MARKETING, NOW)
YEAR = timedelta(days=365)
BASE = "https://notify.example.com"


def keys(*raw: bytes) -> UnsubscribeKeys:
    return UnsubscribeKeys.of(CorrelationKeys(raw))


def test_a_token_names_the_recipient_by_hash_and_verifies_under_any_listed_key() -> None:
    token = keys(OLD).issue(U)
    assert keys(OLD).verify(token, NOW + timedelta(days=30), YEAR) == Unsubscription(
        "acme", "ab" * 32, Category.MARKETING, NOW)
    assert keys(NEW, OLD).verify(token, NOW, YEAR) == U
    with pytest.raises(InvalidToken):
        keys(NEW).verify(token, NOW, YEAR)
    claims = jwt.decode(token, keys(OLD).keys[0], algorithms=["HS256"], audience=AUDIENCE)
    assert claims == {"aud": AUDIENCE, "tid": "acme", "rh": "ab" * 32, "cat": "marketing",
                      "iat": int(NOW.timestamp())}


def test_forged_altered_and_expired_tokens_are_refused() -> None:
    k = keys(OLD)
    token = k.issue(U)
    header, _, signature = token.split(".")
    other = k.issue(Unsubscription("globex", "cd" * 32, Category.MARKETING, NOW))
    with pytest.raises(InvalidToken):
        k.verify(f"{header}.{other.split('.')[1]}.{signature}", NOW, YEAR)
    with pytest.raises(InvalidToken, match="expired"):
        k.verify(token, NOW + YEAR + timedelta(seconds=1), YEAR)
    unsigned = jwt.encode({"aud": AUDIENCE, "tid": "acme", "rh": "x", "cat": "marketing",
                           "iat": int(NOW.timestamp())}, b"k" * 32, algorithm="HS256")
    with pytest.raises(InvalidToken):
        k.verify(unsigned, NOW, YEAR)
    wrong_audience = jwt.encode({"aud": "other", "iat": 1}, k.keys[0], algorithm="HS256")
    with pytest.raises(InvalidToken):
        k.verify(wrong_audience, NOW, YEAR)
    no_category = jwt.encode({"aud": AUDIENCE, "tid": "acme", "rh": "x", "cat": "gossip",
                              "iat": int(NOW.timestamp())}, k.keys[0], algorithm="HS256")
    with pytest.raises(InvalidToken):
        k.verify(no_category, NOW, YEAR)
    with pytest.raises(InvalidToken):
        k.verify("not-a-token", NOW, YEAR)


@pytest.mark.parametrize(("channel", "tier", "category", "wanted"), [
    (Channel.EMAIL, Tier.P3, Category.MARKETING, True),
    (Channel.EMAIL, Tier.P2, Category.ACCOUNT, True),
    (Channel.EMAIL, Tier.P1, Category.TRANSACTIONAL, False),
    (Channel.EMAIL, Tier.P0, Category.OTP, False),
    (Channel.EMAIL, Tier.P1, Category.MARKETING, True),
    (Channel.SMS, Tier.P3, Category.MARKETING, False),
])
def test_bulk_and_marketing_email_carries_the_headers(channel: Channel, tier: Tier,
                                                       category: Category, wanted: bool) -> None:
    assert wants_unsubscribe(channel, tier, category) is wanted


def message(headers: tuple[tuple[str, str], ...]) -> OutboundMessage:
    return OutboundMessage("msg_1", 1, "acme", Channel.EMAIL, Tier.P3, "ana@example.com",
                           "Hello", subject="News", headers=headers)


URI = re.compile(r"<([^<>\s]+)>")


def test_the_smtp_message_carries_rfc_2369_and_rfc_8058_headers() -> None:
    token = keys(OLD).issue(U)
    headers = list_unsubscribe(token, BASE + "/", "unsubscribe@notify.example.com")
    raw = wire_bytes(build_message(message(headers), sender="news@acme.example", now=NOW),
                     utf8=False)
    parsed = email.message_from_bytes(raw.removesuffix(b".\r\n"), policy=email.policy.default)
    listed = str(parsed["List-Unsubscribe"])
    uris = URI.findall(listed)
    assert URI.sub("", listed).replace(",", "").strip() == ""
    https, mailto = uris
    assert urlsplit(https)[:3] == ("https", "notify.example.com", f"/unsubscribe/{token}")
    assert mailto.startswith("mailto:unsubscribe@notify.example.com?subject=")
    assert str(parsed["List-Unsubscribe-Post"]) == ONE_CLICK == "List-Unsubscribe=One-Click"
    assert keys(OLD).verify(https.rsplit("/", 1)[1], NOW, YEAR) == U


async def test_sendgrid_and_ses_bodies_carry_the_headers_as_their_apis_take_them() -> None:
    headers = list_unsubscribe(keys(OLD).issue(U), BASE, None)
    settings = Settings(_env_file=None, sendgrid={"api_key": "SG.k.s"})  # type: ignore[call-arg]
    async with aiohttp.ClientSession() as session:
        body = SendGridEmail(settings.sendgrid, session, timeout=1).payload(message(headers))
    assert body["headers"] == dict(headers)
    assert _validate(body) == []
    assert _validate({**body, "headers": {"Subject": "x"}}) != []
    ses = send_email_body(settings.ses, message(headers))
    assert ses["Content"]["Simple"]["Headers"] == [
        {"Name": "List-Unsubscribe", "Value": headers[0][1]},
        {"Name": "List-Unsubscribe-Post", "Value": ONE_CLICK}]
    assert _valid_headers(ses["Content"]["Simple"]["Headers"])
    assert not _valid_headers([{"Name": "", "Value": "x"}])


def test_the_send_step_adds_the_headers_to_bulk_email_only() -> None:
    settings = Settings(_env_file=None, unsubscribe={"base_url": BASE})  # type: ignore[call-arg]
    ctx = SimpleNamespace(settings=settings, unsubscribe_keys=keys(OLD))

    def work(**over: object) -> Work:
        doc = {"channel": "EMAIL", "tier": "P3", "recipient": "ana@example.com",
               "template_id": "t", "template_version": 1, "tenant_id": "acme",
               "category": "marketing", "message_id": "msg_1", **over}
        return Work(IngestRecord.model_validate(doc), SourceRef("t", 0, 0), b"", None)

    bulk = work()
    out = with_unsubscribe(ctx, bulk, message(()), NOW)  # type: ignore[arg-type]
    [(listed, value), post] = out.headers
    assert listed == "List-Unsubscribe"
    token = URI.findall(value)[0].rsplit("/", 1)[1]
    assert keys(OLD).verify(token, NOW, YEAR) == Unsubscription(
        "acme", bulk.recipient_hash, Category.MARKETING, NOW)
    assert post == ("List-Unsubscribe-Post", ONE_CLICK)
    otp = work(tier="P0", category="otp")
    assert with_unsubscribe(ctx, otp, message(()), NOW).headers == ()  # type: ignore[arg-type]
    off = SimpleNamespace(settings=Settings(_env_file=None), unsubscribe_keys=None)  # type: ignore[call-arg]
    assert with_unsubscribe(off, bulk, message(()), NOW).headers == ()  # type: ignore[arg-type]


def mail(subject: str | None, body: str = "Please stop.") -> bytes:
    msg = email.message.EmailMessage()
    msg["From"], msg["To"] = "ana@example.com", "unsubscribe@notify.example.com"
    if subject is not None:
        msg["Subject"] = subject
    msg.set_content(body)
    return msg.as_bytes()


def test_a_mail_to_the_mailto_link_carries_its_token_in_the_subject_or_the_body() -> None:
    token = keys(OLD).issue(U)
    assert mailed_token(mail(f"unsubscribe {token}")) == token
    assert mailed_token(mail("Re: newsletter", f"unsubscribe {token}\n-- \nAna")) == token
    assert mailed_token(mail(None, f"> {token}")) == token
    assert mailed_token(mail("stop sending me this")) is None
    assert mailed_token(b"\xff\xfe not a mail at all") is None
    assert mailed_token(b"") is None
