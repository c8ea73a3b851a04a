"""The campaign expander: turns the rows of a campaign's manifest into P2/P3 messages.

A plain asyncio process, like the scheduler and for the same reasons: its unit of work is a
campaign that any of several expanders may hold (a lease on the campaign's Cassandra row),
and its whole state is a checkpoint in that row (byte offset and next row of the manifest,
counts), written only after the batch it covers is durable. A Bytewax flow would keep the
same cursor in a second store and pin campaigns to workers.

Recipe, per held campaign:

    read      the manifest from the checkpoint's byte offset, a chunk at a time (never the
              whole object), rows parsed incrementally (``flows/campaigns/manifest.py``)
    map       each row → an ingest record with message id (campaign, row), or a rejection
              with its row number and reason; rows past the campaign's quota end it
    pace      the campaign's rate, capped by its tier's share of the channel's provider
              capacity, scaled by the bulk-yield window (P0's latency signal); expansion
              waits while the tier's oldest unsent message is older than ``backlog_high``
              of its shed bound
    write     due records → the tier's ingest topic (acks=all); records due later (the
              recipient's local window) → ``scheduled_work``; rejections → the error report;
              all confirmed before
    checkpoint  a lightweight transaction that holds only while this expander owns the
              running campaign: a pause, a cancel or a takeover stops it at the next batch

A crash re-expands at most the batch after the last checkpoint: the same message ids, which
the send flow's dedup lease absorbs, so no row is sent twice and none is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol

from notiflow import names, telemetry
from notiflow.adapters.campaign_notices import notice_of
from notiflow.adapters.campaign_store import CampaignRow, Progress
from notiflow.adapters.envelope import dump, envelope
from notiflow.adapters.kafka_io import OutRecord, make_headers
from notiflow.adapters.manifests import ManifestNotAllowed, ManifestUnreadable
from notiflow.correlation import CorrelationKeys
from notiflow.flows.campaigns.manifest import (
    CampaignSpec,
    ManifestError,
    ManifestRow,
    Mapped,
    Rejected,
    RowReader,
    map_row,
)
from notiflow.flows.campaigns.members import (
    People,
    map_member,
    member_of,
    resolve_rows,
    snapshot_lines,
)
from notiflow.flows.campaigns.state_notices import NoticeBoard, Notifier
from notiflow.flows.common.items import utcnow
from notiflow.flows.common.runner import run_until_signalled
from notiflow.flows.common.yielding import YieldWindow
from notiflow.ingest_binding import Binder, binder
from notiflow.preference_links import preference_link
from notiflow.recipient_checks import recipient_problem
from notiflow.schemas.campaigns import CampaignState, RowError, format_of
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.scheduling import ScheduledRow
from notiflow.schemas.topic_sends import TopicCampaign
from notiflow.settings import CampaignRule, Settings, TenantConfig

log = logging.getLogger("notiflow.flows.expander")
_rows = names.CAMPAIGN_ROWS.create(telemetry.meter())
Clock = Callable[[], datetime]
YIELD_CEILING = 100


class Board(Protocol):
    """What the expander reads and writes of campaigns (``adapters/campaign_store.py``)."""

    async def live(self) -> list[tuple[str, str]]: ...

    async def get(self, tenant_id: str, campaign_id: str) -> CampaignRow | None: ...

    async def take(self, row: CampaignRow, owner: str, until: datetime,
                   now: datetime) -> bool: ...

    async def checkpoint(self, row: CampaignRow, owner: str, p: Progress, until: datetime,
                         now: datetime) -> bool: ...

    async def finish(self, row: CampaignRow, owner: str, p: Progress,
                     state: CampaignState, reason: str | None, now: datetime) -> bool: ...

    async def release(self, row: CampaignRow, owner: str, now: datetime) -> None: ...

    async def reject(self, campaign_id: str, errors: Sequence[RowError]) -> None: ...


class Manifests(Protocol):
    """Read access to manifests (``adapters/object_store.py``)."""

    async def size(self, uri: str, tenant_id: str) -> int: ...

    def chunks(self, uri: str, tenant_id: str, start: int,
               size: int | None = None) -> AsyncIterator[bytes]: ...

    async def write(self, uri: str, tenant_id: str, data: AsyncIterable[bytes]) -> int:
        """Store ``data`` as ``uri`` (replacing it); its size."""
        ...


class Signals(Protocol):
    """The pressure signals bulk work yields to (``adapters/admission.py``)."""

    async def p0_worst(self) -> float | None: ...

    async def backlog_age(self, tier: Tier) -> float | None: ...


Publish = Callable[[Sequence[OutRecord]], Awaitable[None]]
"""Produce records; return once Kafka acknowledged every one (raise otherwise)."""
Hold = Callable[[Sequence[ScheduledRow], datetime], Awaitable[None]]
"""Write rows to ``scheduled_work``; return once every one is written."""


def tier_capacity(settings: Settings, tier: Tier, channel: Channel) -> float | None:
    """Messages/s the tier's share of the channel's enabled provider accounts can send;
    None when no provider has a configured rate."""
    enabled = settings.enabled_providers()
    rates = [settings.provider_rates.get(r.provider_id, 0.0) for r in settings.routes
             if r.channel is channel and r.provider_id in enabled]
    total = sum(rate for rate in rates if rate > 0)
    return settings.share(tier) * total if total > 0 else None


def campaign_rate(settings: Settings, row: CampaignRow) -> float:
    """The campaign's pace before yielding: its ``max_rate``, capped by its tier's share of
    the channel's capacity (expanding faster only queues)."""
    cap = tier_capacity(settings, row.request.tier, row.request.channel)
    return row.max_rate if cap is None else min(row.max_rate, cap)


