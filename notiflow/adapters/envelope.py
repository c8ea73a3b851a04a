"""Envelope encryption of the recipient and variables of ingest records.

A sealed record carries, instead of ``recipient`` and ``variables``, one field::

    "sealed": "v1.<kid>.<wrapped data key>.<nonce + ciphertext>"   (URL-safe base64 parts)

The ciphertext is AES-256-GCM of ``{"recipient": ..., "variables": ...}`` under a data key,
with the record's tenant and message id as associated data (a sealed pair moved into another
tenant's or message's record does not open). The data key is AES-256-GCM-wrapped by the
key-encryption key ``kid`` of ``NOTIFLOW_INGEST_ENCRYPTION__KEYS``. A process draws a data key,
seals with it for ``data_key_ttl`` and then draws the next, so a record costs one AES-GCM
operation, not two; an opener keeps the data keys it has unwrapped. Every other field stays
in clear: routing, ordering, scheduling and operators' tools read them without the key.

:func:`dump` and :func:`load` are the only ways notiflow writes and reads ingest payloads.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from notiflow.schemas.messages import IngestRecord
from notiflow.settings import IngestEncryption, Settings

VERSION = "v1"
SEALED = "sealed"
FIELDS = ("recipient", "variables")
NONCE = 12
KEY_BYTES = 32
_KID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_OPENED_CACHE = 1024


class EnvelopeError(ValueError):
    """A sealed record that does not open (unknown key, tampered, or no key configured)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parse_keys(text: str) -> list[tuple[str, bytes]]:
    """``kid:key,kid:key`` → ``[(kid, 32 bytes)]``; ``ValueError`` naming what is wrong."""
    keys: list[tuple[str, bytes]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        kid, sep, encoded = part.partition(":")
        if not sep or not _KID.fullmatch(kid):
            raise ValueError("each ingest key is kid:base64 with kid of [A-Za-z0-9_-]{1,32}")
        try:
            key = _unb64(encoded)
        except ValueError:
            raise ValueError(f"ingest key {kid!r} is not base64") from None
        if len(key) != KEY_BYTES:
            raise ValueError(f"ingest key {kid!r} is {len(key)} bytes, not {KEY_BYTES}")
        if kid in dict(keys):
            raise ValueError(f"ingest key id {kid!r} is listed twice")
        keys.append((kid, key))
    if not keys:
        raise ValueError("no ingest key listed")
    return keys


def new_key(kid: str) -> str:
    """A fresh ``kid:key`` entry for ``NOTIFLOW_INGEST_ENCRYPTION__KEYS``."""
    return f"{kid}:{_b64(os.urandom(KEY_BYTES))}"


def _aad(doc: Mapping[str, Any]) -> bytes:
    return f"{doc.get('tenant_id') or ''}\0{doc.get('message_id') or ''}".encode()


class Envelope:
    """Seals and opens the private fields of ingest documents (JSON objects)."""

    def __init__(self, keys: Sequence[tuple[str, bytes]], *, data_key_ttl_s: float = 300.0,
                 required: bool = False, clock: Callable[[], float] = time.monotonic,
                 urandom: Callable[[int], bytes] = os.urandom) -> None:
        self._keks = {kid: AESGCM(key) for kid, key in keys}
        self._kid = keys[0][0]
        self.data_key_ttl_s, self.required = data_key_ttl_s, required
        self.clock, self.urandom = clock, urandom
        self._sealing: tuple[float, AESGCM, str] | None = None
        self._opened: dict[str, AESGCM] = {}

    def _data_key(self) -> tuple[AESGCM, str]:
        now = self.clock()
        current = self._sealing
        if current is None or now - current[0] >= self.data_key_ttl_s:
            dek, nonce = self.urandom(KEY_BYTES), self.urandom(NONCE)
            wrapped = nonce + self._keks[self._kid].encrypt(nonce, dek, self._kid.encode())
            current = (now, AESGCM(dek), f"{self._kid}.{_b64(wrapped)}")
            self._sealing = current
        return current[1], current[2]

    def seal(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``doc`` with its recipient and variables replaced by ``sealed`` (a new dict; one
        that is sealed already is returned as it is)."""
        if SEALED in doc:
            return doc
        private = {k: doc[k] for k in FIELDS if k in doc}
        cipher, header = self._data_key()
        nonce = self.urandom(NONCE)
        body = nonce + cipher.encrypt(nonce, orjson.dumps(private), _aad(doc))
        out = {k: v for k, v in doc.items() if k not in FIELDS}
        out[SEALED] = f"{VERSION}.{header}.{_b64(body)}"
        return out

    def open(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``doc`` with ``sealed`` replaced by the recipient and variables it holds;
        :class:`EnvelopeError` when it does not open, or when ``doc`` is in clear and
        sealing is required."""
        sealed = doc.get(SEALED)
        if sealed is None:
            if self.required:
                raise EnvelopeError("recipient and variables must be sealed "
                                    "(ingest_encryption.required)")
            return doc
        return _opened(doc, self._cipher_of(sealed), sealed)

    def _cipher_of(self, sealed: object) -> AESGCM:
        if not isinstance(sealed, str):
            raise EnvelopeError("sealed is not a string")
        parts = sealed.split(".")
        if len(parts) != 4 or parts[0] != VERSION:
            raise EnvelopeError("sealed is not v1.<kid>.<key>.<ciphertext>")
        handle = f"{parts[1]}.{parts[2]}"
        cipher = self._opened.get(handle)
        if cipher is not None:
            return cipher
        kek = self._keks.get(parts[1])
        if kek is None:
            raise EnvelopeError(f"sealed under unknown key {parts[1]!r}")
        try:
            wrapped = _unb64(parts[2])
            dek = kek.decrypt(wrapped[:NONCE], wrapped[NONCE:], parts[1].encode())
        except (ValueError, InvalidTag):
            raise EnvelopeError("the sealed data key does not open") from None
        if len(self._opened) >= _OPENED_CACHE:
            self._opened.clear()
        cipher = self._opened[handle] = AESGCM(dek)
        return cipher


def _opened(doc: dict[str, Any], cipher: AESGCM, sealed: str) -> dict[str, Any]:
    try:
        body = _unb64(sealed.rsplit(".", 1)[1])
        private = orjson.loads(cipher.decrypt(body[:NONCE], body[NONCE:], _aad(doc)))
    except (ValueError, InvalidTag, orjson.JSONDecodeError):
        raise EnvelopeError("sealed fields do not open (tampered, or moved from another "
                            "record)") from None
    if not isinstance(private, dict) or set(private) - set(FIELDS):
        raise EnvelopeError("sealed fields are not recipient and variables")
    out = {k: v for k, v in doc.items() if k != SEALED}
    out.update(private)
    return out


class Clear:
    """No keys configured: records are written in clear; a sealed one does not open."""

    required = False

    def seal(self, doc: dict[str, Any]) -> dict[str, Any]:
        return doc

    def open(self, doc: dict[str, Any]) -> dict[str, Any]:
        if SEALED in doc:
            raise EnvelopeError("the record is sealed and no ingest key is configured "
                                "(NOTIFLOW_INGEST_ENCRYPTION__KEYS)")
        return doc


Sealer = Envelope | Clear


@functools.lru_cache(maxsize=8)
def _for_rule(rule: IngestEncryption) -> Sealer:
    if rule.keys is None:
        return Clear()
    return Envelope(parse_keys(rule.keys.get_secret_value()),
                    data_key_ttl_s=rule.data_key_ttl.total_seconds(), required=rule.required)


def envelope(settings: Settings) -> Sealer:
    """The process's sealer for ``settings.ingest_encryption`` (one per configuration)."""
    return _for_rule(settings.ingest_encryption)


def dump(record: IngestRecord, sealer: Sealer) -> str:
    """The ingest payload of ``record``: JSON without nulls, recipient and variables
    sealed when keys are configured."""
    if isinstance(sealer, Clear):
        return record.model_dump_json(exclude_none=True)
    doc = record.model_dump(mode="json", exclude_none=True)
    return orjson.dumps(sealer.seal(doc)).decode()


def load(payload: bytes | str, sealer: Sealer) -> IngestRecord:
    """The record of an ingest payload, opened; ``ValueError`` (pydantic's
    ``ValidationError``, :class:`EnvelopeError`, a JSON error) when it is not one."""
    doc = orjson.loads(payload)
    if not isinstance(doc, dict):
        raise ValueError("an ingest payload is a JSON object")
    return IngestRecord.model_validate(sealer.open(doc))
