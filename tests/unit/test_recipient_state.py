"""Recipient addresses, the state's Cassandra row form, and write-then-publish ordering."""

from __future__ import annotations

from datetime import UTC, datetime, time
from typing import Any, cast

import orjson
import pytest
from pydantic import ValidationError

from notiflow.adapters.cassandra.recipients import (
    RecipientStore,
    StateChange,
    blank_state,
    state_columns,
    state_from_row,
)
from notiflow.adapters.preferences import PreferenceStore, state_record
from notiflow.schemas.messages import SendRequest
from notiflow.schemas.preferences import (
    OptOut,
    PreferenceState,
    PreferencesUpdate,
    QuietWindow,
    address_key,
)
from tests.fakes import Producer

NOW = datetime(2026, 3, 29, 0, 30, 0, 123000, tzinfo=UTC)
IOS = "ab" * 32
FCM = "d" * 22 + ":APA91b" + "Z" * 40


@pytest.mark.parametrize(("channel", "recipient", "address"), [
    ("SMS", "+14155550123", "+14155550123"),
    ("EMAIL", "Jane.Doe@Example.COM", "Jane.Doe@Example.COM"),
    ("EMAIL", "jane.doe@example.com", "JANE.DOE@EXAMPLE.COM"),
    ("PUSH", {"platform": "ios", "device_token": IOS}, f"ios:{IOS}"),
    ("PUSH", {"platform": "android", "device_token": FCM}, f"android:{FCM}"),
])
def test_address_key_matches_send_request_key(channel: str, recipient: Any,
                                              address: str) -> None:
    req = SendRequest.model_validate({"channel": channel, "tier": "P1", "recipient": recipient,
                                      "template_id": "t", "template_version": 1})
    assert address_key(address) == req.recipient_key()


@pytest.mark.parametrize("address", ["", "alice", "+12", "+447700900123", "a@", "ios:xyz",
                                     "ios:" + "g" * 64, "fax:" + "a" * 40, ":" + "a" * 40])
def test_invalid_addresses(address: str) -> None:
    with pytest.raises(ValueError):
        address_key(address)


def test_quiet_hours_are_wall_clock_times() -> None:
    with pytest.raises(ValidationError):
        QuietWindow.model_validate({"start": "22:00+02:00", "end": "07:00"})
    assert QuietWindow.model_validate({"start": "22:00", "end": "07:00"}).end == time(7)


def state(**kw: Any) -> PreferenceState:
    base: dict[str, Any] = {"tenant_id": "acme", "recipient_hash": "h" * 32, "version": 3,
                            "updated_at": NOW}
    base.update(kw)
    return PreferenceState.model_validate(base)


@pytest.mark.parametrize("st", [
    state(),
    state(timezone="America/New_York", quiet_hours={"start": "21:30", "end": "08:00:00.5"},
          opt_outs=[{"channel": "SMS", "category": "marketing"}, {}],
          suppressed="hard_bounce"),
    state(opt_outs=[{"category": "otp"}], suppressed="token_deactivated"),
    state(muted_topics=["deals", "releases"]),
])
def test_row_round_trip(st: PreferenceState) -> None:
    names = ("version", "timezone", "quiet_start", "quiet_end", "opt_outs", "suppressed",
             "updated_at", "muted_topics")
    row = dict(zip(names, state_columns(st), strict=True))
    row.update(tenant_id=st.tenant_id, recipient_hash=st.recipient_hash,
               updated_at=NOW.replace(tzinfo=None))
    assert state_from_row(row) == st


def test_opt_outs_stored_as_channel_slash_category() -> None:
    st = state(opt_outs=[OptOut(channel="EMAIL", category="marketing"), OptOut()])
    assert state_columns(st)[4] == ["EMAIL/marketing", "*/*"]
    assert state_columns(state())[4] is None


def test_state_record_is_keyed_by_tenant_and_hash() -> None:
    rec = state_record("notify.preferences", state())
    assert rec.key == b"acme:" + b"h" * 32
    assert PreferenceState.model_validate_json(rec.value) == state()
    assert ("tenant_id", b"acme") in rec.headers
    assert orjson.loads(rec.value)["schema_version"] == 1


class FakeStore:
    """In-memory stand-in for the Cassandra calls :class:`PreferenceStore` makes; the
    suppression helpers are the real ones, over :meth:`change_state`."""

    suppress = RecipientStore.suppress
    unsuppress = RecipientStore.unsuppress

    def __init__(self) -> None:
        self.states: dict[tuple[str, str], PreferenceState] = {}
        self.after_read: list[PreferenceState] = []

    async def get_state(self, tenant_id: str, recipient_hash: str) -> PreferenceState | None:
        if self.after_read:
            newer = self.after_read.pop(0)
            self.states[(tenant_id, recipient_hash)] = newer
        return self.states.get((tenant_id, recipient_hash))

    async def change_state(self, tenant_id: str, recipient_hash: str, change: StateChange,
                           now: datetime | None = None) -> tuple[PreferenceState | None, bool]:
        current = self.states.get((tenant_id, recipient_hash))
        base = current or blank_state(tenant_id, recipient_hash, now or NOW)
        wanted = change(base)
        if wanted is None:
            return current, False
        new = wanted.model_copy(update={"version": base.version + 1,
                                        "updated_at": now or NOW})
        self.states[(tenant_id, recipient_hash)] = new
        return new, True


def prefs() -> tuple[PreferenceStore, FakeStore, Producer]:
    store, producer = FakeStore(), Producer()
    return (PreferenceStore(cast(RecipientStore, store), producer, "notify.preferences"),
            store, producer)


def versions(producer: Producer) -> list[int]:
    return [PreferenceState.model_validate_json(r.value).version for r in producer.records]


async def test_set_preferences_replaces_everything_but_the_suppression() -> None:
    p, store, producer = prefs()
    store.states[("acme", "h")] = state(recipient_hash="h", suppressed="hard_bounce",
                                        timezone="UTC", opt_outs=[{}])
    new = await p.set_preferences("acme", "h", PreferencesUpdate(timezone="Asia/Tokyo"), NOW)
    assert (new.version, new.timezone, new.opt_outs, new.suppressed) == (
        4, "Asia/Tokyo", (), "hard_bounce")
    assert versions(producer) == [4]


async def test_publish_follows_a_newer_version_written_meanwhile() -> None:
    p, store, producer = prefs()
    await p.set_preferences("acme", "h", PreferencesUpdate(), NOW)
    store.after_read = [state(recipient_hash="h", version=2, timezone="UTC")]
    await p.publish(state(recipient_hash="h", version=1))
    assert versions(producer) == [1, 1, 2]


async def test_unchanged_suppression_is_published_again() -> None:
    p, _, producer = prefs()
    first = await p.suppress("acme", "h", "token_deactivated", NOW)
    again = await p.suppress("acme", "h", "token_deactivated", NOW)
    assert first == again
    assert versions(producer) == [1, 1]
    cleared = await p.unsuppress("acme", "h", NOW)
    assert cleared is not None and (cleared.suppressed, cleared.version) == (None, 2)
    assert await p.unsuppress("acme", "other", NOW) is None
    assert versions(producer) == [1, 1, 2]