class Pace:
    """A token bucket of one campaign (burst: one batch), slowed by ``factor`` (0-1)."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.clock = clock
        self.tokens = float(burst)
        self.at = clock()

    def wait_s(self, n: int, factor: float) -> float | None:
        """Seconds until ``n`` rows may go at ``factor`` of the rate (None: not while the
        factor is 0); takes the tokens when it returns 0."""
        now = self.clock()
        rate = self.rate * factor
        self.tokens = min(self.burst, self.tokens + (now - self.at) * rate)
        self.at = now
        if self.tokens >= n:
            self.tokens -= n
            return 0.0
        return None if rate <= 0 else (n - self.tokens) / rate


@dataclass(frozen=True, slots=True)
class Batch:
    """What one batch of rows became."""

    records: list[OutRecord]
    held: list[ScheduledRow]
    errors: list[RowError]
    over_quota: bool
    rows_used: int
    """Rows the batch took (fewer than it was given once the quota is reached)."""


class Expander:
    """One expander process's campaigns. ``run`` until ``stop`` is set."""

    def __init__(self, settings: Settings, board: Board, manifests: Manifests,
                 publish: Publish, hold: Hold, signals: Signals, owner: str,
                 clock: Clock = utcnow, notices: NoticeBoard | None = None,
                 notifier: Notifier | None = None, people: People | None = None) -> None:
        self.settings = settings
        self.keys = CorrelationKeys.from_settings(settings)
        self.rule: CampaignRule = settings.campaigns
        self.board = board
        self.manifests = manifests
        self.publish = publish
        self.hold = hold
        self.signals = signals
        self.owner = owner
        self.clock = clock
        self.window = YieldWindow(settings.bulk_yield,
                                  settings.policy(Tier.P0).sla.total_seconds(), YIELD_CEILING)
        self.notices = notices
        self.notifier = notifier
        self.people = people
        self.tasks: dict[str, asyncio.Task[str]] = {}
        self.outcomes: dict[str, str] = {}

    @property
    def factor(self) -> float:
        return self.window.limit / YIELD_CEILING

    async def run(self, stop: asyncio.Event) -> None:
        """Take and expand campaigns until ``stop``; then release them for another."""
        loops = [asyncio.create_task(self._every(self.settings.bulk_yield.tick,
                                                 self.tick_signal, stop))]
        if self.notifier is not None:
            loops.append(asyncio.create_task(self._every(self.rule.poll, self.notifier.tick,
                                                         stop)))
        try:
            await self._every(self.rule.poll, self.tick, stop)
        finally:
            for task in [*loops, *self.tasks.values()]:
                task.cancel()
            await asyncio.gather(*loops, *self.tasks.values(), return_exceptions=True)

    async def _every(self, period: timedelta, tick: Callable[[], Awaitable[object]],
                     stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await tick()
            except Exception as exc:
                log.warning("expander %s: %s: %r", tick.__name__, type(exc).__name__, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period.total_seconds())

    async def tick_signal(self) -> int:
        return self.window.step(await self.signals.p0_worst())

    async def tick(self) -> int:
        """Take the live campaigns that are due and free, up to ``max_per_expander``."""
        for cid, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[cid]
                self.outcomes[cid] = (task.result() if not task.cancelled()
                                      and task.exception() is None else "crashed")
        taken = 0
        for tenant_id, cid in await self.board.live():
            if len(self.tasks) >= self.rule.max_per_expander:
                break
            if cid in self.tasks:
                continue
            row = await self.board.get(tenant_id, cid)
            now = self.clock()
            if (row is None or row.state not in ("scheduled", "running")
                    or row.starts_at > now
                    or (row.lease_until is not None and row.lease_until >= now)):
                continue
            if await self.board.take(row, self.owner, now + self.rule.lease, now):
                log.info("expander %s: took campaign %s at row %d", self.owner, cid,
                         row.progress.next_row)
                if row.state == "scheduled":
                    await self._announce(row, "running", None, row.progress, now)
                self.tasks[cid] = asyncio.create_task(self.expand(row))
                taken += 1
        return taken

    async def expand(self, row: CampaignRow) -> str:
        """Expand one campaign until it ends, stops being ours, or fails; its outcome."""
        try:
            outcome = await self._expand(row)
            if outcome == "stopped":
                await self.board.release(row, self.owner, self.clock())
            return outcome
        except ManifestNotAllowed as exc:
            log.warning("expander %s: campaign %s of tenant %s names a manifest outside the "
                        "tenant's prefix; it fails unread", self.owner, row.campaign_id,
                        row.tenant_id)
            await self._finish(row, row.progress, "failed", f"manifest_not_allowed: {exc.reason}")
            return "failed"
        except (ManifestError, ManifestUnreadable) as exc:
            await self._finish(row, row.progress, "failed", f"manifest: {exc.reason}")
            return "failed"
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.board.release(row, self.owner, self.clock()))
            raise
        except Exception:
            log.exception("expander %s: campaign %s", self.owner, row.campaign_id)
            with contextlib.suppress(Exception):
                await self.board.release(row, self.owner, self.clock())
            raise

    async def _expand(self, row: CampaignRow) -> str:
        req = row.request
        p = row.progress
        if p.manifest_bytes is None and isinstance(req, TopicCampaign):
            p = replace(p, manifest_bytes=await self._snapshot(row, req))
            if not await self.board.checkpoint(row, self.owner, p,
                                               self.clock() + self.rule.lease, self.clock()):
                return "stopped"
        if p.manifest_bytes is None:
            p = replace(p, manifest_bytes=await self.manifests.size(req.manifest,
                                                                     row.tenant_id))
        reader = RowReader(format_of(req.manifest, req.format), start_offset=p.bytes_read,
                           next_row=p.next_row, header=p.header)
        spec = CampaignSpec(
            tenant_id=row.tenant_id, campaign_id=row.campaign_id, channel=req.channel,
            tier=req.tier, category=req.category, template_id=req.template_id,
            template_version=req.template_version, mapping=req.mapping, ends_at=row.ends_at,
            default_zone=req.timezone or self._tenant_zone(row.tenant_id), window=req.window,
            sender=req.sender)
        pace = Pace(campaign_rate(self.settings, row), self.rule.batch)
        pending: list[ManifestRow] = []
        chunks = self.manifests.chunks(req.manifest, row.tenant_id, p.bytes_read,
                                       p.manifest_bytes)
        async for chunk in chunks:
            pending.extend(reader.feed(chunk))
            while len(pending) >= self.rule.batch:
                head, pending = pending[:self.rule.batch], pending[self.rule.batch:]
                p, outcome = await self._batch(row, spec, pace, p, head, reader)
                if outcome is not None:
                    return outcome
        pending.extend(reader.finish())
        while pending:
            head, pending = pending[:self.rule.batch], pending[self.rule.batch:]
            p, outcome = await self._batch(row, spec, pace, p, head, reader)
            if outcome is not None:
                return outcome
        await self._finish(row, p, "completed", None)
        log.info("expander %s: campaign %s completed: %d rows, %d expanded, %d rejected",
                 self.owner, row.campaign_id, p.rows_read, p.expanded, p.rejected)
        return "completed"

    async def _snapshot(self, row: CampaignRow, req: TopicCampaign) -> int:
        """Write the topic's subscribers to the campaign's snapshot; its size."""
        if self.people is None:
            raise ManifestError("this expander cannot read topics")
        lines = snapshot_lines(self.people.topics, row.tenant_id, req.audience.topic,
                               self.people.buckets)
        size = await self.manifests.write(req.manifest, row.tenant_id, lines)
        log.info("expander %s: campaign %s: snapshot of topic subscribers written (%d "
                 "bytes)", self.owner, row.campaign_id, size)
        return size

    async def _finish(self, row: CampaignRow, p: Progress, state: CampaignState,
                      reason: str | None) -> None:
        now = self.clock()
        if await self.board.finish(row, self.owner, p, state, reason, now):
            await self._announce(row, state, reason, p, now)

    async def _announce(self, row: CampaignRow, state: CampaignState, reason: str | None,
                        p: Progress, now: datetime) -> None:
        """Record the state change for the campaign's webhook, if it names one."""
        if self.notices is None:
            return
        moved = replace(row, state=state, reason=reason, progress=p)
        notice = notice_of(moved, moved.counts(), now)
        if notice is not None:
            await self.notices.add(notice)

    def _tenant_zone(self, tenant_id: str) -> str:
        tenant = self.settings.tenant(tenant_id)
        return tenant.timezone if tenant is not None else "UTC"

    async def _batch(self, row: CampaignRow, spec: CampaignSpec, pace: Pace, p: Progress,
                     rows: list[ManifestRow], reader: RowReader
                     ) -> tuple[Progress, str | None]:
        """Pace, map, write and checkpoint one batch; (progress, outcome when it ends)."""
        outcome = await self._wait_turn(row, pace, len(rows), p)
        if outcome is not None:
            return p, outcome
        now = self.clock()
        if now >= row.ends_at:
            await self._finish(row, p, "completed", "window_ended")
            return p, "window_ended"
        batch = self._map(spec, await self._rows(row, spec, rows, now), now,
                          row.quota - p.expanded)
        await asyncio.gather(self.publish(batch.records), self.hold(batch.held, now),
                             self.board.reject(row.campaign_id, batch.errors))
        expanded = len(batch.records) + len(batch.held)
        labels = {"campaign": row.campaign_id, "tenant": row.tenant_id}
        for outcome, n in (("expanded", len(batch.records)), ("held", len(batch.held)),
                           ("rejected", len(batch.errors))):
            if n:
                _rows.add(n, {**labels, "outcome": outcome})
        last = rows[-1] if not batch.over_quota else None
        read = batch.rows_used
        p = replace(p, bytes_read=last.end_offset if last else p.bytes_read,
                    next_row=last.number + 1 if last else p.next_row,
                    rows_read=p.rows_read + read, expanded=p.expanded + expanded,
                    rejected=p.rejected + len(batch.errors),
                    waiting=p.waiting + len(batch.held), header=reader.header,
                    first_expanded_at=p.first_expanded_at or now)
        if batch.over_quota:
            await self._finish(row, p, "completed", "quota")
            return p, "quota"
        if not await self.board.checkpoint(row, self.owner, p, self.clock() + self.rule.lease,
                                           self.clock()):
            log.info("expander %s: campaign %s is no longer ours to expand (paused, "
                     "cancelled or taken over)", self.owner, row.campaign_id)
            return p, "stopped"
        return p, None

    async def _wait_turn(self, row: CampaignRow, pace: Pace, n: int, p: Progress
                         ) -> str | None:
        """Wait until ``n`` rows may go: the pace and P0's signal allow it, and the tier's
        backlog is below ``backlog_high`` of its bound. The lease is renewed (and the state
        checked) every second while waiting: a campaign paused or cancelled meanwhile returns
        ``stopped`` within a second, before its next batch."""
        bound = self.settings.policy(row.request.tier).max_backlog_age
        high = (None if bound is None
                else self.rule.backlog_high * self.settings.scaled(bound).total_seconds())
        renewed = time.monotonic()
        while True:
            age = await self.signals.backlog_age(row.request.tier) if high else None
            wait = None if age is not None and high and age > high else pace.wait_s(
                n, self.factor)
            if wait == 0.0:
                return None
            step = self.settings.bulk_yield.tick.total_seconds()
            await asyncio.sleep(step if wait is None else min(wait, step))
            if time.monotonic() - renewed > min(1.0, self.rule.lease.total_seconds() / 4):
                renewed = time.monotonic()
                now = self.clock()
                if not await self.board.checkpoint(row, self.owner, p, now + self.rule.lease,
                                                   now):
                    return "stopped"

    async def _rows(self, row: CampaignRow, spec: CampaignSpec, rows: list[ManifestRow],
                    now: datetime) -> list[tuple[int, list[Mapped] | Rejected]]:
        """Each row's messages (one, of a manifest row; one per chosen address, of a topic
        send's subscriber) or why it sends nothing."""
        req = row.request
        tenant = self.settings.tenant(spec.tenant_id)
        if isinstance(req, TopicCampaign):
            if self.people is None or tenant is None:
                raise ManifestError("this expander cannot resolve users")
            found = await resolve_rows(self.settings, tenant, self.people, req.audience,
                                       spec, rows)
            return [(r.number, map_member(spec, req.audience, r, f, now, self.keys,
                                          self._link(req, spec.tenant_id, r)))
                    for r, f in zip(rows, found, strict=True)]
        out: list[tuple[int, list[Mapped] | Rejected]] = []
        for r in rows:
            one = served_row(self.settings, tenant, map_row(spec, r, now, self.keys))
            out.append((r.number, one if isinstance(one, Rejected) else [one]))
        return out

    def _link(self, req: TopicCampaign, tenant_id: str, row: ManifestRow) -> str | None:
        """The row's user's preference page link, when the send's templates read it."""
        user_id = member_of(row) if req.audience.link else None
        if not isinstance(user_id, str):
            return None
        link = preference_link(self.settings, tenant_id, user_id, keys=self.keys)
        return None if link is None else link.url

    def _map(self, spec: CampaignSpec, rows: list[tuple[int, list[Mapped] | Rejected]],
             now: datetime, room: int) -> Batch:
        """Rows to records, until the quota's ``room`` is used up (the rest stay unread)."""
        records: list[OutRecord] = []
        held: list[ScheduledRow] = []
        errors: list[RowError] = []
        lead = self.settings.scheduling.min_lead
        for used, (_number, outs) in enumerate(rows):
            filled = len(records) + len(held)
            if filled >= room or (not isinstance(outs, Rejected)
                                  and filled + len(outs) > room):
                return Batch(records, held, errors, over_quota=True, rows_used=used)
            if isinstance(outs, Rejected):
                errors.append(RowError(row=outs.row, reason=outs.reason))
                continue
            for out in outs:
                record = out.record
                if out.due > now:
                    record = record.model_copy(update={"scheduled_at": out.due})
                payload = dump(record, envelope(self.settings))
                leg_topic = self.settings.ingest_topic(record.channel, spec.tier)
                if out.due - now >= lead:
                    held.append(ScheduledRow.waiting(record, out.due, leg_topic, payload,
                                                     self.settings.scheduling.bucket,
                                                     self.settings.scheduling.shards))
                else:
                    records.append(_record(leg_topic, record.partition_key(), payload, out,
                                           binder(self.settings)))
        return Batch(records, held, errors, over_quota=False, rows_used=len(rows))


