"""The in-app inbox's rules without I/O: the monotonic item states (hypothesis), user tokens
(minted and tampered with PyJWT), cursors, event-stream framing, the hub's fan-out and its
slow-client rule, and the INAPP recipient's validation."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import jwt
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from notiflow.adapters.inbox_store import Cursor, InboxItem, channel_key
from notiflow.inbox.hub import Connection, Hub
from notiflow.inbox.server import sse
from notiflow.inbox.states import COLUMNS, ORDER, InboxState, marks, state_of
from notiflow.inbox.tokens import TokenRefused, mint, verify
from notiflow.redact import mask
from notiflow.schemas.messages import SendRequest
from notiflow.settings import Settings, TenantConfig
from tests.helpers import wait_until

T0 = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
KEY = "k" * 43


@given(st.lists(st.sampled_from(list(InboxState)[1:]), max_size=8))
def test_marks_only_ever_move_an_item_forward(targets: list[InboxState]) -> None:
    times: dict[str, datetime | None] = {}
    furthest = InboxState.NEW
    for i, target in enumerate(targets):
        before = dict(times)
        times.update(marks(target, times, T0 + timedelta(seconds=i)))
        furthest = max(furthest, target, key=ORDER.index)
        assert state_of(times) is furthest
        assert all(times[c] == v for c, v in before.items() if v is not None)
        for state in ORDER[1:ORDER.index(furthest) + 1]:
            assert times.get(COLUMNS[state]) is not None


def test_reading_also_sees_and_going_back_changes_nothing() -> None:
    assert marks(InboxState.READ, {}, T0) == {"seen_at": T0, "read_at": T0}
    read = {"seen_at": T0, "read_at": T0}
    assert marks(InboxState.SEEN, read, T0 + timedelta(1)) == {}
    assert marks(InboxState.ARCHIVED, read, T0) == {"archived_at": T0}


def settings(**tenant: object) -> Settings:
    return Settings(tenants=(TenantConfig(id="acme", inbox_keys=(KEY,), **tenant),
                             TenantConfig(id="globex")))


def test_a_token_signed_with_the_tenants_key_names_its_user() -> None:
    s = settings()
    user = verify(mint(KEY, "acme", "u-1"), s)
    assert (user.tenant_id, user.user_id) == ("acme", "u-1")
    rotated = Settings(tenants=(TenantConfig(id="acme", inbox_keys=("new" * 15, KEY)),))
    assert verify(mint(KEY, "acme", "u-1"), rotated).user_id == "u-1"


@pytest.mark.parametrize(("token", "reason"), [
    ("not a jwt", "malformed_token"),
    (mint("x" * 43, "acme", "u"), "invalid_signature"),
    (mint(KEY, "globex", "u"), "unknown_issuer"),
    (mint(KEY, "nobody", "u"), "unknown_issuer"),
    (mint(KEY, "acme", "u", audience="else"), "invalid_claims"),
    (mint(KEY, "acme", "u", ttl=timedelta(seconds=-60)), "expired_token"),
    (mint(KEY, "acme", "u", ttl=timedelta(days=2)), "lifetime_too_long"),
    (mint(KEY, "acme", "bad user/"), "invalid_claims"),
    (jwt.encode({"iss": "acme", "sub": "u", "aud": "notiflow-inbox", "iat": 1,
                 "exp": 4102444800}, KEY * 2, algorithm="HS512"), "wrong_algorithm"),
    (jwt.encode({"iss": "acme", "sub": "u", "aud": "notiflow-inbox"}, KEY,
                algorithm="HS256"), "invalid_claims"),
])
def test_tokens_that_open_nothing(token: str, reason: str) -> None:
    with pytest.raises(TokenRefused) as refused:
        verify(token, settings())
    assert refused.value.reason == reason


def test_a_token_signed_for_another_tenant_with_the_same_key_opens_nothing_of_acme() -> None:
    s = Settings(tenants=(TenantConfig(id="acme", inbox_keys=(KEY,)),
                          TenantConfig(id="globex", inbox_keys=("g" * 43,))))
    forged = jwt.encode({**jwt.decode(mint("g" * 43, "globex", "u"),
                                      options={"verify_signature": False}), "iss": "acme"},
                        "g" * 43, algorithm="HS256")
    with pytest.raises(TokenRefused, match="invalid_signature"):
        verify(forged, s)


def test_cursors_round_trip_and_refuse_junk() -> None:
    c = Cursor(datetime(2026, 12, 6, 9, 0, 0, 123000, tzinfo=UTC), "msg_1")
    assert Cursor.parse(c.text()) == c
    for junk in ("", "x", "12", "12.", "-1.msg", "1." + "m" * 65):
        with pytest.raises(ValueError):
            Cursor.parse(junk)


def item(**kw: object) -> InboxItem:
    base: dict[str, object] = dict(tenant_id="acme", user_id="u", message_id="msg_1",
                                   created_at=T0, tier="P0", category="security", attempt=1,
                                   subject="Alert", body="hello")
    return InboxItem(**{**base, **kw})  # type: ignore[arg-type]


def test_an_item_event_on_the_stream_carries_its_cursor_as_id() -> None:
    frame = orjson.dumps({"type": "item", "item": item().view()})
    text = sse(frame).decode()
    assert text.startswith(f"id: {item().cursor.text()}\nevent: item\ndata: ")
    assert text.endswith("\n\n") and text.count("\n") == 4
    assert sse(b'{"type":"state","id":"m","state":"read"}').startswith(b"event: state\n")


async def test_the_hub_fans_out_and_closes_a_client_that_falls_behind() -> None:
    hub = Hub(max_per_user=2)
    written: list[bytes] = []

    async def write(frame: bytes) -> None:
        written.append(frame)

    fast = Connection("c1", 4, write)
    slow = Connection("c1", 2, write)
    other = Connection("c2", 4, write)
    for c in (fast, slow, other):
        hub.join(c)
    pump = asyncio.create_task(fast.pump())
    assert hub.dispatch("c1", b"1") == 2
    assert hub.dispatch("c1", b"2") == 2
    assert hub.dispatch("c1", b"3") == 2
    assert slow.closed.is_set() and slow.overflowed and not fast.closed.is_set()
    await wait_until(lambda: len(written) >= 3, timeout=1.0, what="three frames pumped")
    assert written == [b"1", b"2", b"3"]
    assert hub.dispatch("nobody", b"x") == 0
    third = Connection("c1", 4, write)
    hub.join(third)
    hub.join(Connection("c1", 4, write))
    assert fast.closed.is_set()
    fast.close()
    await pump
    for c in [*hub.by_channel["c1"], other]:
        hub.leave(c)
    assert hub.connections == 0


def test_inapp_recipients() -> None:
    def req(recipient: object) -> SendRequest:
        return SendRequest.model_validate({"channel": "INAPP", "tier": "P0",
                                           "recipient": recipient, "template_id": "t",
                                           "template_version": 1})

    assert req("inapp:user-42").recipient == "inapp:user-42"
    for bad in ("user-42", "inapp:", "inapp:a b", "inapp:" + "x" * 129, "+14155550123",
                {"device_token": "a" * 64, "platform": "ios"}):
        with pytest.raises(ValidationError):
            req(bad)
    assert mask("inapp:user-4242") == "inapp:user…42"
    assert channel_key("t.", "acme", "u-1") != channel_key("t.", "acme", "u-2")
    assert "u-1" not in channel_key("t.", "acme", "u-1")
