"""Locales (pure): a BCP 47 tag of language, optional script and region in its usual case,
and which of a template's variants serves a wanted locale.

The lookup is RFC 4647's: the wanted tag, then the tag with its last part dropped, and so on
to the bare language (``zh-Hant-TW`` → ``zh-Hant`` → ``zh``), then the template's default
content. ``fr-CA`` gets ``fr-CA`` when the template has it, else ``fr``, else the default.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Annotated, Final

from pydantic import AfterValidator, Field

from notiflow.schemas.formats import LOCALE_PATTERN

_TAG: Final = re.compile(LOCALE_PATTERN)
MAX_LOCALE: Final = 20


def canonical(value: str) -> str:
    """The tag with its parts in their usual case (``FR-ca`` → ``fr-CA``, ``zh-hant`` →
    ``zh-Hant``); ValueError for anything else than language, optional script and region."""
    if not _TAG.fullmatch(value):
        raise ValueError("locale is a BCP 47 tag: language, optional script and region "
                         "(e.g. fr, fr-CA, zh-Hant-TW)")
    first, *rest = value.split("-")
    return "-".join([first.lower(), *(p.title() if len(p) == 4 else p.upper() for p in rest)])


Locale = Annotated[str, Field(max_length=MAX_LOCALE, json_schema_extra={
    "pattern": LOCALE_PATTERN}), AfterValidator(canonical)]
"""A locale as the API takes it (any case) and keeps it (:func:`canonical`)."""


def lookup_chain(tag: str) -> tuple[str, ...]:
    """The tags tried for ``tag`` (canonical), most specific first."""
    parts = tag.split("-")
    return tuple("-".join(parts[:n]) for n in range(len(parts), 0, -1))


def best_variant(available: Collection[str], wanted: str | None) -> str | None:
    """The variant of ``available`` (canonical tags) that serves ``wanted``, or None for
    the default content (no locale wanted, or none of its chain available)."""
    if wanted is None:
        return None
    return next((t for t in lookup_chain(wanted) if t in available), None)
