"""What the providers' delivery-webhook modules share: :class:`WebhookRefused`, raised by the
signature checks, and the correlation and clipping helpers of the receipt parsers.

These modules are pure: the gateway reads the request, calls them, and turns a
:class:`WebhookRefused` into ``403`` and a ``ValueError`` into its own ``4xx``.
"""

from __future__ import annotations

import re
from typing import Final

from notiflow.schemas.status import MAX_ATTEMPT

MAX_ERROR_CODE: Final = 200
"""Longest ``error_code`` a receipt carries (longer provider texts are cut)."""
_MESSAGE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class WebhookRefused(Exception):
    """A webhook post that is forged, unsigned, stale or for another account: refused with
    ``403`` (``reason`` and ``message`` as the error body says) and nothing written."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def correlation(message_id: object, attempt: object) -> tuple[str | None, int | None]:
    """The ``(message_id, attempt)`` hint of a report: ``(None, None)`` unless the message id
    has our shape; the attempt only when it is a whole number in range."""
    if not isinstance(message_id, str) or not _MESSAGE_ID.fullmatch(message_id):
        return None, None
    number: int | None = None
    if isinstance(attempt, str) and attempt.isdigit():
        number = int(attempt)
    elif isinstance(attempt, int) and not isinstance(attempt, bool):
        number = attempt
    return message_id, number if number is not None and 1 <= number <= MAX_ATTEMPT else None


def clip(value: object) -> str | None:
    """``value`` as a receipt's ``error_code``: None when empty, else its text cut to
    :data:`MAX_ERROR_CODE` characters."""
    if value is None or value == "":
        return None
    return str(value)[:MAX_ERROR_CODE]
