"""Recurring schedules: a 5-field cron expression or an RFC 5545 RRULE in an IANA time zone.

Pure. A schedule runs in **naive local wall-clock time** in its zone (cron: croniter; RRULE:
dateutil, DTSTART = ``starts_at``'s wall time); each wall time becomes an instant by ``fold=0``:

- a wall time that does not exist (spring forward) fires once, shifted forward by the gap:
  02:30 on 2027-03-14 in America/New_York fires at 03:30 EDT (07:30 UTC);
- a wall time that exists twice (fall back) fires once, at its first occurrence:
  01:30 on 2027-11-07 in America/New_York fires at 01:30 EDT (05:30 UTC);
- an instant not strictly later than the previous one is dropped, so an hourly schedule fires
  once at 03:00 on spring-forward night (02:00 and 03:00 both map to 03:00 EDT) and skips the
  repeated 01:00 hour on fall-back night (01:00 EDT, then 02:00 EST).

Dropping runs over the whole sequence, not from ``after``: ``occurrences`` over (a, c] is
``occurrences`` over (a, b] then (b, c], across transitions too. RRULE: one line, bare or
``RRULE:``-prefixed, no DTSTART; parts it leaves out (BYSECOND...) default from ``starts_at``
(RFC 5545); ``UNTIL`` (UTC ``...Z`` or local) bounds like ``ends_at``; no SECONDLY, BYEASTER.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from itertools import pairwise
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter  # type: ignore[import-untyped]
from dateutil.rrule import rrulestr  # type: ignore[import-untyped]

_TICK = timedelta(microseconds=1)
_LOOKBACK = [timedelta(minutes=30 * k) for k in range(53)]  # UTC offsets span at most 26 h
_END = datetime(9000, 1, 1, tzinfo=UTC)
_PER_DAY = {"DAILY": 1, "HOURLY": 24, "MINUTELY": 1440}
_cron = partial(croniter, max_years_between_matches=50)  # then all_next() ends, never raises


class RecurrenceError(ValueError):
    """Bad input: ``field`` names the request field (``cron``, ``rrule``, ``timezone``,
    ``starts_at``, ``ends_at``), ``reason`` says why (for a 422)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


@dataclass(frozen=True, slots=True)
class Recurrence:
    """A schedule as :func:`parse_recurrence` validated it (instants in UTC)."""

    kind: Literal["cron", "rrule"]
    expression: str
    timezone: str
    starts_at: datetime
    ends_at: datetime | None = None


def parse_recurrence(
    *,
    cron: str | None,
    rrule: str | None,
    timezone: str,
    starts_at: datetime,
    ends_at: datetime | None = None,
    min_interval: timedelta = timedelta(minutes=1),
) -> Recurrence:
    """The schedule, or RecurrenceError naming the field: both or neither of cron and rrule;
    malformed, no occurrence in 100 years, two of the first 50 closer than ``min_interval``;
    unknown zone; naive instants; ``ends_at`` not after starts_at nor the first occurrence."""
    if (cron is None) == (rrule is None):
        raise RecurrenceError("cron", "give exactly one of cron and rrule")
    try:
        if timezone in ("localtime", "posixrules"):
            raise ZoneInfoNotFoundError(timezone)
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        raise RecurrenceError("timezone", f"unknown IANA time zone {timezone!r}") from None
    for name, value in (("starts_at", starts_at), ("ends_at", ends_at)):
        if value is not None and value.utcoffset() is None:
            raise RecurrenceError(name, "must carry a time zone")
    if ends_at is not None and ends_at <= starts_at:
        raise RecurrenceError("ends_at", "must be after starts_at")
    text = (cron if cron is not None else rrule or "").strip()
    rec = Recurrence("rrule" if cron is None else "cron", text, timezone, starts_at.astimezone(UTC))
    _check_fires(rec, zone)
    first = occurrences(rec, rec.starts_at - _TICK, rec.starts_at + timedelta(days=36525), limit=50)
    if not first:
        raise RecurrenceError(rec.kind, "never fires in the next 100 years")
    if any(b - a < min_interval for a, b in pairwise(first)):
        raise RecurrenceError(rec.kind, f"fires more often than every {min_interval}")
    if ends_at is not None and first[0] > ends_at:
        raise RecurrenceError("ends_at", "no occurrence between starts_at and ends_at")
    return replace(rec, ends_at=None if ends_at is None else ends_at.astimezone(UTC))


