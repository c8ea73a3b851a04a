"""Ingest records bound to their tenant: the HMAC rule, the parse step in required mode, the
platform writers that sign, and the attribution of a refused claim."""

from __future__ import annotations

import json
import timeit
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from bytewax.connectors.kafka import KafkaSourceMessage
from cryptography.fernet import Fernet
from pydantic import SecretStr, ValidationError

from notiflow import ingest_binding as ib
from notiflow.adapters.delayed_intake import Delayed
from notiflow.adapters.dlq import DlqEntry
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.kafka_io import OutRecord
from notiflow.client import ingest_headers
from notiflow.devenv import dev_environment
from notiflow.flows.common import steps
from notiflow.flows.common.guard import UNATTRIBUTED, DlqGuard, charged_to_tenant, source_of
from notiflow.flows.common.items import Retry, SourceRef, Work
from notiflow.flows.common.steps import Encoder, IngestParser, retry_record
from notiflow.flows.scheduling.due_work import Scheduler, ingest_record
from notiflow.gateway.outbox import out_record
from notiflow.ops.dlq_actions import Refusal, plan_replay
from notiflow.schemas.enums import Tier
from notiflow.schemas.messages import DlqRecord, IngestRecord
from notiflow.schemas.scheduling import ScheduledRow
from notiflow.settings import DlqRule, IngestBinding, Settings

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
FERNET = Fernet.generate_key()
ACME_KEY = "acme-ingest-key-0123456789abcdef0123"
ACME_OLD = "acme-ingest-key-previous-0123456789ab"
GLOBEX_KEY = "globex-ingest-key-0123456789abcdef01"
PLATFORM_KEY = "platform-binding-key-0123456789abcdef"
TENANTS = [
    {"id": "acme", "token": "t-acme-0123456789abcdef0123456789",
     "ingest_keys": [ACME_KEY, ACME_OLD]},
    {"id": "globex", "token": "t-globex-0123456789abcdef01234567",
     "ingest_keys": [GLOBEX_KEY]},
]


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("NOTIFLOW_TENANTS", json.dumps(TENANTS))
    monkeypatch.setenv("NOTIFLOW_TWILIO__AUTH_TOKEN", "secret")
    monkeypatch.setenv("NOTIFLOW_TOPIC_PREFIX", "")
    return Settings(dlq_key=FERNET.decode(),
                    ingest_binding=IngestBinding(keys=SecretStr(PLATFORM_KEY)))


def body(tenant: str = "acme", **kw: object) -> bytes:
    doc: dict[str, object] = {"channel": "SMS", "tier": "P1", "recipient": "+14155552671",
                              "template_id": "otp", "template_version": 1,
                              "tenant_id": tenant, "variables": {"code": "123456"}}
    doc.update(kw)
    return orjson.dumps(doc)


def kmsg(value: bytes, headers: list[tuple[str, bytes]] | None = None,
         topic: str = "ingest.sms.p1") -> KafkaSourceMessage[bytes, bytes]:
    return KafkaSourceMessage(key=b"k", value=value, topic=topic, headers=headers or [],
                              latency=None, offset=7, partition=2,
                              timestamp=(1, 1_772_366_400_000))


def parse(settings: Settings, msg: KafkaSourceMessage[bytes, bytes],
          tier: Tier = Tier.P1) -> Any:
    return IngestParser(settings, tier, DlqCipher(FERNET), lambda: NOW)(msg)


def signed(key: str, value: bytes, channel: str = "SMS", tier: str = "P1"
           ) -> list[tuple[str, bytes]]:
    return ingest_headers(key, channel, tier, value)


# --- the rule ---------------------------------------------------------------------------


def binder_of(required: bool = True) -> ib.HmacBinder:
    return ib.HmacBinder([PLATFORM_KEY.encode()],
                         {"acme": [ACME_KEY.encode(), ACME_OLD.encode()],
                          "globex": [GLOBEX_KEY.encode()]}, required=required)


def test_platform_and_each_listed_tenant_key_bind() -> None:
    b, value = binder_of(), body()
    assert b.check("acme", "SMS", "P1", value, b.sign([], "SMS", "P1", value)) == ib.PLATFORM
    assert b.check("globex", "SMS", "P1", value,
                   b.sign([], "SMS", "P1", value)) == ib.PLATFORM
    for key in (ACME_KEY, ACME_OLD):
        assert b.check("acme", "SMS", "P1", value, signed(key, value)) == ib.TENANT


