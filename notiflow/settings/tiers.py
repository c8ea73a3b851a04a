"""Per-tier policy (docs/design.md, "Tiers"): each tier's SLA, TTL, retry budget and share
of provider capacity, frequency caps per category, quiet hours, the tiers each message
category may use, and how bulk work yields to P0."""

from __future__ import annotations

from datetime import time, timedelta
from typing import Literal

from pydantic import Field, model_validator

from notiflow.schemas.enums import Category, Tier
from notiflow.settings.section import _Frozen


class RetryBudget(_Frozen):
    """A tier's retry budget after transient failures (docs/architecture.md, "Retries,
    expiry and dead letters"; the schedule itself: ``flows/send/policy.py``). Retry ``n`` is due
    at a uniformly random time within its window ``[S(n-1), S(n))`` after the budget's first
    failure, ``S(n)`` being the sum of the first ``n`` caps: full jitter within each window,
    so the budget covers the sum of its caps however the draws fall."""

    attempts: int = Field(ge=1, le=100)
    """Attempts in all, the first and the failover included; after the last, the DLQ."""
    caps: tuple[timedelta, ...]
    """The width of each retry's window (``attempts - 1`` of them)."""
    span: timedelta
    """The design's bound: every attempt starts within it of the first failure (the caps
    sum to no more, and the tier's TTL is no shorter)."""
    failover_after: int = Field(1, ge=1, le=100)
    """Attempts the budget makes before each move to the next vendor (the account that
    failed the last one is then ranked last): 1 = every retry goes to the other vendor."""

    @model_validator(mode="after")
    def _fits(self) -> RetryBudget:
        if len(self.caps) != self.attempts - 1:
            raise ValueError(f"retry: {self.attempts} attempts need {self.attempts - 1} caps")
        if any(c < timedelta(0) for c in self.caps):
            raise ValueError("retry: caps may not be negative")
        if sum(self.caps, timedelta(0)) > self.span:
            raise ValueError("retry: the caps sum to more than the span")
        return self


