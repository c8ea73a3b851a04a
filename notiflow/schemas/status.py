"""The monotonic order of message statuses.

Statuses form a total order, so merging is ``max``: the result does not depend on the order
in which events or receipts arrive (duplicated, shuffled, replayed). The order encodes the
rules of docs/design.md ("Message states"):

    CREATED < SCHEDULED < QUEUED
      < PROCESSING(1) < RETRY_PENDING(1) < UNKNOWN(1) < PROCESSING(2) < ...   (per attempt)
      < SUPPRESSED < EXPIRED < CANCELLED < PROVIDER_ACCEPTED < SENT < FAILED
      < DELIVERED < BOUNCED < OPENED < CLICKED

so DELIVERED never goes back to SENT, FAILED never overwrites DELIVERED, a carrier failure
after SENT is recorded, an email DELIVERED may still become BOUNCED, and a late provider
acceptance (an UNKNOWN attempt that did go through) wins over the decision to give up. A
cancel wins over the send flow's own ending of a message it never sent (EXPIRED,
SUPPRESSED) and never over a provider's acceptance. CANCELLED shares EXPIRED's class, at the
top of it (ranks are stored: classes are never renumbered).
The rank is stored in Cassandra; a status is written at the row's creation time plus
:func:`write_offset_us` of its rank, so the database keeps the highest rank whatever order
the writes arrive in (``adapters/cassandra/messages.py``, ``rank_write_time``).
"""

from __future__ import annotations

from notiflow.schemas.enums import Status

_CLASS: dict[Status, int] = {
    Status.CREATED: 0,
    Status.SCHEDULED: 1,
    Status.QUEUED: 2,
    Status.PROCESSING: 3,
    Status.RETRY_PENDING: 3,
    Status.UNKNOWN: 3,
    Status.SUPPRESSED: 4,
    Status.EXPIRED: 5,
    Status.CANCELLED: 5,
    Status.PROVIDER_ACCEPTED: 6,
    Status.SENT: 7,
    Status.FAILED: 8,
    Status.DELIVERED: 9,
    Status.BOUNCED: 10,
    Status.OPENED: 11,
    Status.CLICKED: 12,
}
_WITHIN_ATTEMPT: dict[Status, int] = {
    Status.PROCESSING: 0,
    Status.RETRY_PENDING: 1,
    Status.UNKNOWN: 2,
}
MAX_ATTEMPT = 99_999
_CLASS_WEIGHT = 1_000_000
OFFSET_CLASS_US = 10_000
"""Micro-seconds between two status classes in :func:`write_offset_us`."""
_WITHIN_CLASS: dict[Status, int] = {Status.CANCELLED: OFFSET_CLASS_US - 1}
"""Position inside a shared class; below ``OFFSET_CLASS_US``, so the offset stays exact."""


def rank(status: Status, attempt: int = 0) -> int:
    """Position of ``status`` in the order; ``attempt`` matters only for in-flight statuses."""
    if status in _WITHIN_ATTEMPT:
        if not 0 <= attempt <= MAX_ATTEMPT:
            raise ValueError(f"attempt out of range: {attempt}")
        return _CLASS[status] * _CLASS_WEIGHT + attempt * 10 + _WITHIN_ATTEMPT[status]
    return _CLASS[status] * _CLASS_WEIGHT + _WITHIN_CLASS.get(status, 0)


def supersedes(new: Status, new_attempt: int, old: Status, old_attempt: int) -> bool:
    """True when ``new`` may replace ``old`` as the current status."""
    return rank(new, new_attempt) > rank(old, old_attempt)


def write_offset_us(r: int) -> int | None:
    """An order-preserving, compact image of rank ``r`` in micro-seconds (at most
    ``13 * OFFSET_CLASS_US``, 0.13 s): a write timed at creation + offset never lands far in
    the future, where it would shadow a later wall-clock write (a DLQ replay re-queueing the
    message). None for an in-flight rank beyond attempt 999 (no room: such rows use
    compare-and-set)."""
    cls, rest = divmod(r, _CLASS_WEIGHT)
    if rest >= OFFSET_CLASS_US:
        return None
    return cls * OFFSET_CLASS_US + rest