@pytest.mark.parametrize(("claimed", "headers", "channel", "tier", "refusal"), [
    ("acme", None, "SMS", "P1", "unsigned"),
    ("acme", [(ib.HEADER, b"v1.nope")], "SMS", "P1", "malformed"),
    ("acme", [(ib.HEADER, b"v2.abcdefgh." + b"A" * 43)], "SMS", "P1", "malformed"),
    ("acme", signed("someone-else-key-0123456789abcdef0", body()), "SMS", "P1",
     "unknown_key"),
    ("acme", signed(GLOBEX_KEY, body()), "SMS", "P1", "other_tenant"),
    ("acme", signed(ACME_KEY, body(recipient="+14155550000")), "SMS", "P1", "mismatch"),
    ("acme", signed(ACME_KEY, body()), "SMS", "P0", "mismatch"),
    ("acme", signed(ACME_KEY, body()), "EMAIL", "P1", "mismatch"),
])
def test_anything_else_is_refused(claimed: str, headers: list[tuple[str, bytes]] | None,
                                  channel: str, tier: str, refusal: str) -> None:
    verdict = binder_of().check(claimed, channel, tier, body(), headers)
    assert not verdict.bound and verdict.refusal == refusal
    if refusal == "other_tenant":
        assert verdict.signer == "globex"


def test_unsigned_passes_only_when_not_required_and_a_bad_binding_never() -> None:
    loose = binder_of(required=False)
    assert loose.check("acme", "SMS", "P1", body(), None) == ib.UNCHECKED
    assert not loose.check("acme", "SMS", "P1", body(), signed(GLOBEX_KEY, body())).bound


def test_signing_replaces_an_earlier_binding() -> None:
    b, value = binder_of(), body()
    headers = b.sign([("message_id", b"m"), *signed(GLOBEX_KEY, b"old")], "SMS", "P1", value)
    assert [k for k, _ in headers] == ["message_id", ib.HEADER]
    assert b.check("acme", "SMS", "P1", value, headers) == ib.PLATFORM


def test_keys_shorter_than_32_bytes_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFLOW_TENANTS", json.dumps([
        {"id": "acme", "token": "t-acme-0123456789abcdef0123456789", "ingest_keys": ["short"]}]))
    with pytest.raises(ValidationError, match=r"acme: ingest_keys\[0\] must have at least 32"):
        Settings()
    with pytest.raises(ValueError, match="at least 32"):
        ib.Signer.of("short")
    with pytest.raises(ValueError, match="at least 32"):
        ib.platform_keys("short", None)


def test_required_outside_development_and_needs_a_platform_key() -> None:
    assert ib.binder(Settings(dlq_key=FERNET.decode())).required
    assert not ib.binder(Settings(dlq_key=FERNET.decode(), environment="development")).required
    assert ib.binder(Settings(dlq_key=FERNET.decode())).signer is not None
    with pytest.raises(ib.BindingKeyMissing):
        ib.binder(Settings())
    assert ib.binder(Settings(environment="development")).signer is None


def test_the_dev_environment_binds_with_fresh_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    env, _ = dev_environment(api_port=1, fakes_port=2)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = Settings()
    b = ib.binder(s)
    assert b.required and b.signer is not None
    assert all(len(t.ingest_keys) == 1 for t in s.tenants)
    acme = ib.tenant_signer(s, "acme")
    assert acme is not None
    assert b.check("acme", "SMS", "P1", b"x", [acme.header("SMS", "P1", b"x")]) == ib.TENANT


# --- the parse step (required mode) --------------------------------------------------------


def test_a_record_signed_by_its_tenant_or_the_platform_becomes_work(settings: Settings) -> None:
    assert isinstance(parse(settings, kmsg(body(), signed(ACME_KEY, body()))), Work)
    platform = ib.binder(settings).sign([], "SMS", "P1", body())
    assert isinstance(parse(settings, kmsg(body(), platform)), Work)


@pytest.mark.parametrize("by_acme", [False, True], ids=["unsigned", "signed-by-acme"])
def test_a_record_claiming_another_tenant_is_dead_lettered_and_counted(
        settings: Settings, monkeypatch: pytest.MonkeyPatch, by_acme: bool) -> None:
    counted: list[dict[str, str]] = []
    monkeypatch.setattr(steps, "_claims_refused",
                        type("C", (), {"add": lambda _, n, attrs: counted.append(attrs)})())
    forged = body("globex")
    producer = [("producer", b"acme-batch")]
    out = parse(settings, kmsg(forged, producer + (signed(ACME_KEY, forged) if by_acme
                                                   else [])))
    assert isinstance(out, DlqRecord)
    assert (out.error_class, out.category) == ("tenant_claim_refused", "invalid_data")
    assert out.tenant_id is None and "'globex'" in out.reason
    assert DlqCipher(FERNET).decrypt(out.payload_encrypted) == forged
    assert charged_to_tenant(out) and source_of(out) == "producer:acme-batch"
    assert counted == [{"flow": "send.p1",
                        "reason": "other_tenant" if by_acme else "unsigned"}]
    assert ("tenant 'acme'" in out.reason) is by_acme


def test_a_binding_moved_to_another_topic_is_refused(settings: Settings) -> None:
    value = body(tier="P0")
    out = parse(settings, kmsg(value, signed(ACME_KEY, value, tier="P1"),
                               topic="ingest.sms.p0"), Tier.P0)
    assert isinstance(out, DlqRecord) and out.error_class == "tenant_claim_refused"


