"""``notiflow top``: the tier SLO essentials live in the terminal, without Docker.

Sources (never a metrics endpoint, so it works wherever the flows run):

- ``notify.events``, tailed by a private consumer (its own group id, partitions assigned
  explicitly, nothing committed) starting :data:`LOOKBACK_S` back, so the first frame already
  has a minute of history. Per tier: *done/s* = events into a terminal status
  (``TERMINAL_STATUSES``: provider-accepted, sent, delivered, failed, expired, suppressed,
  ...) per second over the last :data:`WINDOW_S`; *retries/s* = ``RETRY_PENDING`` events per
  second over the same window; *p99* = nearest-rank 99th percentile of ``accepted_at`` →
  ``PROVIDER_ACCEPTED`` over the last :data:`LATENCY_WINDOW_S`. Events are deduplicated by
  ``event_id`` (the flows produce at least once); times are the events' ``occurred_at``.
- Redis: the send flows' backlog reports (``adapters/backlog.py``: age of the oldest unsent
  message per tier, fresh reports only) and the circuit breakers' hashes (``{ns}cb:{provider}``,
  read with ``HMGET`` only: ``top`` never runs the breaker script, so it changes nothing).
- The DLQ topics through :class:`~notiflow.adapters.dlq.DepthMonitor` (unresolved dead
  letters; needs Cassandra for the resolved ledger), every :data:`DLQ_EVERY_S`.

:class:`TopCollector` gathers a :class:`Frame`; :func:`render` draws it (rich). ``--once``
prints one frame as plain text after reading the events up to the end of the topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import math
import sys
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from notiflow.schemas.enums import TERMINAL_STATUSES, Status, Tier
from notiflow.settings import Settings

log = logging.getLogger("notiflow.top")

WINDOW_S = 10.0
"""Window of the per-second rates."""
LATENCY_WINDOW_S = 60.0
"""Window of the acceptance → provider-accepted p99."""
LOOKBACK_S = 60.0
"""How far back the events tail starts."""
DLQ_EVERY_S = 5.0
"""How often the DLQ depth is re-counted (incrementally)."""
REFRESH_S = 1.0
_BREAKER_FIELDS = ("st", "since", "until", "why", "w", "wt")
_BREAKER_STATES = {0: "CLOSED", 1: "OPEN", 2: "HALF_OPEN"}
"""The Redis field ``st`` (``adapters/breaker/store.py``: 0 closed, 1 open, 2 half-open)."""


# --------------------------------------------------------------------------- pure parts


@dataclass(frozen=True, slots=True)
class Seen:
    """What ``top`` keeps of one status event."""

    event_id: str
    tier: Tier
    status: Status
    at: float
    """``occurred_at``, epoch seconds."""
    latency: float | None
    """``occurred_at - accepted_at`` of a ``PROVIDER_ACCEPTED`` event, else None."""


def parse_event(value: bytes | None) -> Seen | None:
    """The fields ``top`` needs of a ``notify.events`` value; None for anything else (a
    record ``top`` cannot read is skipped, it never stops the view)."""
    if not value:
        return None
    try:
        doc = orjson.loads(value)
        status = Status(doc["status"])
        at = datetime.fromisoformat(doc["occurred_at"]).timestamp()
        latency = None
        accepted = (doc.get("message") or {}).get("accepted_at")
        if status is Status.PROVIDER_ACCEPTED and accepted:
            latency = max(0.0, at - datetime.fromisoformat(accepted).timestamp())
        return Seen(str(doc["event_id"]), Tier(doc["tier"]), status, at, latency)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def nearest_rank(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank ``q``-quantile (0 < q <= 1), None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class TierStats:
    done_per_s: float
    retries_per_s: float
    p99_s: float | None
    latency_samples: int


class EventWindow:
    """Status events of the last ``latency_window_s`` seconds (deduplicated by event id) and
    the per-tier figures over them; times are epoch seconds, ``now`` is injected."""

    def __init__(self, window_s: float = WINDOW_S,
                 latency_window_s: float = LATENCY_WINDOW_S) -> None:
        self.window_s = window_s
        self.keep_s = max(window_s, latency_window_s)
        self.latency_window_s = latency_window_s
        self._events: deque[Seen] = deque()
        self._ids: set[str] = set()
        self.seen = 0
        self.duplicates = 0

    def add(self, e: Seen) -> None:
        if e.event_id in self._ids:
            self.duplicates += 1
            return
        self.seen += 1
        self._ids.add(e.event_id)
        self._events.append(e)

    def prune(self, now: float) -> None:
        """Forget events older than the longest window (arrival order ~ time order; a late
        straggler is dropped at the next prune that reaches it)."""
        cutoff = now - self.keep_s
        while self._events and self._events[0].at < cutoff:
            self._ids.discard(self._events.popleft().event_id)
        if len(self._events) > 1_000_000:  # hard memory bound under a flood
            for _ in range(len(self._events) - 1_000_000):
                self._ids.discard(self._events.popleft().event_id)

    def __len__(self) -> int:
        return len(self._events)

    def stats(self, now: float) -> dict[Tier, TierStats]:
        """Per tier: done/s and retries/s over ``(now - window_s, now]``, the p99 over the
        latency window."""
        done = dict.fromkeys(Tier, 0)
        retries = dict.fromkeys(Tier, 0)
        latencies: dict[Tier, list[float]] = {t: [] for t in Tier}
        rate_from, latency_from = now - self.window_s, now - self.latency_window_s
        for e in self._events:
            if e.at > now:
                continue
            if e.at > rate_from:
                if e.status in TERMINAL_STATUSES:
                    done[e.tier] += 1
                elif e.status is Status.RETRY_PENDING:
                    retries[e.tier] += 1
            if e.latency is not None and e.at > latency_from:
                latencies[e.tier].append(e.latency)
        return {t: TierStats(done[t] / self.window_s, retries[t] / self.window_s,
                             nearest_rank(latencies[t], 0.99), len(latencies[t]))
                for t in Tier}


@dataclass(frozen=True, slots=True)
class Breaker:
    """A provider account's breaker as stored in Redis (``OPEN`` past its ``until`` reads
    as ``HALF_OPEN``, as the breaker script would materialise it)."""

    provider: str
    state: str
    since: datetime | None
    why: str
    weight: float


def breaker_from_hash(provider: str, h: dict[str, str | None], now: float,
                      recovery_us: int) -> Breaker:
    """:class:`Breaker` from the ``HMGET`` of :data:`_BREAKER_FIELDS` (missing → CLOSED);
    the route weight is the stored one recovered to ``now`` (``breaker.weight_at``)."""
    from notiflow.adapters.breaker import weight_at

    now_us = int(now * 1_000_000)
    code = int(h.get("st") or 0)
    state = _BREAKER_STATES.get(code, f"?{code}")
    since_us = int(h.get("since") or 0)
    until_us = int(h.get("until") or 0)
    why = h.get("why") or ""
    if code == 1 and now_us >= until_us:
        state, since_us, why = "HALF_OPEN", until_us, "open_elapsed"
    weight = weight_at(float(h.get("w") or 1.0), int(h.get("wt") or 0), now_us, recovery_us)
    since = datetime.fromtimestamp(since_us / 1_000_000, UTC) if since_us else None
    return Breaker(provider, state, since, why, weight)


@dataclass(frozen=True, slots=True)
class TierRow:
    tier: Tier
    done_per_s: float
    retries_per_s: float
    p99_s: float | None
    latency_samples: int
    sla: timedelta
    oldest_age_s: float | None
    """None: no fresh backlog report has anything waiting."""
    reporters: int
    """Send-flow workers of the tier with a fresh backlog report (0: no flow reporting)."""
    dlq: int | None


@dataclass(frozen=True)
class Frame:
    """Everything one refresh shows."""

    at: datetime
    tiers: tuple[TierRow, ...]
    breakers: tuple[Breaker, ...]
    dlq: dict[str, int] | None
    """Unresolved dead letters per DLQ name (P0..P3, reconcile, webhooks); None = unknown."""
    events_in_window: int
    window_s: float = WINDOW_S
    latency_window_s: float = LATENCY_WINDOW_S
    problems: tuple[str, ...] = field(default=())

    def tier(self, tier: Tier) -> TierRow:
        return next(r for r in self.tiers if r.tier is tier)


# ---------------------------------------------------------------------------- gathering


class TopCollector:
    """Gathers :class:`Frame` s from Kafka, Redis and the DLQs. ``open`` first, ``close``
    last; :meth:`catch_up` reads the events topic up to where it ended at ``open``."""

    def __init__(self, settings: Settings, *, window_s: float = WINDOW_S,
                 latency_window_s: float = LATENCY_WINDOW_S, lookback_s: float = LOOKBACK_S,
                 dlq_every_s: float = DLQ_EVERY_S) -> None:
        self.settings = settings
        self.window = EventWindow(window_s, latency_window_s)
        self.lookback_s = max(lookback_s, window_s, latency_window_s)
        self.dlq_every_s = dlq_every_s
        self.group_id = f"notiflow-top-{uuid.uuid4().hex[:12]}"
        self._consumer: Any = None
        self._ends: dict[int, int] = {}
        self._next: dict[int, int] = {}
        self._redis: Any = None
        self._ledger: Any = None
        self._monitor: Any = None
        self._dlq: dict[str, int] | None = None
        self._dlq_at = -math.inf
        self._dlq_task: asyncio.Task[None] | None = None
        self._problems: dict[str, str] = {}

    async def open(self) -> None:
        """Assign every partition of ``notify.events`` at ``now - lookback`` (no commits) and
        open Redis. Raises when Kafka has no such topic."""
        from notiflow.adapters.redis_pool import redis_client

        await asyncio.to_thread(self._open_consumer)
        self._redis = redis_client(self.settings, timeout=1.0)

    def _open_consumer(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        from notiflow.adapters.kafka_io import kafka_config

        topic = self.settings.events_topic
        c = Consumer(kafka_config(self.settings, {
            "group.id": self.group_id, "enable.auto.commit": False,
            "enable.auto.offset.store": False, "auto.offset.reset": "latest",
            "client.id": self.group_id}))
        try:
            md = c.list_topics(topic, timeout=10)
            meta = md.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise RuntimeError(f"Kafka topic {topic} does not exist")
            parts = sorted(meta.partitions)
            start_ms = int((time.time() - self.lookback_s) * 1000)
            found = c.offsets_for_times([TopicPartition(topic, p, start_ms) for p in parts],
                                        timeout=10)
            assign = []
            for tp in found:
                _lo, hi = c.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                  timeout=10)
                self._ends[tp.partition] = hi
                self._next[tp.partition] = tp.offset if tp.offset >= 0 else hi
                assign.append(TopicPartition(topic, tp.partition, self._next[tp.partition]))
            c.assign(assign)
        except Exception:
            c.close()
            raise
        self._consumer = c

    async def close(self) -> None:
        if self._dlq_task is not None:
            self._dlq_task.cancel()
            with contextlib.suppress(BaseException):
                await self._dlq_task
        if self._consumer is not None:
            await asyncio.to_thread(self._consumer.close)
        if self._redis is not None:
            await self._redis.aclose()
        if self._ledger is not None:
            await asyncio.to_thread(self._ledger.close)

    def _drain(self, max_records: int, timeout: float) -> int:
        """Read what is available (at most ``max_records``); returns records read."""
        n = 0
        while n < max_records:
            batch = self._consumer.consume(num_messages=min(1000, max_records - n),
                                           timeout=timeout)
            if not batch:
                break
            for m in batch:
                if m.error() is not None:
                    continue
                n += 1
                self._next[m.partition()] = m.offset() + 1
                if (e := parse_event(m.value())) is not None:
                    self.window.add(e)
            timeout = 0.0
        return n

    def _caught_up(self) -> bool:
        return all(self._next.get(p, 0) >= end for p, end in self._ends.items())

    async def catch_up(self, timeout: float = 20.0) -> None:
        """Read the events topic up to its end as of :meth:`open` (or until ``timeout``)."""
        deadline = time.monotonic() + timeout

        def run() -> None:
            while time.monotonic() < deadline:
                self._drain(50_000, 0.2)
                if self._caught_up():
                    return
            self._problems["events"] = "events tail not caught up (timeout)"

        await asyncio.to_thread(run)

    async def poll(self) -> int:
        """Read the events available now; returns how many."""
        return await asyncio.to_thread(self._drain, 200_000, 0.05)

    async def _backlog(self, tier: Tier, now: float) -> tuple[float | None, int]:
        from notiflow.adapters.backlog import STALE_AFTER_S, backlog_key, oldest_age

        raw = await self._redis.hgetall(backlog_key(self.settings.topic_prefix, tier))
        fresh = 0
        for value in raw.values():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                if now - float(orjson.loads(value)["reported_at"]) <= STALE_AFTER_S:
                    fresh += 1
        age = await oldest_age(self._redis, self.settings.topic_prefix, tier, now=now)
        return age, fresh

    async def _breakers(self, now: float) -> list[Breaker]:
        from notiflow.adapters.breaker import BreakerParams

        recovery_us = BreakerParams.from_settings(self.settings).recovery_us
        prefix = f"{self.settings.topic_prefix}cb:"
        keys = sorted([k async for k in self._redis.scan_iter(match=f"{prefix}*", count=200)])
        out = []
        for key in keys:
            values = await self._redis.hmget(key, list(_BREAKER_FIELDS))
            h = dict(zip(_BREAKER_FIELDS, values, strict=True))
            out.append(breaker_from_hash(key.removeprefix(prefix), h, now, recovery_us))
        known = {b.provider for b in out}
        for provider in sorted(self.settings.enabled_providers() - known):
            out.append(Breaker(provider, "CLOSED", None, "no calls yet", 1.0))
        return out

    async def _count_dlq(self) -> None:
        from notiflow.adapters.dlq import DepthMonitor, LedgerSession, selector_of

        class _NoGauge:
            def set(self, amount: float, attributes: dict[str, str] | None = None) -> None:
                pass

        try:
            if self._ledger is None:
                self._ledger = await LedgerSession.open(self.settings)
            if self._monitor is None:
                self._monitor = DepthMonitor(self.settings, self._ledger.ledger,
                                             gauge=_NoGauge())
            counts = await self._monitor.check()
            self._dlq = {selector_of(self.settings, t): n for t, n in counts.items()}
            self._problems.pop("dlq", None)
        except Exception as exc:
            self._problems["dlq"] = f"DLQ depth unavailable: {type(exc).__name__}: {exc}"

    async def refresh_dlq(self) -> None:
        """Count the DLQs now (``--once``); :meth:`frame` otherwise refreshes in the
        background every ``dlq_every_s``."""
        await self._count_dlq()
        self._dlq_at = time.monotonic()

    async def frame(self, *, poll: bool = True) -> Frame:
        """Read new events (``poll``), Redis, and the latest DLQ counts; one :class:`Frame`."""
        if poll:
            await self.poll()
        if (time.monotonic() - self._dlq_at >= self.dlq_every_s
                and (self._dlq_task is None or self._dlq_task.done())):
            self._dlq_at = time.monotonic()
            self._dlq_task = asyncio.create_task(self._count_dlq())
        now = time.time()
        self.window.prune(now)
        stats = self.window.stats(now)
        backlog: dict[Tier, tuple[float | None, int]] = {}
        breakers: list[Breaker] = []
        try:
            for t in Tier:
                backlog[t] = await self._backlog(t, now)
            breakers = await self._breakers(now)
            self._problems.pop("redis", None)
        except Exception as exc:
            self._problems["redis"] = f"Redis unavailable: {type(exc).__name__}"
        rows = []
        for t in Tier:
            s = stats[t]
            age, fresh = backlog.get(t, (None, 0))
            rows.append(TierRow(t, s.done_per_s, s.retries_per_s, s.p99_s, s.latency_samples,
                                self.settings.policy(t).sla, age, fresh,
                                None if self._dlq is None else self._dlq.get(t.value)))
        return Frame(datetime.fromtimestamp(now, UTC), tuple(rows), tuple(breakers),
                     dict(self._dlq) if self._dlq is not None else None, len(self.window),
                     self.window.window_s, self.window.latency_window_s,
                     tuple(self._problems.values()))


# ---------------------------------------------------------------------------- rendering


def _dur(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _span(d: timedelta) -> str:
    return _dur(d.total_seconds())


def render(frame: Frame) -> Group:
    """The frame as rich renderables: a header, the tier table, the breakers and DLQs."""
    head = Text(f"notiflow top  {frame.at:%Y-%m-%d %H:%M:%S} UTC   events in window: "
                f"{frame.events_in_window}   rates over {frame.window_s:.0f} s, p99 over "
                f"{frame.latency_window_s:.0f} s", style="bold")
    tiers = Table("tier", "done/s", "p99 accept→provider", "SLA", "oldest unsent",
                  "retries/s", "DLQ", title="tiers", title_justify="left")
    for r in frame.tiers:
        late = r.p99_s is not None and r.p99_s > r.sla.total_seconds()
        p99 = _dur(r.p99_s) + (f" (n={r.latency_samples})" if r.latency_samples else "")
        if r.reporters == 0:
            oldest = "no flow reporting"
        else:
            oldest = _dur(r.oldest_age_s if r.oldest_age_s is not None else 0.0)
        old = r.oldest_age_s is not None and r.oldest_age_s > r.sla.total_seconds()
        dlq = "?" if r.dlq is None else str(r.dlq)
        tiers.add_row(r.tier.value, f"{r.done_per_s:.1f}",
                      Text(p99, style="red" if late else ""), _span(r.sla),
                      Text(oldest, style="red" if old else ""), f"{r.retries_per_s:.1f}",
                      Text(dlq, style="red" if r.dlq else ""))
    breakers = Table("provider", "circuit", "since (UTC)", "why", "route weight",
                     title="circuit breakers", title_justify="left")
    for b in frame.breakers:
        style = {"OPEN": "red", "HALF_OPEN": "yellow"}.get(b.state, "green")
        breakers.add_row(b.provider, Text(b.state, style=style),
                         f"{b.since:%H:%M:%S}" if b.since else "-", b.why or "-",
                         f"{b.weight:.2f}")
    other = {k: v for k, v in (frame.dlq or {}).items() if k not in {t.value for t in Tier}}
    parts: list[Any] = [head, tiers, breakers]
    if frame.dlq is None:
        parts.append(Text("DLQ depth: not counted yet"))
    else:
        parts.append(Text("DLQ depth (unresolved): " + "  ".join(
            f"{k}={v}" for k, v in {**{t.value: frame.dlq.get(t.value, 0) for t in Tier},
                                    **other}.items())))
    parts += [Text(p, style="yellow") for p in frame.problems]
    return Group(*parts)


def frame_text(frame: Frame, width: int = 120) -> str:
    """The frame as plain text (no colours, no control codes)."""
    console = Console(width=width, no_color=True, force_terminal=False, record=True,
                      file=io.StringIO())
    console.print(render(frame))
    return console.export_text()


# ------------------------------------------------------------------------------ command


async def run_top(settings: Settings, *, once: bool, window_s: float, interval_s: float,
                  console: Console) -> None:
    """``--once``: catch up, count the DLQs, print one plain frame. Otherwise a live view
    refreshing every ``interval_s`` until Ctrl-C."""
    collector = TopCollector(settings, window_s=window_s,
                             latency_window_s=max(LATENCY_WINDOW_S, window_s))
    await collector.open()
    try:
        if once:
            await collector.catch_up()
            await collector.refresh_dlq()
            frame = await collector.frame(poll=False)
            sys.stdout.write(frame_text(frame))
            sys.stdout.flush()
            return
        from rich.live import Live

        await collector.catch_up(timeout=5.0)
        with Live(render(await collector.frame()), console=console, refresh_per_second=4,
                  screen=False) as live:
            while True:
                await asyncio.sleep(interval_s)
                live.update(render(await collector.frame()))
    finally:
        await collector.close()


def top_command(
    once: Annotated[bool, typer.Option(help="Print one frame as plain text and exit.")] = False,
    window: Annotated[float, typer.Option(min=1.0, help="Seconds the rates are averaged "
                                          "over.")] = WINDOW_S,
    interval: Annotated[float, typer.Option(min=0.2, help="Refresh period (s).")] = REFRESH_S,
) -> None:
    """Live tier rates, p99, oldest age, retries, DLQ depth and circuit states.

    Reads Kafka (notify.events), Redis and the DLQ topics; no metrics endpoint needed."""
    from notiflow.settings import load_settings

    console = Console()
    try:
        settings = load_settings()
    except Exception as exc:
        console.print(f"[red]invalid configuration:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    logging.getLogger("notiflow.dlq").setLevel(logging.CRITICAL)  # alerts would tear the view
    try:
        asyncio.run(run_top(settings, once=once, window_s=window, interval_s=interval,
                            console=console))
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        console.print(f"[red]notiflow top:[/red] {type(exc).__name__}: {exc}", highlight=False)
        raise typer.Exit(1) from None
