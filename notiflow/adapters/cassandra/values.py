"""Values as Cassandra stores them: UTC timestamps at millisecond precision, days, hours
and the shards of the operators' query tables (``ops/queries.md``); rows as dataclasses."""

from __future__ import annotations

import dataclasses
import functools
import zlib
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

D = TypeVar("D", bound="DataclassInstance")

OPERATOR_SHARDS = 32
"""Shards of each ``failures_by_tier_day`` day and ``provider_outcomes_by_hour`` hour
(``shard = crc32(message_id) % 32``); the queries in ``ops/queries.md`` list all of them."""


MAX_TTL_S = 630_720_000
"""Cassandra refuses a TTL over 20 years."""
LAST_EXPIRY = datetime(2038, 1, 19, tzinfo=UTC)
"""Cassandra refuses cells expiring after 2038-01-19 (its 32-bit expiration time)."""


def capped_ttl(seconds: float, now: datetime) -> int:
    """``seconds`` as a TTL Cassandra takes: at most 20 years, and expiring before
    2038-01-19 (whatever a client's ``expires_at`` asks for)."""
    return min(int(seconds), MAX_TTL_S, int((LAST_EXPIRY - now).total_seconds()))


@overload
def utc(d: datetime) -> datetime: ...
@overload
def utc(d: datetime | None) -> datetime | None: ...
def utc(d: datetime | None) -> datetime | None:
    """Cassandra returns naive UTC timestamps; make them aware."""
    if d is None:
        return None
    return d.replace(tzinfo=UTC) if d.tzinfo is None else d


def ts(d: datetime | None) -> datetime | None:
    """``d`` in UTC (a timestamp parameter), None as is."""
    return d.astimezone(UTC) if d is not None else None


def to_ms(d: datetime) -> datetime:
    """``d`` in UTC truncated to milliseconds (Cassandra's timestamp precision)."""
    d = d.astimezone(UTC)
    return d.replace(microsecond=d.microsecond // 1000 * 1000)


def date_of(d: datetime) -> date:
    return d.astimezone(UTC).date()


def hour_of(d: datetime) -> datetime:
    """``d`` in UTC truncated to the hour (the ``provider_outcomes_by_hour`` bucket)."""
    return d.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def operator_shard(message_id: str) -> int:
    """The shard of a message's rows in the operators' query tables."""
    return zlib.crc32(message_id.encode()) % OPERATOR_SHARDS


def from_row(cls: type[D], row: Mapping[str, Any], **convert: Callable[[Any], Any]) -> D:
    """The dataclass ``cls`` from the columns of ``row`` named like its fields: a field
    without a default needs its column (``KeyError`` without it), one with a default is None
    when its column is absent; ``convert[field]``, where given, maps the column's value."""
    values: dict[str, Any] = {}
    for name, required in _columns(cls):
        value = row[name] if required else row.get(name)
        values[name] = convert[name](value) if name in convert else value
    return cls(**values)


@functools.cache
def _columns(cls: type[DataclassInstance]) -> tuple[tuple[str, bool], ...]:
    """Each field of ``cls``: its name, and whether it has no default."""
    return tuple((f.name, f.default is dataclasses.MISSING
                  and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(cls))
