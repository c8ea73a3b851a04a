"""Recipient hashes are keyed (HMAC-SHA-256 under ``recipient_hash_key``): a stored hash
cannot be matched to a phone number by hashing candidate numbers without the key; keys
rotate (the first writes, every one is looked up) and the unkeyed hash of earlier releases
is looked up only while ``recipient_hash_legacy`` is on."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import bytewax.operators as op
import orjson
import pytest
from bytewax.dataflow import Dataflow
from bytewax.testing import TestingSink, TestingSource, run_main
from cryptography.fernet import Fernet

from notiflow import redact
from notiflow.adapters.cassandra.idempotency import ReservationRow
from notiflow.adapters.cassandra.recipients import DeviceRow
from notiflow.adapters.idempotency_fence import Holder
from notiflow.adapters.inbox_store import channel_key
from notiflow.adapters.preferences import PreferenceStore
from notiflow.adapters.providers.base import Outcome, SendResult
from notiflow.devenv import dev_environment
from notiflow.flows.common.items import SourceRef, Work
from notiflow.flows.common.steps import snapshot_of
from notiflow.flows.send.cap_rules import cap_check
from notiflow.flows.send.consent import PolicyStep, WithPreferences, join_preferences
from notiflow.flows.send.stages import gates
from notiflow.flows.send.stages.classifying import Classify
from notiflow.flows.send.stages.send_batch import Batch
from notiflow.gateway import acceptance, recipients
from notiflow.gateway.errors import ApiError
from notiflow.gateway.outbox import ACCEPTED
from notiflow.gateway.reservation import Claim, Taken
from notiflow.redact import RecipientHasher, RecipientHashKeyMissing, legacy_hash
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import IngestRecord, SendRequest, StatusEvent
from notiflow.schemas.preferences import PreferenceState, combined_state, state_key
from notiflow.settings import Settings
from tests.fakes import Producer
from tests.helpers import partial_ports
from tests.unit.test_reservation import FakeFence, FakeStore
from tests.unit.test_reservation import run as run_reserve

NEW = "n" * 32
OLD = "o" * 32
PHONE = "+41791234567"


def _unkeyed(tenant: str, key: str) -> str:
    return hashlib.sha256(f"{tenant}\x1f{key}".encode()).hexdigest()[:32]


def test_the_hash_is_keyed_so_enumerating_numbers_does_not_find_it() -> None:
    stored = redact.recipient_hash("acme", PHONE)
    guesses = {_unkeyed("acme", f"+417912345{n:02d}") for n in range(100)}
    assert len(stored) == 32 and int(stored, 16) >= 0
    assert stored not in guesses
    assert stored == hmac.new(b"unit-test-recipient-hash-key-0001", f"acme\x1f{PHONE}".encode(),
                              hashlib.sha256).hexdigest()[:32]
    assert redact.recipient_hash("acme", PHONE) == stored
    assert redact.recipient_hash("other", PHONE) != stored


def test_the_first_key_writes_and_every_key_is_looked_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFLOW_RECIPIENT_HASH_KEY", f"{NEW}, {OLD}")
    hasher = RecipientHasher.from_settings(Settings())
    only_old = RecipientHasher((OLD.encode(),))
    assert hasher.hash("acme", PHONE) != only_old.hash("acme", PHONE)
    assert hasher.candidates("acme", PHONE) == (hasher.hash("acme", PHONE),
                                                only_old.hash("acme", PHONE))
    assert legacy_hash("acme", PHONE) not in hasher.candidates("acme", PHONE)


def test_the_legacy_hash_is_looked_up_only_when_asked_and_never_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFLOW_RECIPIENT_HASH_KEY", NEW)
    monkeypatch.setenv("NOTIFLOW_RECIPIENT_HASH_LEGACY", "true")
    hasher = RecipientHasher.from_settings(Settings())
    assert hasher.legacy
    assert hasher.candidates("acme", PHONE)[-1] == _unkeyed("acme", PHONE)
    assert hasher.hash("acme", PHONE) != _unkeyed("acme", PHONE)
    monkeypatch.delenv("NOTIFLOW_RECIPIENT_HASH_LEGACY")
    assert not RecipientHasher.from_settings(Settings(recipient_hash_key=NEW)).legacy


def test_without_a_key_one_is_derived_from_each_dlq_key_else_nothing_is_hashed() -> None:
    a, b = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    two = RecipientHasher.from_settings(Settings(dlq_key=f"{a},{b}"))
    one = RecipientHasher.from_settings(Settings(dlq_key=a))
    assert len(two.keys) == 2 and two.hash("t", PHONE) == one.hash("t", PHONE)
    assert a.encode() not in two.keys
    assert RecipientHasher.from_settings(Settings(recipient_hash_key=" ", dlq_key=a)) == one
    with pytest.raises(RecipientHashKeyMissing):
        RecipientHasher.from_settings(Settings())
    with pytest.raises(ValueError, match="16 bytes"):
        RecipientHasher.from_settings(Settings(recipient_hash_key="short"))


def test_an_unconfigured_process_takes_the_key_of_its_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFLOW_RECIPIENT_HASH_KEY", NEW)
    redact.use(None)
    assert redact.recipient_hash("acme", PHONE) == RecipientHasher((NEW.encode(),)).hash(
        "acme", PHONE)
    assert redact.configure(Settings(recipient_hash_key=OLD)).keys == (OLD.encode(),)
    assert redact.recipient_hashes("acme", PHONE) == (
        RecipientHasher((OLD.encode(),)).hash("acme", PHONE),)


def test_the_development_environment_has_its_own_key() -> None:
    env, _ = dev_environment(api_port=1, fakes_port=2)
    again, _ = dev_environment(api_port=1, fakes_port=2)
    key = env["NOTIFLOW_RECIPIENT_HASH_KEY"]
    assert len(key) >= 32 and key != again["NOTIFLOW_RECIPIENT_HASH_KEY"]


def test_message_rows_store_the_keyed_hash() -> None:
    record = IngestRecord.model_validate({
        "tenant_id": "acme", "channel": "SMS", "tier": "P1", "recipient": PHONE,
        "template_id": "otp", "template_version": 1, "variables": {"code": "1"},
        "message_id": "m1",
        "accepted_at": "2026-12-06T12:00:00Z", "expires_at": "2026-12-06T13:00:00Z"})
    snap = snapshot_of(record)
    assert snap.recipient_hash == redact.recipient_hash("acme", record.recipient_key())
    assert snap.recipient_hash != _unkeyed("acme", record.recipient_key())


# lookups under every hash -----------------------------------------------------------------

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _state(tenant: str, h: str, **kw: Any) -> PreferenceState:
    return PreferenceState(tenant_id=tenant, recipient_hash=h, version=1, updated_at=T0, **kw)


def _rotated(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Keys ``NEW,OLD`` in force; the hashes of ``PHONE`` (acme) under each."""
    redact.configure(Settings(recipient_hash_key=f"{NEW},{OLD}"))
    new, old = redact.recipient_hashes("acme", PHONE)
    return new, old


