"""Status changes too old to announce: history is skipped, anything else is dead-lettered.

A change older than the webhook policy's ``max_age`` (the whole retry schedule) is never
POSTed late. What becomes of it depends on when its record reached Kafka:

- **history**: appended before this flow first read the record's partition (a first start,
  or a start after the flow's recovery store was lost, reads from offset 0). Those changes
  were announced by an earlier deployment, or predate the flow: :class:`Fresh` skips them
  and counts them in the log, so a replay floods neither clients nor the DLQ.
- **anything else** (the flow was behind for longer than the schedule, or a provider
  reported a status long after it happened): ``WebhookLogic`` turns it into a
  ``webhook_stale`` dead letter of its tenant, with the URL, webhook-id and body.

:class:`HistorySource` tells the two apart: it wraps the flow's Kafka source, keeps the time
each partition was first read in the partition's recovery snapshot, and marks records
appended before it with the :data:`HISTORY_HEADER` header (set by it alone: a record's own
header of that name is removed).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from bytewax.connectors.kafka import KafkaError, KafkaSourceMessage
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from notiflow.flows.webhooks.webhook_items import StatusChange

log = logging.getLogger("notiflow.flows.client_webhooks")

HISTORY_HEADER: Final = "notiflow-history"
Item = KafkaSourceMessage[Any, Any] | KafkaError[Any, Any]


@dataclass(frozen=True, slots=True)
class HistoryState:
    """A partition's recovery snapshot: the wrapped source's, and the epoch milliseconds of
    the partition's first read (records appended before are history)."""

    inner: Any
    since_ms: int


def mark_history(item: Item, since_ms: int) -> Item:
    """``item`` with :data:`HISTORY_HEADER` set when its Kafka timestamp is before
    ``since_ms``, and removed otherwise (a record without a timestamp is not history)."""
    if isinstance(item, KafkaError):
        return item
    headers = [(k, v) for k, v in item.headers or () if k != HISTORY_HEADER]
    ts = item.timestamp[1] if item.timestamp and item.timestamp[0] else None
    if ts is not None and ts < since_ms:
        headers.append((HISTORY_HEADER, b"1"))
    return dataclasses.replace(item, headers=headers)


def is_history(headers: list[tuple[str, bytes]] | None) -> bool:
    return any(k == HISTORY_HEADER for k, _ in headers or ())


class HistoryPartition(StatefulSourcePartition[Item, HistoryState]):
    """One partition of :class:`HistorySource`."""

    def __init__(self, inner: StatefulSourcePartition[Item, Any], since_ms: int) -> None:
        self.inner = inner
        self.since_ms = since_ms

    def next_batch(self) -> list[Item]:
        return [mark_history(i, self.since_ms) for i in self.inner.next_batch()]

    def next_awake(self) -> datetime | None:
        return self.inner.next_awake()

    def snapshot(self) -> HistoryState:
        return HistoryState(self.inner.snapshot(), self.since_ms)

    def close(self) -> None:
        self.inner.close()


class HistorySource(FixedPartitionedSource[Item, HistoryState]):
    """``inner``'s partitions, their records marked as history or not. A partition resumed
    without a snapshot starts its history at ``clock()``; one resumed from a snapshot of
    ``inner`` alone (taken before this wrapper existed) has no history."""

    def __init__(self, inner: FixedPartitionedSource[Item, Any],
                 clock: Callable[[], float] = time.time) -> None:
        self.inner = inner
        self.clock = clock

    def list_parts(self) -> list[str]:
        return self.inner.list_parts()

    def build_part(self, step_id: str, for_part: str,
                   resume_state: HistoryState | Any | None) -> HistoryPartition:
        if isinstance(resume_state, HistoryState):
            inner, since_ms = resume_state.inner, resume_state.since_ms
        elif resume_state is None:
            inner, since_ms = None, int(self.clock() * 1000)
        else:
            inner, since_ms = resume_state, 0
        return HistoryPartition(self.inner.build_part(step_id, for_part, inner), since_ms)


def too_old(change_at: datetime, now: datetime, max_age: timedelta) -> bool:
    return now - change_at > max_age


class Fresh:
    """``filter`` predicate: False for a change read as history (:data:`HISTORY_HEADER`)
    and older than ``max_age``; those are counted and logged (a summary at most every
    ``LOG_EVERY``: a replay may skip millions). Every other change goes on."""

    LOG_EVERY = 10.0

    def __init__(self, max_age: timedelta, clock: Callable[[], datetime]) -> None:
        self.max_age = max_age
        self.clock = clock
        self._skipped = 0
        self._logged = 0.0
        self._lock = threading.Lock()

    def __call__(self, change: StatusChange) -> bool:
        if not change.history or not too_old(change.occurred_at, self.clock(), self.max_age):
            return True
        with self._lock:
            self._skipped += 1
            if time.monotonic() - self._logged >= self.LOG_EVERY:
                log.info("not announcing %d status changes read as history and older than %s "
                         "(latest: %s of %s)", self._skipped, self.max_age,
                         change.status.value, change.message_id or change.provider_ref)
                self._skipped, self._logged = 0, time.monotonic()
        return False
