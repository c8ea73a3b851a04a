"""A user's own preferences: ``GET``/``PUT /v1/users/{user_id}/preferences``, which channels
and categories the user does not want, whatever address a message would take.

They are a preference state like an address's (``PreferenceStore``), stored under the
user's hash (``redact.user_hash``), so a change is in Cassandra and on
``notify.preferences`` before the ``200``. A send to the user skips a channel the user
opted out of for the message's category (the decision records the version honoured), and
the send flow reads them again from Cassandra before it sends. Categories of
``REQUIRED_CATEGORIES`` cannot be opted out of. See ``docs/users.md``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from notiflow.gateway.auth import RuntimeDep, Tenant, read_model
from notiflow.gateway.errors import not_found, unavailable
from notiflow.gateway.openapi import json_body, tenant_errors
from notiflow.gateway.recipients import STATE_ERRORS, stored_state
from notiflow.gateway.runtime import Runtime
from notiflow.gateway.users import UserIdPath, checked_user_id
from notiflow.preference_links import PageLink, preference_link
from notiflow.redact import recipient_hashes, user_hash, user_recipient_key
from notiflow.schemas.preferences import (
    PreferenceState,
    PreferencesUpdate,
    UserPreferencesUpdate,
    UserPreferencesView,
)

router = APIRouter()
JSON = "application/json"

EXAMPLE = {"no-marketing-sms": {"opt_outs": [{"channel": "SMS", "category": "marketing"}]}}


def preferences_view(user_id: str, state: PreferenceState | None) -> UserPreferencesView:
    if state is None:
        return UserPreferencesView(user_id=user_id, version=0, updated_at=None, opt_outs=())
    return UserPreferencesView(user_id=user_id, version=state.version,
                               updated_at=state.updated_at, opt_outs=state.opt_outs,
                               muted_topics=state.muted_topics)


async def user_preferences(rt: Runtime, tenant_id: str, user_id: str
                           ) -> PreferenceState | None:
    """The user's stored preferences (under any of their hashes); None when none."""
    hashes = recipient_hashes(tenant_id, user_recipient_key(user_id))
    return await stored_state(rt, tenant_id, hashes)


async def set_user_preferences(rt: Runtime, tenant_id: str, user_id: str,
                               update: UserPreferencesUpdate) -> PreferenceState:
    """Replace the user's opt-outs and muted topics; returns the state once stored and
    published."""
    return await rt.preferences().set_preferences(
        tenant_id, user_hash(tenant_id, user_id), PreferencesUpdate(opt_outs=update.opt_outs),
        muted_topics=update.muted_topics)


async def _existing(rt: Runtime, tenant_id: str, user_id: str) -> None:
    if await rt.users().get(tenant_id, checked_user_id(user_id)) is None:
        raise not_found()


def _answer(view: UserPreferencesView) -> Response:
    return Response(view.model_dump_json(), media_type=JSON)


@router.get("/v1/users/{user_id}/preferences", response_model=UserPreferencesView,
            responses=tenant_errors(404, 422, r422="`invalid_user_id`."))
async def get_user_preferences(user_id: UserIdPath, tenant: Tenant,
                               rt: RuntimeDep) -> Response:
    """The user's opt-outs (none stored: version 0); ``404`` when there is no such user."""
    await _existing(rt, tenant.id, user_id)
    return _answer(preferences_view(user_id, await user_preferences(rt, tenant.id, user_id)))


@router.put(
    "/v1/users/{user_id}/preferences", response_model=UserPreferencesView,
    responses={200: {"description": "The user's preferences, replaced."},
               **tenant_errors(400, 404, 413, 422,
                               r422="`invalid_user_id`; `invalid_body` (an opt-out of `otp` "
                                    "or `security`, which no one can opt out of, among "
                                    "others).", **STATE_ERRORS)},
    openapi_extra=json_body(UserPreferencesUpdate, "Replaces the user's opt-outs.", EXAMPLE))
async def put_user_preferences(user_id: UserIdPath, request: Request, tenant: Tenant,
                               rt: RuntimeDep) -> Response:
    """Replace the user's opt-outs; ``200`` once stored and published, ``404`` when there
    is no such user."""
    await _existing(rt, tenant.id, user_id)
    update = await read_model(request, UserPreferencesUpdate)
    state = await set_user_preferences(rt, tenant.id, user_id, update)
    return _answer(preferences_view(user_id, state))


@router.post("/v1/users/{user_id}/preferences:link", response_model=PageLink,
             responses=tenant_errors(404, 422, r422="`invalid_user_id`.",
                                     r503="`preference_page_not_configured`: no "
                                          "`NOTIFLOW_PREFERENCE_PAGE__BASE_URL` or no "
                                          "correlation key."))
async def link_user_preferences(user_id: UserIdPath, tenant: Tenant,
                                rt: RuntimeDep) -> Response:
    """A signed link to the user's hosted preference page, to put in a message or an app."""
    await _existing(rt, tenant.id, user_id)
    link = preference_link(rt.settings, tenant.id, user_id)
    if link is None:
        raise unavailable("preference_page_not_configured",
                          "this deployment has no hosted preference page")
    return Response(link.model_dump_json(), media_type=JSON)
