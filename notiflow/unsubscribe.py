"""One-click unsubscribe (RFC 8058): the signed token of an email's unsubscribe link and the
``List-Unsubscribe`` headers (RFC 2369) that carry it.

A token is a JWT (HS256, PyJWT) naming the tenant, the recipient's hash (never the
address), the message's category and when the email was sent; ``POST
/unsubscribe/{token}`` opts that recipient out of that category on email. The signing key is
derived from each correlation key (``notiflow/correlation.py``: ``correlation_key``, else
``dlq_key``), so a rotation keeps the links already sent working while the old key is
listed.
"""

from __future__ import annotations

import email
import email.policy
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from typing import Final

from notiflow.correlation import CorrelationKeys
from notiflow.schemas.enums import Category, Channel, Tier
from notiflow.signed_tokens import sign, verified_claims

AUDIENCE: Final = "notiflow-unsubscribe"
_DERIVATION: Final = b"notiflow unsubscribe v1"
ONE_CLICK: Final = "List-Unsubscribe=One-Click"
"""The body a mailbox provider POSTs (RFC 8058), and the ``List-Unsubscribe-Post`` value."""
BULK_TIERS: Final = frozenset({Tier.P2, Tier.P3})


class InvalidToken(ValueError):
    """Not a token this platform issued, or one older than its ``max_age``."""


@dataclass(frozen=True, slots=True)
class Unsubscription:
    """What an unsubscribe link opts out: ``recipient_hash`` of ``tenant_id`` from
    ``category`` on email."""

    tenant_id: str
    recipient_hash: str
    category: Category
    issued_at: datetime


@dataclass(frozen=True, slots=True)
class UnsubscribeKeys:
    """The keys tokens are signed with (the first) and verified with (any)."""

    keys: tuple[bytes, ...]

    @classmethod
    def of(cls, correlation: CorrelationKeys) -> UnsubscribeKeys:
        return cls(correlation.derived(_DERIVATION))

    def issue(self, u: Unsubscription) -> str:
        return sign({"aud": AUDIENCE, "tid": u.tenant_id, "rh": u.recipient_hash,
                     "cat": u.category.value, "iat": int(u.issued_at.timestamp())}, self.keys)

    def verify(self, token: str, now: datetime, max_age: timedelta) -> Unsubscription:
        """The unsubscription of ``token``; :class:`InvalidToken` when no key signed it, a
        claim is missing or malformed, or it was issued more than ``max_age`` before
        ``now``."""
        claims = verified_claims(token, self.keys, AUDIENCE, ["iat"], InvalidToken)
        return _unsubscription(claims, now, max_age)


def _unsubscription(claims: dict[str, object], now: datetime,
                    max_age: timedelta) -> Unsubscription:
    try:
        issued = datetime.fromtimestamp(int(str(claims["iat"])), UTC)
        u = Unsubscription(str(claims["tid"]), str(claims["rh"]),
                           Category(str(claims["cat"])), issued)
    except (KeyError, ValueError, OverflowError):
        raise InvalidToken("claims are not an unsubscription") from None
    if now - issued > max_age:
        raise InvalidToken("the link has expired")
    return u


def wants_unsubscribe(channel: Channel, tier: Tier, category: Category) -> bool:
    """Whether an email carries the one-click headers: every P2/P3 and every marketing
    email."""
    return channel is Channel.EMAIL and (tier in BULK_TIERS or category is Category.MARKETING)


def list_unsubscribe(token: str, base_url: str, mailto: str | None
                     ) -> tuple[tuple[str, str], ...]:
    """``List-Unsubscribe`` (the https link, then the ``mailto:`` one when configured) and
    ``List-Unsubscribe-Post: List-Unsubscribe=One-Click``."""
    links = [f"<{base_url.rstrip('/')}/unsubscribe/{token}>"]
    if mailto is not None:
        links.append(f"<mailto:{mailto}?subject=unsubscribe%20{token}>")
    return (("List-Unsubscribe", ", ".join(links)), ("List-Unsubscribe-Post", ONE_CLICK))


_TOKEN: Final = re.compile(r"[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")
MAX_MAIL_TEXT: Final = 64 * 1024


def mailed_token(raw: bytes) -> str | None:
    """The unsubscribe token of a mail sent to the ``mailto:`` link: in its subject
    (``unsubscribe <token>``, as the link sets it), else in the first ``text/plain`` part
    (a client that dropped the subject); None when it has none. Never raises."""
    try:
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        found = _TOKEN.search(str(msg.get("Subject") or ""))
        if found is None and isinstance(msg, EmailMessage):
            part = msg.get_body(preferencelist=("plain",))
            text = part.get_content() if part is not None else ""
            found = _TOKEN.search(str(text)[:MAX_MAIL_TEXT])
    except Exception:
        return None
    return found.group(0) if found else None
