"""Recipient preferences and device tokens (tenant-scoped by the bearer token).

``{recipient}`` is the address exactly as in a send request (E.164 phone, email address, or
``<platform>:<device token>``), URL-encoded; it is hashed with the tenant like the send path
does (``recipient_hash(tenant_id, key)``), so the send flow finds the same state. Every
change is written to Cassandra (lightweight transaction on ``version``), then published to
``notify.preferences``, then answered: a ``200`` means any reader of Cassandra already sees
it. See ``docs/api.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Final, TypeVar

from fastapi import APIRouter, Path, Request, Response

from notiflow.adapters.cassandra.recipients import DeviceRow
from notiflow.gateway import examples
from notiflow.gateway.auth import RuntimeDep, Tenant, read_model
from notiflow.gateway.errors import ApiError, not_found
from notiflow.gateway.openapi import json_body, link, tenant_errors
from notiflow.gateway.runtime import Runtime, now_ms
from notiflow.redact import mask, recipient_hash, recipient_hashes
from notiflow.schemas.enums import PushPlatform
from notiflow.schemas.formats import FCM_TOKEN_PATTERN, owner_address, recipient_address
from notiflow.schemas.preferences import (
    DeviceRegistration,
    DeviceView,
    PreferenceState,
    PreferencesUpdate,
    PreferencesView,
    address_key,
    combined_state,
)
from notiflow.settings import TenantConfig

router = APIRouter()
T = TypeVar("T")

JSON = "application/json"
DELETED_BY_CLIENT = "deleted_by_client"
_PUSH_PREFIXES = tuple(f"{p.value}:" for p in PushPlatform)


Address = Annotated[str, Path(json_schema_extra=recipient_address())]
Owner = Annotated[str, Path(json_schema_extra=owner_address())]
Token = Annotated[str, Path(description="The device token (its shape follows the platform: "
                                        "ios tokens are 64-200 hex digits).",
                            json_schema_extra={"pattern": FCM_TOKEN_PATTERN})]
INVALID_ADDRESS: Final = "`invalid_recipient` (`details[0].loc = [\"path\", \"recipient\"]`)"
STATE_ERRORS: Final = dict(r503="`preferences_contention`, `kafka_unavailable` (the change "
                                "is stored; retry to publish it).")
PREFERENCE_LINKS: Final = {"GetPreferences": link(
    "get_preferences", "The state just written.", recipient="$request.path.recipient")}
DEVICE_LINKS: Final = {"GetDevice": link(
    "get_device", "The device just registered.", recipient="$request.path.recipient",
    token="$request.path.token"), "DeleteDevice": link(
    "delete_device", "Deactivate the token again.", recipient="$request.path.recipient",
    token="$request.path.token")}


def _invalid(reason: str, field: str, msg: str) -> ApiError:
    return ApiError(422, "validation_failed", reason,
                    details=[{"loc": ["path", field], "msg": msg, "type": "value_error"}])


def recipient_key(address: str) -> str:
    """The normalised key of a ``{recipient}`` path segment; ``422 invalid_recipient``."""
    try:
        return address_key(address)
    except ValueError as exc:
        raise _invalid("invalid_recipient", "recipient", str(exc)) from None


def owner_key(address: str) -> str:
    """The key of a device owner: a phone number or email address, never a push address."""
    key = recipient_key(address)
    if key.startswith(_PUSH_PREFIXES):
        raise _invalid("invalid_recipient", "recipient",
                       "a device owner is a phone number or an email address")
    return key


def token_key(platform: PushPlatform, token: str) -> str:
    """``<platform>:<token>`` after validating the token's shape; ``422
    invalid_device_token``."""
    try:
        return address_key(f"{platform.value}:{token}")
    except ValueError as exc:
        raise _invalid("invalid_device_token", "token", str(exc)) from None


def _state_response(state: PreferenceState, key: str) -> Response:
    return Response(PreferencesView.of(state, mask(key)).model_dump_json(), media_type=JSON)


@router.put(
    "/v1/recipients/{recipient:path}/preferences", response_model=PreferencesView,
    responses={200: {"description": "The new state.", "links": PREFERENCE_LINKS},
               **tenant_errors(400, 404, 413, 422, r422=f"{INVALID_ADDRESS}, `invalid_body`.",
                               r404="No route matches the path (e.g. an empty recipient).",
                               **STATE_ERRORS)},
    openapi_extra=json_body(PreferencesUpdate, "Replaces timezone, quiet hours and opt-outs.",
                            examples.PREFERENCES))
async def put_preferences(recipient: Address, request: Request, tenant: Tenant,
                          rt: RuntimeDep) -> Response:
    """Replace timezone, quiet hours and opt-outs (the suppression is kept); ``200`` with
    the new state once it is in Cassandra and on ``notify.preferences``."""
    key = recipient_key(recipient)
    update = await read_model(request, PreferencesUpdate)
    await carry_forward(rt, tenant.id, key)
    state = await rt.preferences().set_preferences(
        tenant.id, recipient_hash(tenant.id, key), update)
    return _state_response(state, key)


@router.get("/v1/recipients/{recipient:path}/preferences", response_model=PreferencesView,
            responses=tenant_errors(404, 422, r422=f"{INVALID_ADDRESS}."))
async def get_preferences(recipient: Address, tenant: Tenant, rt: RuntimeDep) -> Response:
    """The stored state of the caller's recipient; ``404`` when it has none."""
    key = recipient_key(recipient)
    state = await stored_state(rt, tenant.id, recipient_hashes(tenant.id, key))
    if state is None:
        raise not_found()
    return _state_response(state, key)


