"""SMS text facts shared by the SMS adapters and their emulators: the GSM 03.38 alphabet and
the segment count a carrier bills for."""

from __future__ import annotations

from typing import Final

GSM7_BASIC: Final = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?¡ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    "ÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà")
"""The GSM 03.38 default alphabet (one septet each)."""
GSM7_EXTENDED: Final = frozenset("^{}\\[~]|€\f")
"""Characters of the GSM 03.38 extension table (two septets each: escape + character)."""


def is_gsm7(text: str) -> bool:
    """True when ``text`` can be sent in the GSM-7 encoding."""
    return all(c in GSM7_BASIC or c in GSM7_EXTENDED for c in text)


def sms_segments(body: str, *, ucs2: bool = False) -> int:
    """SMS segments a carrier bills for ``body`` (GSM-7: 160/153 septets, else UCS-2:
    70/67 UTF-16 code units); ``ucs2`` forces UCS-2 (a ``unicode`` message)."""
    if not ucs2 and is_gsm7(body):
        units = len(body) + sum(c in GSM7_EXTENDED for c in body)
        single, multi = 160, 153
    else:
        units = len(body.encode("utf-16-le")) // 2
        single, multi = 70, 67
    return 1 if units <= single else -(-units // multi)
