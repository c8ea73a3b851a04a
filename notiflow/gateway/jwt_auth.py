"""OAuth2 client-credentials access tokens (JWTs) as API credentials.

A token is accepted when its signature verifies with the identity provider's key named by
its ``kid`` (``adapters/jwks.py``), its algorithm is one ``settings.jwt.algorithms`` allows,
it is within its ``nbf``/``exp`` (with ``leeway``), and it names the configured issuer and
audience and carries the scope. Its tenant claim must name a configured tenant, whose limits
and policies apply; the optional tier, channel, template and sender claims narrow what that
tenant may send with this token, never widen it. Every refusal is a ``401`` (who are you?)
or a ``403`` (not that) with a reason."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import jwt

from notiflow.gateway.errors import ApiError, forbidden
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import JwtAuth, TenantConfig, narrowed_senders, normalised_senders

KeyLookup = Callable[[str], Awaitable[jwt.PyJWK | None]]
"""The signing key of a key id, ``None`` when the provider does not publish it."""


def looks_like_jwt(token: str) -> bool:
    """Three base64url segments (a static token never has two dots)."""
    return token.count(".") == 2 and token.startswith("eyJ")


def unauthorized(reason: str, message: str) -> ApiError:
    return ApiError(401, "unauthorized", reason, message,
                    headers={"WWW-Authenticate": f'Bearer error="invalid_token", '
                                                 f'error_description="{reason}"'})


_REFUSALS: tuple[tuple[type[jwt.PyJWTError], str, str], ...] = (
    (jwt.ExpiredSignatureError, "token_expired", "the token has expired"),
    (jwt.ImmatureSignatureError, "token_not_yet_valid", "the token is not valid yet (nbf/iat)"),
    (jwt.InvalidAudienceError, "wrong_audience", "the token is not meant for this API (aud)"),
    (jwt.InvalidIssuerError, "wrong_issuer", "the token's issuer is not trusted (iss)"),
    (jwt.MissingRequiredClaimError, "missing_claim", "the token lacks a required claim"),
    (jwt.InvalidSignatureError, "bad_signature", "the token's signature does not verify"),
    (jwt.InvalidAlgorithmError, "unsupported_algorithm", "the token's algorithm is not allowed"),
)


_KEY_TYPES = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}
"""The JWK key type each algorithm family signs with."""


async def verify(token: str, rule: JwtAuth, key_of: KeyLookup) -> dict[str, Any]:
    """The token's claims once it verifies; :class:`ApiError` 401 otherwise."""
    try:
        header = jwt.get_unverified_header(token)
    except (jwt.DecodeError, ValueError):
        raise unauthorized("malformed_token", "the bearer token is not a readable JWT") from None
    alg, kid = header.get("alg"), header.get("kid")
    if alg not in rule.algorithms:
        raise unauthorized("unsupported_algorithm",
                           f"algorithm {alg!r} is not accepted (allowed: "
                           f"{', '.join(rule.algorithms)})")
    if not isinstance(kid, str) or not kid:
        raise unauthorized("missing_kid", "the token's header names no key (kid)")
    key = await key_of(kid)
    if key is None:
        raise unauthorized("unknown_key", f"the issuer publishes no key {kid!r}")
    if _KEY_TYPES[alg[:2]] != key.key_type:
        raise unauthorized("unsupported_algorithm",
                           f"key {kid!r} is an {key.key_type} key, the token says {alg}")
    try:
        claims: dict[str, Any] = jwt.decode(
            token, key=key.key, algorithms=[alg], audience=rule.audience, issuer=rule.issuer,
            leeway=rule.leeway, options={"require": ["exp", "iss", "aud"]})
    except (TypeError, ValueError) as exc:
        raise unauthorized("invalid_token", f"the token is not valid: {exc}") from None
    except jwt.PyJWTError as exc:
        for kind, reason, message in _REFUSALS:
            if isinstance(exc, kind):
                raise unauthorized(reason, f"{message}: {exc}") from None
        raise unauthorized("invalid_token", f"the token is not valid: {exc}") from None
    return claims


def _scopes(claims: dict[str, Any]) -> set[str]:
    scope, scp = claims.get("scope"), claims.get("scp")
    found = set(scope.split()) if isinstance(scope, str) else set()
    if isinstance(scp, list):
        found |= {s for s in scp if isinstance(s, str)}
    elif isinstance(scp, str):
        found |= set(scp.split())
    return found


def _names(claims: dict[str, Any], claim: str) -> list[str] | None:
    value = claims.get(claim)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise unauthorized("invalid_claim", f"claim {claim!r} must be a list of strings")
    return value


E = TypeVar("E", Tier, Channel)


def _members(claims: dict[str, Any], claim: str, kind: type[E]) -> frozenset[E] | None:
    """The claim's list as members of ``kind``; 401 when it names one that does not exist."""
    names = _names(claims, claim)
    if names is None:
        return None
    unknown = set(names) - {m.value for m in kind}
    if unknown:
        raise unauthorized("invalid_claim", f"claim {claim!r} names unknown "
                           f"{kind.__name__.lower()}s: {', '.join(sorted(unknown))}")
    return frozenset(kind(n) for n in names)


def principal(claims: dict[str, Any], rule: JwtAuth,
              tenant_of: Callable[[str], TenantConfig | None]) -> TenantConfig:
    """The tenant a verified token acts as, narrowed by its claims; 401/403 otherwise."""
    if rule.scope is not None and rule.scope not in _scopes(claims):
        raise ApiError(403, "forbidden", "insufficient_scope",
                       f"the token lacks the scope {rule.scope!r}",
                       headers={"WWW-Authenticate": f'Bearer error="insufficient_scope", '
                                                    f'scope="{rule.scope}"'})
    tenant_id = claims.get(rule.tenant_claim)
    if not isinstance(tenant_id, str) or not tenant_id:
        raise unauthorized("missing_claim", f"the token has no {rule.tenant_claim!r} claim")
    tenant = tenant_of(tenant_id)
    if tenant is None:
        raise forbidden("unknown_tenant", f"tenant {tenant_id!r} is not configured here")
    update: dict[str, Any] = {}
    tiers = _members(claims, rule.tiers_claim, Tier)
    if tiers is not None:
        update["tiers"] = tenant.tiers & tiers
    channels = _members(claims, rule.channels_claim, Channel)
    if channels is not None:
        update["channels"] = tenant.channels & channels
    templates = _names(claims, rule.templates_claim)
    if templates is not None:
        update["templates"] = (frozenset(templates) if tenant.templates is None
                               else tenant.templates & set(templates))
    senders = _names(claims, rule.senders_claim)
    if senders is not None:
        update["senders"] = narrowed_senders(tenant.senders, normalised_senders(senders))
    return tenant.model_copy(update=update) if update else tenant