class TierPolicy(_Frozen):
    """Per-tier defaults (docs/design.md, "Tiers")."""

    sla: timedelta
    ttl: timedelta
    retry: RetryBudget
    batch_size: int = Field(500, ge=1, le=10_000)
    poll_wait: timedelta = timedelta(milliseconds=20)
    """How long a send flow's worker waits in Kafka for its next ingest record (the wait ends
    when one arrives; ``adapters/kafka_group.py``). Meanwhile the worker does nothing else,
    so it bounds how late an idle flow's timers and send outcomes can be; shorter costs the
    idle flow CPU (more wake-ups)."""
    epoch: timedelta | None = None
    """Bytewax epoch length of the tier's send flow (``None``: ``flow_epoch_seconds``). At
    every epoch's end the worker stands still while it writes and fsyncs its recovery store,
    so a disk that stalls then holds every message of the tier for the rest of the stall
    (docs/decisions/2026-12-02-p0-epoch-length.md: the P0 flow's thread waiting in the block
    layer during
    a 1.2 s stall of the virtual disk). A longer epoch meets fewer stalls; what it costs is
    a longer stretch re-read after a crash, which the dedup leases make harmless."""
    max_in_flight: int = Field(64, ge=1, le=10_000)
    """Provider calls in flight at once, per channel, per worker."""
    max_queued: int = Field(256, ge=1, le=1_000_000)
    """Messages waiting per channel and worker before that channel's source pauses. Each
    waiting message is in every epoch's snapshot (pickled and written to the recovery
    store): beyond what keeps the in-flight slots busy, depth only costs CPU (P2 send flow
    1.38 ms/msg at 2000, 1.16 at 500; ``notiflow bench throughput``)."""
    provider_timeout: timedelta = timedelta(seconds=5)
    """How long one provider call may take before it counts as a timeout (ambiguous). It is
    measured by the tier's own event loop: a bulk tier's process is starved of CPU by design
    (``nice``), so its timeout must cover the seconds it waits for a core, not only the
    provider's answer."""
    redis_timeout: timedelta = timedelta(seconds=3)
    """Socket timeout of the tier's breaker and capacity calls to Redis: how soon the tier
    notices an unreachable Redis. P0/P1 fall back to local limits, so they notice fast; P2/P3
    pause either way, and a short timeout in a CPU-starved process reads a late event loop as
    "Redis unreachable" and pauses sends that Redis would have answered."""
    store_concurrency: int = Field(16, ge=1, le=1024)
    """Cassandra reads in flight per worker (the tier's share of the shared database)."""
    redis_down: Literal["local", "pause"] = "pause"
    """Without Redis: send on conservative local limits (no cluster dedup), or wait."""
    nice: int = Field(0, ge=-20, le=19)
    """CPU niceness of the tier's flow processes (reservation of CPU for higher tiers; a
    negative one needs ``CAP_SYS_NICE``, see ``notiflow/tuning.py``)."""
    realtime: int = Field(0, ge=0, le=99)
    """Above 0: the tier's processes run in the kernel's round-robin real-time class at this
    priority (``SCHED_RR``; they run as soon as they are runnable, ahead of every normal
    process; needs ``CAP_SYS_NICE``, else ``nice`` applies). 0: the normal scheduler."""
    max_backlog_age: timedelta | None = None
    """The API sheds this tier (429) when its oldest unsent message is older than this."""
    quiet_hours: bool = False
    """Whether the recipient's quiet hours defer this tier."""
    on_ambiguous: Literal["resend", "wait"] = "wait"
    """After an ambiguous provider outcome: send again (a duplicate beats a loss) or wait for
    a receipt to resolve it (UNKNOWN, FAILED ``ambiguous`` after ``unknown_resolution``)."""
    provider_batch: int = Field(1, ge=1, le=1000)
    """Most messages of this tier one provider request carries, where the provider takes
    several (SendGrid personalizations): sends that meet within ``provider_batch_linger``
    share a request, each message keeping its own result and status. 1: one request per
    message (what a latency tier wants). A batch never holds more than ``max_in_flight``
    messages, since each waits in its own in-flight slot."""
    provider_batch_linger: timedelta = timedelta(milliseconds=20)
    """How long the first send of a batch waits for others before the request goes out."""
    last_resort: bool = False
    """When every breaker of the channel refuses a message, send it through the best-ranked
    account anyway (a capacity token is still taken; the breaker is not told) instead of
    waiting for one to half-open; a transient failure then waits on the same attempt (no
    retry budget spent: ``last_resort_wait``, or a quarter of the message's age when longer,
    or the provider's ``Retry-After``) and tries the other account first. For P0: breakers
    open within a second of a 5xx or 429 storm and stay open a minute, P0's whole TTL, while
    both accounts still accept most sends (``notiflow chaos provider-5xx``: p99 60 s
    without it)."""
    last_resort_wait: timedelta = timedelta(milliseconds=250)
    lane: Literal["priority", "bulk"] = "bulk"
    """Which side of the shared bottlenecks the tier is on: ``bulk`` work yields to
    ``priority`` work (its own circuit breakers, throttled when P0's budget is threatened;
    docs/architecture.md, "Reservation at shared bottlenecks")."""

    @model_validator(mode="after")
    def _budget_within_ttl(self) -> TierPolicy:
        if self.retry.span > self.ttl:
            raise ValueError("retry.span exceeds the tier's ttl")
        return self


def _s(*seconds: float) -> tuple[timedelta, ...]:
    return tuple(timedelta(seconds=s) for s in seconds)


DEFAULT_TIERS: dict[Tier, TierPolicy] = {
    Tier.P0: TierPolicy(
        sla=timedelta(seconds=1),
        ttl=timedelta(seconds=60),
        retry=RetryBudget(attempts=3, caps=_s(0, 2), span=timedelta(seconds=60),
                          failover_after=2),
        batch_size=100,
        epoch=timedelta(seconds=30),
        max_in_flight=128,
        provider_timeout=timedelta(seconds=2),
        redis_timeout=timedelta(milliseconds=150),
        store_concurrency=64,
        redis_down="local",
        nice=-5,
        realtime=1,
        on_ambiguous="resend",
        last_resort=True,
        lane="priority",
    ),
    Tier.P1: TierPolicy(
        sla=timedelta(seconds=10),
        ttl=timedelta(minutes=30),
        retry=RetryBudget(attempts=5, caps=_s(10, 50, 300, 1320), span=timedelta(minutes=30)),
        batch_size=250,
        max_in_flight=64,
        redis_timeout=timedelta(seconds=0.5),
        redis_down="local",
        nice=2,
        on_ambiguous="resend",
        lane="priority",
    ),
    Tier.P2: TierPolicy(
        sla=timedelta(minutes=5),
        ttl=timedelta(hours=4),
        retry=RetryBudget(attempts=3, caps=_s(1800, 10800), span=timedelta(hours=4)),
        batch_size=500,
        max_in_flight=64,
        provider_timeout=timedelta(seconds=10),
        nice=10,
        max_backlog_age=timedelta(minutes=4),
        quiet_hours=True,
    ),
    Tier.P3: TierPolicy(
        sla=timedelta(hours=1),
        ttl=timedelta(hours=24),
        retry=RetryBudget(attempts=4, caps=_s(300, 1800, 7200), span=timedelta(seconds=9300)),
        batch_size=1000,
        max_in_flight=64,
        provider_timeout=timedelta(seconds=30),
        store_concurrency=8,
        nice=19,
        max_backlog_age=timedelta(minutes=30),
        quiet_hours=True,
        provider_batch=64,
        provider_batch_linger=timedelta(milliseconds=250),
    ),
}