def occurrences(
    rec: Recurrence, after: datetime, until: datetime, limit: int = 10_000
) -> list[datetime]:
    """Aware UTC instants of the occurrences strictly after ``after`` and at or before
    ``until`` (and within starts_at/ends_at), strictly increasing, at most ``limit``."""
    zone = ZoneInfo(rec.timezone)
    low = max(after.astimezone(UTC), rec.starts_at - _TICK)
    high = min(until.astimezone(UTC), rec.ends_at or _END)
    start = _first_wall(low, zone)
    if rec.kind == "cron":
        walls: Iterator[datetime] = _cron(rec.expression, start - _TICK).all_next(datetime)
    else:
        anchor = rec.starts_at.astimezone(zone).replace(tzinfo=None)
        rule, rule_end = _rrule(rec.expression, anchor, zone, near=start)
        high = min(high, rule_end or _END)
        walls = rule.xafter(start, inc=True)
    out: list[datetime] = []
    latest = low
    for wall in walls if high > low else ():
        at = wall.replace(tzinfo=zone).astimezone(UTC)
        if at > high or len(out) >= limit:
            break
        if at > latest:
            out.append(at)
            latest = at
    return out


class _Budget(tuple[int, ...]):
    """dateutil's BYSECOND (internal), which it reads once per sub-daily period it scans."""

    left = 20_000

    def __iter__(self) -> Iterator[int]:
        self.left -= 1
        if self.left < 0:
            raise RecurrenceError("rrule", "fires too rarely: nothing in 20,000 periods")
        return super().__iter__()


def _first_wall(low: datetime, zone: ZoneInfo) -> datetime:
    """``low`` as wall time at the lowest offset of the prior 26 h: none mapping later is before."""
    offsets = [(low - back).astimezone(zone).utcoffset() or timedelta() for back in _LOOKBACK]
    return low.replace(tzinfo=None) + min(offsets)


def _check_fires(rec: Recurrence, zone: ZoneInfo) -> None:
    """Refuse a malformed expression, or one with no wall time in 50 years (cron) or in 20,000
    sub-daily periods or the 400-year cycle from the same date in years 9200-9599 (RRULE)."""
    anchor = rec.starts_at.astimezone(zone).replace(tzinfo=None)
    fields = rec.expression.split()
    try:
        if rec.kind == "rrule":
            far = anchor.replace(year=anchor.year + 400 * ((9599 - anchor.year) // 400))
            rule = _rrule(rec.expression, far, zone)[0]
            rule._bysecond = _Budget(rule._bysecond)
            first = next(iter(rule), None)
        elif len(fields) != 5 and not (len(fields) == 1 and fields[0].startswith("@")):
            raise RecurrenceError("cron", "expected 5 fields: minute hour day month weekday")
        elif any(field[0].lower() in "hr" for field in fields):
            raise RecurrenceError("cron", "hashed (H) and random (R) fields are unsupported")
        else:
            first = next(_cron(rec.expression, anchor - _TICK).all_next(datetime), None)
    except RecurrenceError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:
        raise RecurrenceError(rec.kind, f"malformed: {exc}") from None
    if first is None:
        raise RecurrenceError(rec.kind, "never fires")


def _rrule(
    expression: str, anchor: datetime, zone: ZoneInfo, near: datetime | None = None
) -> tuple[Any, datetime | None]:
    """dateutil's rule from ``anchor`` (naive wall time) or, without COUNT, from the last whole
    cycle of a DAILY/HOURLY/MINUTELY rule before ``near``; and the instant UNTIL names."""
    body = expression[6:] if expression.upper().startswith("RRULE:") else expression
    parts = {p.partition("=")[0].upper(): p.partition("=")[2].upper() for p in body.split(";")}
    if "DTSTART" in body.upper():
        raise RecurrenceError("rrule", "DTSTART is not allowed: starts_at is the start")
    if not body or any(c.isspace() or c == ":" for c in body):
        raise RecurrenceError("rrule", "expected one RRULE line such as FREQ=DAILY;BYHOUR=9")
    if "BYEASTER" in parts or parts.get("FREQ") == "SECONDLY":
        raise RecurrenceError("rrule", "FREQ=SECONDLY and BYEASTER are not supported")
    if not re.fullmatch(r"0*[1-9][0-9]*", parts.get("INTERVAL", "1")):
        raise RecurrenceError("rrule", "INTERVAL must be a positive integer")
    per_day = _PER_DAY.get(parts.get("FREQ", ""))
    if near is not None and per_day and "COUNT" not in parts:
        interval = int(parts.get("INTERVAL", "1"))
        cycle = timedelta(days=interval // math.gcd(interval, per_day))
        anchor += max(0, (near - anchor) // cycle) * cycle
    if "UNTIL" not in parts:
        return rrulestr(body, dtstart=anchor), None
    match = re.fullmatch(r"(\d{8}T\d{6})(Z?)", parts["UNTIL"])
    if match is None or "COUNT" in parts:
        raise RecurrenceError("rrule", "UNTIL must be YYYYMMDDTHHMMSS[Z], without COUNT")
    until = datetime.strptime(match[1], "%Y%m%dT%H%M%S")
    until = until.replace(tzinfo=UTC if match[2] else zone)
    body = ";".join(p for p in body.split(";") if p.partition("=")[0].upper() != "UNTIL")
    return rrulestr(body, dtstart=anchor), until.astimezone(UTC)
