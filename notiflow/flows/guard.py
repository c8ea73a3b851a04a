"""The DLQ limit: one poison record never stops a flow, but a flood of them does.

:class:`DlqGuard` watches a flow's outputs just before they are encoded. Dead letters
interleaved with ordinary outcomes pass through. When ``max_consecutive`` dead letters arrive
in a row, or more than ``max_ratio`` of the last ``ratio_window`` outputs are dead letters,
the guard raises :class:`DlqLimitBreached`: the flow stops before that epoch is committed (its
outputs are re-produced after the restart), with a ``DLQ_LIMIT_BREACH`` line at CRITICAL and
the ``notiflow.dlq.limit_breaches`` counter. A systemic fault (a bad deploy, a renamed schema,
a wrong key) thus halts the consumer instead of moving a whole topic into the DLQ.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from opentelemetry import metrics

from notiflow import names
from notiflow.schemas.messages import DlqRecord, StatusEvent
from notiflow.settings import DlqRule

log = logging.getLogger(__name__)
_meter = metrics.get_meter(names.METER)
_breaches = names.DLQ_LIMIT_BREACHES.create(_meter)
_records = names.DLQ_RECORDS.create(_meter)


class DlqLimitBreached(RuntimeError):
    """Too many dead letters: a systemic fault rather than bad data. Stops the flow."""


class DlqGuard:
    """``op.map`` step (identity on its input); thread-safe, one per process and flow.

    Counts each :class:`DlqRecord` as a dead letter and each instance of ``ok`` (default:
    :class:`StatusEvent`) as an ordinary outcome; other items (retries) are not counted."""

    def __init__(self, rule: DlqRule, flow: str, ok: tuple[type, ...] = (StatusEvent,)) -> None:
        self.rule = rule
        self.flow = flow
        self.ok = ok
        self._lock = threading.Lock()
        self._recent: deque[bool] = deque(maxlen=rule.ratio_window)
        self._dead = 0
        self._consecutive = 0

    def __call__(self, out: Any) -> Any:
        if isinstance(out, DlqRecord):
            _records.add(1, {"dlq": out.tier.value if out.tier else self.flow,
                             "category": out.category, "error_class": out.error_class})
            self._count(True, out)
        elif isinstance(out, self.ok):
            self._count(False, out)
        return out

    def _count(self, dead: bool, out: Any) -> None:
        with self._lock:
            if len(self._recent) == self._recent.maxlen and self._recent[0]:
                self._dead -= 1
            self._recent.append(dead)
            self._dead += dead
            self._consecutive = self._consecutive + 1 if dead else 0
            why = self._breach()
        if why is not None:
            _breaches.add(1, {"flow": self.flow})
            last = out.reason if isinstance(out, DlqRecord) else ""
            log.critical("DLQ_LIMIT_BREACH flow=%s %s; last reason: %s. The consumer stops: "
                         "fix the cause (or raise NOTIFLOW_DLQ__MAX_CONSECUTIVE / "
                         "NOTIFLOW_DLQ__MAX_RATIO) and restart it", self.flow, why, last)
            raise DlqLimitBreached(f"{self.flow}: {why}")

    def _breach(self) -> str | None:
        r = self.rule
        if self._consecutive >= r.max_consecutive:
            return f"{self._consecutive} dead letters in a row (limit {r.max_consecutive})"
        n = len(self._recent)
        if n == r.ratio_window and self._dead / n > r.max_ratio:
            return (f"{self._dead} of the last {n} outputs were dead letters "
                    f"(limit {r.max_ratio:.0%})")
        return None