async def stored_state(rt: Runtime, tenant_id: str,
                       hashes: tuple[str, ...]) -> PreferenceState | None:
    """The state stored under the first of ``hashes`` that has one."""
    for h in hashes:
        state = await rt.store().recipients.get_state(tenant_id, h)
        if state is not None:
            return state
    return None


async def carry_forward(rt: Runtime, tenant_id: str, key: str) -> None:
    """Before a write under the recipient's current hash: when that hash has no state yet,
    a suppression stored under an older one (a rotated key, the legacy hash) is copied to
    it, so the write keeps it. No read at all while a single key is configured."""
    current, *older = recipient_hashes(tenant_id, key)
    if not older or await rt.store().recipients.get_state(tenant_id, current) is not None:
        return
    previous = await stored_state(rt, tenant_id, tuple(older))
    if previous is not None and previous.suppressed is not None:
        await rt.preferences().suppress(tenant_id, current, previous.suppressed)


@router.put(
    "/v1/recipients/{recipient:path}/devices/{token}", response_model=DeviceView,
    responses={200: {"description": "The device, active.", "links": DEVICE_LINKS},
               **tenant_errors(400, 404, 413, 422,
                               r404="The path names no device (a token holding `/`).",
                               r422=f"{INVALID_ADDRESS}, `invalid_body`; not "
                               "stated by the schema: `invalid_device_token` (the token does "
                               "not have the body's platform's shape).", **STATE_ERRORS)},
    openapi_extra=json_body(DeviceRegistration, "The token's platform.", examples.DEVICE))
async def put_device(recipient: Owner, token: Token, request: Request, tenant: Tenant,
                     rt: RuntimeDep) -> Response:
    """Register or reactivate a device token of a recipient and clear the token's
    suppression; idempotent. ``200`` with the device."""
    owner = owner_key(recipient)
    reg = await read_model(request, DeviceRegistration)
    push = token_key(reg.platform, token)
    now = now_ms()
    push_hash = recipient_hash(tenant.id, push)
    await rt.store().recipients.activate_device(
        tenant.id, recipient_hash(tenant.id, owner), token, reg.platform.value, now, push_hash)
    state = await reactivated(rt, tenant.id, push, now)
    view = DeviceView(recipient=mask(owner), device_token=mask(push), platform=reg.platform,
                      active=True, updated_at=now,
                      suppressed=state.suppressed if state else None)
    return Response(view.model_dump_json(), media_type=JSON)


