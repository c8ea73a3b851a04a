"""Receipts that cannot be forged: provider callbacks fail closed without their secret, a
receipt changes only the attempt its provider and provider message id were recorded for, and
SMTP bounces are correlated only by the keyed tag of the bounce address they were sent to."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.fernet import Fernet
from pydantic import SecretStr

from notiflow.adapters.cassandra.attempts import ProviderIndexRow
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.providers.base import OutboundMessage
from notiflow.adapters.providers.webhook import WebhookRefused
from notiflow.adapters.rows import AttemptRow, MessageHeadRow
from notiflow.correlation import CorrelationKeyMissing, CorrelationKeys
from notiflow.flows.common.items import SourcedReceipt, SourceRef
from notiflow.flows.receipts import receipt_match
from notiflow.flows.receipts.reconcile import ApplyStep
from notiflow.providers.smtp import bounces
from notiflow.providers.smtp import receipts as smtp_receipts
from notiflow.providers.smtp.client import SmtpEmail
from notiflow.providers.smtp.config import SmtpSettings
from notiflow.providers.smtp.emulator import build_dsn
from notiflow.providers.vonage import signature as vonage_signature
from notiflow.providers.vonage.config import VonageSettings
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import Receipt
from notiflow.settings import Settings

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
KEYS = CorrelationKeys((b"k" * 32,))
A_MSG, B_MSG = "msg_" + "a" * 32, "msg_" + "b" * 32


# every provider's callbacks fail closed -------------------------------------------------


def test_vonage_receipts_are_refused_without_a_signature_secret() -> None:
    params = {"messageId": "0A0000001", "status": "delivered", "client-ref": f"{B_MSG}:1"}
    for secret in (None, SecretStr("")):
        with pytest.raises(WebhookRefused) as refused:
            vonage_signature.check_receipt(VonageSettings(signature_secret=secret),
                                           timedelta(minutes=5), params, NOW.timestamp())
        assert refused.value.reason == "signature_not_configured"


def test_vonage_receipts_signed_with_the_secret_still_pass() -> None:
    config = VonageSettings(signature_secret=SecretStr("s" * 32))
    params = {"messageId": "0A0000001", "status": "delivered",
              "timestamp": str(int(NOW.timestamp()))}
    params["sig"] = vonage_signature.signature("s" * 32, params)
    vonage_signature.check_receipt(config, timedelta(minutes=5), params, NOW.timestamp())


def test_every_receipt_route_refuses_an_unconfigured_account() -> None:
    from notiflow.providers.sendgrid import signature as sendgrid_signature
    from notiflow.providers.sendgrid.config import SendGridSettings
    from notiflow.providers.ses import sns
    from notiflow.providers.smtp import signature as smtp_signature
    from notiflow.providers.twilio import signature as twilio_signature
    from notiflow.providers.twilio.config import TwilioSettings

    checks = [
        lambda: twilio_signature.check_callback(TwilioSettings(), "https://x/webhooks/twilio",
                                                {}, "c2lnbmF0dXJl"),
        lambda: sendgrid_signature.check_event_post(SendGridSettings(), timedelta(minutes=5),
                                                    {}, b"[]", NOW.timestamp()),
        lambda: vonage_signature.check_receipt(VonageSettings(), timedelta(minutes=5), {},
                                               NOW.timestamp()),
        lambda: smtp_signature.check_bearer(None, "Bearer anything"),
        lambda: sns.check_topic(sns.SnsMessage({"TopicArn": "arn:x"}), ()),
    ]
    for check in checks:
        with pytest.raises(WebhookRefused):
            check()


# the reconciler applies a receipt only to its own attempt --------------------------------


class FakeStore:
    """What ``ApplyStep._receipts_at_once`` reads and writes, in memory."""

    @property
    def messages(self) -> FakeStore:
        return self

    @property
    def delivery(self) -> FakeStore:
        return self

    def __init__(self, index: dict[tuple[str, str], ProviderIndexRow],
                 attempts: dict[str, list[AttemptRow]]) -> None:
        self.index = index
        self.attempt_rows = attempts
        self.moved: list[tuple[str, Status, int, str | None, str | None]] = []

    async def message_for_provider_id(self, provider_id: str, pmid: str) -> Any:
        return self.index.get((provider_id, pmid))

    async def attempts(self, message_id: str) -> list[AttemptRow]:
        return self.attempt_rows.get(message_id, [])

    async def heads(self, ids: list[str]) -> list[MessageHeadRow]:
        return [MessageHeadRow(status="PROVIDER_ACCEPTED") for _ in ids]

    async def receipt_records(self, keys: list[tuple[str, str]]) -> list[None]:
        return [None for _ in keys]

    def planned_transition(self, mid: str, status: Status, attempt: int, reason: str | None,
                           now: datetime, provider_id: str | None = None,
                           provider_message_id: str | None = None,
                           next_attempt_at: datetime | None = None, *,
                           head: MessageHeadRow) -> tuple[bool, list[Any]]:
        self.moved.append((mid, status, attempt, provider_id, provider_message_id))
        return True, []

    def receipt_writes(self, *args: Any) -> list[Any]:
        return []

    def event_write(self, *args: Any) -> Any:
        return ("event_insert", args)

    async def write_each(self, groups: Any) -> list[None]:
        return []

    async def get_message(self, message_id: str) -> None:
        return None


def settings() -> Settings:
    return Settings(dlq_key=Fernet.generate_key().decode())


def apply(store: FakeStore, *receipts: Receipt) -> list[Any]:
    step = ApplyStep(settings(), DlqCipher(Fernet.generate_key().decode()), clock=lambda: NOW)
    wave = [SourcedReceipt(r, SourceRef("notify.receipts", 0, i), b"{}")
            for i, r in enumerate(receipts)]
    return asyncio.run(step._receipts_at_once(wave, store))  # type: ignore[arg-type]


def receipt(provider: str, pmid: str, message_id: str | None = None,
            attempt: int | None = None, status: Status = Status.DELIVERED) -> Receipt:
    return Receipt(provider_id=provider, provider_event_id=f"{pmid}:{status.value}",
                   provider_message_id=pmid, status=status, occurred_at=NOW,
                   message_id=message_id, attempt=attempt)


def attempt_row(provider: str, pmid: str | None, no: int = 1,
                message_id: str = B_MSG) -> AttemptRow:
    return AttemptRow(message_id, no, provider_id=provider, provider_message_id=pmid)


def index_row(provider: str, pmid: str, message_id: str, attempt: int) -> ProviderIndexRow:
    return ProviderIndexRow(provider, pmid, message_id, attempt)


def test_a_receipt_whose_hint_names_another_message_than_its_provider_id_is_dropped() -> None:
    """Tenant A's own genuine provider message id, with a hint naming B's message."""
    store = FakeStore({("twilio", "SMa"): index_row("twilio", "SMa", A_MSG, 1)},
                      {B_MSG: [attempt_row("twilio", "SMb")]})
    out = apply(store, receipt("twilio", "SMa", B_MSG, 1, Status.FAILED))
    assert store.moved == [] and out == []


def test_a_receipt_naming_an_attempt_sent_through_another_provider_is_dropped() -> None:
    store = FakeStore({}, {B_MSG: [attempt_row("twilio", "SMb")]})
    assert apply(store, receipt("vonage", "0Aforged", B_MSG, 1, Status.FAILED)) == []
    assert store.moved == []


def test_a_receipt_with_another_provider_message_id_for_the_attempt_is_dropped() -> None:
    store = FakeStore({}, {B_MSG: [attempt_row("sendgrid", "xmid#3")]})
    assert apply(store, receipt("sendgrid", "other", B_MSG, 1, Status.BOUNCED)) == []
    assert store.moved == []


def test_matching_receipts_apply_with_the_recorded_provider_message_id() -> None:
    store = FakeStore({("twilio", "SMb"): index_row("twilio", "SMb", B_MSG, 2)},
                      {A_MSG: [attempt_row("sendgrid", "xmid#3", message_id=A_MSG)]})
    out = apply(store, receipt("twilio", "SMb", B_MSG, 2),
                receipt("sendgrid", "xmid", A_MSG, 1, Status.OPENED))
    assert out == []
    assert sorted(store.moved) == sorted([
        (B_MSG, Status.DELIVERED, 2, "twilio", "SMb"),
        (A_MSG, Status.OPENED, 1, "sendgrid", "xmid#3")])


def test_a_receipt_whose_attempt_is_not_recorded_yet_is_parked_not_applied() -> None:
    store = FakeStore({}, {})
    [parked] = apply(store, receipt("twilio", "SMearly", B_MSG, 1))
    assert isinstance(parked, Receipt) and parked.parked_since == NOW
    assert store.moved == []


def test_match_rules() -> None:
    r = receipt("smtp", f"{B_MSG}.2@notiflow", B_MSG, 2)
    assert receipt_match.by_attempts(r, [attempt_row("smtp", "QUEUEID", 2)]) == \
        receipt_match.Target(B_MSG, 2, "QUEUEID")
    ambiguous = receipt_match.by_attempts(receipt("twilio", "SMx", B_MSG, 1),
                                          [attempt_row("twilio", None)])
    assert ambiguous == receipt_match.Target(B_MSG, 1, "SMx")
    forged = receipt_match.by_index(receipt("twilio", "SMa", A_MSG, 3),
                                    index_row("twilio", "SMa", A_MSG, 1))
    assert isinstance(forged, receipt_match.Forged) and forged.reason == "attempt"


# SMTP bounces: VERP with a keyed tag -----------------------------------------------------


def test_bounce_address_round_trips_and_refuses_forged_tags() -> None:
    address = bounces.bounce_address(KEYS, "notifications@example.com", B_MSG, 2)
    local, _, domain = address.partition("@")
    assert domain == "example.com" and local.startswith(f"notifications+{B_MSG}.2.")
    assert bounces.attempt_of(KEYS, address) == (B_MSG, 2)
    assert bounces.attempt_of(KEYS, address.upper().replace(B_MSG.upper(), B_MSG)) == (B_MSG, 2)
    assert bounces.attempt_of(CorrelationKeys((b"x" * 32,)), address) is None
    other = address.replace(f"{B_MSG}.2.", f"{A_MSG}.2.")
    assert bounces.attempt_of(KEYS, other) is None
    assert bounces.attempt_of(KEYS, address.replace(".2.", ".3.")) is None
    assert bounces.attempt_of(KEYS, "notifications@example.com") is None


def test_a_key_rotation_keeps_old_tags_valid() -> None:
    old = bounces.bounce_address(KEYS, "n@example.com", B_MSG, 1)
    rotated = CorrelationKeys((b"n" * 32, *KEYS.keys))
    assert bounces.attempt_of(rotated, old) == (B_MSG, 1)
    assert bounces.bounce_address(rotated, "n@example.com", B_MSG, 1) != old


def forged_dsn(sender: str) -> bytes:
    """A bounce whose reported original headers, ENVID and queue id all name B's message."""
    return build_dsn(sender=sender, rcpt="kim@example.com",
                     original_headers=(f"Message-ID: <{B_MSG}.1@notiflow>\n"
                                       f"X-Notiflow-Message-Id: {B_MSG}\n"
                                       "X-Notiflow-Attempt: 1\n").encode(),
                     queue_id="ABC123", envid=f"{B_MSG}.1", diagnostic="smtp; 550 5.1.1 no")


