"""An identity provider's signing keys, by key id, from its JWKS document (RFC 7517).

Keys are fetched when first needed and again after ``ttl``; a token signed with a key id the
cached set lacks (the provider rotated its keys) makes one refetch, at most every
``min_refetch`` seconds, so a flood of tokens with made-up key ids costs one request per
interval, not one per token. Concurrent misses share one fetch. A failed fetch keeps the keys
already known. Keys are parsed by PyJWT (``PyJWKSet``): keys it cannot use (an unknown key
type, an encryption key) are skipped."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx
import jwt

log = logging.getLogger(__name__)


class JwksUnavailable(RuntimeError):
    """No key set could be fetched yet."""


class JwksCache:
    def __init__(self, url: str, http: httpx.AsyncClient, *, ttl: float, min_refetch: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url, self._http, self._ttl, self._min_refetch = url, http, ttl, min_refetch
        self._clock = clock
        self._keys: dict[str, jwt.PyJWK] | None = None
        self._fetched_at = float("-inf")
        self._lock = asyncio.Lock()
        self.fetches = 0

    async def key(self, kid: str) -> jwt.PyJWK | None:
        """The signing key ``kid``, or ``None`` when the provider does not publish it.
        Raises :class:`JwksUnavailable` when no key set was ever fetched."""
        keys = self._keys
        fresh = self._clock() - self._fetched_at < self._ttl
        if keys is not None and fresh and kid in keys:
            return keys[kid]
        async with self._lock:
            age = self._clock() - self._fetched_at
            stale = self._keys is None or age >= self._ttl
            missing = self._keys is not None and kid not in self._keys
            if stale or (missing and age >= self._min_refetch):
                await self._fetch()
        if self._keys is None:
            raise JwksUnavailable(f"no key set from {self.url} yet")
        return self._keys.get(kid)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _fetch(self) -> None:
        self.fetches += 1
        self._fetched_at = self._clock()
        try:
            resp = await self._http.get(self.url, headers={"Accept": "application/json"})
            resp.raise_for_status()
            keyset = jwt.PyJWKSet.from_dict(resp.json())
        except (httpx.HTTPError, ValueError, TypeError, AttributeError, jwt.PyJWTError) as exc:
            log.warning("JWKS %s: fetch failed (%s); keeping %d known keys", self.url,
                        exc.__class__.__name__, len(self._keys or {}))
            return
        self._keys = {k.key_id: k for k in keyset.keys
                      if k.key_id and k.public_key_use in (None, "sig")}
