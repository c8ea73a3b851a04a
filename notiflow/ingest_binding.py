"""Ingest records bound to the tenant that may send them.

A record written to an ``ingest.<channel>.<tier>`` topic (or to ``notify.delayed``) carries a
Kafka header::

    nf-binding: v1.<kid>.<mac>

``mac`` is HMAC-SHA-256 (URL-safe base64, unpadded) over ``nf-binding v1``, the channel and
the tier the record is written for, and the exact value bytes; ``kid`` names the key (the
first 8 characters of a keyed fingerprint of the key itself, so nobody has to name keys).

A record is **bound** when its MAC verifies under a platform key (every writer of the
platform signs with one: the API, the scheduler, the campaign expander, recurring schedules,
the send flows' retries, ``notiflow dlq replay``) or under one of the ``ingest_keys`` of the
tenant its ``tenant_id`` names (a direct producer signs with its tenant's key). Any other
record is refused: no header while binding is required, a header that does not parse, a key
nobody configured, another tenant's key, or a MAC that does not match the bytes.

Everything here is pure (``hmac``/``hashlib`` over bytes); :class:`Binder` is the interface
the parse step and the writers use, :class:`HmacBinder` its one implementation.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, Protocol

if TYPE_CHECKING:
    from notiflow.settings import Settings

HEADER: Final = "nf-binding"
"""The Kafka header that carries a record's binding."""
VERSION: Final = "v1"
MIN_KEY_BYTES: Final = 32
"""Shortest key accepted, platform or tenant (bytes of its UTF-8 text)."""
_DOMAIN: Final = b"nf-binding v1"
_KID_DOMAIN: Final = b"nf-binding kid"
_DERIVATION: Final = b"notiflow ingest binding key v1"
_SEP: Final = b"\x1f"
_MAC_CHARS: Final = 43

Refusal = Literal["unsigned", "malformed", "unknown_key", "other_tenant", "mismatch"]
"""Why a record is not bound (the bounded ``reason`` of ``notiflow.ingest.claims_refused``)."""
Headers = Sequence[tuple[str, bytes | None]]


class BindingKeyMissing(RuntimeError):
    """Binding is required but no platform key is configured (nor ``dlq_key`` to derive
    one from)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def key_id(key: bytes) -> str:
    """The public id of ``key``: 8 URL-safe characters of a keyed fingerprint."""
    return _b64(hmac.new(key, _KID_DOMAIN, hashlib.sha256).digest())[:8]


def mac(key: bytes, channel: str, tier: str, value: bytes) -> bytes:
    """HMAC-SHA-256 of a record's value for ``channel``/``tier`` (upper case) under ``key``."""
    return hmac.digest(key, _SEP.join((_DOMAIN, channel.upper().encode(),
                                       tier.upper().encode(), value)), "sha256")


@dataclass(frozen=True, slots=True)
class Signer:
    """Signs records with one key: what a direct producer holds (its tenant's key) and what
    each platform writer holds (the platform key)."""

    key: bytes
    kid: str

    @classmethod
    def of(cls, secret: str | bytes) -> Signer:
        """A signer for ``secret`` (at least :data:`MIN_KEY_BYTES` bytes)."""
        key = secret.encode() if isinstance(secret, str) else secret
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"an ingest binding key has at least {MIN_KEY_BYTES} bytes")
        return cls(key, key_id(key))

    def header(self, channel: str, tier: str, value: bytes) -> tuple[str, bytes]:
        """The ``nf-binding`` header of ``value`` written for ``channel``/``tier``."""
        tag = _b64(mac(self.key, channel, tier, value))
        return HEADER, f"{VERSION}.{self.kid}.{tag}".encode()

    def headers(self, headers: Iterable[tuple[str, bytes | None]], channel: str, tier: str,
                value: bytes) -> list[tuple[str, bytes]]:
        """``headers`` without any earlier binding (nor empty ones), plus this signer's
        binding of ``value``."""
        kept = _others(headers)
        kept.append(self.header(channel, tier, value))
        return kept