def test_a_bounce_is_correlated_only_by_a_tagged_bounce_address() -> None:
    forged = smtp_receipts.parse_dsn(forged_dsn("notifications@example.com"))
    assert smtp_receipts.attempt_of(forged, KEYS) is None
    assert smtp_receipts.dsn_receipts(forged, "smtp", NOW,
                                      smtp_receipts.attempt_of(forged, KEYS)) == []
    own = bounces.bounce_address(KEYS, "notifications@example.com", A_MSG, 1)
    mixed = smtp_receipts.parse_dsn(forged_dsn(own))
    attempt = smtp_receipts.attempt_of(mixed, KEYS)
    assert attempt == (A_MSG, 1)
    [r] = smtp_receipts.dsn_receipts(mixed, "smtp", NOW, attempt)
    assert (r.message_id, r.attempt, r.status) == (A_MSG, 1, Status.BOUNCED)
    assert r.provider_message_id == f"{A_MSG}.1@notiflow"
    assert smtp_receipts.attempt_of(forged, KEYS, envelope_to=f"<{own}>") == (A_MSG, 1)


def test_the_smtp_adapter_sends_from_the_attempts_bounce_address() -> None:
    config = SmtpSettings(from_email="notifications@example.com")
    message = OutboundMessage(message_id=B_MSG, attempt=2, tenant_id="acme",
                              channel=Channel.EMAIL, tier=Tier.P3,
                              recipient="kim@example.com", body="hi", subject="s")
    client = SmtpEmail(config, timeout=1.0, bounce_keys=KEYS)
    sender = client.envelope_sender(message)
    assert bounces.attempt_of(KEYS, sender) == (B_MSG, 2)
    assert SmtpEmail(config, timeout=1.0).envelope_sender(message) == config.from_email


def test_correlation_keys_come_from_settings_or_fail_closed() -> None:
    with pytest.raises(CorrelationKeyMissing):
        CorrelationKeys.from_settings(Settings())
    explicit = CorrelationKeys.from_settings(
        Settings(correlation_key=SecretStr("a" * 32 + "," + "b" * 32)))
    assert explicit.keys == (b"a" * 32, b"b" * 32)
    derived = CorrelationKeys.from_settings(settings())
    assert len(derived.keys) == 1 and derived.keys[0] != settings().dlq_key
