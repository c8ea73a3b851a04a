"""The reconciliation dataflow: the single place where status reaches Cassandra.

Recipe (``build_reconcile_flow``)::

    notify.events + notify.receipts       Kafka, offsets in Bytewax recovery
      → parse (parse_or_dlq, guarded)     unparseable → notify.dlq.{tier|reconcile}; too many
                                          dead letters → the flow halts (guard.py)
      → park (hold_until_due, by receipt) a parked receipt waits for its next try (timer)
      → apply (per batch, in waves)       rows read together, writes decided, sent together;
                                          per message: create the row if a direct-producer
                                          message is new, move it to the highest status
                                          (schemas/status.py), history + attempts + index;
                                          receipts: matched to the attempt their provider and
                                          provider message id were recorded for (a hint that
                                          disagrees: dropped, counted as forged), dedup by
                                          (provider, event id); a hard bounce,
                                          unsubscribe or complaint suppresses the
                                          address; a receipt nobody can
                                          correlate yet is parked (re-published with a later
                                          ``not_before``) for ``receipt_park_for``, then DLQ
      → guard_and_emit                    encode → confirming Kafka sink: DLQ records and
                                          parked receipts

Merging is ``max`` over a total order, so duplicated, replayed or shuffled inputs converge
to the same row, and a status never regresses.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream
from bytewax.inputs import Source
from bytewax.outputs import Sink
from opentelemetry import trace

from notiflow import names, telemetry
from notiflow.adapters.bytewax_kafka import ConfirmingSink, kafka_source
from notiflow.adapters.cassandra.attempts import ProviderIndexRow, ReceiptRecord
from notiflow.adapters.cassandra.session import Write
from notiflow.adapters.cassandra.store import CassandraStore, ClusterStore
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.kafka_io import OutRecord
from notiflow.adapters.outages import REDIS_DOWN
from notiflow.adapters.preferences import PREFERENCE_OUTAGE
from notiflow.adapters.retrying import until_up
from notiflow.adapters.rows import MessageHeadRow
from notiflow.adapters.worker import WorkerLoop
from notiflow.correlation import CorrelationKeys
from notiflow.flows.common.guard import DlqGuard
from notiflow.flows.common.items import ReconcileIn, SourcedReceipt, utcnow
from notiflow.flows.common.steps import Clock, Encoder, dead_letter, parse_reconcile
from notiflow.flows.common.toolbox import guard_and_emit, hold_until_due, parse_or_dlq
from notiflow.flows.common.yielding import Slots, YieldWindow
from notiflow.flows.receipts import receipt_match
from notiflow.schemas.campaigns import ID_PREFIX
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import DlqRecord, Receipt, StatusEvent
from notiflow.schemas.status import rank
from notiflow.settings import Settings

log = logging.getLogger("notiflow.flows.reconcile")
_transitions = names.STATUS_TRANSITIONS.create(telemetry.meter())
_forged = names.RECEIPTS_FORGED.create(telemetry.meter())

CONCURRENCY = 512
"""Messages of a batch applied at once; their reads and writes share requests
(adapters/cassandra_coalesce.py), so more at once means fewer requests."""
INFRA_RETRY_FOR = timedelta(minutes=5)
PARK_FIRST_WAIT = timedelta(seconds=5)
PARK_MAX_WAIT = timedelta(minutes=1)
HARD_BOUNCES = {"bounce": "hard_bounce", "unsubscribe": "unsubscribed",
                "group_unsubscribe": "unsubscribed", "spamreport": "complaint",
                "complaint": "complaint"}


def suppression_for(r: Receipt) -> str | None:
    """The suppression a receipt implies for its address: a hard bounce, an unsubscribe or a
    spam complaint (raw provider event types as the receivers record them)."""
    if r.status is Status.BOUNCED:
        return "hard_bounce"
    return HARD_BOUNCES.get((r.raw_status or "").lower()) if r.raw_status else None


T = TypeVar("T", bound=StatusEvent | Receipt)


@dataclass(slots=True)
class _Plan(Generic[T]):
    """One message's events, or one receipt, as decided: the writes to send with the wave
    and whether they move the status, or (a row on the compare-and-set path) the
    transition to run instead, which tells ``applied`` once done."""

    top: T
    span: trace.Span
    writes: list[Write] = field(default_factory=list)
    applied: bool = False
    cas: Callable[[], Awaitable[tuple[bool, bool]]] | None = None


class BulkYield:
    """The reconciler's window of bulk writes at once, stepped every ``bulk_yield.tick``
    while bulk work is applied by P0's latency signal (``adapters/pressure.py``); Redis
    unreachable counts as no signal."""

    def __init__(self, settings: Settings, ceiling: int) -> None:
        self.settings = settings
        self.window = YieldWindow(settings.bulk_yield, settings.policy(Tier.P0).sla
                                  .total_seconds(), ceiling)
        self.slots = Slots(ceiling)
        self._client: Any = None
        self._last = 0.0

    async def follow(self) -> None:
        tick = self.settings.bulk_yield.tick.total_seconds()
        while True:
            now = asyncio.get_running_loop().time()
            if now - self._last >= tick:
                self._last = now
                self.slots.resize(max(1, self.window.step(await self._signal())))
            await asyncio.sleep(tick)

    async def _signal(self) -> float | None:
        from notiflow.adapters import pressure
        from notiflow.adapters.redis_pool import redis_client

        if self._client is None:
            self._client = redis_client(self.settings, timeout=0.5)
        try:
            return await pressure.worst(self._client, self.settings.topic_prefix)
        except REDIS_DOWN:
            return None


class Tally:
    """Marks the campaign outcomes a wave applied (``adapters/campaign_tally.py``) after its
    writes are acknowledged; Redis unreachable leaves them out of the funnel (logged), never
    holds the reconciler back."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.keys = CorrelationKeys.from_settings(settings)
        self._tally: Any = None

    async def mark(self, pairs: Iterator[tuple[str, Status]]) -> None:
        from notiflow.adapters.campaign_tally import CampaignTally
        from notiflow.adapters.redis_pool import redis_client

        marks = list(pairs)
        if not any(mid.startswith(ID_PREFIX) for mid, _ in marks):
            return
        if self._tally is None:
            self._tally = CampaignTally(redis_client(self.settings, timeout=0.5),
                                        self.settings.topic_prefix,
                                        self.settings.operational_ttl)
        try:
            await self._tally.mark(marks, self.keys)
        except REDIS_DOWN as exc:
            log.warning("campaign tally not updated (%s): %d outcomes missing from the "
                        "funnel", type(exc).__name__, len(marks))


