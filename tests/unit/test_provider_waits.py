"""An account's ``Retry-After`` binds that account only: the retry goes to another account at
once when one can carry the message, and waits for the first wait to end when none can."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from notiflow.flows.send.policy import MAX_PROVIDER_WAITS, held_for, provider_waits, waiting

NOW = datetime(2026, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)


def test_a_throttled_account_is_remembered_until_its_wait_ends() -> None:
    waits = provider_waits(None, "twilio", 2 * S, NOW)
    assert waits == {"twilio": NOW + 2 * S}
    assert waiting(waits, "twilio", NOW + S) and not waiting(waits, "twilio", NOW + 2 * S)
    assert not waiting(waits, "vonage", NOW)


def test_the_alternate_is_tried_at_once() -> None:
    waits = provider_waits(None, "twilio", 2 * S, NOW)
    assert held_for(waits, ["twilio", "vonage"], NOW) is None


def test_a_lone_account_holds_the_retry_for_its_wait() -> None:
    waits = provider_waits(None, "twilio", 2 * S, NOW)
    assert held_for(waits, ["twilio"], NOW) == 2 * S


def test_every_account_waiting_holds_until_the_first_ends() -> None:
    waits = provider_waits(None, "twilio", 2 * S, NOW)
    waits = provider_waits(waits, "vonage", 5 * S, NOW + S)
    assert held_for(waits, ["twilio", "vonage"], NOW + S) == S
    assert held_for(waits, ["twilio", "vonage"], NOW + 2 * S) is None


def test_ended_waits_are_dropped_and_a_shorter_one_does_not_shorten() -> None:
    waits = provider_waits(None, "twilio", 10 * S, NOW)
    waits = provider_waits(waits, "vonage", 1 * S, NOW)
    assert provider_waits(waits, "vonage", None, NOW + 2 * S) == {"twilio": NOW + 10 * S}
    assert provider_waits(waits, "twilio", S, NOW + S / 2) == {"twilio": NOW + 10 * S,
                                                               "vonage": NOW + S}
    assert provider_waits(None, "twilio", None, NOW) is None


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]),
                          st.integers(0, 30), st.integers(0, 5)), max_size=40))
def test_waits_stay_bounded_and_never_end_early(answers: list[tuple[str, int, int]]) -> None:
    """Model: each account's wait ends at the latest ``at + retry_after`` it gave; the record
    keeps at most :data:`MAX_PROVIDER_WAITS`, the latest-ending ones."""
    waits: dict[str, datetime] | None = None
    model: dict[str, datetime] = {}
    at = NOW
    for provider, after_s, step_s in answers:
        at += step_s * S
        waits = provider_waits(waits, provider, after_s * S, at)
        if after_s:
            model[provider] = max(model.get(provider, at), at + after_s * S)
        running = {p: t for p, t in model.items() if t > at}
        kept = waits or {}
        assert len(kept) <= MAX_PROVIDER_WAITS
        for p, t in kept.items():
            assert running[p] == t
        if len(running) <= MAX_PROVIDER_WAITS:
            assert kept == running
        else:
            assert min(kept.values()) >= sorted(running.values())[-MAX_PROVIDER_WAITS]
