"""Inbound SMS keywords (pure): which consent change a text a person sends to one of the
platform's numbers asks for, and which tenants' recipients it changes.

A text whose whole body, trimmed and without trailing ``.`` or ``!``, is one of
:data:`STOP_WORDS` (any case) stops SMS from the number it was sent to; one of
:data:`START_WORDS` undoes that; one of :data:`HELP_WORDS` asks who is writing. Any other
text is no keyword: the platform takes it and changes nothing. A provider that recognised a
keyword itself (Twilio's ``OptOutType``) is believed.

A number is a tenant's when its ``senders`` name it; a provider account's own number (the
sender of every message that names none) is every SMS tenant's, so STOP to it stops them
all, as the carrier does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from notiflow.schemas.enums import Channel
from notiflow.settings.rendering import SmsReplies
from notiflow.settings.tenants import TenantConfig


class Keyword(StrEnum):
    STOP = "STOP"
    START = "START"
    HELP = "HELP"


STOP_WORDS: Final = frozenset({"STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT",
                               "OPTOUT", "REVOKE"})
START_WORDS: Final = frozenset({"START", "UNSTOP", "YES"})
HELP_WORDS: Final = frozenset({"HELP", "INFO"})
_WORDS: Final = {**dict.fromkeys(STOP_WORDS, Keyword.STOP),
                 **dict.fromkeys(START_WORDS, Keyword.START),
                 **dict.fromkeys(HELP_WORDS, Keyword.HELP)}


def keyword_of(body: str, recognised: str | None = None) -> Keyword | None:
    """The keyword a text is, or None. ``recognised`` is the provider's own verdict
    (``STOP``, ``START`` or ``HELP``), taken when it is one of them."""
    if recognised:
        try:
            return Keyword(recognised.strip().upper())
        except ValueError:
            pass
    word = body.strip().rstrip(".!").strip().upper()
    return _WORDS.get(word)


def e164(number: str) -> str:
    """A number as the provider wrote it, in E.164 (Vonage omits the ``+``)."""
    digits = number.strip()
    return digits if digits.startswith("+") else "+" + digits


@dataclass(frozen=True, slots=True)
class InboundSms:
    """One text a person sent to one of the platform's numbers."""

    provider_id: str
    sender: str
    """The person's number (E.164): the recipient whose consent changes."""
    number: str
    """The platform's number it was sent to (E.164)."""
    body: str
    keyword: Keyword | None


def tenants_of_number(tenants: Iterable[TenantConfig], number: str,
                      account_numbers: Sequence[str]) -> tuple[str, ...]:
    """Ids of the tenants whose messages ``number`` sends: every SMS tenant for one of the
    provider's ``account_numbers``, else those whose ``senders`` name it."""
    if number in account_numbers:
        return tuple(t.id for t in tenants if Channel.SMS in t.channels)
    return tuple(t.id for t in tenants if number in t.senders)


def reply_for(keyword: Keyword, tenants: Sequence[TenantConfig], replies: SmsReplies
              ) -> str | None:
    """What the platform answers a keyword with: a tenant's own HELP text when the number
    is that one tenant's and it has one, else the platform's text (None: no answer)."""
    if keyword is Keyword.HELP:
        if len(tenants) == 1 and tenants[0].sms_help:
            return tenants[0].sms_help
        return replies.help
    return replies.stop if keyword is Keyword.STOP else replies.start

