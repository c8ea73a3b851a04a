"""The depth of the DLQs: unresolved dead letters per DLQ topic, and the depth alert.

Contracts:

- :class:`DepthMonitor` counts unresolved dead letters incrementally and raises the depth
  alert (log line ``DLQ_DEPTH_ALERT`` on the logger ``notiflow.dlq`` + gauge
  ``notiflow.dlq.depth``, created once per process);
- :func:`watch_depth` runs it periodically inside a long-running process (``notiflow api``);
  :func:`dlq_depth` is one blocking check for the command line.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import defaultdict
from collections.abc import Mapping
from typing import Protocol

from opentelemetry import metrics

from notiflow import names
from notiflow.adapters.dlq.ledger import DlqLedger, LedgerSession
from notiflow.adapters.dlq.reader import (
    LOOKUP_CHUNK,
    PartitionKey,
    ReadStats,
    dlq_topics,
    read_dlq,
    watermarks,
)
from notiflow.settings import Settings

log = logging.getLogger("notiflow.dlq")

DEPTH_INTERVAL_S = 60.0
"""How often :func:`watch_depth` checks the depth of every DLQ."""


def alert_line(dlq: str, topic: str, depth: int, threshold: int) -> str:
    """The log line of the depth alert (log-based alert rules match ``DLQ_DEPTH_ALERT``)."""
    return f"DLQ_DEPTH_ALERT dlq={dlq} topic={topic} depth={depth} threshold={threshold}"


class Gauge(Protocol):
    """What :class:`DepthMonitor` needs of an OpenTelemetry gauge."""

    def set(self, amount: int | float, attributes: dict[str, str] | None = None) -> None: ...


class DepthMonitor:
    """Unresolved dead letters per DLQ topic, kept current incrementally.

    Each :meth:`check` reads only the records appended since the previous one, forgets the
    ones Kafka deleted (retention, ``purge --before``) and asks the ledger which of those
    still open were resolved meanwhile; a dead letter written twice (at-least-once sinks)
    counts once. Memory: one entry per unresolved dead letter. Above ``dlq.depth_alert``
    a check logs :func:`alert_line` at ERROR for that topic (every check while it stays
    above; one ``DLQ_DEPTH_OK`` line when it drops back) and sets the gauge
    ``notiflow.dlq.depth`` (attribute ``dlq``) for every topic."""

    def __init__(self, settings: Settings, ledger: DlqLedger, selector: str | None = None,
                 gauge: Gauge | None = None) -> None:
        self.settings = settings
        self.ledger = ledger
        self.topics = dlq_topics(settings, selector)
        self.gauge: Gauge = gauge if gauge is not None else _depth_gauge()
        self.stats = ReadStats()
        self.alerting: set[str] = set()
        self._next: dict[PartitionKey, int] = {}
        self._open: dict[PartitionKey, dict[str, int]] = defaultdict(dict)

    async def check(self) -> dict[str, int]:
        """One pass: ``{topic: unresolved dead letters}``; sets the gauge, logs alerts."""
        marks = await asyncio.to_thread(watermarks, self.settings, list(self.topics.values()))
        for key in set(self._open) - set(marks):
            del self._open[key]
        ranges: dict[PartitionKey, tuple[int, int]] = {}
        for key, (lo, hi) in marks.items():
            start = self._next.get(key, lo)
            if start > hi:
                self._open.pop(key, None)
                start = lo
            opened = self._open.get(key)
            if opened:
                for dlq_id in [i for i, offset in opened.items() if offset < lo]:
                    del opened[dlq_id]
            ranges[key] = (max(start, lo), hi)
        found = await asyncio.to_thread(_scan, self.settings, ranges, self.stats)
        for key, dlq_id, offset in found:
            self._open[key][dlq_id] = offset
        self._next.update({key: hi for key, (_lo, hi) in ranges.items()})
        await self._forget_resolved()
        counts = dict.fromkeys(self.topics.values(), 0)
        for (topic, _partition), ids in self._open.items():
            counts[topic] = counts.get(topic, 0) + len(ids)
        self._report(counts)
        return counts

    async def _forget_resolved(self) -> None:
        by_topic: dict[str, list[str]] = defaultdict(list)
        for (topic, _partition), opened_ids in self._open.items():
            by_topic[topic].extend(opened_ids)
        for topic, ids in by_topic.items():
            for i in range(0, len(ids), LOOKUP_CHUNK):
                resolved = await self.ledger.resolutions(topic, ids[i:i + LOOKUP_CHUNK])
                if not resolved:
                    continue
                for (t, _partition), opened in self._open.items():
                    if t == topic:
                        for dlq_id in resolved.keys() & opened.keys():
                            del opened[dlq_id]

    def _report(self, counts: Mapping[str, int]) -> None:
        threshold = self.settings.dlq.depth_alert
        for dlq, topic in self.topics.items():
            n = counts[topic]
            self.gauge.set(n, {"dlq": dlq})
            if n > threshold:
                self.alerting.add(topic)
                log.error(alert_line(dlq, topic, n, threshold))
            elif topic in self.alerting:
                self.alerting.discard(topic)
                log.warning("DLQ_DEPTH_OK dlq=%s topic=%s depth=%d threshold=%d", dlq, topic,
                            n, threshold)


@functools.cache
def _depth_gauge() -> Gauge:
    gauge: Gauge = names.DLQ_DEPTH.create(metrics.get_meter(names.METER))
    return gauge


async def watch_depth(settings: Settings, interval_s: float = DEPTH_INTERVAL_S, *,
                      gauge: Gauge | None = None) -> None:
    """Run a :class:`DepthMonitor` over every DLQ every ``interval_s`` until cancelled. It
    opens its own Cassandra connection (retried each interval until it succeeds); a failed
    check is logged and tried again at the next interval."""
    ls: LedgerSession | None = None
    monitor: DepthMonitor | None = None
    log.info("DLQ depth monitor: every %.0fs, alert above %d", interval_s,
             settings.dlq.depth_alert)
    try:
        while True:
            try:
                if ls is None:
                    ls = await LedgerSession.open(settings)
                if monitor is None:
                    monitor = DepthMonitor(settings, ls.ledger, gauge=gauge)
                await monitor.check()
            except Exception as exc:
                log.warning("DLQ depth check failed: %s", exc)
            await asyncio.sleep(interval_s)
    finally:
        if ls is not None:
            await asyncio.to_thread(ls.close)


def dlq_depth(settings: Settings, selector: str | None = None) -> dict[str, int]:
    """``{topic: unresolved dead letters}`` of every DLQ (or the one ``selector`` names);
    blocking, opens its own connections (call it from a thread when a loop is running)."""

    async def run() -> dict[str, int]:
        ls = await LedgerSession.open(settings)
        try:
            return await DepthMonitor(settings, ls.ledger, selector).check()
        finally:
            ls.close()

    return asyncio.run(run())


def _scan(settings: Settings, ranges: Mapping[PartitionKey, tuple[int, int]],
          stats: ReadStats) -> list[tuple[PartitionKey, str, int]]:
    """(partition, DLQ id, offset) of every dead letter in ``ranges``: the consumer is
    opened, read and closed by the calling thread alone (a cancelled check never closes
    it under a read still running in another thread)."""
    records = read_dlq(settings, ranges, stats)
    try:
        return [((e.topic, e.partition), e.dlq_id, e.offset) for e in records]
    finally:
        records.close()