DEFAULT_SHARES: dict[Tier, float] = {Tier.P0: 0.20, Tier.P1: 0.25, Tier.P2: 0.25, Tier.P3: 0.30}


class CapRule(_Frozen):
    """At most ``limit`` messages per recipient and category in any ``window``."""

    limit: int = Field(ge=0)
    window: timedelta


DEFAULT_CAPS: dict[Category, CapRule] = {
    Category.OTP: CapRule(limit=5, window=timedelta(minutes=10)),
    Category.MARKETING: CapRule(limit=3, window=timedelta(days=7)),
}


class QuietHours(_Frozen):
    """Local wall-clock window (start inclusive, end exclusive; may wrap midnight)."""

    start: time = time(22, 0)
    end: time = time(8, 0)


NEVER_URGENT: frozenset[Category] = frozenset({Category.MARKETING})
"""Categories no configuration may allow at P0 or P1."""


class CategoryTiers(_Frozen):
    """Which tiers each message category may use, for every tenant: a category not listed
    may use any tier its tenant may. Marketing is never P0 or P1 (it would skip quiet hours
    and marketing caps and take the urgent lanes); configuration may narrow, never widen
    that."""

    allowed: dict[Category, frozenset[Tier]] = Field(
        default_factory=lambda: {Category.MARKETING: frozenset({Tier.P2, Tier.P3})})

    @model_validator(mode="after")
    def _never_urgent(self) -> CategoryTiers:
        for category in NEVER_URGENT:
            urgent = self.tiers(category) & {Tier.P0, Tier.P1}
            if urgent:
                raise ValueError(f"category_tiers: {category.value} may not use "
                                 f"{', '.join(sorted(t.value for t in urgent))}")
        return self

    def tiers(self, category: Category) -> frozenset[Tier]:
        """The tiers ``category`` may use: as listed, else P2 and P3 for a category in
        :data:`NEVER_URGENT`, else every tier."""
        listed = self.allowed.get(category)
        if listed is not None:
            return listed
        return frozenset({Tier.P2, Tier.P3} if category in NEVER_URGENT else Tier)

    def allows(self, category: Category, tier: Tier) -> bool:
        return tier in self.tiers(category)


class YieldRule(_Frozen):
    """How bulk work yields to P0 (``flows/common/yielding.py``): the signal is the worst P0 latency
    the priority lane reports (``adapters/pressure.py``), compared with P0's SLA. Above
    ``high`` of the SLA a bulk flow halves its in-flight window every ``tick`` (down to
    ``floor`` slots), below ``low`` it grows by ``increase`` of its ceiling per tick; the
    bulk-lane API refuses bulk acceptances (429) above ``high``; the reconciler applies at
    most the same window of bulk writes at once, after the priority lane's."""

    high: float = Field(0.35, gt=0, le=1)
    low: float = Field(0.2, gt=0, le=1)
    decrease: float = Field(0.5, gt=0, lt=1)
    increase: float = Field(0.05, gt=0, le=1)
    floor: int = Field(0, ge=0)
    """Fewest slots a bulk flow keeps while P0 is slow. 0 (the default) pauses its sends and
    its intake outright until the signal is back below ``high``: a window of one slot per
    channel still kept the P3 flow at a third of a core (p99 1,419 and 1,430 ms vs 942 ms at
    0, ``docs/decisions/2026-12-01-p0-reservation-at-shared-bottlenecks.md``). The price:
    while P0 is slow for a reason bulk
    does not cause (a slow P0 provider), bulk waits too. The reconciler keeps at least one."""
    start: float = Field(0.1, gt=0, le=1)
    """Share of the ceiling a bulk process starts with (slow start)."""
    tick: timedelta = timedelta(milliseconds=250)
    enabled: bool = True

    @model_validator(mode="after")
    def _ordered(self) -> YieldRule:
        if self.low > self.high:
            raise ValueError("bulk_yield: low must not exceed high")
        return self
