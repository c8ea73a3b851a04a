"""The APNs provider token: an ES256 JWT of the team's key (header ``{"alg": "ES256", "kid":
key_id}``, claims ``{"iss": team_id, "iat": now}``), and :class:`ProviderTokens`, which signs
one, hands it out for ``refresh_after`` and re-signs early only after an
``ExpiredProviderToken``, at most once per 20 minutes (Apple refuses tokens older than an hour
and refreshes more often than every 20 minutes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from notiflow.adapters.providers.common import utcnow
from notiflow.providers.apns.config import ApnsSettings

TOKEN_MAX_AGE: Final = timedelta(hours=1)
"""APNs refuses a provider token whose ``iat`` is older than this."""
TOKEN_MIN_REFRESH: Final = timedelta(minutes=20)
"""APNs refuses a new provider token sooner than this after the previous one."""
DEFAULT_TOKEN_REFRESH: Final = timedelta(minutes=45)


def load_signing_key(pem: str) -> ec.EllipticCurvePrivateKey:
    """The APNs signing key (.p8 PEM); ``ValueError`` unless it is an EC P-256 private key."""
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=None)
    except (TypeError, ValueError) as exc:
        raise ValueError("apns.private_key is not a PEM private key") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve,
                                                                         ec.SECP256R1):
        raise ValueError("apns.private_key is not an EC P-256 key")
    return key


def provider_token(team_id: str, key_id: str, key: ec.EllipticCurvePrivateKey,
                   now: datetime) -> str:
    """The provider token issued at ``now``: header exactly ``{"alg": "ES256", "kid"}`` (no
    ``typ``), claims ``{"iss", "iat"}``, signature the raw 64-byte ``r || s`` of RFC 7518."""
    return jwt.encode({"iss": team_id, "iat": int(now.timestamp())}, key, algorithm="ES256",
                      headers={"kid": key_id, "typ": None})


@dataclass(frozen=True, slots=True)
class IssuedToken:
    value: str
    issued_at: datetime


class ProviderTokens:
    """The provider token of one APNs key, signed locally and cached.

    ``current`` returns the cached token until it is ``refresh_after`` old (20 minutes ≤
    ``refresh_after`` < 60 minutes), then signs a new one. ``expired(value)`` is called after
    APNs answered ``ExpiredProviderToken`` for ``value``: if ``value`` is still the cached token
    and no early refresh happened in the last 20 minutes, the next ``current`` signs a new
    token; it returns whether a retry with ``current`` can help.
    """

    def __init__(self, team_id: str, key_id: str, key: ec.EllipticCurvePrivateKey, *,
                 clock: Callable[[], datetime] = utcnow,
                 refresh_after: timedelta = DEFAULT_TOKEN_REFRESH) -> None:
        if not TOKEN_MIN_REFRESH <= refresh_after < TOKEN_MAX_AGE:
            raise ValueError("refresh_after must be at least 20 and under 60 minutes")
        self.team_id = team_id
        self.key_id = key_id
        self._key = key
        self._clock = clock
        self.refresh_after = refresh_after
        self._token: IssuedToken | None = None
        self._forced_at: datetime | None = None
        self.signed = 0
        """Tokens signed (for tests and metrics)."""

    @classmethod
    def from_settings(cls, config: ApnsSettings, *, clock: Callable[[], datetime] = utcnow,
                      refresh_after: timedelta = DEFAULT_TOKEN_REFRESH) -> ProviderTokens:
        """The configured key; ``ValueError`` when team id, key id or key are missing or
        the key is not EC P-256."""
        if not config.team_id or not config.key_id or config.private_key is None:
            raise ValueError("apns.team_id, apns.key_id and apns.private_key are not configured")
        return cls(config.team_id, config.key_id,
                   load_signing_key(config.private_key.get_secret_value()), clock=clock,
                   refresh_after=refresh_after)

    @property
    def cached(self) -> IssuedToken | None:
        return self._token

    def current(self) -> str:
        """A provider token younger than ``refresh_after`` (signed now if needed)."""
        token = self._token
        now = self._clock()
        if token is None or now - token.issued_at >= self.refresh_after:
            token = IssuedToken(provider_token(self.team_id, self.key_id, self._key, now), now)
            self._token = token
            self.signed += 1
        return token.value

    def expired(self, value: str) -> bool:
        """APNs called ``value`` expired: drop it if it is the cached token and no early
        refresh happened in the last 20 minutes. True when ``current`` now differs from
        ``value`` (a retry is worthwhile)."""
        token = self._token
        if token is None or token.value != value:
            return True
        now = self._clock()
        if self._forced_at is not None and now - self._forced_at < TOKEN_MIN_REFRESH:
            return False
        self._forced_at = now
        self._token = None
        return True
