"""The DLQ limit: one poison record never stops a flow, one tenant's or producer's bad
records never stop it for the others, but a systemic flood of dead letters does.

:class:`DlqGuard` watches a flow's outputs just before they are encoded. Each dead letter is
either **charged to its source** (:func:`charged_to_tenant`: input a tenant or producer can
cause, attributed by :func:`source_of` to the record's configured tenant, else its
``producer`` header, else ``unattributed``) or **systemic** (a fault no input can cause: the
Kafka consumer failing, a platform provider never answering).

- A source whose charged dead letters reach ``quarantine_after`` within the last
  ``ratio_window`` outputs is *quarantined*: a ``PRODUCER_QUARANTINE`` line at CRITICAL and
  the ``notiflow.dlq.quarantines`` counter, once per burst (again after the source's dead
  letters have left the window). Its records keep going to the DLQ with their reasons and
  never count toward the halt; its valid records and every other source's traffic go on.
- The flow halts (:class:`DlqLimitBreached`, a ``DLQ_LIMIT_BREACH`` line at CRITICAL, the
  ``notiflow.dlq.limit_breaches`` counter) when ``max_consecutive`` counted dead letters
  arrive in a row, or more than ``max_ratio`` of the last ``ratio_window`` outputs are
  counted dead letters. Systemic dead letters always count; charged ones count only while
  at least ``systemic_sources`` sources that are not quarantined have dead letters in the
  window (a renamed schema breaks every producer at once). A source's flood counts at most
  until the source is quarantined, so with ``quarantine_after`` below ``max_consecutive`` one
  source alone never halts a flow. The flow stops before that epoch is committed (its
  outputs are re-produced after the restart).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any, Final, Literal

from opentelemetry import metrics

from notiflow import names
from notiflow.schemas.enums import Channel
from notiflow.schemas.messages import DlqRecord, StatusEvent
from notiflow.settings import DlqRule

log = logging.getLogger("notiflow.flows.guard")
_meter = metrics.get_meter(names.METER)
_breaches = names.DLQ_LIMIT_BREACHES.create(_meter)
_quarantines = names.DLQ_QUARANTINES.create(_meter)
_records = names.DLQ_RECORDS.create(_meter)

INVALID: Final = "invalid_data"
SYSTEMIC: Final = ""
"""Marker of a systemic dead letter in the window (a source is never empty)."""
UNATTRIBUTED: Final = "unattributed"

Charge = Literal["tenant", "platform", "endpoint", "outage"]
"""Who a kind of dead letter is charged to: its source (``tenant``), nobody (``platform``:
systemic), its source only when the endpoint that failed is the tenant's own (``endpoint``:
:data:`TENANT_ENDPOINTS`, else systemic), or, for a message whose retry budget a provider
outage used up (``outage``), its source for a tenant's own endpoint and else nobody: such a
dead letter counts toward neither a quarantine nor a halt (restarting the flow would not
bring the provider back; the breakers and the DLQ alerts report the outage)."""

ATTRIBUTION: Final[Mapping[tuple[str, str], Charge]] = {
    ("poison", INVALID): "tenant",
    ("unknown_schema", INVALID): "tenant",
    ("sealed", INVALID): "tenant",
    ("validation", INVALID): "tenant",
    ("wrong_topic", INVALID): "tenant",
    ("unknown_tenant", INVALID): "tenant",
    ("tenant_claim_refused", INVALID): "tenant",
    ("category_tier_not_allowed", INVALID): "tenant",
    ("uncorrelated_receipt", INVALID): "tenant",
    ("webhook_invalid_url", INVALID): "tenant",
    ("webhook_url_not_allowed", INVALID): "tenant",
    ("webhook_no_secret", INVALID): "tenant",
    ("webhook_gone", INVALID): "tenant",
    ("webhook_exhausted", "unavailable"): "tenant",
    ("webhook_stale", "unavailable"): "tenant",
    ("channel_unavailable", "unavailable"): "tenant",
    ("recipient_not_served", "unavailable"): "tenant",
    ("crash_loop", "bug"): "tenant",
    ("render_error", "bug"): "tenant",
    ("exhausted_unexplained", "bug"): "tenant",
    ("exhausted_unexplained", "provider_outage"): "endpoint",
    ("retries_exhausted", "provider_outage"): "outage",
    ("consumer_error", "bug"): "platform",
    ("suppression_not_recorded", "bug"): "platform",
}
"""Every (error class, category) a flow dead-letters with, and who it is charged to. A
record a tenant or producer wrote can cause each ``tenant`` kind: bytes, schema, topic or
tenant claims that are wrong; a category at a tier it may not use; a channel or chat URL no
provider serves; a record that crashed the flow or whose template does not render; a
provider client raising on its content; a receipt matching no attempt; a status webhook that
is invalid, refused by the egress rules, gone, down or too old to announce. Only a Kafka
consumer error, a suppression the preference store failed to record, or a platform provider
that never answered, is systemic. A pair not listed: charged when its category is
``invalid_data``."""

TENANT_ENDPOINTS: Final = frozenset({Channel.CHAT.value})
"""Channels whose endpoint is a URL the tenant chose (a chat webhook)."""

UNVERIFIED_CLAIMS: Final = frozenset({"unknown_tenant", "tenant_claim_refused"})
"""Error classes whose record's tenant claim names nobody (:func:`source_of`): a tenant that
is not configured, or a record not bound to the tenant it names (``ingest_binding``)."""


class DlqLimitBreached(RuntimeError):
    """Too many dead letters: a systemic fault rather than bad data. Stops the flow."""


def channel_of(record: DlqRecord) -> str | None:
    """The dead letter's channel from its ``channel`` header (set by the send flow)."""
    value = record.headers.get("channel")
    return value.upper() if value else None