class Store:
    def __init__(self, states: dict[str, PreferenceState]) -> None:
        self.states = states

    @property
    def recipients(self) -> Store:
        return self

    async def get_state(self, tenant: str, h: str) -> PreferenceState | None:
        return self.states.get(state_key(tenant, h))

    async def get_states(self, keys: list[tuple[str, str]]) -> dict[str, PreferenceState]:
        return {state_key(t, h): s for t, h in keys
                if (s := self.states.get(state_key(t, h))) is not None}

    async def suppress(self, tenant: str, h: str, reason: Any) -> PreferenceState:
        self.states[state_key(tenant, h)] = _state(tenant, h, suppressed=reason)
        return self.states[state_key(tenant, h)]


def _runtime(store: Store) -> Any:
    return SimpleNamespace(store=lambda: store, preferences=lambda: store)


def _strong_consent(monkeypatch: pytest.MonkeyPatch, store: Store, work: Work) -> list[Any]:
    """Run ``gates.StrongConsent`` over ``work`` with ``store`` as the preferences port; the
    ``(status, reason)`` of each message it finished."""
    decided: list[Any] = []

    async def infra(_: str, call: Any) -> Any:
        return await call()

    async def finish(ctx: Any, w: Any, event: Any) -> list[Any]:
        decided.append(event)
        return []

    monkeypatch.setattr(gates, "finish", finish)
    ctx = SimpleNamespace(
        settings=Settings(), policy=SimpleNamespace(store_concurrency=8), infra=infra,
        ports=SimpleNamespace(preferences=store),
        event=lambda w, status, at, reason=None: (status, reason))
    asyncio.run(gates.StrongConsent()(Batch([work], T0), ctx))  # type: ignore[arg-type]
    return decided


