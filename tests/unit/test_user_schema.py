"""The user profile's rules: addresses validated and listed once, locales and zones checked,
properties bounded; a merge patch replaces, clears and merges as RFC 7396 says; the state
published to ``notify.users`` carries hashes, never an address."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from notiflow.adapters.user_directory import user_state
from notiflow.schemas.enums import Channel
from notiflow.schemas.users import (
    MAX_PROPERTIES_BYTES,
    UserPatch,
    UserProfile,
    UserView,
    next_version,
)

IOS = "a1" * 32
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def ana(**over: object) -> UserProfile:
    return UserProfile.model_validate({
        "phones": ["+33612345678"], "emails": ["Ana@Example.COM"],
        "devices": [{"platform": "ios", "token": IOS}], "locale": "fr-fr",
        "timezone": "Europe/Paris", "properties": {"first_name": "Ana", "visits": 3}, **over})


def test_addresses_are_normalised_and_listed_by_channel() -> None:
    p = ana(chat_webhooks=["https://hooks.slack.com/services/T0/B0/xyz"])
    assert p.emails == ("ana@example.com",)
    assert p.locale == "fr-FR"
    assert p.addresses() == {
        Channel.SMS: ("+33612345678",), Channel.EMAIL: ("ana@example.com",),
        Channel.PUSH: (f"ios:{IOS}",),
        Channel.CHAT: ("https://hooks.slack.com/services/T0/B0/xyz",)}
    assert UserProfile().addresses() == {}


@pytest.mark.parametrize(("tag", "normal"), [
    ("fr", "fr"), ("FR-ca", "fr-CA"), ("zh-hant-tw", "zh-Hant-TW"), ("es-419", "es-419"),
    ("gsw", "gsw")])
def test_locales_take_their_usual_case(tag: str, normal: str) -> None:
    assert UserProfile(locale=tag).locale == normal


@pytest.mark.parametrize("field, value", [
    ("locale", "french"), ("locale", "fr_CA"), ("locale", "f"), ("timezone", "Mars/Olympus"),
    ("phones", ["0612345678"]), ("emails", ["not-an-address"]),
    ("phones", ["+33612345678", "+33612345678"]), ("emails", ["a@b.org", "A@b.org"]),
    ("devices", [{"platform": "ios", "token": "zz" * 32}]),
    ("devices", [{"platform": "ios", "token": IOS}, {"platform": "ios", "token": IOS}]),
    ("chat_webhooks", ["ftp://hooks.example.com/x"]),
    ("properties", {"bad name": 1}), ("properties", {"nested": {"a": 1}}),
    ("properties", {"blob": "x" * MAX_PROPERTIES_BYTES}),
    ("phones", [f"+3361234{i:04d}" for i in range(9)]),
    ("unknown_field", 1)])
def test_a_profile_breaking_a_rule_is_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        UserProfile.model_validate({field: value})


def test_a_patch_replaces_clears_and_merges() -> None:
    before = ana()
    after = UserPatch.model_validate({
        "emails": ["new@example.com"], "locale": None,
        "properties": {"visits": None, "plan": "pro"}}).applied_to(before)
    assert after.emails == ("new@example.com",)
    assert after.locale is None
    assert after.properties == {"first_name": "Ana", "plan": "pro"}
    assert (after.phones, after.devices, after.timezone) == (
        before.phones, before.devices, before.timezone)
    assert UserPatch.model_validate({"devices": None}).applied_to(before).devices == ()
    assert UserPatch.model_validate({"in_app": None}).applied_to(
        ana(in_app=False)).in_app is True
    assert UserPatch().applied_to(before) == before


def test_a_patch_whose_result_breaks_a_rule_is_refused() -> None:
    full = ana(properties={f"p{i}": i for i in range(64)})
    with pytest.raises(ValidationError):
        UserPatch.model_validate({"properties": {"one_more": 1}}).applied_to(full)


@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True),
                       st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=5)),
                       max_size=8),
       st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True),
                       st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=5)),
                       max_size=8))
def test_properties_merge_like_rfc_7396(stored: dict[str, object],
                                        patch: dict[str, object]) -> None:
    before = UserProfile.model_validate({"properties": stored})
    after = UserPatch.model_validate({"properties": patch}).applied_to(before)
    expected = {k: v for k, v in {**stored, **patch}.items()
                if not (k in patch and patch[k] is None)}
    assert after.properties == expected


def test_versions_start_at_one_and_keep_the_creation_time() -> None:
    first = next_version(None, ana(), "u-1", NOW)
    assert (first.version, first.created_at, first.updated_at) == (1, NOW, NOW)
    later = NOW.replace(hour=13)
    second = next_version(first, ana(locale="de"), "u-1", later)
    assert (second.version, second.created_at, second.updated_at) == (2, NOW, later)
    assert next_version(second, ana(), "u-1", NOW).updated_at == later
    assert second.profile() == ana(locale="de")
    assert isinstance(second, UserView)


def test_the_published_state_holds_hashes_never_addresses() -> None:
    user = next_version(None, ana(), "u-1", NOW)
    state = user_state("acme", user, hashing=lambda t, k: f"h({t},{k[-4:]})")
    text = state.model_dump_json()
    for address in ("+33612345678", "ana@example.com", IOS):
        assert address not in text
    assert state.channels[Channel.SMS] == ("h(acme,5678)",)
    assert state.channels[Channel.PUSH] == (f"h(acme,{IOS[-4:]})",)
    assert (state.key, state.locale, state.timezone, state.version) == (
        "acme:u-1", "fr-FR", "Europe/Paris", 1)
