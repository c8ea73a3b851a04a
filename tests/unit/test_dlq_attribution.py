"""Who a dead letter is charged to: every kind a tenant's or producer's input can cause is
charged to that source (quarantined, never halting a flow by itself); only faults no input
can cause halt a tier."""

from __future__ import annotations

import random
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from notiflow import flows
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.flows.common.guard import (
    ATTRIBUTION,
    UNATTRIBUTED,
    DlqGuard,
    DlqLimitBreached,
    charged_to_tenant,
    source_of,
    uncounted,
)
from notiflow.flows.common.items import SourceRef, Work
from notiflow.flows.send.stages.context import SendContext
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import DlqRecord, IngestRecord, StatusEvent
from notiflow.settings import DlqRule, Settings

NOW = datetime(2026, 12, 6, tzinfo=UTC)
CHAT_URL = "https://hooks.slack.com/services/T000/B000/XXXXXXXX"

EXPECTED: dict[tuple[str, str], bool | None] = {
    ("poison", "invalid_data"): True,
    ("unknown_schema", "invalid_data"): True,
    ("sealed", "invalid_data"): True,
    ("validation", "invalid_data"): True,
    ("wrong_topic", "invalid_data"): True,
    ("unknown_tenant", "invalid_data"): True,
    ("tenant_claim_refused", "invalid_data"): True,
    ("category_tier_not_allowed", "invalid_data"): True,
    ("uncorrelated_receipt", "invalid_data"): True,
    ("webhook_invalid_url", "invalid_data"): True,
    ("webhook_url_not_allowed", "invalid_data"): True,
    ("webhook_no_secret", "invalid_data"): True,
    ("webhook_gone", "invalid_data"): True,
    ("webhook_exhausted", "unavailable"): True,
    ("webhook_stale", "unavailable"): True,
    ("channel_unavailable", "unavailable"): True,
    ("recipient_not_served", "unavailable"): True,
    ("crash_loop", "bug"): True,
    ("render_error", "bug"): True,
    ("exhausted_unexplained", "bug"): True,
    ("exhausted_unexplained", "provider_outage"): None,
    ("retries_exhausted", "provider_outage"): None,
    ("consumer_error", "bug"): False,
    ("suppression_not_recorded", "bug"): False,
}
"""Per (error class, category): charged to the tenant, systemic, or (None) charged only when
the endpoint that failed is the tenant's own (a chat webhook)."""


def letter(error_class: str, category: str, tenant: str | None = "acme",
           headers: dict[str, str] | None = None) -> DlqRecord:
    return DlqRecord(dlq_id=uuid.uuid4().hex, reason=error_class, error_class=error_class,
                     category=category,
                     failed_at=NOW, source_topic="ingest.sms.p1", source_partition=0,
                     source_offset=1, tenant_id=tenant, headers=headers or {},
                     payload_encrypted="x")


def ok(tenant: str = "globex") -> StatusEvent:
    return StatusEvent(event_id=uuid.uuid4().hex, message_id="msg_b", tenant_id=tenant,
                       channel=Channel.SMS, tier=Tier.P1, status=Status.PROVIDER_ACCEPTED,
                       attempt=1, occurred_at=NOW, source="test")


CATEGORIES = ("invalid_data", "bug", "unavailable", "provider_outage")
_PAIR = re.compile(r'(?:error_class=)?"([a-z_]+)",\s*(?:category=)?"(' + "|".join(CATEGORIES)
                   + r')"')


def test_the_table_names_every_kind_a_flow_dead_letters_with() -> None:
    assert dict.fromkeys(ATTRIBUTION) == dict.fromkeys(EXPECTED)
    written = {(m[1], m[2]) for path in Path(flows.__file__).parent.rglob("*.py")
               if path.name != "guard.py" for m in _PAIR.finditer(path.read_text())
               if m[1] not in CATEGORIES}
    assert written, "no dead-letter kinds found in the flows"
    assert written <= set(ATTRIBUTION), written - set(ATTRIBUTION)


@pytest.mark.parametrize(("kind", "charged"), sorted(EXPECTED.items()))
def test_each_kind_is_charged_as_the_table_says(kind: tuple[str, str],
                                                charged: bool | None) -> None:
    error_class, category = kind
    if charged is None:
        assert charged_to_tenant(letter(*kind, headers={"channel": "CHAT"}))
        assert not charged_to_tenant(letter(*kind, headers={"channel": "SMS"}))
        assert not charged_to_tenant(letter(*kind))
    else:
        assert charged_to_tenant(letter(error_class, category)) is charged


def test_an_outage_that_used_up_budgets_counts_toward_nothing_but_a_tenant_endpoint() -> None:
    guard = DlqGuard(DlqRule(), "send.p1")
    for i in range(300):
        guard(letter("retries_exhausted", "provider_outage", tenant=f"t{i % 40}",
                     headers={"channel": "SMS"}))
    assert guard.quarantined == frozenset()
    assert uncounted(letter("retries_exhausted", "provider_outage", headers={"channel": "SMS"}))
    chat = letter("retries_exhausted", "provider_outage", headers={"channel": "CHAT"})
    assert not uncounted(chat) and charged_to_tenant(chat)