def test_the_api_finds_a_state_stored_under_the_old_key_and_keeps_its_suppression(
        monkeypatch: pytest.MonkeyPatch) -> None:
    new, old = _rotated(monkeypatch)
    store = Store({state_key("acme", old): _state("acme", old, suppressed="unsubscribed")})
    rt = _runtime(store)
    found = asyncio.run(recipients.stored_state(rt, "acme", redact.recipient_hashes(
        "acme", PHONE)))
    assert found is not None and found.recipient_hash == old
    asyncio.run(recipients.carry_forward(rt, "acme", PHONE))
    assert store.states[state_key("acme", new)].suppressed == "unsubscribed"


def test_marketing_sends_honour_an_opt_out_stored_under_the_old_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _, old = _rotated(monkeypatch)
    opted_out = _state("acme", old, opt_outs=[{"category": "marketing"}])
    store = Store({state_key("acme", old): opted_out})
    record = IngestRecord.model_validate({
        "tenant_id": "acme", "channel": "SMS", "tier": "P3", "category": "marketing",
        "recipient": PHONE, "template_id": "promo", "template_version": 1,
        "message_id": "m1", "accepted_at": T0.isoformat()})
    work = Work(record, SourceRef("ingest.sms.p3", 0, 1), b"raw", b"k")
    decided = _strong_consent(monkeypatch, store, work)
    assert decided == [(Status.SUPPRESSED, "opted_out")]


def test_the_duplicate_content_fingerprint_is_keyed_too() -> None:
    record = IngestRecord.model_validate({
        "tenant_id": "acme", "channel": "SMS", "tier": "P1", "recipient": PHONE,
        "template_id": "otp", "template_version": 1, "variables": {"code": "1"},
        "message_id": "m1", "accepted_at": T0.isoformat()})
    work = Work(record, SourceRef("ingest.sms.p1", 0, 1), b"raw", b"k")
    doc = orjson.dumps([PHONE, "SMS", "otp", 1, {"code": "1"}], option=orjson.OPT_SORT_KEYS)
    fingerprint = gates.content_fingerprint(work)
    assert fingerprint != hashlib.sha256(doc).hexdigest()
    assert fingerprint == redact.hasher().digest(doc)
    redact.use(RecipientHasher((NEW.encode(),)))
    assert gates.content_fingerprint(work) != fingerprint


# the send flows' consent join ------------------------------------------------------------


def _sms(message_id: str, recipient: str, *, category: str = "transactional",
         offset: int = 1) -> Work:
    record = IngestRecord.model_validate({
        "tenant_id": "acme", "channel": "SMS", "tier": "P2", "category": category,
        "recipient": recipient, "template_id": "t", "template_version": 1,
        "message_id": message_id, "accepted_at": T0.isoformat()})
    return Work(record, SourceRef("ingest.sms.p2", 0, offset), b"raw", b"k")


def _joined(works: list[Work], prefs: list[PreferenceState]) -> dict[str, PreferenceState | None]:
    """Run the send flows' consent join (``join_preferences``) over ``prefs`` then
    ``works``; the state each message was paired with, by message id."""
    flow = Dataflow("join")
    out: list[WithPreferences] = []
    paired = join_preferences(
        op.input("works", flow, TestingSource([TestingSource.PAUSE(timedelta(milliseconds=200)),
                                               *works])),
        op.input("prefs", flow, TestingSource(prefs)))
    op.output("out", paired, TestingSink(out))
    run_main(flow)
    assert sorted(p.work.message_id for p in out) == sorted(w.message_id for w in works)
    return {p.work.message_id: p.state for p in out}


