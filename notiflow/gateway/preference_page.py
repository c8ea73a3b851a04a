"""The hosted preference page: ``GET``/``POST /preferences/{token}``, a server-rendered form
in the user's language that works without JavaScript, and its JSON twin ``GET``/``PUT
/preferences/{token}/data`` for tenants that draw their own.

The link's token (``notiflow/preference_links.py``) is the only credential. The page shows
one checkbox per category a user may opt out of and channel the user has an address on
(checked: they receive it), and one per topic the user follows or muted (checked: they hear
from it); saving replaces exactly those pairs and topics of the user's own preferences
(``gateway/user_preferences.py``) and answers ``303`` to the page, which then says it
saved. An unknown, forged or expired link, or one whose user was erased, is a
``404`` page. See ``docs/users.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Annotated, Any, Final
from urllib.parse import parse_qsl

import jinja2
from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import ValidationError

from notiflow.correlation import CorrelationKeyMissing, CorrelationKeys
from notiflow.gateway import page_text
from notiflow.gateway.auth import RuntimeDep, read_model
from notiflow.gateway.bodies import read_limited
from notiflow.gateway.errors import not_found, unavailable
from notiflow.gateway.openapi import errors, json_body
from notiflow.gateway.runtime import Runtime
from notiflow.gateway.user_preferences import set_user_preferences, user_preferences
from notiflow.preference_links import InvalidLink, PageGrant, PreferenceLinks
from notiflow.schemas.enums import Category, Channel
from notiflow.schemas.formats import TOPIC_PATTERN
from notiflow.schemas.preferences import (
    REQUIRED_CATEGORIES,
    OptOut,
    OptOutChoice,
    PreferenceState,
    UserPreferencesUpdate,
    as_choices,
)
from notiflow.schemas.users import UserView
from notiflow.user_choice import candidates

router = APIRouter()

MAX_FORM: Final = 16 * 1024
HTML: Final = "text/html; charset=utf-8"
TOPIC: Final = re.compile(TOPIC_PATTERN)
CHOOSABLE: Final = tuple(c for c in Category if c not in REQUIRED_CATEGORIES)
Pair = tuple[Category, Channel]
Token = Annotated[str, Path(description="The link's token (a signed JWT).",
                            json_schema_extra={"pattern": r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+"
                                                          r"\.[A-Za-z0-9_-]+$",
                                               "maxLength": 2048})]
HEADERS: Final = {
    "Cache-Control": "no-store", "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"}
_PAGE: Final = jinja2.Environment(autoescape=True).from_string("""<!doctype html>
<html lang="{{ lang }}"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ t.title }}</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:36rem;margin:2rem auto;padding:0 1rem}
fieldset{margin:0 0 1rem;border:1px solid #888;border-radius:4px}
label{display:block;padding:.25rem 0}button{font-size:1rem;padding:.5rem 1.5rem}
.saved{background:#e6f4ea;border:1px solid #2e7d32;padding:.5rem 1rem}</style></head>
<body><main><h1>{{ t.title }}</h1>
{% if saved %}<p class="saved" role="status">{{ t.saved }}</p>{% endif %}
{% if too_many %}<p role="alert">{{ t.too_many }}</p>{% endif %}
{% if gone %}<p>{{ t.gone }}</p>{% elif not channels %}<p>{{ t.no_channels }}</p>{% else %}
<p>{{ t.intro }}</p>
<form method="post">
{% for category, label, choices in sections %}<fieldset><legend>{{ label }}</legend>
{% for value, channel_label, on in choices %}<label><input type="checkbox" name="receive"
 value="{{ value }}"{% if on %} checked{% endif %}> {{ channel_label }}</label>
{% endfor %}</fieldset>
{% endfor %}{% if topics %}<fieldset><legend>{{ t.topics }}</legend>
{% for topic, on in topics %}<input type="hidden" name="shown_topic" value="{{ topic }}">
<label><input type="checkbox" name="hear" value="{{ topic }}"{% if on %} checked{% endif %}>
 {{ topic }}</label>
{% endfor %}</fieldset>{% endif %}<p>{{ t.required }}</p>
<button type="submit">{{ t.save }}</button></form>{% endif %}
</main></body></html>
""")


def shown_pairs(channels: Iterable[Channel]) -> list[Pair]:
    """The (category, channel) choices of the page, categories first."""
    chans = list(channels)
    return [(category, channel) for category in CHOOSABLE for channel in chans]


def opt_outs_after(existing: Iterable[OptOut], shown: list[Pair],
                   receive: set[Pair]) -> tuple[OptOutChoice, ...]:
    """The opt-outs once the page was saved: each shown pair not ticked, and each stored
    opt-out that covers no shown pair (a channel the user has no address on yet)."""
    kept = [o for o in existing if not any(o.matches(ch, cat) for cat, ch in shown)]
    return (*as_choices(kept),
            *(OptOutChoice(channel=ch, category=cat) for cat, ch in shown
              if (cat, ch) not in receive))


def mutes_after(stored: Iterable[str], shown: Iterable[str], hear: set[str]
                ) -> tuple[str, ...]:
    """The muted topics once the page was saved: each shown topic not ticked, and each
    stored mute the page did not show (a topic the user no longer follows)."""
    shown_set = set(shown)
    return tuple(sorted({t for t in stored if t not in shown_set}
                        | {t for t in shown_set if t not in hear}))


def page_topics(followed: Iterable[str], state: PreferenceState | None) -> list[str]:
    """The topics the page shows: those the user follows and those they muted."""
    muted = state.muted_topics if state is not None else ()
    return sorted({*followed, *muted})


def page(lang: str, *, channels: list[Channel], state: PreferenceState | None,
         saved: bool = False, gone: bool = False, topics: Iterable[str] = (),
         too_many: bool = False) -> str:
    t = page_text.words(lang)
    opt_outs = state.opt_outs if state is not None else ()
    muted = set(state.muted_topics) if state is not None else set()
    sections = [(category, page_text.category_label(lang, category), [
        (f"{category.value}:{channel.value}", page_text.channel_label(lang, channel),
         not any(o.matches(channel, category) for o in opt_outs))
        for channel in channels]) for category in CHOOSABLE]
    return _PAGE.render(lang=lang, t=t, sections=sections, channels=channels, saved=saved,
                        gone=gone, topics=[(x, x not in muted) for x in topics],
                        too_many=too_many)


def _html(body: str, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type=HTML, headers=HEADERS)


def _gone() -> Response:
    return _html(page(page_text.DEFAULT, channels=[], state=None, gone=True), 404)


def _grant(rt: Runtime, token: str) -> PageGrant | None:
    try:
        links = PreferenceLinks.of(CorrelationKeys.from_settings(rt.settings))
    except CorrelationKeyMissing:
        raise unavailable("preferences_unavailable", "preference links need "
                          "NOTIFLOW_CORRELATION_KEY or NOTIFLOW_DLQ_KEY") from None
    try:
        return links.verify(token, datetime.now(UTC))
    except InvalidLink:
        return None


async def _user(rt: Runtime, token: str) -> tuple[PageGrant, UserView] | None:
    grant = _grant(rt, token)
    if grant is None:
        return None
    user = await rt.users().get(grant.tenant_id, grant.user_id)
    return None if user is None else (grant, user)


def user_channels(user: UserView) -> list[Channel]:
    """The channels the user has an address on, in the platform's order."""
    have = candidates(user.addresses(), user.user_id, user.in_app)
    return [c for c in Channel if c in have]


_HTML_BODY: Final = {"text/html": {"schema": {"type": "string"}}}
PAGE_ANSWERS: Final[dict[int | str, dict[str, Any]]] = {
    200: {"description": "The page.", "content": _HTML_BODY},
    404: {"description": "An unknown or expired link.", "content": _HTML_BODY}}


@router.get("/preferences/{token}", response_class=Response, responses=PAGE_ANSWERS)
async def preference_page(token: Token, request: Request, rt: RuntimeDep) -> Response:
    """The user's preferences as a form in their language (``?saved=true`` after a
    save)."""
    saved = request.query_params.get("saved") == "true"
    found = await _user(rt, token)
    if found is None:
        return _gone()
    grant, user = found
    state = await user_preferences(rt, grant.tenant_id, grant.user_id)
    followed = await rt.store().topics.topics_of(grant.tenant_id, grant.user_id)
    return _html(page(page_text.page_language(user.locale), channels=user_channels(user),
                      state=state, saved=saved, topics=page_topics(followed, state)))


@router.post("/preferences/{token}", response_class=Response, status_code=303,
             responses={303: {"description": "Saved: back to the page."}, 404:
                        PAGE_ANSWERS[404], 422: {"description": "Too many muted topics: "
                                                 "nothing saved.", "content": _HTML_BODY},
                        **errors(413, 503)})
async def save_preference_page(token: Token, request: Request, rt: RuntimeDep) -> Response:
    """Save the form: every shown choice not ticked becomes an opt-out."""
    form = parse_qsl((await read_limited(request, MAX_FORM)).decode(errors="replace"))
    found = await _user(rt, token)
    if found is None:
        return _gone()
    grant, user = found
    shown = shown_pairs(user_channels(user))
    ticked = {value for name, value in form if name == "receive"}
    receive = {(cat, ch) for cat, ch in shown if f"{cat.value}:{ch.value}" in ticked}
    state = await user_preferences(rt, grant.tenant_id, grant.user_id)
    opt_outs = opt_outs_after(state.opt_outs if state else (), shown, receive)
    shown_topics = [v for name, v in form if name == "shown_topic" and TOPIC.fullmatch(v)]
    hear = {v for name, v in form if name == "hear"}
    mutes = mutes_after(state.muted_topics if state else (), shown_topics, hear)
    try:
        update = UserPreferencesUpdate(opt_outs=opt_outs, muted_topics=mutes)
    except ValidationError:
        return _html(page(page_text.page_language(user.locale), channels=user_channels(user),
                          state=state, topics=page_topics(shown_topics, state),
                          too_many=True), 422)
    await set_user_preferences(rt, grant.tenant_id, grant.user_id, update)
    return RedirectResponse(f"/preferences/{token}?saved=true", status_code=303,
                            headers=HEADERS)


class PageData(UserPreferencesUpdate):
    """Body of ``GET``/``PUT /preferences/{token}/data``: the user's opt-outs and muted
    topics, the channels
    they have an address on and the categories they may choose (and those they may not)."""

    version: int
    channels: tuple[Channel, ...]
    categories: tuple[Category, ...] = CHOOSABLE
    required: tuple[Category, ...] = tuple(sorted(REQUIRED_CATEGORIES))


def _data(user: UserView, state: PreferenceState | None) -> Response:
    data = PageData(opt_outs=as_choices(state.opt_outs if state else ()),
                    muted_topics=state.muted_topics if state else (),
                    version=state.version if state else 0, channels=tuple(user_channels(user)))
    return Response(data.model_dump_json(), media_type="application/json", headers=HEADERS)


@router.get("/preferences/{token}/data", response_model=PageData, responses=errors(404, 503))
async def preference_data(token: Token, rt: RuntimeDep) -> Response:
    """The page's data as JSON."""
    found = await _user(rt, token)
    if found is None:
        raise not_found()
    grant, user = found
    return _data(user, await user_preferences(rt, grant.tenant_id, grant.user_id))


@router.put("/preferences/{token}/data", response_model=PageData,
            responses=errors(400, 404, 413, 422, 503),
            openapi_extra=json_body(UserPreferencesUpdate,
                                    "Replaces the user's opt-outs and muted topics.",
                                    {"no-news": {"opt_outs": [{"category": "marketing"}]}}))
async def save_preference_data(token: Token, request: Request, rt: RuntimeDep) -> Response:
    """Replace the user's opt-outs and muted topics from JSON; answers the page's data."""
    found = await _user(rt, token)
    if found is None:
        raise not_found()
    grant, user = found
    update = await read_model(request, UserPreferencesUpdate)
    state = await set_user_preferences(rt, grant.tenant_id, grant.user_id, update)
    return _data(user, state)