class ApplyStep:
    """``flat_map_batch`` mapper: events and receipts → Cassandra; yields DLQ records."""

    def __init__(self, settings: Settings, cipher: DlqCipher, clock: Clock = utcnow) -> None:
        self.settings = settings
        self.cipher = cipher
        self.clock = clock
        self.runtime = WorkerLoop()
        self.yielding = BulkYield(settings, CONCURRENCY)
        self.tally = Tally(settings)
        self._preferences: Any = None
        self._channels = {route.provider_id: route.channel.value for route in settings.routes}

    def _store(self) -> CassandraStore:
        async def open_store() -> ClusterStore:
            opened = await ClusterStore.open(self.settings)
            opened.store.coalesce(max_keys=self.settings.cassandra_read_keys,
                                  max_rows=self.settings.cassandra_batch_rows)
            return opened

        return self.runtime.resource("cassandra", open_store).store

    def __call__(self, batch: list[ReconcileIn]) -> list[DlqRecord | Receipt]:
        store = self._store()
        return self.runtime.run(self._with_retries(batch, store))

    async def _with_retries(self, batch: list[ReconcileIn],
                            store: CassandraStore) -> list[DlqRecord | Receipt]:
        """Cassandra or Redis down, Kafka not acknowledging a suppression, or a recipient's
        state contended (``preferences.PREFERENCE_OUTAGE``) → wait and retry the whole batch
        (writes are idempotent); nothing is committed meanwhile. Gives up (the flow stops,
        raising the last error) after ``INFRA_RETRY_FOR``; any other exception stops it at
        once."""
        return await until_up("reconcile batch", lambda: self._apply(batch, store), log,
                              first=0.5, most=10.0, give_up_after=INFRA_RETRY_FOR,
                              on=PREFERENCE_OUTAGE)

    async def _apply(self, batch: list[ReconcileIn],
                     store: CassandraStore) -> list[DlqRecord | Receipt]:
        """Priority-lane events first, in waves of :data:`CONCURRENCY` messages; then
        bulk-lane events and the receipts, in waves as wide as the bulk window (it narrows
        while P0 is slow, see ``flows/common/yielding.py``). Copies of one receipt (same provider
        event id) in a batch are applied once: their ``receipts_dedup`` reads would all run
        before any write, and a copy the webhook received later carries a later
        ``occurred_at``, so a history row of its own."""
        priority: dict[str, list[StatusEvent]] = defaultdict(list)
        bulk: dict[str, list[StatusEvent]] = defaultdict(list)
        receipts: dict[str, SourcedReceipt] = {}
        for item in batch:
            if isinstance(item, StatusEvent):
                lane = self.settings.policy(item.tier).lane
                (priority if lane == "priority" else bulk)[item.message_id].append(item)
            else:
                receipts.setdefault(_receipt_key(item), item)

        for wave in _waves(priority, lambda: CONCURRENCY):
            await self._events_at_once(wave, store)
        if not bulk and not receipts:
            return []
        follow = asyncio.ensure_future(self.yielding.follow())
        try:
            for wave in _waves(bulk, lambda: self.yielding.slots.limit):
                await self._events_at_once(wave, store)
            outs: list[DlqRecord | Receipt] = []
            for part in _waves(receipts, lambda: self.yielding.slots.limit):
                outs += await self._receipts_at_once(list(part.values()), store)
        finally:
            follow.cancel()
        return outs

    async def _events_at_once(self, groups: dict[str, list[StatusEvent]],
                              store: CassandraStore) -> None:
        """The events of many messages (by message id) as one wave: their rows read together,
        each message's writes decided (:meth:`_planned`), then sent together; a row that
        keeps the compare-and-set path is moved by its own compare-and-set meanwhile. Each
        message's span ends once its writes are acknowledged."""
        ids = list(groups)
        heads = await store.messages.heads(ids)
        now = self.clock()
        plans = [self._planned(mid, groups[mid], head, store, now)
                 for mid, head in zip(ids, heads, strict=True)]
        await self._write(store, plans)
        for p in plans:
            if p.applied:
                _transitions.add(1, {"tier": p.top.tier.value, "channel": p.top.channel.value,
                                     "status": p.top.status.value})
        await self.tally.mark((mid, e.status) for mid, evs in groups.items() for e in evs)

    def _planned(self, message_id: str, evs: list[StatusEvent], head: MessageHeadRow | None,
                 store: CassandraStore, now: datetime) -> _Plan[StatusEvent]:
        """A message's events against its row as read (``head``): the row created if a
        direct-producer message is new, moved to the highest event's status, the history,
        attempt and index rows written. An unknown message without a snapshot only gets its
        history (logged)."""
        top = max(evs, key=lambda e: rank(e.status, e.attempt))
        others = {e._traceparent for e in evs if e._traceparent != top._traceparent}
        span = telemetry.started(
            names.RECONCILE, {names.ATTR_MESSAGE_ID: message_id, names.ATTR_TIER: top.tier.value,
                              names.ATTR_STATUS: top.status.value},
            parent=top._traceparent, links=[telemetry.link_to(t) for t in others])
        created: list[Write] = []
        if head is None:
            snap = next((e.message for e in evs if e.message is not None), None)
            if snap is None:
                log.error("event for unknown message %s without snapshot", message_id)
                return _Plan(top, span, self._history(store, message_id, evs, top, False))
            initial = Status.SCHEDULED if snap.scheduled_at else Status.QUEUED
            created = store.messages.creation_writes(message_id, snap, initial, now, "reconcile")
            head = store.messages.created_head(snap, initial, now)

        def then(applied: bool) -> list[Write]:
            return [*created, *self._history(store, message_id, evs, top, applied)]

        args = (message_id, top.status, top.attempt, top.reason, now, *_provider_ids(top),
                top.next_attempt_at)
        return self._plan(store, top, span, head, args, then)

    @staticmethod
    def _plan(store: CassandraStore, top: T, span: trace.Span, head: MessageHeadRow,
              args: tuple[Any, ...], then: Callable[[bool], list[Write]]) -> _Plan[T]:
        """The plan of a transition (``args`` as :meth:`MessageStore.transition` takes
        them) from the row ``head``, followed by ``then(applied)``'s writes."""
        planned = store.messages.planned_transition(*args, head=head)
        if planned is None:
            return _Plan(top, span, cas=functools.partial(store.messages.transition, *args,
                                                          head=head, then=then))
        applied, writes = planned
        return _Plan(top, span, [*writes, *then(applied)], applied)

    @staticmethod
    async def _write(store: CassandraStore, plans: Sequence[_Plan[Any]]) -> None:
        """Send a wave's writes together, run its compare-and-set transitions meanwhile, then
        end every span (with the error, when one failed)."""
        cas = [(p, p.cas) for p in plans if p.cas is not None]
        moved = asyncio.gather(*(run() for _, run in cas))
        try:
            await asyncio.gather(store.write_each([p.writes for p in plans if p.cas is None]),
                                 moved)
        except BaseException as exc:
            for p in plans:
                p.span.record_exception(exc)
                p.span.end()
            raise
        for (p, _), (applied, _) in zip(cas, moved.result(), strict=True):
            p.applied = applied
        for p in plans:
            p.span.set_attribute("notiflow.reconcile.applied", p.applied)
            p.span.end()

    @staticmethod
    def _history(store: CassandraStore, message_id: str, evs: list[StatusEvent],
                 top: StatusEvent, applied: bool) -> list[Write]:
        """History rows of ``evs`` (``top`` flagged ``applied``), attempts and index rows."""
        writes = []
        for e in evs:
            writes.append(store.messages.event_write(
                message_id, e.occurred_at, e.event_id, e.status, e.attempt, e.reason, e.source,
                applied and e is top))
            if e.attempt_detail is not None:
                writes += store.delivery.attempt_writes(message_id, e.attempt_detail,
                                                        e._traceparent)
        return writes

    async def _receipts_at_once(self, wave: list[SourcedReceipt],
                                store: CassandraStore) -> list[DlqRecord | Receipt]:
        """Receipts as one wave: each matched to the attempt its provider message id was
        recorded for (the provider message index), else to the attempt its hint names when
        that attempt's provider and provider message id agree (``receipt_match.py``); a
        receipt that names an attempt it does not belong to is dropped and counted as
        forged, one whose attempt is not recorded yet is parked. Their rows and dedup
        records read together, the suppressions the new ones imply written, then their
        writes decided and sent together (as for events): a suppression that fails fails
        the batch before the receipt's dedup row exists, so the retry suppresses again
        (suppressing is idempotent). Returns parked receipts and DLQ records."""
        now = self.clock()
        found = await asyncio.gather(*(store.delivery.message_for_provider_id(
            sr.receipt.provider_id, sr.receipt.provider_message_id) for sr in wave))
        hinted = {sr.receipt.message_id for sr, row in zip(wave, found, strict=True)
                  if row is None and sr.receipt.message_id is not None}
        rows = dict(zip(hinted, await asyncio.gather(*(store.delivery.attempts(m) for m in hinted)),
                        strict=True))
        outs: list[DlqRecord | Receipt] = []
        targets: list[tuple[SourcedReceipt, str, int, trace.Span, str]] = []
        forged: list[tuple[Receipt, receipt_match.Forged]] = []
        for sr, idx in zip(wave, found, strict=True):
            r = sr.receipt
            verdict = (receipt_match.by_index(r, idx) if idx is not None
                       else receipt_match.by_attempts(r, rows.get(r.message_id or "", [])))
            if isinstance(verdict, receipt_match.Target):
                targets.append((sr, verdict.message_id, verdict.attempt,
                                self._receipt_span(r, idx), verdict.provider_message_id))
            elif isinstance(verdict, receipt_match.Forged):
                forged.append((r, verdict))
            else:
                outs.append(self._park(sr, verdict.why, now))
        self._drop_forged(forged)
        heads, seens = await asyncio.gather(
            store.messages.heads([t[1] for t in targets]),
            store.delivery.receipt_records([(sr.receipt.provider_id, sr.receipt.provider_event_id)
                                            for sr, *_ in targets]))
        plans: list[tuple[_Plan[Receipt], str, bool]] = []
        for (sr, mid, attempt, span, pmid), head, seen in zip(targets, heads, seens,
                                                              strict=True):
            r = sr.receipt
            if head is None:
                span.end()
                outs.append(self._park(sr, f"no message row {mid}", now))
                continue
            args = (mid, r.status, attempt, r.error_code, now, r.provider_id, pmid)
            plans.append((self._plan(
                store, r, span, head, args,
                functools.partial(self._receipt_rows, store, r, mid, attempt, seen, now=now)),
                mid, seen is None))
        await asyncio.gather(*(self._suppress(store, mid, reason)
                               for p, mid, new in plans
                               if new and (reason := suppression_for(p.top)) is not None))
        await self._write(store, [p for p, *_ in plans])
        await self.tally.mark((mid, p.top.status) for p, mid, _ in plans)
        for p, _, _ in plans:
            if p.applied:
                _transitions.add(1, {"channel": self._channels.get(p.top.provider_id, ""),
                                     "status": p.top.status.value})
        return outs

    @staticmethod
    def _drop_forged(forged: Sequence[tuple[Receipt, receipt_match.Forged]]) -> None:
        """Count every forged receipt (by provider and what differed); one log line a wave."""
        for r, f in forged:
            _forged.add(1, {"provider": r.provider_id, "reason": f.reason})
        if forged:
            log.warning("%d receipt(s) dropped as forged, e.g. %s", len(forged),
                        forged[0][1].detail)

    @staticmethod
    def _receipt_rows(store: CassandraStore, r: Receipt, message_id: str, attempt: int,
                      seen: ReceiptRecord | None, applied: bool, *,
                      now: datetime) -> list[Write]:
        """A receipt's dedup and outcome rows, and its history row when it is new."""
        writes = store.delivery.receipt_writes(r.provider_id, r.provider_event_id, message_id,
                                               r.status, now, seen)
        if seen is None:
            writes.append(store.messages.event_write(
                message_id, r.occurred_at, f"{r.provider_id}:{r.provider_event_id}",
                r.status, attempt, r.error_code, f"receipt.{r.provider_id}", applied))
        return writes

    @staticmethod
    def _receipt_span(r: Receipt, index: ProviderIndexRow | None) -> trace.Span:
        """The receipt's ``notiflow.reconcile`` span, started. It continues the receipt's
        trace (the provider call's, when the provider echoed it). When tracing is on and the
        receipt's trace is not the send's (Vonage, SMTP, push echo nothing), it continues
        the send's trace stored with the provider message ``index`` and links the
        receipt's; a receipt that overtakes that index row keeps its own trace."""
        parent, links = r._traceparent, []
        stored = index.traceparent if index is not None else None
        if stored and telemetry.trace_id_of(stored) != telemetry.trace_id_of(parent):
            parent, links = stored, [telemetry.link_to(r._traceparent)]
        return telemetry.started(names.RECONCILE, {names.ATTR_MESSAGE_ID: r.message_id,
                                                   names.ATTR_STATUS: r.status.value},
                                 parent=parent, links=links)

    def _park(self, sr: SourcedReceipt, why: str, now: datetime) -> DlqRecord | Receipt:
        """Try an uncorrelated receipt again later (the send event that indexes its provider
        message id may not have been applied yet); DLQ after ``receipt_park_for``."""
        r = sr.receipt
        since = r.parked_since or now
        if now - since >= self.settings.scaled(self.settings.receipt_park_for):
            return self._uncorrelated(sr, why, now)
        tries = max(1, round((now - since) / PARK_FIRST_WAIT))
        wait = min(PARK_FIRST_WAIT * tries, PARK_MAX_WAIT)
        return r.model_copy(update={"parked_since": since,
                                    "not_before": now + self.settings.scaled(wait)})

    def _uncorrelated(self, sr: SourcedReceipt, why: str, now: datetime) -> DlqRecord:
        r = sr.receipt
        return dead_letter(raw=sr.raw, source=sr.source,
                           reason=f"receipt never correlated ({why}) after "
                                  f"{self.settings.receipt_park_for}",
                           error_class="uncorrelated_receipt", category="invalid_data",
                           tier=None, cipher=self.cipher, now=now, message_id=r.message_id)

    async def _suppress(self, store: CassandraStore, message_id: str, reason: str) -> None:
        from notiflow.adapters.kafka_io import AsyncProducer
        from notiflow.adapters.preferences import PreferenceStore

        row = await store.messages.get_message(message_id)
        if row is None or not row.recipient_hash or row.tenant_id is None:
            return
        if self._preferences is None:
            self._preferences = PreferenceStore(store.recipients, AsyncProducer(self.settings),
                                                self.settings.preferences_topic)
        await self._preferences.suppress(row.tenant_id, row.recipient_hash, reason)


