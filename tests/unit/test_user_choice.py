"""The choice of a user's channels and addresses (``notiflow/user_choice.py``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from notiflow.schemas.enums import Channel
from notiflow.schemas.user_sends import Decision, SkipReason
from notiflow.user_choice import candidates, choose

PHONE, EMAIL_1, EMAIL_2 = "+33612345678", "ana@example.com", "ana@work.example"
IOS, ANDROID = "ios:" + "a" * 64, "android:" + "b" * 40
ADDRESSES = candidates({Channel.SMS: (PHONE,), Channel.EMAIL: (EMAIL_1, EMAIL_2),
                        Channel.PUSH: (IOS, ANDROID)}, "42", in_app=True)


def blocking(blocked: dict[str, SkipReason]) -> object:
    def block(channel: Channel, key: str) -> tuple[SkipReason | None, int]:
        return blocked.get(key), 3
    return block


def test_first_takes_the_first_channel_with_an_address_and_every_device() -> None:
    d = choose([Channel.PUSH, Channel.SMS], ADDRESSES, blocking({}), "first")
    assert [(p.channel, p.index) for p in d.picks] == [(Channel.PUSH, 0), (Channel.PUSH, 1)]
    assert [(s.channel, s.reason) for s in d.skipped] == [(Channel.SMS, "not_needed")]
    assert {p.preferences_version for p in d.picks} == {3}


def test_an_opted_out_channel_falls_through_to_the_next() -> None:
    d = choose([Channel.PUSH, Channel.SMS, Channel.EMAIL], ADDRESSES,
               blocking({IOS: "opted_out", ANDROID: "token_deactivated"}), "first")
    assert [(p.channel, p.index) for p in d.picks] == [(Channel.SMS, 0)]
    assert [(s.channel, s.index, s.reason) for s in d.skipped] == [
        (Channel.PUSH, 0, "opted_out"), (Channel.PUSH, 1, "token_deactivated"),
        (Channel.EMAIL, None, "not_needed")]


def test_a_dead_address_gives_way_to_the_next_address_of_its_channel() -> None:
    d = choose([Channel.EMAIL], ADDRESSES, blocking({EMAIL_1: "hard_bounce"}), "first")
    assert [(p.channel, p.index) for p in d.picks] == [(Channel.EMAIL, 1)]
    assert [(s.index, s.reason) for s in d.skipped] == [(0, "hard_bounce")]


def test_every_sends_on_each_channel_that_may_receive_it() -> None:
    d = choose([Channel.SMS, Channel.CHAT, Channel.EMAIL, Channel.INAPP], ADDRESSES,
               blocking({PHONE: "unsubscribed"}), "every")
    assert [(p.channel, p.index) for p in d.picks] == [(Channel.EMAIL, 0), (Channel.INAPP, 0)]
    assert [(s.channel, s.reason) for s in d.skipped] == [
        (Channel.SMS, "unsubscribed"), (Channel.CHAT, "no_address")]


def test_an_inbox_the_user_does_not_read_is_skipped_as_such() -> None:
    off = candidates({Channel.SMS: (PHONE,)}, "42", in_app=False)
    d = choose([Channel.INAPP], off, blocking({}), "first", in_app=False)
    assert d == Decision(picks=(), skipped=d.skipped)
    assert [(s.channel, s.reason) for s in d.skipped] == [(Channel.INAPP, "in_app_off")]
    assert candidates({}, "42", in_app=True) == {Channel.INAPP: ("inapp:42",)}


ORDERS = st.permutations(list(Channel)).flatmap(
    lambda cs: st.integers(1, len(cs)).map(lambda n: cs[:n]))
BLOCKED = st.dictionaries(st.sampled_from([PHONE, EMAIL_1, EMAIL_2, IOS, ANDROID]),
                          st.sampled_from(["opted_out", "hard_bounce", "token_deactivated"]))


@given(ORDERS, BLOCKED, st.sampled_from(["first", "every"]))
def test_every_channel_and_address_is_accounted_for_once(
        order: list[Channel], blocked: dict[str, SkipReason], deliver: str) -> None:
    d = choose(order, ADDRESSES, blocking(blocked), deliver)  # type: ignore[arg-type]
    for p in d.picks:
        assert ADDRESSES[p.channel][p.index] not in blocked
    picked_channels = list(dict.fromkeys(p.channel for p in d.picks))
    assert picked_channels == [c for c in order if c in picked_channels]
    if deliver == "first":
        assert len(picked_channels) <= 1
    for channel in order:
        keys = ADDRESSES.get(channel, ())
        mentioned = {s.index for s in d.skipped if s.channel is channel}
        mentioned |= {p.index for p in d.picks if p.channel is channel}
        whole = any(s.index is None for s in d.skipped if s.channel is channel)
        assert whole or mentioned, channel
        if whole:
            assert mentioned == {None}
        if channel in picked_channels or whole:
            continue
        assert mentioned == set(range(len(keys))), channel
