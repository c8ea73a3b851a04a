"""The keyring of reloaded credentials: what a reload applies, and which retired tokens and
webhook secrets stay valid for how long (a model-based property test under a driven
clock)."""

from __future__ import annotations

import json
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from notiflow.secrets import Keyring, Reload, differing
from notiflow.settings import Settings, TenantConfig
from tests.fakes import ManualClock

WINDOW = 60.0


def tok(name: str) -> str:
    """A bearer token of the minimum length, told apart by ``name``."""
    return name.ljust(32, "-")


def configured(token: str = "t1", twilio: str = "tw1", **extra: object) -> Settings:
    tenants = [TenantConfig(id="acme", token=tok(token), rate_limit=10.0),
               TenantConfig(id="globex", token=tok("g1"))]
    return Settings(tenants=tuple(tenants), twilio={"auth_token": twilio},
                    secrets_rotation_window=timedelta(seconds=WINDOW), **extra)


def test_a_reload_applies_tenants_and_provider_accounts_and_reports_the_rest() -> None:
    ring = Keyring(configured())
    fresh = configured("t2", "tw2", kafka_bootstrap="elsewhere:9092", dlq_key="k" * 44)
    change = ring.reload(fresh)
    assert change == Reload(("tenants", "twilio"), ("dlq_key", "kafka_bootstrap"))
    assert ring.settings.twilio.auth_token is not None
    assert ring.settings.twilio.auth_token.get_secret_value() == "tw2"
    assert ring.settings.kafka_bootstrap == Settings().kafka_bootstrap
    assert ring.settings.dlq_key is None
    assert ring.reload(fresh) == Reload((), ("dlq_key", "kafka_bootstrap"))


def test_an_unchanged_reload_retires_nothing() -> None:
    ring = Keyring(configured())
    assert ring.reload(configured()) == Reload()
    assert ring.in_force() == [ring.settings]
    assert differing(configured(), configured()) == []


def test_a_retired_token_is_the_tenant_as_configured_now_until_the_window_ends() -> None:
    clock = ManualClock(1000.0)
    ring = Keyring(configured(), clock=clock)
    fresh = configured("t2")
    tenants = [t.model_copy(update={"rate_limit": 99.0}) if t.id == "acme" else t
               for t in fresh.tenants]
    ring.reload(fresh.model_copy(update={"tenants": tuple(tenants)}))
    for token in ("t1", "t2"):
        found = ring.tenant_by_token(tok(token))
        assert found is not None and (found.id, found.rate_limit) == ("acme", 99.0)
    clock.now += WINDOW - 0.001
    assert ring.tenant_by_token(tok("t1")) is not None
    clock.now += 0.002
    assert ring.tenant_by_token(tok("t1")) is None
    assert ring.tenant_by_token(tok("t2")) is not None
    assert ring.tenant_by_token(tok("g1")) is not None


def test_a_tenant_removed_by_a_reload_loses_its_retired_token_at_once() -> None:
    ring = Keyring(configured())
    ring.reload(configured().model_copy(update={"tenants": (
        TenantConfig(id="globex", token=tok("g1")),)}))
    assert ring.tenant_by_token(tok("t1")) is None


def test_sections_are_current_first_then_retired_each_once() -> None:
    clock = ManualClock(1000.0)
    ring = Keyring(configured(twilio="a"), clock=clock)
    ring.reload(configured(twilio="b"))
    clock.now += 1
    ring.reload(configured(twilio="c"))
    ring.reload(configured("t9", twilio="c"))
    tokens = [s.auth_token.get_secret_value() for s in ring.sections("twilio")]
    assert tokens == ["c", "b", "a"]
    clock.now += WINDOW - 0.5
    assert [s.auth_token.get_secret_value() for s in ring.sections("twilio")] == ["c", "b"]


def test_the_window_in_force_at_a_reload_is_the_one_that_counts() -> None:
    clock = ManualClock(1000.0)
    ring = Keyring(configured(), clock=clock)
    longer = configured("t2").model_copy(update={
        "secrets_rotation_window": timedelta(seconds=10 * WINDOW)})
    ring.reload(longer)
    clock.now += WINDOW + 1
    assert ring.tenant_by_token(tok("t1")) is None


Op = tuple[str, int]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["rotate", "wait"]), st.integers(0, 90)),
                max_size=25))
def test_tokens_accepted_match_a_model_of_rotations(ops: list[Op]) -> None:
    """Model: a token is accepted when it is acme's current one, or was replaced less than
    the window ago."""
    clock = ManualClock(1000.0)
    ring = Keyring(configured("tok0"), clock=clock)
    current, retired_at = "tok0", {}
    issued = ["tok0"]
    for n, (op, amount) in enumerate(ops, start=1):
        if op == "rotate":
            token = f"tok{n}"
            retired_at[current] = clock.now
            current = token
            issued.append(token)
            ring.reload(configured(token))
        else:
            clock.now += amount
        for token in issued:
            expected = token == current or (
                token in retired_at and clock.now < retired_at[token] + WINDOW)
            found = ring.tenant_by_token(tok(token))
            assert (found is not None) == expected, (token, json.dumps(ops))
            assert found is None or found.id == "acme"
