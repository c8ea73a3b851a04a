"""The FCM access token: a service-account assertion (an RS256 JWT: ``iss`` = client_email,
``scope`` = firebase.messaging, ``aud`` = token_uri, at most one hour) exchanged at
``token_uri`` (``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer``), and
:class:`AccessTokens`, which caches it until shortly before it expires; concurrent sends share
one exchange."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from notiflow.adapters.providers.common import Rule, utcnow
from notiflow.providers.fcm.config import FcmSettings

SCOPE: Final = "https://www.googleapis.com/auth/firebase.messaging"
GRANT_TYPE: Final = "urn:ietf:params:oauth:grant-type:jwt-bearer"
MAX_ASSERTION_LIFETIME: Final = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class ServiceAccount:
    """The parts of a Google service-account key the token exchange needs."""

    client_email: str
    private_key: rsa.RSAPrivateKey
    token_uri: str
    private_key_id: str | None = None

    @classmethod
    def from_settings(cls, config: FcmSettings) -> ServiceAccount:
        """The configured account; ``ValueError`` when incomplete or not an RSA key."""
        if not config.client_email or config.private_key is None:
            raise ValueError("fcm.client_email and fcm.private_key are not configured")
        key = serialization.load_pem_private_key(
            config.private_key.get_secret_value().encode(), password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError("fcm.private_key is not an RSA private key")
        return cls(config.client_email, key, config.token_uri, config.private_key_id)


def assertion_claims(account: ServiceAccount, now: datetime, *,
                     lifetime: timedelta = MAX_ASSERTION_LIFETIME,
                     scope: str = SCOPE) -> dict[str, Any]:
    """The claims of a token-exchange assertion issued at ``now`` (lifetime capped at 1 h)."""
    iat = int(now.timestamp())
    span = int(min(lifetime, MAX_ASSERTION_LIFETIME).total_seconds())
    return {"iss": account.client_email, "scope": scope, "aud": account.token_uri,
            "iat": iat, "exp": iat + span}


def service_account_assertion(account: ServiceAccount, now: datetime, *,
                              lifetime: timedelta = MAX_ASSERTION_LIFETIME) -> str:
    """The JWT exchanged for an access token: RS256 over :func:`assertion_claims`, header
    ``{"alg": "RS256", "typ": "JWT"}`` plus ``kid`` = ``private_key_id`` when configured."""
    headers = {"kid": account.private_key_id} if account.private_key_id else None
    return jwt.encode(assertion_claims(account, now, lifetime=lifetime), account.private_key,
                      algorithm="RS256", headers=headers)


class TokenError(Exception):
    """The token endpoint gave no token; carries the classification of the failed send."""

    def __init__(self, rule: Rule, error_code: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{rule.reason} ({error_code})")
        self.rule = rule
        self.error_code = error_code
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class AccessToken:
    value: str
    refresh_at: datetime
    """When the cache stops handing it out (shortly before it expires)."""


Exchange = Callable[[str, float], Awaitable[tuple[str, float]]]
"""(assertion, timeout seconds) → (access token, expires_in seconds); raises
:class:`TokenError` or a transport exception."""


class AccessTokens:
    """The cached OAuth2 access token of one service account.

    ``get`` returns the cached token until ``refresh_margin`` (at most a tenth of its lifetime)
    before it expires; then one exchange runs, shared by every concurrent caller. A failed
    exchange is raised to each waiting caller and is not cached. ``invalidate`` drops the token
    only if it is still the cached one, so concurrent 401s cause a single refresh.
    """

    def __init__(self, account: ServiceAccount, exchange: Exchange, *,
                 clock: Callable[[], datetime] = utcnow,
                 refresh_margin: timedelta = timedelta(minutes=5)) -> None:
        self.account = account
        self._exchange = exchange
        self._clock = clock
        self._margin = refresh_margin
        self._token: AccessToken | None = None
        self._pending: asyncio.Task[AccessToken] | None = None
        self.exchanges = 0
        """Exchanges started (for tests and metrics)."""

    @property
    def cached(self) -> AccessToken | None:
        return self._token

    async def get(self, timeout: float) -> str:
        """A valid access token, waiting at most ``timeout`` seconds for an exchange."""
        token = self._token
        if token is not None and self._clock() < token.refresh_at:
            return token.value
        task = self._pending
        if task is None:
            task = asyncio.get_running_loop().create_task(self._refresh(timeout))
            task.add_done_callback(self._settled)
            self._pending = task
        return (await asyncio.wait_for(asyncio.shield(task), timeout)).value

    def cancel(self) -> None:
        """Abandon an exchange in flight (the client is closing)."""
        if self._pending is not None:
            self._pending.cancel()

    def invalidate(self, value: str) -> None:
        """Forget ``value`` if it is the cached token (the provider refused it)."""
        if self._token is not None and self._token.value == value:
            self._token = None

    async def _refresh(self, timeout: float) -> AccessToken:
        self.exchanges += 1
        assertion = service_account_assertion(self.account, self._clock())
        value, expires_in = await self._exchange(assertion, timeout)
        margin = min(self._margin, timedelta(seconds=expires_in / 10))
        token = AccessToken(value, self._clock() + timedelta(seconds=expires_in) - margin)
        self._token = token
        return token

    def _settled(self, task: asyncio.Task[AccessToken]) -> None:
        if self._pending is task:
            self._pending = None
        if not task.cancelled():
            task.exception()