def test_the_consent_join_honours_states_stored_under_an_old_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    new, old = _rotated(monkeypatch)
    other = "+41797654321"
    other_new, other_old = redact.recipient_hashes("acme", other)
    found = _joined(
        [_sms("dead", PHONE), _sms("quiet", other, offset=2), _sms("free", "+41790000000")],
        [_state("acme", old, suppressed="hard_bounce"),
         _state("acme", other_old, timezone="Asia/Tokyo",
                quiet_hours={"start": "00:00", "end": "23:59"})])
    assert found["free"] is None
    dead, quiet = found["dead"], found["quiet"]
    assert dead is not None and dead.suppressed == "hard_bounce"
    assert quiet is not None and quiet.timezone == "Asia/Tokyo"
    step = PolicyStep(Settings(), lambda: T0)
    [suppressed] = step(WithPreferences(_sms("dead", PHONE), dead))
    assert isinstance(suppressed, StatusEvent) and suppressed.status is Status.SUPPRESSED
    scheduled, _ = step(WithPreferences(_sms("quiet", other, offset=2), quiet))
    assert isinstance(scheduled, StatusEvent) and scheduled.reason == "quiet_hours"
    assert {new, other_new}.isdisjoint({old, other_old})


def test_the_consent_join_takes_preferences_from_the_current_hash_and_any_suppression(
        monkeypatch: pytest.MonkeyPatch) -> None:
    new, old = _rotated(monkeypatch)
    found = _joined([_sms("m", PHONE)], [
        _state("acme", new, timezone="Europe/Zurich"),
        _state("acme", old, timezone="Asia/Tokyo", suppressed="unsubscribed",
               opt_outs=[{"category": "marketing"}])])
    state = found["m"]
    assert state is not None and state.recipient_hash == new
    assert state.timezone == "Europe/Zurich" and state.opt_outs == ()
    assert state.suppressed == "unsubscribed"


def test_the_consent_join_finds_the_legacy_hash_only_while_legacy_is_on() -> None:
    prefs = [_state("acme", legacy_hash("acme", PHONE), suppressed="complaint")]
    redact.use(RecipientHasher((NEW.encode(),), legacy=True))
    on = _joined([_sms("m", PHONE)], prefs)["m"]
    assert on is not None and on.suppressed == "complaint"
    redact.use(RecipientHasher((NEW.encode(),)))
    assert _joined([_sms("m", PHONE)], prefs)["m"] is None


def test_combined_state_keeps_the_first_states_preferences_and_any_suppression() -> None:
    current = _state("acme", "a", timezone="UTC")
    older = _state("acme", "b", suppressed="hard_bounce", opt_outs=[{"category": "*"}])
    assert combined_state([None, None]) is None
    assert combined_state([None, older]) == older
    assert combined_state([current, None]) is current
    both = combined_state([current, older])
    assert both is not None and both.recipient_hash == "a" and both.opt_outs == ()
    assert both.suppressed == "hard_bounce"


def test_strong_consent_sees_an_old_suppression_behind_a_newer_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    new, old = _rotated(monkeypatch)
    store = Store({state_key("acme", new): _state("acme", new, timezone="UTC"),
                   state_key("acme", old): _state("acme", old, suppressed="complaint")})
    work = _sms("m1", PHONE, category="marketing")
    decided = _strong_consent(monkeypatch, store, work)
    assert decided == [(Status.SUPPRESSED, "complaint")]


# device tokens and their owners ----------------------------------------------------------

TOKEN = "a" * 64
PUSH = f"ios:{TOKEN}"