G = TypeVar("G")


def _waves(groups: dict[str, G], width: Callable[[], int]) -> Iterator[dict[str, G]]:
    """``groups`` in order, in waves of at most ``width()`` messages (read at each wave)."""
    items = list(groups.items())
    i = 0
    while i < len(items):
        n = max(1, width())
        yield dict(items[i:i + n])
        i += n


def _receipt_due(item: ReconcileIn) -> datetime | None:
    return item.receipt.not_before if isinstance(item, SourcedReceipt) else None


def _receipt_key(item: ReconcileIn) -> str:
    assert isinstance(item, SourcedReceipt)
    return f"{item.receipt.provider_id}:{item.receipt.provider_event_id}"


def _provider_ids(e: StatusEvent) -> tuple[str | None, str | None]:
    d = e.attempt_detail
    return (d.provider_id, d.provider_message_id) if d is not None else (None, None)


def build_reconcile_flow(
    settings: Settings,
    *,
    source: Source[Any] | None = None,
    sink: Sink[OutRecord] | None = None,
    clock: Clock = utcnow,
) -> Dataflow:
    """The reconciliation dataflow; ``source``/``sink`` default to Kafka."""
    cipher = DlqCipher.from_settings(settings)
    flow = Dataflow("reconcile")
    topics = [settings.events_topic, settings.receipts_topic]
    raw = op.input("events", flow, source or kafka_source(settings, topics, 1000))
    valid: Stream[ReconcileIn]
    valid, dead = parse_or_dlq(
        "parse", raw, functools.partial(parse_reconcile, settings=settings, cipher=cipher,
                                        clock=clock),
        (StatusEvent, SourcedReceipt),
        guard=DlqGuard(settings.dlq, "reconcile", ok=(StatusEvent, SourcedReceipt)))
    ready = hold_until_due("park", valid, key=_receipt_key, clock=clock, due_of=_receipt_due)
    applied = op.flat_map_batch("apply", ready, ApplyStep(settings, cipher, clock))
    outputs: Stream[DlqRecord | Receipt] = op.merge("outputs", applied, dead)
    guard_and_emit(outputs, guard=None, encode=Encoder(settings),
                   sink=sink or ConfirmingSink(settings))
    return flow
