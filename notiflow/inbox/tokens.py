"""User tokens of the inbox: JWTs a tenant's backend signs (HS256) with one of its
``inbox_keys`` for one of its users, verified with PyJWT.

Claims: ``iss`` the tenant id, ``sub`` the user id (the ``<user id>`` of ``inapp:<user id>``),
``aud`` ``inbox.token_audience``, ``iat`` and ``exp`` (at most ``inbox.max_token_lifetime``
apart). A token opens that user's inbox and nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import jwt

from notiflow.settings import Settings

ALGORITHM: Final = "HS256"
_USER: Final = re.compile(r"[A-Za-z0-9._@+:-]{1,128}")


@dataclass(frozen=True, slots=True)
class User:
    """Who a valid token speaks for."""

    tenant_id: str
    user_id: str


class TokenRefused(ValueError):
    """A token that opens nothing; ``reason`` is safe to show."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def verify(token: str, settings: Settings) -> User:
    """The user ``token`` speaks for, or :class:`TokenRefused`."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise TokenRefused("malformed_token") from None
    if header.get("alg") != ALGORITHM:
        raise TokenRefused("wrong_algorithm")
    tenant = settings.tenant(str(claims.get("iss", "")))
    if tenant is None or not tenant.inbox_keys:
        raise TokenRefused("unknown_issuer")
    inbox = settings.inbox
    for key in tenant.inbox_keys:
        try:
            verified = jwt.decode(
                token, key.get_secret_value(), algorithms=[ALGORITHM],
                audience=inbox.token_audience, issuer=tenant.id,
                leeway=inbox.token_leeway.total_seconds(),
                options={"require": ["exp", "iat", "sub", "iss", "aud"]})
        except jwt.InvalidSignatureError:
            continue
        except jwt.ExpiredSignatureError:
            raise TokenRefused("expired_token") from None
        except jwt.PyJWTError:
            raise TokenRefused("invalid_claims") from None
        return _user(tenant.id, verified, inbox.max_token_lifetime)
    raise TokenRefused("invalid_signature")


def _user(tenant_id: str, claims: dict[str, object], lifetime: timedelta) -> User:
    sub, iat, exp = claims["sub"], claims["iat"], claims["exp"]
    if not isinstance(sub, str) or not _USER.fullmatch(sub):
        raise TokenRefused("invalid_claims")
    if not isinstance(iat, int | float) or not isinstance(exp, int | float) \
            or exp - iat > lifetime.total_seconds():
        raise TokenRefused("lifetime_too_long")
    return User(tenant_id, sub)


def mint(key: str, tenant_id: str, user_id: str, *, audience: str = "notiflow-inbox",
         ttl: timedelta = timedelta(hours=1), now: datetime | None = None) -> str:
    """A user token as a tenant's backend makes one (the demo, tests and docs' example)."""
    issued = now or datetime.now(UTC)
    return jwt.encode({"iss": tenant_id, "sub": user_id, "aud": audience,
                       "iat": int(issued.timestamp()), "exp": int((issued + ttl).timestamp())},
                      key, algorithm=ALGORITHM)
