"""Recipient redaction for logs, traces, status rows and DLQ listings, and the keyed
pseudonymous recipient hash.

:func:`recipient_hash` is HMAC-SHA-256 under the platform's recipient hash key over the tenant
and the recipient key, cut to 128 bits (32 hex characters): without the key a stored hash
cannot be matched to a phone number or address by enumerating candidates. The key is
``recipient_hash_key`` (several, comma separated, during a rotation: the first hashes,
:func:`recipient_hashes` gives every one's, plus the unkeyed SHA-256 of earlier releases while
``recipient_hash_legacy`` is on); unset, one key is derived from each ``dlq_key``. A process
takes its keys from :func:`configure` (the API does it when it builds its app), else from
``load_settings()`` at the first hash.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from dataclasses import dataclass
from typing import Final

from notiflow.settings import Settings, load_settings

HASH_LENGTH: Final = 32
"""Hex characters of a recipient hash (128 bits)."""
MIN_KEY_BYTES: Final = 16
_DERIVATION: Final = b"notiflow recipient hash key v1"
_SEPARATOR: Final = "\x1f"


class RecipientHashKeyMissing(RuntimeError):
    """Neither ``recipient_hash_key`` nor ``dlq_key`` is configured."""


def legacy_hash(tenant_id: str, recipient_key: str) -> str:
    """The unkeyed SHA-256 recipient hash of earlier releases (enumerable: looked up only
    during a migration window, never written)."""
    return hashlib.sha256(f"{tenant_id}{_SEPARATOR}{recipient_key}".encode()).hexdigest()[
        :HASH_LENGTH]


@dataclass(frozen=True, slots=True)
class RecipientHasher:
    """The keys recipient hashes are written with (the first) and looked up by (each, then
    the legacy unkeyed hash when ``legacy``)."""

    keys: tuple[bytes, ...]
    legacy: bool = False

    def __post_init__(self) -> None:
        if not self.keys or any(len(k) < MIN_KEY_BYTES for k in self.keys):
            raise ValueError(f"recipient hash keys must be at least {MIN_KEY_BYTES} bytes each")

    @classmethod
    def from_settings(cls, settings: Settings) -> RecipientHasher:
        """``recipient_hash_key``'s keys, else (unset or blank) one derived from each
        ``dlq_key``; :class:`RecipientHashKeyMissing` when neither is set."""
        legacy = settings.recipient_hash_legacy
        given = settings.recipient_hash_key.get_secret_value() \
            if settings.recipient_hash_key is not None else ""
        if given.strip():
            return cls(tuple(k.strip().encode() for k in given.split(",") if k.strip()), legacy)
        if settings.dlq_key is not None:
            return cls(tuple(
                hmac.new(k.strip().encode(), _DERIVATION, hashlib.sha256).digest()
                for k in settings.dlq_key.get_secret_value().split(",") if k.strip()), legacy)
        raise RecipientHashKeyMissing(
            "NOTIFLOW_RECIPIENT_HASH_KEY (or NOTIFLOW_DLQ_KEY) is not set")

    def hash(self, tenant_id: str, recipient_key: str) -> str:
        """The hash written for a recipient of a tenant (the first key's)."""
        return _keyed(self.keys[0], tenant_id, recipient_key)

    def candidates(self, tenant_id: str, recipient_key: str) -> tuple[str, ...]:
        """Every hash the recipient may be stored under: the first key's first, then the
        other keys', then the legacy hash when ``legacy``; no repeats."""
        found = [_keyed(k, tenant_id, recipient_key) for k in self.keys]
        if self.legacy:
            found.append(legacy_hash(tenant_id, recipient_key))
        return tuple(dict.fromkeys(found))

    def digest(self, data: bytes) -> str:
        """HMAC-SHA-256 (hex) of ``data`` under the first key: for other values that hold a
        recipient (a content fingerprint, a request's hash) and must not be matched by
        enumeration."""
        return hmac.new(self.keys[0], data, hashlib.sha256).hexdigest()

    def digests(self, data: bytes) -> tuple[str, ...]:
        """Every form :meth:`digest` of ``data`` may have been stored in: the first key's
        first, then the other keys', then the unkeyed SHA-256 of earlier releases when
        ``legacy``; no repeats."""
        found = [hmac.new(k, data, hashlib.sha256).hexdigest() for k in self.keys]
        if self.legacy:
            found.append(hashlib.sha256(data).hexdigest())
        return tuple(dict.fromkeys(found))


def _keyed(key: bytes, tenant_id: str, recipient_key: str) -> str:
    message = f"{tenant_id}{_SEPARATOR}{recipient_key}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:HASH_LENGTH]


_lock = threading.Lock()
_hasher: RecipientHasher | None = None


def configure(settings: Settings) -> RecipientHasher:
    """Hash with ``settings``' keys in this process from now on (raises
    :class:`RecipientHashKeyMissing` when it has none)."""
    configured = RecipientHasher.from_settings(settings)
    use(configured)
    return configured


def use(hasher: RecipientHasher | None) -> RecipientHasher | None:
    """Hash with ``hasher`` in this process from now on (None: from ``load_settings()`` at
    the next hash); returns it."""
    global _hasher
    with _lock:
        _hasher = hasher
    return hasher


def hasher() -> RecipientHasher:
    """The hasher of this process (:func:`configure`, else from ``load_settings()``)."""
    global _hasher
    current = _hasher
    if current is None:
        with _lock:
            current = _hasher = _hasher or RecipientHasher.from_settings(load_settings())
    return current


def recipient_hash(tenant_id: str, recipient_key: str) -> str:
    """Stable pseudonymous id of a recipient within a tenant: keyed, so not reversible by
    enumeration without the key; still personal data."""
    return hasher().hash(tenant_id, recipient_key)


def user_recipient_key(user_id: str) -> str:
    """A user as a recipient key (``user:<id>``): hashed like an address."""
    return f"user:{user_id}"


def user_hash(tenant_id: str, user_id: str) -> str:
    """The keyed hash of a user (:func:`user_recipient_key`): what their messages are counted under
    (caps) and their own preferences are stored under; never reversible."""
    return recipient_hash(tenant_id, user_recipient_key(user_id))


def recipient_hashes(tenant_id: str, recipient_key: str) -> tuple[str, ...]:
    """Every hash a recipient's stored state may be under, :func:`recipient_hash` first."""
    return hasher().candidates(tenant_id, recipient_key)


def mask(recipient_key: str) -> str:
    """Human-readable but redacted form: ``+4179*****67``, ``j***@example.com``, ``ios:ab12…9f``,
    ``https://hooks.slack.com/…`` (a webhook URL is a credential: only its origin shows)."""
    if "://" in recipient_key:
        scheme, _, rest = recipient_key.partition("://")
        host = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
        return f"{scheme}://{host}/…"
    if "@" in recipient_key:
        local, _, domain = recipient_key.partition("@")
        return f"{local[:1]}***@{domain}"
    if recipient_key.startswith("+"):
        keep = recipient_key[:5]
        return f"{keep}{'*' * max(len(recipient_key) - 7, 1)}{recipient_key[-2:]}"
    platform, _, token = recipient_key.rpartition(":")
    prefix = f"{platform}:" if platform else ""
    return f"{prefix}{token[:4]}…{token[-2:]}"
