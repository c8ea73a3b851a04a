"""VERP bounce addresses: the envelope sender (``Return-Path``) of each SMTP attempt names the
attempt and carries a keyed tag, ``local+{message_id}.{attempt}.{tag}@domain`` from
``smtp.from_email`` ``local@domain``; a bounce is correlated only by such an address with a
valid tag (:mod:`notiflow.correlation`), never by what the bounce itself says about the
message (headers, ``ENVID``, queue ids are the bouncer's to write). Pure.

The relay must deliver ``local+anything@domain`` to the bounce pipe (Postfix:
``recipient_delimiter = +``). The local part is longer than RFC 5321's 64 octets for long
message ids; relays and receiving servers accept it in practice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from notiflow.correlation import TAG_LENGTH, CorrelationKeys
from notiflow.schemas.status import MAX_ATTEMPT

PURPOSE: Final = "smtp-bounce"
_VERP: Final = re.compile(rf"[^@\s+]*\+([A-Za-z0-9_-]{{1,64}})\.([0-9]{{1,5}})\."
                          rf"([a-z2-7]{{{TAG_LENGTH}}})@[^@\s]+", re.IGNORECASE)
_ANGLE: Final = re.compile(r"<([^<>\s]+)>")


def bounce_address(keys: CorrelationKeys, from_email: str, message_id: str,
                   attempt: int) -> str:
    """The envelope sender of one attempt."""
    local, _, domain = from_email.rpartition("@")
    tag = keys.tag(PURPOSE, message_id, str(attempt))
    return f"{local}+{message_id}.{attempt}.{tag}@{domain}"


def attempt_of(keys: CorrelationKeys, address: str) -> tuple[str, int] | None:
    """``(message_id, attempt)`` of a bounce address whose tag is valid; None otherwise (not
    a bounce address, or a tag the keys did not make)."""
    found = _VERP.fullmatch(address.strip())
    if found is None:
        return None
    message_id, attempt, tag = found.group(1), int(found.group(2)), found.group(3)
    if not 1 <= attempt <= MAX_ATTEMPT or not keys.valid(tag, PURPOSE, message_id,
                                                         str(attempt)):
        return None
    return message_id, attempt


def first_attempt(keys: CorrelationKeys, candidates: Iterable[str | None]
                  ) -> tuple[str, int] | None:
    """The attempt of the first valid bounce address among ``candidates`` (header values:
    bare or in angle brackets, several comma separated)."""
    for value in candidates:
        if not value:
            continue
        addresses = _ANGLE.findall(value) or [a for a in value.split(",") if a.strip()]
        for address in addresses:
            if (found := attempt_of(keys, address)) is not None:
                return found
    return None
