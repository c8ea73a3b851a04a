"""The DLQ limit: one poison record never stops a flow, one producer's bad records never stop
it for the others, but a systemic flood of dead letters does.

:class:`DlqGuard` watches a flow's outputs just before they are encoded. Each dead letter is
either **invalid input** (category ``invalid_data``), attributed to its source
(:func:`source_of`: the record's tenant, else its ``producer`` header, else
``unattributed``), or **systemic** (any other category: a stage failing on well-formed
records).

- A source whose invalid records reach ``quarantine_after`` within the last
  ``ratio_window`` outputs is *quarantined*: a ``PRODUCER_QUARANTINE`` line at CRITICAL and
  the ``notiflow.dlq.quarantines`` counter, once per burst (again after the source's invalid
  records have left the window). Its invalid records keep going to the DLQ with their
  reasons; its valid records and every other source's traffic go on.
- The flow halts (:class:`DlqLimitBreached`, a ``DLQ_LIMIT_BREACH`` line at CRITICAL, the
  ``notiflow.dlq.limit_breaches`` counter) when ``max_consecutive`` counted dead letters
  arrive in a row, or more than ``max_ratio`` of the last ``ratio_window`` outputs are
  counted dead letters. Systemic dead letters always count; invalid records count only while
  those in the window come from at least ``systemic_sources`` sources (a renamed schema
  breaks every producer at once). The flow stops before that epoch is committed (its
  outputs are re-produced after the restart).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from typing import Any, Final

from opentelemetry import metrics

from notiflow import names
from notiflow.schemas.messages import DlqRecord, StatusEvent
from notiflow.settings import DlqRule

log = logging.getLogger(__name__)
_meter = metrics.get_meter(names.METER)
_breaches = names.DLQ_LIMIT_BREACHES.create(_meter)
_quarantines = names.DLQ_QUARANTINES.create(_meter)
_records = names.DLQ_RECORDS.create(_meter)

INVALID: Final = "invalid_data"
SYSTEMIC: Final = ""
"""Marker of a systemic dead letter in the window (a source is never empty)."""
UNATTRIBUTED: Final = "unattributed"


class DlqLimitBreached(RuntimeError):
    """Too many dead letters: a systemic fault rather than bad data. Stops the flow."""


def source_of(record: DlqRecord) -> str:
    """Who sent a dead letter's input: ``tenant:<id>`` (the record's tenant or its
    ``tenant_id`` header), ``producer:<name>`` (its ``producer`` header), else
    ``unattributed``."""
    tenant = record.tenant_id or record.headers.get("tenant_id")
    if tenant:
        return f"tenant:{tenant}"
    producer = record.headers.get("producer")
    return f"producer:{producer}" if producer else UNATTRIBUTED


class DlqGuard:
    """``op.map`` step (identity on its input); thread-safe, one per process and flow.

    Counts each :class:`DlqRecord` as a dead letter and each instance of ``ok`` (default:
    :class:`StatusEvent`) as an ordinary outcome; other items (retries) are not counted."""

    def __init__(self, rule: DlqRule, flow: str, ok: tuple[type, ...] = (StatusEvent,)) -> None:
        self.rule = rule
        self.flow = flow
        self.ok = ok
        self._lock = threading.Lock()
        self._recent: deque[str | None] = deque(maxlen=rule.ratio_window)
        """Per output: None (ordinary), :data:`SYSTEMIC`, or an invalid record's source."""
        self._systemic = 0
        self._invalid: Counter[str] = Counter()
        self._quarantined: set[str] = set()
        self._consecutive = 0

    @property
    def quarantined(self) -> frozenset[str]:
        """Sources quarantined now (their burst still in the window)."""
        with self._lock:
            return frozenset(self._quarantined)

    def __call__(self, out: Any) -> Any:
        if isinstance(out, DlqRecord):
            _records.add(1, {"dlq": out.tier.value if out.tier else self.flow,
                             "category": out.category, "error_class": out.error_class})
            self._count(source_of(out) if out.category == INVALID else SYSTEMIC, out)
        elif isinstance(out, self.ok):
            self._count(None, out)
        return out

    def _count(self, kind: str | None, out: Any) -> None:
        with self._lock:
            self._push(kind)
            quarantine = self._quarantine(kind)
            held = self._invalid[quarantine] if quarantine else 0
            if kind is None:
                self._consecutive = 0
            elif kind == SYSTEMIC or self._invalid_counts():
                self._consecutive += 1
            why = self._breach()
        if quarantine:
            _quarantines.add(1, {"flow": self.flow, "source": quarantine})
            log.critical("PRODUCER_QUARANTINE flow=%s source=%s: %d invalid records within the "
                         "last %d outputs; they go to the DLQ with their reasons and the flow "
                         "goes on. Last reason: %s", self.flow, quarantine, held,
                         self.rule.ratio_window, out.reason)
        if why is not None:
            _breaches.add(1, {"flow": self.flow})
            last = out.reason if isinstance(out, DlqRecord) else ""
            log.critical("DLQ_LIMIT_BREACH flow=%s %s; last reason: %s. The consumer stops: "
                         "fix the cause (or raise NOTIFLOW_DLQ__MAX_CONSECUTIVE / "
                         "NOTIFLOW_DLQ__MAX_RATIO) and restart it", self.flow, why, last)
            raise DlqLimitBreached(f"{self.flow}: {why}")

    def _push(self, kind: str | None) -> None:
        if len(self._recent) == self._recent.maxlen:
            old = self._recent.popleft()
            if old == SYSTEMIC:
                self._systemic -= 1
            elif old is not None:
                self._invalid[old] -= 1
                if not self._invalid[old]:
                    del self._invalid[old]
                    self._quarantined.discard(old)
        self._recent.append(kind)
        if kind == SYSTEMIC:
            self._systemic += 1
        elif kind is not None:
            self._invalid[kind] += 1

    def _quarantine(self, kind: str | None) -> str | None:
        """The source to quarantine now, if ``kind``'s burst just reached the limit."""
        if (kind is None or kind == SYSTEMIC or kind in self._quarantined
                or self._invalid[kind] < self.rule.quarantine_after):
            return None
        self._quarantined.add(kind)
        return kind

    def _invalid_counts(self) -> bool:
        return len(self._invalid) >= self.rule.systemic_sources

    def _breach(self) -> str | None:
        r = self.rule
        if self._consecutive >= r.max_consecutive:
            return f"{self._consecutive} dead letters in a row (limit {r.max_consecutive})"
        n = len(self._recent)
        dead = self._systemic + (sum(self._invalid.values()) if self._invalid_counts() else 0)
        if n == r.ratio_window and dead / n > r.max_ratio:
            return (f"{dead} of the last {n} outputs were dead letters "
                    f"(limit {r.max_ratio:.0%})")
        return None