def test_a_flood_of_forged_claims_quarantines_its_producer_not_the_tenant_it_names(
        settings: Settings) -> None:
    guard = DlqGuard(DlqRule(), "send.p1")
    for i in range(300):
        guard(parse(settings, kmsg(body("globex", idempotency_key=f"f{i}"),
                                   [("producer", b"rogue")])))
    assert guard.quarantined == frozenset({"producer:rogue"})
    unnamed = parse(settings, kmsg(body("globex")))
    assert source_of(unnamed) == UNATTRIBUTED


# --- the platform's writers sign -----------------------------------------------------------


def stamped(settings: Settings, **kw: object) -> IngestRecord:
    doc = orjson.loads(body(message_id="msg_1", accepted_at=NOW.isoformat(),
                            expires_at=(NOW + timedelta(minutes=30)).isoformat(), **kw))
    return IngestRecord.model_validate(doc)


def test_every_platform_writer_binds_what_it_writes(settings: Settings) -> None:
    b, record = ib.binder(settings), stamped(settings)
    payload = record.model_dump_json(exclude_none=True)
    api = out_record(record, "ingest.sms.p1", payload, "", b)
    assert b.check("acme", "SMS", "P1", api.value, api.headers) == ib.PLATFORM

    row = ScheduledRow.waiting(record, NOW, "ingest.sms.p1", payload, timedelta(minutes=1), 4)
    due = ingest_record(row, Clear(), b)
    assert b.check("acme", "SMS", "P1", due.value, due.headers) == ib.PLATFORM

    work = parse(settings, kmsg(payload.encode(), signed(ACME_KEY, payload.encode())))
    assert isinstance(work, Work)
    retry = Encoder(settings, lambda: NOW)(Retry(work, retry_record(
        work, 2, NOW + timedelta(seconds=5)).record))
    assert retry.topic == "ingest.sms.p1"
    assert b.check("acme", "SMS", "P1", retry.value, retry.headers) == ib.PLATFORM
    assert sum(k == ib.HEADER for k, _ in retry.headers) == 1


class Clear:
    """No envelope."""

    required = False

    def seal(self, doc: dict[str, Any]) -> dict[str, Any]:
        return doc

    def open(self, doc: dict[str, Any]) -> dict[str, Any]:
        return doc


async def test_an_unbound_delayed_record_is_dead_lettered_not_published(
        settings: Settings) -> None:
    record = stamped(settings, attempt=2, tenant_id="globex").model_copy(
        update={"not_before": NOW + timedelta(seconds=1)})
    value = record.model_dump_json(exclude_none=True).encode()
    sched = Scheduler(settings, board=None, publish=None, owner="x",  # type: ignore[arg-type]
                      clock=lambda: NOW)
    refused = sched._placed(Delayed(value, "notify.delayed", 0, 1, None, None), NOW)
    assert isinstance(refused, OutRecord) and refused.topic.startswith("notify.dlq.")
    assert DlqRecord.model_validate_json(refused.value).error_class == "tenant_claim_refused"
    [(_, binding)] = ib.binder(settings).sign([], "SMS", "P1", value)
    placed = sched._placed(Delayed(value, "notify.delayed", 0, 1, None, None, binding), NOW)
    assert isinstance(placed, OutRecord) and placed.topic == "ingest.sms.p1"
    assert ib.binder(settings).check("globex", "SMS", "P1", placed.value,
                                     placed.headers) == ib.PLATFORM


def test_a_replay_never_binds_a_record_that_arrived_unbound(settings: Settings) -> None:
    record = stamped(settings, tenant_id="globex")
    raw = record.model_dump_json(exclude_none=True).encode()

    def entry(headers: dict[str, str]) -> DlqEntry:
        dl = steps.dead_letter(raw=raw, source=SourceRef("ingest.sms.p1", 0, 1, None),
                               reason="x", error_class="tenant_claim_refused",
                               category="invalid_data", tier=Tier.P1,
                               cipher=DlqCipher(FERNET), now=NOW,
                               headers=[(k, v.encode()) for k, v in headers.items()])
        return DlqEntry(dl, "notify.dlq.p1", 0, 1, None)

    refused = plan_replay(entry({}), raw, settings, now=NOW)
    assert isinstance(refused, Refusal) and "not bound" in refused.why
    [(name, binding)] = signed(GLOBEX_KEY, raw)
    assert not isinstance(plan_replay(entry({name: binding.decode()}), raw, settings,
                                      now=NOW), Refusal)


# --- cost on the hot path ------------------------------------------------------------------


def test_the_check_costs_microseconds(settings: Settings) -> None:
    b, value = ib.binder(settings), body()
    headers = signed(ACME_KEY, value)
    n = 2000
    per = timeit.timeit(lambda: b.check("acme", "SMS", "P1", value, headers), number=n) / n
    assert b.check("acme", "SMS", "P1", value, headers) == ib.TENANT
    assert per < 200e-6
