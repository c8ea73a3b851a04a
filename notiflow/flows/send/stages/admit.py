"""Admit: which attempts may go on. A record that crash-looped goes to the DLQ; a check
record resolves an ambiguous attempt; every other attempt takes its lease (a replay of a
finished attempt re-emits its outcome, a live lease elsewhere makes it wait) and, when old,
is checked against Cassandra before it is sent again."""

from __future__ import annotations

import asyncio
import functools
import logging
from datetime import UTC, datetime, timedelta

from notiflow.adapters.outages import REDIS_DOWN
from notiflow.adapters.ports import LeaseState
from notiflow.flows.common.items import Work
from notiflow.flows.common.steps import retry_record
from notiflow.flows.send.stages.context import InfraUnavailable, SendContext
from notiflow.flows.send.stages.emit import release, replayed
from notiflow.flows.send.stages.send_batch import Batch
from notiflow.schemas.enums import Status
from notiflow.schemas.status import rank

log = logging.getLogger("notiflow.flows.dispatch")
CRASH_MEMORY = timedelta(days=7)


def crash_field(work: Work) -> str:
    """What a crash is counted against: the message's attempt. Not the source offset alone: a
    record that waits (backoff, a stale lease) is re-published at a new offset."""
    return f"{work.message_id}:{work.record.attempt}"


class CrashLoop:
    """Records that crashed the flow ``dlq.max_crashes`` times → DLQ (category bug)."""

    async def __call__(self, batch: Batch, ctx: SendContext) -> None:
        limit = ctx.settings.dlq.max_crashes
        for w in batch.live:
            n = ctx.crashes.get(crash_field(w), 0)
            if n >= limit:
                batch.decide(w, [ctx.dead_letter(w, f"crashed the flow {n} times",
                                                 "crash_loop", "bug", batch.now)])


class UnknownChecks:
    """Check records: an ambiguous attempt that no receipt resolved in time ends FAILED
    (``ambiguous``); one that a receipt moved on needs nothing."""

    async def __call__(self, batch: Batch, ctx: SendContext) -> None:
        checks = [w for w in batch.live if w.record.unknown_check is not None]
        if not checks:
            return
        store = ctx.ports.messages
        rows = await ctx.infra("cassandra", lambda: asyncio.gather(
            *(store.message(w.message_id) for w in checks)))
        for w, row in zip(checks, rows, strict=True):
            attempt = w.record.unknown_check or w.record.attempt
            current = int(row.status_rank or 0) if row else 0
            if current <= rank(Status.UNKNOWN, attempt):
                batch.decide(w, [ctx.event(w, Status.FAILED, batch.now, reason="ambiguous",
                                           attempt=attempt)])
            else:
                batch.decide(w, [])


class Lease:
    """Take each attempt's lease (one round trip). Already finished → its outcome again;
    pending in a live process → wait until that lease is stale; pending in a dead one →
    take it over (a possible duplicate, logged); pending here → nothing."""

    async def __call__(self, batch: Batch, ctx: SendContext) -> None:
        leases = ctx.ports.leases
        now = batch.now
        keys = [ctx.lease_key(w) for w in batch.live]
        ttl = max(ctx.lease_ttl(w) for w in batch.live)
        states = await ctx.redis(lambda: leases.acquire(keys, ttl),
                                 [LeaseState(True) for _ in keys])
        for w, key, st in zip(batch.live, keys, states, strict=True):
            if st.acquired:
                continue
            if (done := st.done) is not None:
                batch.decide(w, replayed(ctx, w, done, now))
            elif (owner := st.pending_owner()) is not None and owner != leases.owner:
                since = datetime.fromtimestamp((st.pending_since_ms() or 0) / 1000, UTC)
                stale_at = since + ctx.stale_after(w)
                if now < stale_at:
                    batch.decide(w, [retry_record(w, w.record.attempt, stale_at)])
                elif await ctx.redis(functools.partial(leases.take_over, key,
                                                       st.holder or "", ttl), True):
                    log.warning("message %s attempt %s: resuming after a crashed sender "
                                "(possible duplicate)", w.message_id, w.record.attempt)
                else:
                    batch.decide(w, [retry_record(w, w.record.attempt,
                                                  now + ctx.stale_after(w))])
            else:
                batch.decide(w, [])


class AlreadyFinal:
    """A lease can only have expired for an old record: ask Cassandra whether the message
    already ended before sending it again."""

    async def __call__(self, batch: Batch, ctx: SendContext) -> None:
        now = ctx.clock()
        old = [w for w in batch.live if now - w.accepted_at > ctx.lease_ttl(w)]
        if not old:
            return
        store = ctx.ports.messages
        rows = await ctx.infra("cassandra", lambda: asyncio.gather(
            *(store.message(w.message_id) for w in old)))
        for w, row in zip(old, rows, strict=True):
            if row and (row.status_rank or 0) >= rank(Status.SUPPRESSED):
                batch.decide(w, [])


async def count_crash(ctx: SendContext, w: Work) -> None:
    """The flow is about to stop because of this record: count it, so the next start
    dead-letters it instead of crash-looping, and free its lease (this process will not
    finish the attempt; the restart may, as a takeover of a stale lease would)."""
    try:
        n = await ctx.ports.leases.count_crash(ctx.source, crash_field(w), CRASH_MEMORY)
        log.error("message %s attempt %d (source %s:%d:%d) crashed the flow %d time(s)",
                  w.message_id, w.record.attempt, w.source.topic, w.source.partition,
                  w.source.offset, n)
        await release(ctx, w)
    except REDIS_DOWN as exc:
        log.warning("crash of %s not counted: %r", crash_field(w), exc)


def counts_as_crash(exc: BaseException) -> bool:
    """Whether a send step stopped by ``exc`` counts against its records (toward
    :class:`CrashLoop`): anything but an outage of the infrastructure (which no record
    causes, and which a restart does not repeat for ever)."""
    return not isinstance(exc, (InfraUnavailable, *REDIS_DOWN))


async def count_crashes(ctx: SendContext, works: list[Work], exc: BaseException) -> None:
    """The preparing stages failed on ``works`` with ``exc``: count the crash against each
    of them (:func:`count_crash`) unless ``exc`` is an outage, so a poison record is
    dead-lettered on the next start instead of crash-looping the flow."""
    if not counts_as_crash(exc):
        return
    counted = await asyncio.gather(*(count_crash(ctx, w) for w in works),
                                   return_exceptions=True)
    for w, outcome in zip(works, counted, strict=True):
        if isinstance(outcome, Exception):
            log.error("crash of %s not counted: %r", crash_field(w), outcome)
