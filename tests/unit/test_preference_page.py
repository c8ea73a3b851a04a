"""The hosted preference page's parts: its signed links (read back by PyJWT), which opt-outs
a saved form leaves, and the page itself in the user's language."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import jwt
import pytest

from notiflow.correlation import CorrelationKeys
from notiflow.gateway import page_text
from notiflow.gateway.preference_page import (
    mutes_after,
    opt_outs_after,
    page,
    page_topics,
    shown_pairs,
)
from notiflow.preference_links import AUDIENCE, InvalidLink, PreferenceLinks, page_url
from notiflow.schemas.enums import Category, Channel
from notiflow.schemas.preferences import OptOut, PreferenceState

NOW = datetime(2026, 12, 7, 0, 0, tzinfo=UTC)
MONTH = timedelta(days=30)
OLD, NEW = b"o" * 32, b"n" * 32


def links(*raw: bytes) -> PreferenceLinks:
    return PreferenceLinks.of(CorrelationKeys(raw))


def test_a_link_names_tenant_and_user_until_it_expires() -> None:
    token, grant = links(OLD).issue("acme", "user-42", NOW, MONTH)
    assert grant.expires_at == NOW + MONTH
    assert links(NEW, OLD).verify(token, NOW + MONTH - timedelta(seconds=1)) == grant
    claims = jwt.decode(token, links(OLD).keys[0], algorithms=["HS256"], audience=AUDIENCE)
    assert (claims["tid"], claims["uid"], claims["exp"] - claims["iat"]) == (
        "acme", "user-42", int(MONTH.total_seconds()))
    for bad, at in ((token, NOW + MONTH), (token[:-2] + "AA", NOW),
                    (links(NEW).issue("acme", "user-42", NOW, MONTH)[0], NOW)):
        with pytest.raises(InvalidLink):
            links(OLD).verify(bad, at)
    unsub = jwt.encode({"aud": "notiflow-unsubscribe", "tid": "acme", "uid": "u",
                        "exp": 2**40}, links(OLD).keys[0], algorithm="HS256")
    with pytest.raises(InvalidLink):
        links(OLD).verify(unsub, NOW)
    assert page_url("https://n.example/", token) == f"https://n.example/preferences/{token}"


def test_saving_replaces_exactly_the_pairs_the_page_showed() -> None:
    shown = shown_pairs([Channel.SMS, Channel.PUSH])
    assert len(shown) == 6 and (Category.OTP, Channel.SMS) not in shown
    existing = (OptOut(category=Category.MARKETING),
                OptOut(channel=Channel.EMAIL, category=Category.ACCOUNT))
    receive = set(shown) - {(Category.MARKETING, Channel.SMS)}
    after = opt_outs_after(existing, shown, receive)
    assert [(o.channel, o.category) for o in after] == [
        (Channel.EMAIL, Category.ACCOUNT), (Channel.SMS, Category.MARKETING)]
    assert opt_outs_after(after, shown, set(shown)) == after[:1]


class Inputs(HTMLParser):
    """Each checkbox of a page: (value, checked, inside a label)."""

    def __init__(self) -> None:
        super().__init__()
        self.boxes: list[tuple[str, bool, bool]] = []
        self.lang = ""
        self._labels = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "html":
            self.lang = a.get("lang") or ""
        elif tag == "label":
            self._labels += 1
        elif tag == "input" and a.get("type") == "checkbox":
            self.boxes.append((a.get("value") or "", "checked" in a, self._labels > 0))

    def handle_endtag(self, tag: str) -> None:
        if tag == "label":
            self._labels -= 1


def test_the_page_speaks_the_users_language_and_labels_every_choice() -> None:
    state = PreferenceState(tenant_id="acme", recipient_hash="h", version=2, updated_at=NOW,
                            opt_outs=(OptOut(channel=Channel.SMS,
                                             category=Category.MARKETING),))
    html = page(page_text.page_language("fr-CA"), channels=[Channel.SMS, Channel.EMAIL],
                state=state, saved=True)
    parsed = Inputs()
    parsed.feed(html)
    assert parsed.lang == "fr"
    assert "Préférences de notification" in html and 'role="status"' in html
    assert all(inside for _, _, inside in parsed.boxes) and len(parsed.boxes) == 6
    assert {v for v, on, _ in parsed.boxes if not on} == {"marketing:SMS"}
    assert page_text.page_language("pt-BR") == "en"
    assert page_text.page_language(None) == "en"


def test_the_page_escapes_what_it_shows() -> None:
    page_text.TEXT["xx"] = {**page_text.TEXT["en"], "title": "<script>alert(1)</script>"}
    try:
        html = page("xx", channels=[Channel.SMS], state=None)
    finally:
        del page_text.TEXT["xx"]
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_the_page_shows_followed_and_muted_topics_and_saving_keeps_what_it_hid() -> None:
    state = PreferenceState(tenant_id="acme", recipient_hash="h", version=2, updated_at=NOW,
                            muted_topics=("deals", "old-news"))
    shown = page_topics(["releases", "deals"], state)
    assert shown == ["deals", "old-news", "releases"]
    html = page("en", channels=[Channel.SMS], state=state, topics=shown)
    assert 'name="hear" value="releases" checked' in html.replace("\n", " ")
    assert 'name="hear" value="deals">' in html
    assert mutes_after(state.muted_topics, shown, {"deals", "old-news"}) == ("releases",)
    assert mutes_after(("hidden",), ["a", "b"], {"a"}) == ("b", "hidden")
    assert "Topics you follow" in html
    assert 'role="alert"' in page("de", channels=[Channel.SMS], state=state, too_many=True)

