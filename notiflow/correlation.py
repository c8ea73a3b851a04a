"""Keyed correlation tags: what makes the ids and addresses the platform hands out and later
reads back (SMTP bounce addresses, campaign row and schedule occurrence message ids)
impossible to mint from outside.

A tag is HMAC-SHA-256 under the platform's correlation key over the tagged parts, cut to 64
bits and written as 13 lowercase base32 characters (safe in message ids and in the local part
of an address, which mail systems may lower-case). The key is ``correlation_key`` (several,
comma separated, during a rotation: the first tags, every one verifies); unset, one key is
derived from each ``dlq_key`` (which every flow process already requires), so rotating the
DLQ key keeps the old tags valid for as long as the old DLQ key is listed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from typing import Final

from notiflow.settings import Settings

TAG_LENGTH: Final = 13
"""Characters of a tag: 13 base32 characters, the first 64 bits of the HMAC (and one bit)."""
MAX_LENGTH: Final = 51
"""Longest tag :meth:`CorrelationKeys.tags_each` makes: 255 of the HMAC's 256 bits."""
_DERIVATION: Final = b"notiflow correlation key v1"
_SEPARATOR: Final = b"\x1f"


class CorrelationKeyMissing(RuntimeError):
    """Neither ``correlation_key`` nor ``dlq_key`` is configured."""


@dataclass(frozen=True, slots=True)
class CorrelationKeys:
    """The keys tags are made (the first) and checked (any) with."""

    keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.keys or any(len(k) < 16 for k in self.keys):
            raise ValueError("correlation keys must be at least 16 bytes each")

    @classmethod
    def from_settings(cls, settings: Settings) -> CorrelationKeys:
        """``correlation_key``'s keys, else one derived from each ``dlq_key``;
        :class:`CorrelationKeyMissing` when neither is set."""
        if settings.correlation_key is not None:
            given = settings.correlation_key.get_secret_value()
            return cls(tuple(k.strip().encode() for k in given.split(",") if k.strip()))
        if settings.dlq_key is not None:
            return cls(tuple(
                hmac.new(k.strip().encode(), _DERIVATION, hashlib.sha256).digest()
                for k in settings.dlq_key.get_secret_value().split(",") if k.strip()))
        raise CorrelationKeyMissing("NOTIFLOW_CORRELATION_KEY (or NOTIFLOW_DLQ_KEY) is not set")

    def derived(self, label: bytes) -> tuple[bytes, ...]:
        """One key per correlation key for another use, named by ``label`` (HMAC-SHA-256 of
        the label): the current one first, so a rotation carries over."""
        return tuple(hmac.new(k, label, hashlib.sha256).digest() for k in self.keys)

    def tag(self, *parts: str) -> str:
        """The tag of ``parts`` under the current key."""
        return _tag(self.keys[0], parts)

    def tags_each(self, *parts: str, length: int = TAG_LENGTH) -> tuple[str, ...]:
        """The ``length``-character tag (at most :data:`MAX_LENGTH`) of ``parts`` under each
        key, the current key's first: a keyed id made again after a rotation, or looked up
        under every key that may have made it."""
        return tuple(_tag(k, parts, length) for k in self.keys)

    def valid(self, tag: str, *parts: str) -> bool:
        """True when ``tag`` is the tag of ``parts`` under one of the keys (constant time per
        key)."""
        given = tag.lower().encode()
        return any(hmac.compare_digest(_tag(k, parts).encode(), given) for k in self.keys)


def _tag(key: bytes, parts: tuple[str, ...], length: int = TAG_LENGTH) -> str:
    if not 1 <= length <= MAX_LENGTH:
        raise ValueError(f"a tag has 1 to {MAX_LENGTH} characters")
    digest = hmac.new(key, _SEPARATOR.join(p.encode() for p in parts), hashlib.sha256).digest()
    return base64.b32encode(digest).decode().lower()[:length]
