"""SendGrid bulk batching, on paper: the batched Mail Send body is the one SendGrid's own
Python library (``sendgrid.helpers.mail``) builds for the same personalizations, and what the
emulator reads back from it is each message as it was rendered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from sendgrid.helpers.mail import (
    Content,
    CustomArg,
    From,
    Mail,
    Personalization,
    Substitution,
    To,
)

from notiflow.adapters.providers.base import OutboundMessage
from notiflow.providers.sendgrid.client import (
    BODY_TAG,
    MAX_SUBSTITUTIONS_BYTES,
    SendGridEmail,
)
from notiflow.providers.sendgrid.config import SendGridSettings
from notiflow.providers.sendgrid.emulator import _parse, _validate
from notiflow.schemas.enums import Channel, Tier

CONFIG = SendGridSettings(api_key=SecretStr("SG.test"), from_email="news@example.com",
                          from_name="Example News")


@pytest.fixture
async def client() -> AsyncIterator[SendGridEmail]:
    async with aiohttp.ClientSession() as session:
        yield SendGridEmail(CONFIG, session, timeout=5)


def email(i: int, body: str = "", subject: str | None = "Winter sale",
          to: str | None = None) -> OutboundMessage:
    return OutboundMessage(f"msg_{i}", 2, "mkt", Channel.EMAIL, Tier.P3,
                           to or f"user{i}@example.com", body or f"Hi user {i}, it starts now.",
                           subject)


def sdk_mail(messages: list[OutboundMessage], traces: list[str | None]) -> dict[str, Any]:
    mail = Mail()
    mail.from_email = From(CONFIG.from_email, CONFIG.from_name)
    mail.add_content(Content("text/plain", BODY_TAG))
    for m, trace in zip(messages, traces, strict=True):
        p = Personalization()
        p.add_to(To(str(m.recipient)))
        p.subject = m.subject
        p.add_substitution(Substitution(BODY_TAG, m.body))
        p.add_custom_arg(CustomArg("message_id", m.message_id))
        p.add_custom_arg(CustomArg("attempt", str(m.attempt)))
        if trace:
            p.add_custom_arg(CustomArg("traceparent", trace))
        mail.add_personalization(p, index=len(mail.personalizations or []))
    return dict(mail.get())


async def test_the_batch_body_is_what_sendgrids_library_builds(client: SendGridEmail) -> None:
    messages = [email(i) for i in range(3)]
    traces = [None, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None]
    ours = client.batch_payload(messages, traces)
    assert ours == sdk_mail(messages, traces)
    assert orjson.loads(orjson.dumps(ours)) == ours


async def test_what_cannot_share_a_request_goes_alone(client: SendGridEmail) -> None:
    assert client.joinable(email(1))
    assert not client.joinable(email(1, subject=None))
    assert not client.joinable(email(1, body="x" * MAX_SUBSTITUTIONS_BYTES))
    assert not client.joinable(email(1, body=f"see {BODY_TAG}"))
    assert not client.joinable(OutboundMessage("m", 1, "t", Channel.EMAIL, Tier.P3,
                                               "a@example.com", "", "s"))


texts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=3_000)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(texts, texts), min_size=1, max_size=8))
def test_the_emulator_reads_back_each_message_as_rendered(
        rendered: list[tuple[str, str]]) -> None:
    async def payload() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session:
            c = SendGridEmail(CONFIG, session, timeout=5)
            messages = [email(i, body=b, subject=s) for i, (s, b) in enumerate(rendered)]
            joinable = [m for m in messages if c.joinable(m)]
            if not joinable:
                return {}
            return c.batch_payload(joinable, [None] * len(joinable)) | {"_n": [
                (m.message_id, m.subject, m.body) for m in joinable]}

    body = asyncio.run(payload())
    if not body:
        return
    expected = body.pop("_n")
    wire = orjson.loads(orjson.dumps(body))
    assert _validate(wire) == []
    req = _parse(wire)
    assert [(p.message_id, p.subject, p.body) for p in req.personals] == [
        tuple(e) for e in expected]
    assert all(p.attempt == 2 for p in req.personals)
