"""Amazon SES (email, API v2): its harness, the wire format, and the emulator checked against
botocore's own ``sesv2`` client (serializer, SigV4 signer, error parser)."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from notiflow.adapters.providers.base import Outcome
from notiflow.providers.ses.client import SesEmail
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings
from tests.integration.contract.harness import (
    Emulator,
    Harness,
    Overrides,
    Rejection,
    TimedClient,
    assert_result,
    configure_section,
    for_harness,
    message,
    raw_post,
)

# the harness ----------------------------------------------------------------------------------


def _ses_configure(settings: Settings, overrides: Overrides) -> Settings:
    """The session's SES section with the emulator's key pair, then the generic overrides."""
    keyed = settings.ses.model_copy(update={
        "access_key_id": settings.fakes_ses_access_key_id,
        "secret_access_key": settings.fakes_ses_secret_access_key})
    return configure_section("ses", {
        "base_url": "endpoint_url", "secret": "secret_access_key", "sender": "from_email"})(
        settings.model_copy(update={"ses": keyed}), overrides)


async def _ses_unauthorized(settings: Settings) -> httpx.Response:
    s = settings.ses
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return await raw_post(
        f"{s.endpoint_url}/v2/email/outbound-emails", headers={
            "X-Amz-Date": stamp, "Authorization": (
                f"AWS4-HMAC-SHA256 Credential=AKIANOTTHEKEY0000000/{stamp[:8]}/"
                f"{s.region}/ses/aws4_request, SignedHeaders=host;x-amz-date, "
                f"Signature={'0' * 64}")},
        json={"FromEmailAddress": s.from_email,
              "Destination": {"ToAddresses": ["ada@example.com"]},
              "Content": {"Simple": {"Subject": {"Data": "hi"},
                                     "Body": {"Text": {"Data": "hi"}}}}})


SES = Harness(
    name="ses",
    sender=("billing@acme.example", "from", "billing@acme.example"),
    channel=Channel.EMAIL,
    recipients={"ok": "ada@example.com", "malformed": "not-an-address",
                "refused": "kim@reject.example.com"},
    rejections=(Rejection("malformed", "rejected"), Rejection("refused", "content_rejected")),
    configure=_ses_configure,
    adapter=SesEmail,
    unauthorized=_ses_unauthorized,
    unauthorized_body={"message": "The security token included in the request is invalid."},
    wrong_secret=lambda: "wrong/" + "x" * 34,
    provider_message_id=re.compile(r"0100[0-9a-f]{24}-[0-9a-f]{8}-000000"),
    retry_after=False,
    unauthorized_status=403,
)

pytestmark = [pytest.mark.integration, for_harness(SES)]


# SES's own cases ------------------------------------------------------------------------------


async def test_ses_wire_format(harness: Harness, adapter: TimedClient, emulator: Emulator,
                               provider_settings: Settings) -> None:
    msg = message(harness, attempt=3, body="Grüße, your code is 1")
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    [record] = await emulator.records(msg.message_id)
    assert (record["to"], record["subject"], record["body"], record["attempt"]) == (
        "ada@example.com", "Your code", "Grüße, your code is 1", 3)
    assert record["from"] == provider_settings.ses.from_email
    assert record["tags"]["message_id"] == msg.message_id


async def test_ses_sdk_and_emulator_agree(harness: Harness, provider_settings: Settings,
                                          emulator: Emulator) -> None:
    """botocore's own ``sesv2`` client (the SDK: its serializer, SigV4 signer and error
    parser) against the emulator: accepted, and SES's error types read back as the SDK reads
    them, the ones :mod:`~notiflow.providers.ses.classify` keys on."""
    import botocore.session
    from botocore.exceptions import ClientError

    s = provider_settings.ses
    assert s.secret_access_key is not None
    client = botocore.session.get_session().create_client(
        "sesv2", region_name=s.region, endpoint_url=s.endpoint_url,
        aws_access_key_id=s.access_key_id,
        aws_secret_access_key=s.secret_access_key.get_secret_value())

    def send(to: str, sender: str = s.from_email) -> dict[str, Any]:
        return dict(client.send_email(
            FromEmailAddress=sender, Destination={"ToAddresses": [to]},
            Content={"Simple": {"Subject": {"Data": "Hi"}, "Body": {"Text": {"Data": "x"}}}},
            EmailTags=[{"Name": "message_id", "Value": "sdk-1"}]))

    accepted = await asyncio.to_thread(send, "ada@example.com")
    assert harness.provider_message_id.fullmatch(accepted["MessageId"])
    for to, sender, code in (("kim@reject.example.com", s.from_email, "MessageRejected"),
                             ("ada@example.com", "x@unverified.example.com",
                              "MessageRejected"),
                             ("not-an-address", s.from_email, "BadRequestException")):
        with pytest.raises(ClientError) as refused:
            await asyncio.to_thread(send, to, sender)
        assert refused.value.response["Error"]["Code"] == code
    [record] = [r for r in await emulator.records("sdk-1") if r["outcome"] == "accepted"]
    assert record["to"] == "ada@example.com"


async def test_ses_unverified_sender_is_misconfiguration(harness: Harness, adapter: TimedClient,
                                                         emulator: Emulator) -> None:
    msg = message(harness, sender="news@unverified.example.com")
    result = await adapter.send(msg)
    assert_result(result, Outcome.TRANSIENT, "misconfigured")
    assert result.error_code == "http_400:MessageRejected"
