"""SendGrid bulk batching against the emulator (and SendGrid's own Python library against the
emulator, so the two cannot share a mistake): one request carries several messages, each
recorded, refused, accepted and announced on its own."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sendgrid import SendGridAPIClient
from sendgrid.helpers.mail import Content, CustomArg, Mail, Personalization, Substitution, To

from notiflow.adapters.providers.base import OutboundMessage, Outcome
from notiflow.providers.sendgrid.client import MAX_SUBSTITUTIONS_BYTES, SendGridEmail
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings
from tests.integration.contract.harness import Emulator, _serve
from tests.integration.contract.test_contract_sendgrid import (
    EventReceiver,
    sendgrid_documented_verify,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def emulator(fakes: str) -> AsyncIterator[Emulator]:
    async with httpx.AsyncClient(timeout=30) as http:
        emu = Emulator(fakes, "sendgrid", http)
        await emu.reset()
        yield emu
        await emu.reset()


@pytest.fixture
async def sendgrid(settings: Settings, emulator: Emulator) -> AsyncIterator[SendGridEmail]:
    client = await SendGridEmail.open(settings, timeout=5.0)
    yield client
    await client.aclose()


@pytest.fixture
async def events() -> AsyncIterator[EventReceiver]:
    rec = EventReceiver("")
    rec.url, runner = await _serve("/hooks/email", rec.handle)
    yield rec
    await runner.cleanup()


def mail(to: str, body: str | None = None, subject: str | None = "Winter sale",
         attempt: int = 1) -> OutboundMessage:
    mid = f"msg_{uuid.uuid4().hex}"
    return OutboundMessage(mid, attempt, "mkt", Channel.EMAIL, Tier.P3, to,
                           body if body is not None else f"Hi {to}, it starts now ({mid}).",
                           subject)


async def requests_of(emulator: Emulator) -> int:
    return int((await emulator.stats())["requests"])


async def test_one_request_carries_many_messages_each_recorded_as_rendered(
        sendgrid: SendGridEmail, emulator: Emulator) -> None:
    batch = [mail(f"ana{i}@example.com", subject=f"For you, Ana {i}") for i in range(25)]
    results = await sendgrid.send_batch(batch, [None] * len(batch))
    assert [r.outcome for r in results] == [Outcome.ACCEPTED] * 25
    ids = [r.provider_message_id or "" for r in results]
    sid = ids[0].partition("#")[0]
    assert ids == [f"{sid}#{k}" for k in range(25)]
    assert await requests_of(emulator) == 1
    for m in batch:
        [rec] = await emulator.records(m.message_id)
        assert (rec["to"], rec["subject"], rec["body"], rec["attempt"], rec["status"]) == (
            m.recipient, m.subject, m.body, 1, 202)


async def test_refused_recipients_fail_alone_and_the_rest_go_again(
        sendgrid: SendGridEmail, emulator: Emulator) -> None:
    batch = [mail(f"bo{i}@invalid.example.com" if i in (3, 7) else f"bo{i}@example.com")
             for i in range(10)]
    results = await sendgrid.send_batch(batch, [None] * len(batch))
    refused = {i for i, r in enumerate(results) if r.outcome is Outcome.PERMANENT}
    assert refused == {3, 7}
    assert all(results[i].reason == "invalid_recipient" for i in refused)
    assert results[3].error_code == "http_400:personalizations.3.to.0.email"
    assert all(r.outcome is Outcome.ACCEPTED for i, r in enumerate(results) if i not in refused)
    assert await requests_of(emulator) == 2
    for i, m in enumerate(batch):
        recs = await emulator.records(m.message_id)
        accepted = [r for r in recs if r["outcome"] == "accepted"]
        assert len(accepted) == (0 if i in refused else 1)


async def test_a_message_that_cannot_join_goes_alone_with_its_own_answer(
        sendgrid: SendGridEmail, emulator: Emulator) -> None:
    batch = [mail("a@example.com"), mail("b@example.com", subject=None),
             mail("c@example.com", body="x" * MAX_SUBSTITUTIONS_BYTES), mail("d@example.com")]
    results = await sendgrid.send_batch(batch, [None] * len(batch))
    assert [(r.outcome, r.reason) for r in results] == [
        (Outcome.ACCEPTED, None), (Outcome.PERMANENT, "invalid_content"),
        (Outcome.ACCEPTED, None), (Outcome.ACCEPTED, None)]
    assert "#" not in (results[2].provider_message_id or "")
    assert await requests_of(emulator) == 3


async def test_a_request_wide_answer_is_each_messages_answer(
        sendgrid: SendGridEmail, emulator: Emulator) -> None:
    await emulator.configure(outage=True)
    batch = [mail(f"o{i}@example.com") for i in range(5)]
    results = await sendgrid.send_batch(batch, [None] * 5)
    assert {(r.outcome, r.reason) for r in results} == {(Outcome.TRANSIENT, "server_error")}
    await emulator.configure(outage=False, error_rate_429=1.0, retry_after_s=7)
    results = await sendgrid.send_batch(batch, [None] * 5)
    assert {(r.outcome, r.reason) for r in results} == {(Outcome.TRANSIENT, "rate_limited")}
    assert all(r.retry_after_s is not None and r.retry_after_s > 0 for r in results)


async def test_each_recipient_of_a_batch_gets_its_own_signed_events(
        sendgrid: SendGridEmail, emulator: Emulator, events: EventReceiver,
        settings: Settings) -> None:
    await emulator.configure(callbacks_enabled=True, callback_delay_ms=10,
                             event_webhook_url=events.url)
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    batch = [mail("kim@example.com", attempt=2), mail("lee@bounce.example.com", attempt=2),
             mail("max@example.com", attempt=2)]
    results = await sendgrid.send_batch(batch, [trace, None, None])
    sid = (results[0].provider_message_id or "").partition("#")[0]
    finals = []
    for m in batch:
        processed, final = await events.wait(m.message_id, 2)
        assert processed["event"] == "processed" and processed["email"] == m.recipient
        assert processed["attempt"] == "2" and processed["sg_message_id"].startswith(sid + ".")
        finals.append(final["event"])
    assert finals == ["delivered", "bounce", "delivered"]
    assert [e.get("traceparent") for e in await events.wait(batch[0].message_id, 2)] == [
        trace, trace]
    key = settings.sendgrid.event_webhook_public_key
    assert key is not None
    for post in events.posts:
        assert sendgrid_documented_verify(
            key, post.body, post.headers["X-Twilio-Email-Event-Webhook-Signature"],
            post.headers["X-Twilio-Email-Event-Webhook-Timestamp"])


def test_the_emulator_takes_a_batch_built_by_sendgrids_library(
        settings: Settings, fakes: str) -> None:
    """SendGrid's own client and mail helpers, pointed at the emulator: every personalization
    is a message of its own, with its substitutions applied."""
    assert settings.sendgrid.api_key is not None
    httpx.post(f"{fakes}/_admin/reset").raise_for_status()
    message = Mail(from_email=settings.sendgrid.from_email, subject="Hello from the SDK")
    message.add_content(Content("text/plain", "Dear -name-, your code is -code-."))
    ids = []
    for i, name in enumerate(("Ada", "Bo", "Cy")):
        p = Personalization()
        p.add_to(To(f"{name.lower()}@example.com"))
        p.add_substitution(Substitution("-name-", name))
        p.add_substitution(Substitution("-code-", str(1000 + i)))
        ids.append(f"sdk-{uuid.uuid4().hex}")
        p.add_custom_arg(CustomArg("message_id", ids[-1]))
        message.add_personalization(p, index=i)
    client = SendGridAPIClient(settings.sendgrid.api_key.get_secret_value(),
                               host=settings.sendgrid.base_url)
    response = client.send(message)
    assert response.status_code == 202 and response.headers["X-Message-Id"]
    records: list[dict[str, Any]] = []
    for mid in ids:
        records += httpx.get(f"{fakes}/_admin/sendgrid/messages",
                             params={"message_id": mid}).json()
    assert [(r["to"], r["subject"], r["body"]) for r in records] == [
        (f"{n.lower()}@example.com", "Hello from the SDK", f"Dear {n}, your code is {c}.")
        for n, c in (("Ada", 1000), ("Bo", 1001), ("Cy", 1002))]
    stats = httpx.get(f"{fakes}/_admin/sendgrid/stats").json()
    assert stats["requests"] == 1


async def test_concurrent_sends_through_a_coalescer_share_requests(
        sendgrid: SendGridEmail, emulator: Emulator) -> None:
    from notiflow.adapters.providers.batching import Coalescer

    c = Coalescer(sendgrid, 50, 0.02)
    batch = [mail(f"z{i}@example.com") for i in range(120)]
    results = await asyncio.gather(*(c.send(m) for m in batch))
    assert all(r.outcome is Outcome.ACCEPTED for r in results)
    assert len({r.provider_message_id for r in results}) == 120
    assert await requests_of(emulator) == 3


async def test_a_request_too_large_is_split_until_it_fits(
        sendgrid: SendGridEmail, emulator: Emulator) -> None:
    """The emulator takes at most 1 MiB a request (SendGrid: 30 MB): 200 bodies of 9 KB go as
    a refused request, then two halves."""
    batch = [mail(f"big{i}@example.com", body=f"{i} " + "y" * 9_000) for i in range(200)]
    results = await sendgrid.send_batch(batch, [None] * len(batch))
    assert all(r.outcome is Outcome.ACCEPTED for r in results), {r.reason for r in results}
    assert len({(r.provider_message_id or "").partition("#")[0] for r in results}) == 2
    assert await requests_of(emulator) == 3
