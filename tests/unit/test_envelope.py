"""Envelope encryption of ingest records: sealed and opened back exactly (hypothesis), the
recipient and variables absent from the sealed bytes, tampering and transplanting detected,
key rotation by kid, data keys drawn per ``data_key_ttl`` under a driven clock, and the
refusals (unknown key, no key, clear records when sealing is required)."""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notiflow.adapters.envelope import (
    SEALED,
    Clear,
    Envelope,
    EnvelopeError,
    dump,
    envelope,
    load,
    new_key,
    parse_keys,
)
from notiflow.flows.common.items import Retry, SourceRef, Work
from notiflow.flows.send.stages.emit import lease_outcome
from notiflow.schemas.messages import IngestRecord, StatusEvent
from notiflow.settings import Settings
from tests.fakes import ManualClock

PHONE = "+14155550123"


def record(**extra: Any) -> IngestRecord:
    return IngestRecord.model_validate({
        "channel": "SMS", "tier": "P1", "recipient": PHONE, "template_id": "otp",
        "template_version": 1, "variables": {"code": "123456"}, "tenant_id": "acme",
        "message_id": "01JAAAAAAAAAAAAAAAAAAAAAAA", **extra})


def sealer(*kids: str, **kw: Any) -> Envelope:
    return Envelope(parse_keys(",".join(new_key(k) for k in kids or ("k1",))), **kw)


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10**9, 10**9),
                   st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))


@settings(max_examples=300, deadline=None)
@given(variables=st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True),
                                 VALUES, max_size=8),
       tenant=st.from_regex(r"[a-z][a-z0-9_-]{0,20}", fullmatch=True),
       email=st.emails())
def test_a_sealed_record_opens_to_the_same_record(variables: dict[str, Any], tenant: str,
                                                   email: str) -> None:
    try:
        original = record(variables=variables, tenant_id=tenant, channel="EMAIL",
                          recipient=email)
    except ValueError:
        return
    env = sealer()
    payload = dump(original, env)
    doc = orjson.loads(payload)
    assert "recipient" not in doc and "variables" not in doc and SEALED in doc
    assert original.recipient not in payload
    assert load(payload, env) == original


def test_everything_but_the_private_fields_stays_readable() -> None:
    payload = orjson.loads(dump(record(), sealer()))
    clear = orjson.loads(dump(record(), Clear()))
    assert {k: v for k, v in clear.items() if k not in ("recipient", "variables")} == {
        k: v for k, v in payload.items() if k != SEALED}


def test_tampering_or_moving_the_sealed_fields_is_detected() -> None:
    env = sealer()
    doc = orjson.loads(dump(record(), env))
    body = doc[SEALED]
    head, last = body.rsplit(".", 1)
    raw = bytearray(base64.urlsafe_b64decode(last + "=" * (-len(last) % 4)))
    raw[-1] ^= 1
    flipped = head + "." + base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    with pytest.raises(EnvelopeError, match="do not open"):
        env.open({**doc, SEALED: flipped})
    for moved in ({"tenant_id": "globex"}, {"message_id": "01JBBBBBBBBBBBBBBBBBBBBBBB"}):
        with pytest.raises(EnvelopeError, match="moved"):
            env.open({**doc, **moved})
    for broken in (42, "v2.k1.a.b", "v1.k1.a", "v1.k1.!!.x"):
        with pytest.raises(EnvelopeError):
            env.open({**doc, SEALED: broken})


def test_rotation_new_key_seals_every_listed_key_opens() -> None:
    old_key, new = new_key("old"), new_key("new")
    before = Envelope(parse_keys(old_key))
    after = Envelope(parse_keys(f"{new},{old_key}"))
    sealed_before = dump(record(), before)
    assert load(sealed_before, after) == record()
    sealed_after = dump(record(), after)
    assert orjson.loads(sealed_after)[SEALED].split(".")[1] == "new"
    with pytest.raises(EnvelopeError, match="unknown key 'new'"):
        load(sealed_after, before)


def test_a_data_key_serves_its_ttl_then_the_next_is_drawn() -> None:
    clock = ManualClock(0.0)
    env = sealer(clock=clock, data_key_ttl_s=60)

    def data_key() -> str:
        return str(orjson.loads(dump(record(), env))[SEALED].split(".")[2])

    first = data_key()
    clock.now = 59.9
    assert data_key() == first
    clock.now = 60.0
    second = data_key()
    assert second != first
    assert load(dump(record(), env), env) == record()
    with pytest.raises(EnvelopeError, match="data key does not open"):
        sealer().open(orjson.loads(dump(record(), env)))


def test_clear_records_pass_unless_sealing_is_required() -> None:
    clear = dump(record(), Clear())
    assert load(clear, sealer()) == record()
    with pytest.raises(EnvelopeError, match="must be sealed"):
        load(clear, sealer(required=True))
    with pytest.raises(EnvelopeError, match="no ingest key"):
        load(dump(record(), sealer()), Clear())


def test_keys_are_checked_when_read() -> None:
    for text, reason in (("", "no ingest key"), ("k1", "kid:base64"), ("k 1:AAAA", "kid"),
                         ("k1:AAAA", "3 bytes"), (f"{new_key('a')},{new_key('a')}", "twice")):
        with pytest.raises(ValueError, match=reason):
            parse_keys(text)


def test_the_settings_choose_the_sealer() -> None:
    assert isinstance(envelope(Settings()), Clear)
    configured = Settings(ingest_encryption={"keys": new_key("k9"), "required": True,
                                             "data_key_ttl": timedelta(minutes=1)})
    env = envelope(configured)
    assert isinstance(env, Envelope) and env.required and env.data_key_ttl_s == 60
    assert envelope(configured) is env


def test_the_retry_kept_on_a_finished_lease_is_sealed_too() -> None:
    retry = record(attempt=2)
    work = Work(retry, SourceRef("ingest.sms.p1", 0, 1), b"k", [])
    event = StatusEvent(event_id="e", message_id=str(retry.message_id), tenant_id="acme",
                        channel="SMS", tier="P1", status="RETRY_PENDING",
                        occurred_at="2026-03-01T12:00:00Z", source="x")
    env = sealer()
    done = lease_outcome(event, [Retry(work, retry)], env)
    kept = done["retry"]
    assert isinstance(kept, dict) and SEALED in kept and PHONE not in orjson.dumps(kept).decode()
    assert IngestRecord.model_validate(env.open(kept)) == retry
    assert lease_outcome(event, [Retry(work, retry)])["retry"]["recipient"] == PHONE