async def reactivated(rt: Runtime, tenant_id: str, push: str,
                      now: datetime) -> PreferenceState | None:
    """Clear the token's suppression under every hash it may be stored under (a suppression
    under any of them would keep it dead); the token's state afterwards, None when it has
    none."""
    prefs = rt.preferences()
    states = [await prefs.unsuppress(tenant_id, h, now)
              for h in recipient_hashes(tenant_id, push)]
    return combined_state(states)


async def combined_stored(rt: Runtime, tenant_id: str, key: str) -> PreferenceState | None:
    """The state of a recipient combined from those under each of its hashes
    (:func:`~notiflow.schemas.preferences.combined_state`)."""
    return combined_state([await rt.store().recipients.get_state(tenant_id, h)
                           for h in recipient_hashes(tenant_id, key)])


@dataclass(frozen=True, slots=True)
class Registered:
    """A device token registered for an owner: its ``device_tokens`` row and the keys the
    owner's and the token's own state go by."""

    owner: str
    owner_hash: str
    row: DeviceRow
    platform: PushPlatform
    push: str
    """``<platform>:<token>``."""


async def registered(rt: Runtime, tenant: TenantConfig, recipient: str,
                     token: str) -> Registered:
    """The owner's registration of ``token``, under the first of the owner's hashes that
    has one (``owner_hash``: a registration made before a key rotation keeps its old one);
    ``404`` when it was never registered."""
    owner = owner_key(recipient)
    for owner_hash in recipient_hashes(tenant.id, owner):
        row = await rt.store().recipients.get_device(tenant.id, owner_hash, token)
        if row is not None and row.platform:
            break
    else:
        raise not_found()
    platform = PushPlatform(row.platform)
    return Registered(owner, owner_hash, row, platform, f"{platform.value}:{token}")


@router.delete(
    "/v1/recipients/{recipient:path}/devices/{token}", status_code=204,
    responses={204: {"description": "Deactivated (also when it already was)."},
               **tenant_errors(404, 422, r422=f"{INVALID_ADDRESS}.", **STATE_ERRORS)})
async def delete_device(recipient: Owner, token: str, tenant: Tenant,
                        rt: RuntimeDep) -> Response:
    """Deactivate a registered device token (reason ``deleted_by_client``) and suppress
    the token (``token_deactivated``); idempotent. ``204``; ``404`` for a token never
    registered for this recipient."""
    device = await registered(rt, tenant, recipient, token)
    now = now_ms()
    await rt.preferences().suppress(tenant.id, recipient_hash(tenant.id, device.push),
                                    "token_deactivated", now)
    row = device.row
    if row.active is not False or row.deactivated_reason != DELETED_BY_CLIENT:
        await rt.store().recipients.deactivate_device(tenant.id, device.owner_hash, token,
                                                      DELETED_BY_CLIENT, now)
    return Response(status_code=204)


@router.get(
    "/v1/recipients/{recipient:path}/devices/{token}", response_model=DeviceView,
    responses=tenant_errors(404, 422, r404="A token never registered for this recipient.",
                            r422=f"{INVALID_ADDRESS}."))
async def get_device(recipient: Owner, token: str, tenant: Tenant, rt: RuntimeDep) -> Response:
    """A registered device token: ``active`` false once the client deleted it
    (``deactivated_reason`` ``deleted_by_client``) or its push service said it is dead
    (``<provider>:unregistered``), and the token's suppression."""
    device = await registered(rt, tenant, recipient, token)
    row = device.row
    state = await combined_stored(rt, tenant.id, device.push)
    view = DeviceView(recipient=mask(device.owner), device_token=mask(device.push),
                      platform=device.platform, active=row.active is not False,
                      deactivated_reason=row.deactivated_reason,
                      updated_at=row.updated_at or now_ms(),
                      suppressed=state.suppressed if state else None)
    return Response(view.model_dump_json(), media_type=JSON)
