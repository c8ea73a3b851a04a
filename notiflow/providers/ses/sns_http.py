"""What the SNS receiver asks of the network: signing certificates, cached, and the
subscription confirmation.

Certificates are fetched when first needed and kept for ``ttl`` (SNS rotates them rarely and
names each by a new URL); concurrent misses of one URL share one fetch; at most
``max_entries`` URLs are kept (the oldest goes first). Only URLs ``sns.check_url`` accepted
are ever fetched: the caller checks first.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable

import httpx
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa

from notiflow.adapters.providers.webhook import WebhookRefused

MAX_CERT_BYTES = 16 * 1024


class SnsUnreachable(RuntimeError):
    """A certificate could not be fetched, or the confirmation was not taken: the post is
    answered ``503`` and SNS delivers it again."""


class SnsCertificates:
    """The RSA public keys of SNS signing certificates, by URL."""

    def __init__(self, http: httpx.AsyncClient, *, ttl: float, max_entries: int = 32,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._http, self._ttl, self._max, self._clock = http, ttl, max_entries, clock
        self._keys: OrderedDict[str, tuple[float, rsa.RSAPublicKey]] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self.fetches = 0

    async def public_key(self, url: str) -> rsa.RSAPublicKey:
        """The key of the certificate at ``url``; :class:`SnsUnreachable` when it cannot be
        fetched, :class:`WebhookRefused` when it is not an RSA certificate."""
        cached = self._fresh(url)
        if cached is not None:
            return cached
        lock = self._locks.setdefault(url, asyncio.Lock())
        try:
            async with lock:
                cached = self._fresh(url)
                if cached is None:
                    cached = await self._fetch(url)
                    self._keys[url] = (self._clock(), cached)
                    while len(self._keys) > self._max:
                        self._keys.popitem(last=False)
        finally:
            if not lock.locked():
                self._locks.pop(url, None)
        return cached

    def _fresh(self, url: str) -> rsa.RSAPublicKey | None:
        entry = self._keys.get(url)
        if entry is None or self._clock() - entry[0] >= self._ttl:
            return None
        return entry[1]

    async def _get(self, url: str, what: str) -> httpx.Response:
        """SNS's ``200`` answer to a GET of ``url``; :class:`SnsUnreachable` otherwise."""
        try:
            resp = await self._http.get(url)
        except httpx.HTTPError as exc:
            raise SnsUnreachable(f"{what}: {type(exc).__name__}") from None
        if resp.status_code != 200:
            raise SnsUnreachable(f"{what}: HTTP {resp.status_code}")
        return resp

    async def _fetch(self, url: str) -> rsa.RSAPublicKey:
        self.fetches += 1
        resp = await self._get(url, "signing certificate")
        if len(resp.content) > MAX_CERT_BYTES:
            raise WebhookRefused("invalid_signature", "the signing certificate is too large")
        try:
            key = x509.load_pem_x509_certificate(resp.content).public_key()
        except ValueError:
            raise WebhookRefused("invalid_signature", "the signing certificate does not "
                                                      "parse") from None
        if not isinstance(key, rsa.RSAPublicKey):
            raise WebhookRefused("invalid_signature", "the signing certificate's key is not "
                                                      "RSA")
        return key

    async def confirm(self, subscribe_url: str) -> None:
        """Visit a checked ``SubscribeURL`` (SNS's ``ConfirmSubscription``);
        :class:`SnsUnreachable` unless SNS answers ``200``."""
        await self._get(subscribe_url, "subscription confirmation")

    async def aclose(self) -> None:
        await self._http.aclose()