def served_row(settings: Settings, tenant: TenantConfig | None,
               out: Mapped | Rejected) -> Mapped | Rejected:
    """A mapped row whose recipient the platform cannot serve for ``tenant``
    (:func:`~notiflow.recipient_checks.recipient_problem`, the API's check) becomes a
    rejected row with that reason; other rows pass unchanged."""
    if isinstance(out, Rejected) or tenant is None:
        return out
    problem = recipient_problem(settings, tenant, out.record.channel, out.record.recipient)
    if problem is None:
        return out
    return Rejected(out.row, f"{problem.code}: {problem.message}")


def _record(topic: str, key: bytes, payload: str, out: Mapped, signer: Binder) -> OutRecord:
    r = out.record
    value = payload.encode()
    return OutRecord(topic=topic, key=key, value=value, headers=signer.sign(
        make_headers(r.message_id or "", r.tenant_id, r.tier.value), r.channel.value,
        r.tier.value, value))


async def serve(settings: Settings, owner: str, stop: asyncio.Event) -> None:
    """Open Cassandra, Redis, the object store and a confirming Kafka producer (acks=all,
    idempotent) and expand until ``stop`` is set."""
    from notiflow.adapters.admission import AdmissionStore
    from notiflow.adapters.campaign_notices import NoticeStore
    from notiflow.adapters.campaign_store import CampaignStore
    from notiflow.adapters.cassandra.session import connect
    from notiflow.adapters.client_webhooks import WebhookClient
    from notiflow.adapters.egress import EgressGuard
    from notiflow.adapters.kafka_io import AsyncProducer
    from notiflow.adapters.manifests import Manifests as ObjectManifests
    from notiflow.adapters.scheduled_store import ScheduledStore

    cluster, session = await asyncio.to_thread(connect, settings)
    people = await asyncio.to_thread(open_people, settings, session)
    producer = AsyncProducer(settings)
    signals = AdmissionStore.open(settings)
    client = WebhookClient(settings.client_webhooks.timeout,
                           egress=EgressGuard(settings.egress))
    publish = producer.produce_all

    try:
        scheduled = ScheduledStore(session, settings)

        async def hold(rows: Sequence[ScheduledRow], now: datetime) -> None:
            await asyncio.gather(*(scheduled.add(r, now) for r in rows))

        notices = NoticeStore(session)
        await client.open()
        log.info("expander %s: batches of %d rows, up to %d campaigns", owner,
                 settings.campaigns.batch, settings.campaigns.max_per_expander)
        await Expander(settings, CampaignStore(session, settings),
                       ObjectManifests(settings), publish, hold, signals, owner,
                       notices=notices, notifier=Notifier(settings, notices, client.post),
                       people=people).run(stop)
    finally:
        await client.aclose()
        await signals.aclose()
        await asyncio.to_thread(producer.close)
        cluster.shutdown()


def open_people(settings: Settings, session: object) -> People | None:
    """Users, address states and topics over Cassandra ``session``; None without
    ``NOTIFLOW_DLQ_KEY`` (profiles are sealed with it), so topic sends fail."""
    from notiflow.adapters.cassandra.recipients import RecipientStore
    from notiflow.adapters.cassandra.session import Statements
    from notiflow.adapters.cassandra.topics import CassandraTopics
    from notiflow.adapters.cassandra.users import CassandraUsers
    from notiflow.adapters.dlq_crypto import DlqCipher
    from notiflow.adapters.ports import TOPIC_BUCKETS
    from notiflow.adapters.preferences import StoredStates

    if settings.dlq_key is None:
        return None
    cql = Statements(session)  # type: ignore[arg-type]  # a cassandra Session
    return People(users=CassandraUsers(cql, DlqCipher.from_settings(settings)),
                  prefs=StoredStates(RecipientStore(cql)), topics=CassandraTopics(cql),
                  buckets=TOPIC_BUCKETS)


def main(settings: Settings, owner: str) -> None:
    """Run one expander process until SIGTERM or SIGINT (its campaigns are then released at
    once, for another expander to take over)."""
    run_until_signalled(settings, "expander", owner, serve)