class Devices(Store):
    """Device rows by ``(owner hash, token)``, owners by token hash, states by key."""

    def __init__(self, states: dict[str, PreferenceState],
                 rows: dict[tuple[str, str], dict[str, Any]],
                 owners: dict[str, list[tuple[str, str]]]) -> None:
        super().__init__(states)
        self.rows, self.owners = rows, owners
        self.deactivated: list[tuple[str, str, str]] = []

    async def suppress(self, tenant: str, h: str, reason: Any,
                       now: Any = None) -> PreferenceState:
        return await super().suppress(tenant, h, reason)

    async def get_device(self, tenant: str, owner_hash: str, token: str) -> DeviceRow | None:
        found = self.rows.get((owner_hash, token))
        return DeviceRow(tenant, owner_hash, token, **found) if found is not None else None

    async def unsuppress(self, tenant: str, h: str, now: Any = None, *,
                         only: Any = None) -> PreferenceState | None:
        state = self.states.get(state_key(tenant, h))
        if state is not None and state.suppressed is not None:
            state = self.states[state_key(tenant, h)] = state.model_copy(
                update={"suppressed": None, "version": state.version + 1})
        return state

    async def deactivate_token(self, tenant: str, token_hash: str, reason: str,
                               now: Any) -> int:
        found = self.owners.get(token_hash, [])
        self.deactivated += [(owner, token, reason) for owner, token in found]
        return len(found)

    async def get_state(self, tenant: str, h: str) -> PreferenceState | None:
        return self.states.get(state_key(tenant, h))


