"""Localized templates: tags in their usual case, the RFC 4647 lookup from a wanted locale to
the variant that serves it, and the send flow's render stage filling each message from the
variant of its ``locale`` (memory ports)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from notiflow.flows.send.stages.render import Render
from notiflow.flows.send.stages.send_batch import Batch, attempt_key
from notiflow.gateway.errors import ApiError
from notiflow.gateway.templates import check_version
from notiflow.schemas.locales import best_variant, canonical, lookup_chain
from notiflow.schemas.messages import SendRequest, TemplateCreate
from notiflow.settings import RenderLimits
from tests.unit.memory_send import run, setup, work


@pytest.mark.parametrize(("raw", "tag"), [
    ("fr", "fr"), ("FR-ca", "fr-CA"), ("zh-hant-tw", "zh-Hant-TW"), ("es-419", "es-419"),
    ("SR-LATN", "sr-Latn"),
])
def test_a_tag_takes_its_usual_case(raw: str, tag: str) -> None:
    assert canonical(raw) == tag


@pytest.mark.parametrize("raw", ["", "f", "french", "fr_CA", "fr-", "fr-CA-x", "12", "fr-C"])
def test_anything_else_than_language_script_region_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="BCP 47"):
        canonical(raw)


TAGS = st.builds(lambda lang, script, region: "-".join(
    p for p in (lang, script, region) if p),
    st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=2, max_size=3),
    st.one_of(st.none(), st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
                                 min_size=4, max_size=4)),
    st.one_of(st.none(), st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
                                 min_size=2, max_size=2), st.from_regex(r"\A[0-9]{3}\Z")))


@given(TAGS)
def test_canonical_is_stable_and_the_chain_ends_at_the_language(raw: str) -> None:
    tag = canonical(raw)
    assert canonical(tag) == tag and tag.lower() == raw.lower()
    chain = lookup_chain(tag)
    assert chain[0] == tag and chain[-1] == tag.split("-")[0]
    assert all(a.startswith(b + "-") for a, b in itertools.pairwise(chain))


@given(TAGS, st.sets(TAGS.map(canonical), max_size=5))
def test_the_variant_chosen_is_the_most_specific_one_available(
        raw: str, available: set[str]) -> None:
    wanted = canonical(raw)
    got = best_variant(available, wanted)
    served = [t for t in lookup_chain(wanted) if t in available]
    assert got == (served[0] if served else None)


def test_the_fallback_chain_of_a_french_canadian() -> None:
    assert best_variant({"fr", "fr-CA"}, "fr-CA") == "fr-CA"
    assert best_variant({"fr"}, "fr-CA") == "fr"
    assert best_variant({"de"}, "fr-CA") is None
    assert best_variant({"fr"}, None) is None
    assert best_variant({"zh-Hant", "zh"}, "zh-Hant-TW") == "zh-Hant"


def test_requests_and_templates_keep_tags_canonical() -> None:
    req = SendRequest.model_validate({
        "channel": "SMS", "tier": "P1", "recipient": "+14155552671", "template_id": "otp",
        "template_version": 1, "locale": "fr-ca"})
    assert req.locale == "fr-CA"
    tc = TemplateCreate.model_validate({"template_id": "otp", "channel": "SMS", "body": "x",
                                        "locales": {"FR": {"body": "y"}}})
    assert list(tc.locales) == ["fr"]
    with pytest.raises(ValidationError):
        SendRequest.model_validate({**req.model_dump(mode="json"), "locale": "français"})
    with pytest.raises(ValidationError, match="each locale is listed once"):
        TemplateCreate.model_validate({"template_id": "otp", "channel": "SMS", "body": "x",
                                       "locales": {"fr": {"body": "y"}, "FR": {"body": "z"}}})


def test_each_message_is_rendered_from_the_variant_of_its_locale() -> None:
    s = setup()
    s.state.put_template("acme", "otp", "SMS", "Your code is {{ code }}", locales={
        "fr": (None, "Votre code : {{ code }}"), "fr-CA": (None, "Ton code : {{ code }}")})
    works = [work(s, 1, locale="fr-CA"), work(s, 2, locale="fr-BE"), work(s, 3),
             work(s, 4, locale="de"), work(s, 5, locale="FR")]
    batch = Batch(list(works), s.clock())
    run(Render()(batch, s.ctx))
    assert [batch.rendered[attempt_key(w)].body for w in works] == [
        "Ton code : 1", "Votre code : 2", "Your code is 3", "Your code is 4", "Votre code : 5"]


def test_a_variant_must_use_the_default_contents_variables_and_subject() -> None:
    def version(**locales: dict[str, str]) -> TemplateCreate:
        return TemplateCreate.model_validate({
            "template_id": "welcome", "channel": "EMAIL", "subject": "Hi {{ name }}",
            "body": "Code {{ code }}", "locales": locales})

    info, variants = check_version(version(fr={"subject": "Salut {{ name }}",
                                                "body": "Code {{ code }}"}), RenderLimits())
    assert set(info.variables) == {"code", "name"} and list(variants) == ["fr"]
    refusals = [
        (version(fr={"subject": "Salut", "body": "Code {{ code }} {{ extra }}"}),
         "locale_variables_differ", "locales.fr"),
        (version(de={"body": "Code {{ code }} {{ name }}"}), "locale_subject_differs",
         "locales.de.subject"),
        (version(es={"subject": "Hola {{ name }}", "body": "{% if %}"}),
         "template_syntax_error", "locales.es.body"),
    ]
    for tc, reason, field in refusals:
        with pytest.raises(ApiError) as caught:
            check_version(tc, RenderLimits())
        body = caught.value.body()
        assert (caught.value.status, body["reason"], body["field"]) == (422, reason, field)