def uncounted(record: DlqRecord) -> bool:
    """A dead letter the guard counts as an ordinary outcome: a platform provider's outage
    used up the message's retry budget (:data:`ATTRIBUTION` ``outage``)."""
    return (ATTRIBUTION.get((record.error_class, record.category)) == "outage"
            and channel_of(record) not in TENANT_ENDPOINTS)


def charged_to_tenant(record: DlqRecord) -> bool:
    """Whether tenant or producer input can cause this dead letter (:data:`ATTRIBUTION`):
    then it is charged to :func:`source_of` and never halts a flow by itself."""
    charge = ATTRIBUTION.get((record.error_class, record.category))
    if charge is None:
        return record.category == INVALID
    if charge in ("endpoint", "outage"):
        return channel_of(record) in TENANT_ENDPOINTS
    return charge == "tenant"


def source_of(record: DlqRecord) -> str:
    """Who sent a dead letter's input: ``tenant:<id>`` (the record's tenant or its
    ``tenant_id`` header), ``producer:<name>`` (its ``producer`` header), else
    ``unattributed``. A tenant claim that failed its check (:data:`UNVERIFIED_CLAIMS`: a
    tenant that is not configured, a record not bound to its tenant) names nobody: any
    string can be claimed, and charging it would quarantine the tenant it names."""
    tenant = None if record.error_class in UNVERIFIED_CLAIMS else (
        record.tenant_id or record.headers.get("tenant_id"))
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
        """Per output: None (ordinary), :data:`SYSTEMIC`, or a charged dead letter's source."""
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
            if uncounted(out):
                self._count(None, out)
            else:
                self._count(source_of(out) if charged_to_tenant(out) else SYSTEMIC, out)
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
            elif self._counts(kind):
                self._consecutive += 1
            why = self._breach()
        if quarantine:
            _quarantines.add(1, {"flow": self.flow, "source": quarantine})
            log.critical("PRODUCER_QUARANTINE flow=%s source=%s producer=%s: %d dead letters "
                         "charged to it within the last %d outputs; they go to the DLQ with "
                         "their reasons and the flow goes on. Last: %s (%s)", self.flow,
                         quarantine, out.headers.get("producer", "-"), held,
                         self.rule.ratio_window, out.error_class, out.reason)
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

    def _counts(self, kind: str) -> bool:
        """Whether a dead letter of ``kind`` counts toward the halt now."""
        return kind == SYSTEMIC or (kind not in self._quarantined and self._spread())

    def _spread(self) -> bool:
        """Whether enough sources that are not quarantined have dead letters in the window."""
        return len(self._invalid) - len(self._quarantined) >= self.rule.systemic_sources

    def _breach(self) -> str | None:
        r = self.rule
        if self._consecutive >= r.max_consecutive:
            return f"{self._consecutive} dead letters in a row (limit {r.max_consecutive})"
        n = len(self._recent)
        dead = self._systemic + (sum(n for src, n in self._invalid.items()
                                     if src not in self._quarantined) if self._spread() else 0)
        if n == r.ratio_window and dead / n > r.max_ratio:
            return (f"{dead} of the last {n} outputs were dead letters "
                    f"(limit {r.max_ratio:.0%})")
        return None