def test_a_device_registered_under_the_old_key_is_found_by_its_owner(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _, old_owner = _rotated(monkeypatch)
    store = Devices({}, {(old_owner, TOKEN): {"platform": "ios", "active": True}}, {})
    tenant = SimpleNamespace(id="acme")
    device = asyncio.run(recipients.registered(_runtime(store), tenant,  # type: ignore[arg-type]
                                               PHONE, TOKEN))
    assert device.owner_hash == old_owner and device.push == PUSH


def test_registering_a_token_again_clears_its_suppression_under_every_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    redact.configure(Settings(recipient_hash_key=f"{NEW},{OLD}"))
    _, old = redact.recipient_hashes("acme", PUSH)
    store = Devices({state_key("acme", old): _state("acme", old, suppressed="token_deactivated")},
                    {}, {})
    rt = _runtime(store)
    before = asyncio.run(recipients.combined_stored(rt, "acme", PUSH))
    assert before is not None and before.suppressed == "token_deactivated"
    state = asyncio.run(recipients.reactivated(rt, "acme", PUSH, T0))
    assert state is not None and state.suppressed is None
    assert store.states[state_key("acme", old)].suppressed is None
    assert asyncio.run(recipients.combined_stored(rt, "acme", PUSH)) == state


def test_a_dead_token_deactivates_the_owners_recorded_under_every_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    redact.configure(Settings(recipient_hash_key=f"{NEW},{OLD}"))
    new, old = redact.recipient_hashes("acme", PUSH)
    store = Devices({}, {}, {new: [("owner-new", TOKEN)], old: [("owner-old", TOKEN)]})

    prefs = PreferenceStore(store, Producer(), topic="notify.preferences")  # type: ignore[arg-type]
    record = IngestRecord.model_validate({
        "tenant_id": "acme", "channel": "PUSH", "tier": "P1", "category": "transactional",
        "recipient": {"device_token": TOKEN, "platform": "ios"}, "template_id": "t",
        "template_version": 1, "message_id": "m1", "accepted_at": T0.isoformat()})
    work = Work(record, SourceRef("ingest.push.p1", 0, 1), b"raw", b"k")
    result = SendResult(Outcome.PERMANENT, "apns", T0, T0, reason="unregistered",
                        deactivate_recipient=True)
    ctx: Any = SimpleNamespace(ports=partial_ports(preferences=prefs))
    asyncio.run(Classify()._suppress(ctx, work, result))
    assert sorted(store.deactivated) == [("owner-new", TOKEN, "apns:unregistered"),
                                         ("owner-old", TOKEN, "apns:unregistered")]
    assert store.states[state_key("acme", new)].suppressed == "token_deactivated"


# idempotency reservations and inbox channels ----------------------------------------------

SEND = {"channel": "SMS", "tier": "P1", "recipient": PHONE, "template_id": "otp",
        "template_version": 1, "variables": {"code": "1"}}


def _canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def test_the_request_hash_of_a_reservation_is_keyed() -> None:
    req = SendRequest.model_validate(SEND)
    fields = req.model_dump(mode="json")
    del fields["sender"]
    unkeyed = hashlib.sha256(_canonical(fields)).hexdigest()
    assert acceptance.request_hash(req) != unkeyed
    assert acceptance.request_hash(req) == redact.hasher().digest(_canonical(fields))
    assert unkeyed not in acceptance.request_hashes(req)


def _replay(existing_hash: str) -> Any:
    existing = ReservationRow("acme", "k1", request_hash=existing_hash, state=ACCEPTED,
                              message_id="m0", response='{"message_id":"m0"}')
    req = SendRequest.model_validate(SEND)
    return asyncio.run(acceptance.resume(SimpleNamespace(), "acme",  # type: ignore[arg-type]
                                          "k1", acceptance.request_hashes(req), existing, "tp"))


def test_a_reservation_made_before_the_upgrade_or_under_an_old_key_still_matches() -> None:
    req = SendRequest.model_validate(SEND)
    fields = req.model_dump(mode="json")
    del fields["sender"]
    unkeyed = hashlib.sha256(_canonical(fields)).hexdigest()
    under_old = RecipientHasher((OLD.encode(),)).digest(_canonical(fields))
    redact.use(RecipientHasher((NEW.encode(), OLD.encode()), legacy=True))
    for stored in (acceptance.request_hash(req), under_old, unkeyed):
        replayed = _replay(stored)
        assert replayed.status_code == 202 and replayed.headers["Idempotent-Replayed"] == "true"
    redact.use(RecipientHasher((NEW.encode(),)))
    for stored in (under_old, unkeyed):
        with pytest.raises(ApiError) as err:
            _replay(stored)
        assert err.value.status == 409


def test_a_fence_held_under_another_form_of_the_same_request_is_not_a_conflict() -> None:
    row = ReservationRow("acme", "k1", request_hash="old-form", message_id="m9",
                         state="PENDING")
    c = Claim("acme", "k1", "new-form", "m1", "topic", "{}", T0, ("new-form", "old-form"))
    store, fence = FakeStore([None, row]), FakeFence(Holder("old-form", "m9"))
    assert run_reserve(store, fence, c) == Taken(row)
    alone = Claim("acme", "k1", "new-form", "m1", "topic", "{}", T0)
    with pytest.raises(ApiError) as err:
        run_reserve(FakeStore(), FakeFence(Holder("old-form", "m9")), alone)
    assert err.value.status == 409


def test_inbox_channels_name_users_by_their_keyed_hash() -> None:
    channel = channel_key("t.", "acme", "u-1")
    unkeyed = hashlib.sha256(b"acme\x1fu-1").hexdigest()[:32]
    assert channel == f"t.inbox:acme:{redact.recipient_hash('acme', 'u-1')}"
    assert unkeyed not in channel
    redact.use(RecipientHasher((NEW.encode(),)))
    assert channel_key("t.", "acme", "u-1") != channel


def test_caps_and_content_keys_follow_the_first_key_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinned by design (docs/operations.md, "Redis counters restart once"): after a
    rotation the cap and duplicate-content keys are the new first key's, not looked up
    under older ones."""
    work = _sms("m1", PHONE)
    settings = Settings(caps={"transactional": {"limit": 5, "window": "PT10M"}})
    redact.use(RecipientHasher((OLD.encode(),)))
    before = cap_check(work, settings, T0), gates.content_fingerprint(work)
    new, old = _rotated(monkeypatch)
    after = cap_check(work, settings, T0), gates.content_fingerprint(work)
    assert before[0] is not None and after[0] is not None
    assert before[0].recipient_key == f"acme:{old}:transactional"
    assert after[0].recipient_key == f"acme:{new}:transactional"
    assert after[1] != before[1] == RecipientHasher((OLD.encode(),)).digest(
        orjson.dumps([PHONE, "SMS", "t", 1, {}], option=orjson.OPT_SORT_KEYS))