def test_a_kind_not_listed_is_charged_only_as_invalid_data() -> None:
    assert charged_to_tenant(letter("EnvelopeError", "invalid_data"))
    assert not charged_to_tenant(letter("something_new", "bug"))
    assert not charged_to_tenant(letter("something_new", "provider_outage"))


def test_a_claim_of_an_unconfigured_tenant_names_no_source() -> None:
    assert source_of(letter("unknown_tenant", "invalid_data", "x1")) == UNATTRIBUTED
    assert source_of(letter("unknown_tenant", "invalid_data", "x1",
                            {"producer": "billing"})) == "producer:billing"
    assert source_of(letter("validation", "invalid_data", "acme")) == "tenant:acme"


@pytest.mark.parametrize("kind", [("recipient_not_served", "unavailable"),
                                  ("crash_loop", "bug"), ("render_error", "bug"),
                                  ("channel_unavailable", "unavailable"),
                                  ("exhausted_unexplained", "bug")])
def test_one_tenants_batch_of_1000_dead_letters_quarantines_it_and_never_halts(
        kind: tuple[str, str], caplog: pytest.LogCaptureFixture) -> None:
    g = DlqGuard(DlqRule(), "send.p1")
    passed = []
    for i in range(1000):
        g(letter(*kind, tenant="acme"))
        if i % 10 == 0:
            passed.append(g(ok()))
    assert len(passed) == 100 and all(isinstance(o, StatusEvent) for o in passed)
    assert g.quarantined == {"tenant:acme"}
    assert "DLQ_LIMIT_BREACH" not in caplog.text


def test_a_tenants_chat_endpoint_that_never_answers_is_charged_to_it() -> None:
    g = DlqGuard(DlqRule(), "send.p1")
    for _ in range(1000):
        g(letter("exhausted_unexplained", "provider_outage", headers={"channel": "CHAT"}))
    assert g.quarantined == {"tenant:acme"}
    sms = DlqGuard(DlqRule(), "send.p1")
    with pytest.raises(DlqLimitBreached, match="100 dead letters in a row"):
        for _ in range(100):
            sms(letter("exhausted_unexplained", "provider_outage", headers={"channel": "SMS"}))


def test_other_tenants_stray_dead_letters_do_not_make_one_tenants_flood_count() -> None:
    g = DlqGuard(DlqRule(), "send.p1")
    g(letter("validation", "invalid_data", tenant="globex"))
    g(letter("recipient_not_served", "unavailable", tenant="initech"))
    for _ in range(1000):
        g(letter("recipient_not_served", "unavailable", tenant="acme"))
    assert "tenant:acme" in g.quarantined


def test_claims_of_many_unconfigured_tenants_are_one_source() -> None:
    g = DlqGuard(DlqRule(), "send.p1")
    for i in range(1000):
        g(letter("unknown_tenant", "invalid_data", tenant=f"spoof{i}"))
    assert g.quarantined == {UNATTRIBUTED}


def test_100_systemic_dead_letters_in_a_row_still_halt() -> None:
    g = DlqGuard(DlqRule(), "send.p1")
    for _ in range(99):
        g(letter("consumer_error", "bug", tenant=None))
    with pytest.raises(DlqLimitBreached, match="100 dead letters in a row"):
        g(letter("consumer_error", "bug", tenant=None))


def test_many_sources_failing_at_once_still_halt() -> None:
    g = DlqGuard(DlqRule(), "send.p1")
    with pytest.raises(DlqLimitBreached, match="100 dead letters in a row"):
        for i in range(102):
            g(letter("validation", "invalid_data", tenant=("a", "b", "c")[i % 3]))


def test_the_send_flows_dead_letters_carry_their_channel() -> None:
    settings = Settings()
    ctx = SendContext(settings, Tier.P1, settings.policy(Tier.P1),
                      DlqCipher(Fernet.generate_key()), lambda: NOW, random.Random(1),
                      "send.p1")
    record = IngestRecord.model_validate({
        "channel": "CHAT", "tier": "P1", "recipient": CHAT_URL, "template_id": "alert",
        "template_version": 1, "tenant_id": "acme", "message_id": "msg_1",
        "accepted_at": NOW.isoformat()})
    w = Work(record, SourceRef("ingest.chat.p1", 0, 1), b"raw", b"k",
             (("tenant_id", b"acme"),))
    rec = ctx.dead_letter(w, "no answer", "exhausted_unexplained", "provider_outage", NOW)
    assert rec.headers == {"tenant_id": "acme", "channel": "CHAT"}
    assert charged_to_tenant(rec) and source_of(rec) == "tenant:acme"