def _others(headers: Iterable[tuple[str, bytes | None]]) -> list[tuple[str, bytes]]:
    return [(k, v) for k, v in headers if k != HEADER and v is not None]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of a check: ``by`` is ``platform`` or ``tenant`` when bound, else None
    and ``refusal`` says why; ``signer`` names the tenant whose key verified a record that
    claims another tenant."""

    by: Literal["platform", "tenant", "unchecked"] | None
    refusal: Refusal | None = None
    signer: str | None = None

    @property
    def bound(self) -> bool:
        return self.by is not None


PLATFORM: Final = Verdict("platform")
TENANT: Final = Verdict("tenant")
UNCHECKED: Final = Verdict("unchecked")
"""An unsigned record let through because binding is not required."""


class Binder(Protocol):
    """What the parse step and the platform writers need of a binding scheme."""

    required: bool

    def check(self, claimed_tenant: str | None, channel: str, tier: str, value: bytes,
              headers: Headers | None) -> Verdict:
        """Whether ``value`` (read for ``channel``/``tier``) is bound to ``claimed_tenant``."""
        ...

    def sign(self, headers: Iterable[tuple[str, bytes | None]], channel: str, tier: str,
             value: bytes) -> list[tuple[str, bytes]]:
        """``headers`` with the platform's binding of ``value`` (in place of any other)."""
        ...


def _split(raw: bytes) -> tuple[str, bytes] | None:
    try:
        version, kid, tag = raw.decode("ascii").split(".")
        if version != VERSION or len(tag) != _MAC_CHARS:
            return None
        return kid, base64.urlsafe_b64decode(tag + "=")
    except (UnicodeDecodeError, ValueError, binascii.Error):
        return None


def binding_of(headers: Headers | None) -> bytes | None:
    """The value of the ``nf-binding`` header (the last one, as Kafka clients read it)."""
    found = None
    for name, value in headers or ():
        if name == HEADER:
            found = value
    return found


class HmacBinder:
    """:class:`Binder` with HMAC-SHA-256 keys: the platform's (the first signs, every one
    verifies) and each tenant's ``ingest_keys`` (every listed one verifies)."""

    def __init__(self, platform: Sequence[bytes], tenants: Mapping[str, Sequence[bytes]], *,
                 required: bool) -> None:
        self.required = required
        self._platform = {key_id(k): k for k in platform}
        self._signer = Signer(platform[0], key_id(platform[0])) if platform else None
        self._tenant_keys: dict[tuple[str, str], bytes] = {}
        self._owner: dict[str, str] = {}
        for tenant, keys in tenants.items():
            for k in keys:
                kid = key_id(k)
                self._tenant_keys[(tenant, kid)] = k
                self._owner.setdefault(kid, tenant)
        if required and self._signer is None:
            raise BindingKeyMissing("ingest_binding.required needs a platform key: set "
                                    "NOTIFLOW_INGEST_BINDING__KEYS (or NOTIFLOW_DLQ_KEY)")

    @property
    def signer(self) -> Signer | None:
        """The platform's signer (None: no platform key, records go unsigned)."""
        return self._signer

    def check(self, claimed_tenant: str | None, channel: str, tier: str, value: bytes,
              headers: Headers | None) -> Verdict:
        raw = binding_of(headers)
        if raw is None:
            return Verdict(None, "unsigned") if self.required else UNCHECKED
        parts = _split(raw)
        if parts is None:
            return Verdict(None, "malformed")
        kid, tag = parts
        key = self._platform.get(kid)
        by: Literal["platform", "tenant"] = "platform"
        if key is None and claimed_tenant is not None:
            key, by = self._tenant_keys.get((claimed_tenant, kid)), "tenant"
        if key is None:
            owner = self._owner.get(kid)
            if owner is None:
                return Verdict(None, "unknown_key")
            other = self._tenant_keys[(owner, kid)]
            proven = hmac.compare_digest(mac(other, channel, tier, value), tag)
            return Verdict(None, "other_tenant" if proven else "mismatch",
                           owner if proven else None)
        if not hmac.compare_digest(mac(key, channel, tier, value), tag):
            return Verdict(None, "mismatch")
        return PLATFORM if by == "platform" else TENANT

    def sign(self, headers: Iterable[tuple[str, bytes | None]], channel: str, tier: str,
             value: bytes) -> list[tuple[str, bytes]]:
        if self._signer is None:
            return _others(headers)
        return self._signer.headers(headers, channel, tier, value)


