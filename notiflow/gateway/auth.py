"""Request dependencies: the process runtime, the calling tenant, the JSON body."""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from notiflow.adapters.jwks import JwksUnavailable
from notiflow.gateway import jwt_auth
from notiflow.gateway.bodies import read_limited
from notiflow.gateway.errors import ApiError, bad_request, unavailable, validated
from notiflow.gateway.runtime import Runtime
from notiflow.settings import TenantConfig

MAX_BODY_BYTES = 256 * 1024
BEARER = HTTPBearer(scheme_name="TenantToken", auto_error=False,
                    description="The tenant's static token (`NOTIFLOW_TENANTS`), or an OAuth2 "
                    "client-credentials access token (a JWT) from the identity provider "
                    "`NOTIFLOW_JWT__*` names (docs/api.md, \"Authentication\").")
"""Declares the tenant token in the OpenAPI document; :func:`authenticate` checks it."""


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def _unauthorized(reason: str, message: str) -> ApiError:
    return ApiError(401, "unauthorized", reason, message,
                    headers={"WWW-Authenticate": "Bearer"})


async def authenticate(request: Request, rt: Annotated[Runtime, Depends(get_runtime)],
                 _bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
                 ) -> TenantConfig:
    """The tenant owning the ``Authorization: Bearer <token>``; ``401`` otherwise."""
    header = request.headers.get("authorization")
    if not header:
        raise _unauthorized("missing_token", "Authorization: Bearer <token> is required")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _unauthorized("malformed_authorization", "expected Authorization: Bearer <token>")
    rule = rt.settings.jwt
    if rule.jwks_url and jwt_auth.looks_like_jwt(token):
        try:
            claims = await jwt_auth.verify(token, rule, rt.signing_key)
        except JwksUnavailable:
            raise unavailable("identity_provider_unreachable",
                              "the identity provider's keys could not be fetched") from None
        principal = jwt_auth.principal(claims, rule, rt.settings.tenant)
        subject = claims.get("sub") or claims.get("client_id") or claims.get("azp")
        request.state.actor = f"jwt:{subject}" if isinstance(subject, str) else "jwt"
        return principal
    tenant = rt.keyring.tenant_by_token(token) if rule.accepts_static_tokens else None
    if tenant is None:
        raise _unauthorized("unknown_token", "the bearer token is not valid")
    request.state.actor = f"token:{tenant.id}"
    return tenant


def actor_of(request: Request) -> str:
    """Who made an authenticated request, for the audit trail: ``jwt:<sub>`` (the OAuth2
    client), or ``token:<tenant>`` for a static token."""
    return str(getattr(request.state, "actor", "unknown"))


Tenant = Annotated[TenantConfig, Depends(authenticate)]
RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def read_json_object(request: Request, limit: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """The body as a JSON object: ``413`` as soon as it passes ``limit`` bytes (declared or
    streamed; :func:`~notiflow.gateway.bodies.read_limited`), ``400`` when not JSON, ``422``
    when JSON but not an object."""
    raw = await read_limited(request, limit)
    if not raw.strip():
        raise bad_request("empty_body", "a JSON object body is required")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        pos = f" at line {exc.lineno} column {exc.colno}" if isinstance(
            exc, json.JSONDecodeError) else ""
        raise bad_request("malformed_json", f"body is not valid JSON: {reason}{pos}") from None
    if not isinstance(data, dict):
        raise ApiError(422, "validation_failed", "invalid_body",
                       details=[{"loc": [], "msg": "body must be a JSON object",
                                 "type": "model_type"}])
    return data


M = TypeVar("M", bound=BaseModel)


async def read_model(request: Request, model: type[M]) -> M:
    """The body as ``model``: the errors of :func:`read_json_object`, then ``422`` when the
    object does not validate (:func:`~notiflow.gateway.errors.validated`)."""
    return validated(model, await read_json_object(request))
