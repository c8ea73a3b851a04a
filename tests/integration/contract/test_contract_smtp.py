"""SMTP (email): its harness, the wire format, the classification of each SMTP reply (error knobs
and magic recipients), greylisting, pooled connections and the envelope id that correlates
refused recipients."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiosmtplib
import pytest
from pydantic import SecretStr

from notiflow.adapters.providers.base import Outcome
from notiflow.correlation import CorrelationKeys
from notiflow.providers.smtp.bounces import bounce_address
from notiflow.providers.smtp.client import SmtpEmail
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings
from tests.integration.contract.harness import (
    Emulator,
    Harness,
    Overrides,
    Rejection,
    TimedClient,
    assert_result,
    for_harness,
    message,
)

# the harness ----------------------------------------------------------------------------------


def _smtp_configure(settings: Settings, overrides: Overrides) -> Settings:
    update: dict[str, Any] = {}
    for key, value in overrides.items():
        if key == "base_url":
            parts = urlsplit(value)
            update.update(host=parts.hostname, port=parts.port)
        elif key == "secret":
            update["password"] = SecretStr(value)
        elif key == "sender":
            update["from_email"] = value
    return settings.model_copy(update={"smtp": settings.smtp.model_copy(update=update)})


@dataclass(frozen=True)
class SmtpAnswer:
    """A raw SMTP reply, shaped like the HTTP answers the suite compares."""

    status_code: int
    body: dict[str, Any]

    def json(self) -> dict[str, Any]:
        return self.body


async def smtp_session(settings: Settings) -> aiosmtplib.SMTP:
    """An independent, connected (not authenticated) SMTP client."""
    s = settings.smtp
    client = aiosmtplib.SMTP(hostname=s.host, port=s.port, start_tls=False,
                             local_hostname="contract.test", timeout=10)
    await client.connect()
    return client


async def _smtp_unauthorized(settings: Settings) -> SmtpAnswer:
    assert settings.smtp.username is not None
    client = await smtp_session(settings)
    try:
        await client.login(settings.smtp.username, "not-the-password")
    except aiosmtplib.SMTPAuthenticationError as exc:
        return SmtpAnswer(exc.code, {"message": exc.message})
    finally:
        client.close()
    raise AssertionError("the SMTP emulator accepted a wrong password")


SMTP = Harness(
    name="smtp",
    sender=("billing@acme.example", "header_from", "billing@acme.example"),
    channel=Channel.EMAIL,
    recipients={"ok": "ada@example.com", "bounce": "nobody@bounce.example.com",
                "syntax": "x@invalid.example.com", "disabled": "old@disabled.example.com"},
    rejections=(Rejection("bounce", "invalid_recipient", deactivate=True),
                Rejection("syntax", "invalid_recipient"),
                Rejection("disabled", "mailbox_disabled", deactivate=True)),
    configure=_smtp_configure,
    adapter=SmtpEmail,
    unauthorized=_smtp_unauthorized,
    unauthorized_body={"message": "5.7.8 Authentication credentials invalid"},
    wrong_secret=lambda: "wrong-" + "x" * 12,
    unauthorized_records=(),
    provider_message_id=re.compile(r"[0-9A-F]{12}"),
    retry_after=False,
    unauthorized_status=535,
    http=False,
)

pytestmark = [pytest.mark.integration, for_harness(SMTP)]


# SMTP's own cases -----------------------------------------------------------------------------


async def test_smtp_wire_format(harness: Harness, adapter: TimedClient, emulator: Emulator,
                                provider_settings: Settings) -> None:
    msg = message(harness, attempt=2, subject="Grüße aus Zürich",
                  body="Line one\n.dot line\nünïcödé")
    result = await adapter.send(msg)
    assert_result(result, Outcome.ACCEPTED, None)
    [record] = await emulator.records(msg.message_id)
    assert (record["subject"], record["body"]) == (msg.subject, msg.body)
    keys = CorrelationKeys.from_settings(provider_settings)
    assert record["from"] == bounce_address(keys, provider_settings.smtp.from_email,
                                            msg.message_id, 2)
    assert record["smtp_message_id"] == f"<{msg.message_id}.2@notiflow>"
    assert (record["stage"], record["status"], record["enhanced"]) == ("data_end", 250, "2.0.0")
    assert record["sid"] == result.provider_message_id


@pytest.mark.parametrize(("knob", "expected", "code", "stage"), [
    ("error_rate_421", (Outcome.TRANSIENT, "server_error", False), "421 4.3.0", "mail"),
    ("error_rate_429", (Outcome.TRANSIENT, "rate_limited", False), "451 4.7.1", "mail"),
    ("error_rate_452", (Outcome.TRANSIENT, "server_error", False), "452 4.3.1", "rcpt"),
    ("error_rate_550", (Outcome.PERMANENT, "invalid_recipient", True), "550 5.1.1", "rcpt"),
    ("error_rate_552", (Outcome.TRANSIENT, "mailbox_full", False), "552 5.2.2", "rcpt"),
    ("error_rate_451", (Outcome.TRANSIENT, "server_error", False), "451 4.3.0", "data_end"),
    ("error_rate_554", (Outcome.PERMANENT, "rejected", False), "554 5.7.1", "data_end"),
])
async def test_smtp_error_mix(harness: Harness, adapter: TimedClient, emulator: Emulator,
                              knob: str, expected: tuple[Outcome, str, bool], code: str,
                              stage: str) -> None:
    await emulator.configure(**{knob: 1.0})
    msg = message(harness)
    result = await adapter.send(msg)
    assert_result(result, expected[0], expected[1])
    assert (result.deactivate_recipient, result.error_code) == (expected[2], code)
    [record] = await emulator.records(msg.message_id)
    assert (record["stage"], record["outcome"] != "accepted") == (stage, True)
    await emulator.configure(**{knob: 0.0})
    assert_result(await adapter.send(message(harness)), Outcome.ACCEPTED, None)


@pytest.mark.parametrize(("recipient", "expected", "code"), [
    ("kim@full.example.com", (Outcome.TRANSIENT, "mailbox_full"), "552 5.2.2"),
    ("kim@policy.example.com", (Outcome.PERMANENT, "rejected"), "554 5.7.1"),
])
async def test_smtp_magic_recipients(harness: Harness, adapter: TimedClient, emulator: Emulator,
                                     recipient: str, expected: tuple[Outcome, str],
                                     code: str) -> None:
    result = await adapter.send(message(harness, recipient=recipient))
    assert_result(result, *expected)
    assert result.error_code == code and result.deactivate_recipient is False


async def test_smtp_greylisting_passes_on_retry(harness: Harness, adapter: TimedClient,
                                                emulator: Emulator) -> None:
    recipient = f"grey-{uuid.uuid4().hex[:8]}@greylist.example.com"
    msg = message(harness, recipient=recipient)
    first = await adapter.send(msg)
    assert_result(first, Outcome.TRANSIENT, "rate_limited")
    assert first.error_code == "451 4.7.1"
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    assert [r["outcome"] for r in await emulator.records(msg.message_id)] == [
        "rate_limited", "accepted"]


async def test_smtp_reuses_connections(harness: Harness, adapter: TimedClient,
                                       emulator: Emulator) -> None:
    for scenario in ("ok", "bounce", "ok", "ok"):
        await adapter.send(message(harness, scenario))
    assert isinstance(adapter, SmtpEmail)
    assert (adapter.stats.opened, adapter.stats.reused) == (1, 3)
    stats = await emulator.stats()
    assert (stats["connections"]["opened"], stats["auth"]["succeeded"]) == (1, 1)
    assert (stats["accepted"], stats["rejected"]) == (3, 1)


async def test_smtp_pooled_connection_refused_by_outage(harness: Harness, adapter: TimedClient,
                                                        emulator: Emulator) -> None:
    assert_result(await adapter.send(message(harness)), Outcome.ACCEPTED, None)
    await emulator.configure(outage=True)
    msg = message(harness)
    result = await adapter.send(msg)
    assert_result(result, Outcome.TRANSIENT, "server_error")
    assert isinstance(adapter, SmtpEmail) and adapter.stats.stale_retries == 1
    assert [(r["stage"], r["outcome"]) for r in await emulator.records(msg.message_id)] == [
        ("mail", "outage")]
    stats = await emulator.stats()
    assert (stats["received"], stats["connections"]["refused"]) == (3, 1)


async def test_smtp_requires_auth(harness: Harness, provider_settings: Settings,
                                  emulator: Emulator) -> None:
    client = await smtp_session(provider_settings)
    try:
        await client.ehlo()
        assert client.supports_extension("auth") and client.supports_extension("dsn")
        with pytest.raises(aiosmtplib.SMTPSenderRefused) as refused:
            await client.mail(provider_settings.smtp.from_email)
    finally:
        client.close()
    assert (refused.value.code, refused.value.message) == (
        530, "5.7.0 Authentication required")


async def test_smtp_envid_correlates_refused_recipients(harness: Harness, adapter: TimedClient,
                                                        emulator: Emulator) -> None:
    msg = message(harness, "bounce", attempt=7)
    await adapter.send(msg)
    [record] = await emulator.records(msg.message_id)
    assert (record["attempt"], record["stage"], record["enhanced"]) == (7, "rcpt", "5.1.1")
    assert record["to"] == msg.recipient and record["body"] is None