def claimed_target(doc: Mapping[str, object]) -> tuple[str, str]:
    """The channel and tier a record names for itself (where its topic names none: the
    shared topic, ``notify.delayed``)."""
    channel, tier = doc.get("channel"), doc.get("tier")
    return (channel if isinstance(channel, str) else "",
            tier if isinstance(tier, str) else "")


_EXPLANATIONS: Final[Mapping[Refusal, str]] = {
    "unsigned": f"no {HEADER} header (ingest_binding.required)",
    "malformed": f"the {HEADER} header is not {VERSION}.<kid>.<mac>",
    "unknown_key": "signed with a key neither the platform nor that tenant has",
    "mismatch": "the MAC does not match the record's bytes, channel and tier",
}


def explain(verdict: Verdict, claimed: str | None) -> str:
    """The dead letter's reason for a refused record (the claim cut to 64 characters)."""
    who = repr(claimed[:64]) if claimed is not None else "(none)"
    if verdict.refusal == "other_tenant":
        why = f"signed with a key of tenant {verdict.signer!r}"
    else:
        why = _EXPLANATIONS.get(verdict.refusal or "mismatch", "not bound")
    return f"record not bound to the tenant it names, {who}: {why}"


def platform_keys(secret: str | None, dlq_keys: str | None) -> tuple[bytes, ...]:
    """The platform keys: each listed in ``secret`` (comma separated, the first signs), else
    one derived from each DLQ key, else none."""
    if secret:
        keys = tuple(k.strip().encode() for k in secret.split(",") if k.strip())
        short = [i for i, k in enumerate(keys) if len(k) < MIN_KEY_BYTES]
        if short:
            raise ValueError(f"ingest_binding.keys[{short[0]}] must have at least "
                             f"{MIN_KEY_BYTES} bytes")
        return keys
    if dlq_keys:
        return tuple(hmac.new(k.strip().encode(), _DERIVATION, hashlib.sha256).digest()
                     for k in dlq_keys.split(",") if k.strip())
    return ()


def tenant_signer(settings: Settings, tenant_id: str) -> Signer | None:
    """A signer with the first ``ingest_keys`` entry of ``tenant_id`` (what the tenant's
    direct producers hold); None when it has none."""
    tenant = settings.tenant(tenant_id)
    if tenant is None or not tenant.ingest_keys:
        return None
    return Signer.of(tenant.ingest_keys[0].get_secret_value())


_last: list[tuple[Settings, HmacBinder]] = []


def binder(settings: Settings) -> HmacBinder:
    """The process's binder for ``settings`` (one per configuration; the last settings
    object asked for is answered without rebuilding anything)."""
    if _last and _last[0][0] is settings:
        return _last[0][1]
    found = _binder_of(settings)
    _last[:] = [(settings, found)]
    return found


def _binder_of(settings: Settings) -> HmacBinder:
    rule = settings.ingest_binding
    required = (settings.environment != "development" if rule.required is None
                else rule.required)
    tenants = tuple((t.id, tuple(k.get_secret_value() for k in t.ingest_keys))
                    for t in settings.tenants)
    return _binder(rule.keys.get_secret_value() if rule.keys else None,
                   settings.dlq_key.get_secret_value() if settings.dlq_key else None,
                   tenants, required)


@functools.lru_cache(maxsize=8)
def _binder(secret: str | None, dlq_keys: str | None,
            tenants: tuple[tuple[str, tuple[str, ...]], ...], required: bool) -> HmacBinder:
    return HmacBinder(platform_keys(secret, dlq_keys),
                      {tid: [k.encode() for k in keys] for tid, keys in tenants},
                      required=required)
