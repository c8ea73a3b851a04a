"""Which dead letters an operator means: :class:`DlqFilter`, and :func:`scan`, the stream of
the matching ones with their channel and resolution.

A scan streams like a read (one lookup chunk at a time) and asks the ledger about each chunk;
resolved dead letters are skipped unless asked for. The payload is decrypted only when the
channel filter needs it and nothing else tells the channel.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass
from datetime import datetime

from notiflow.adapters.dlq.ledger import DlqLedger, Resolution
from notiflow.adapters.dlq.reader import (
    LOOKUP_CHUNK,
    DlqEntry,
    ReadStats,
    channel_of,
    ingest_channels,
    read_dlq,
    take,
    watermarks,
)
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.schemas.enums import Channel
from notiflow.schemas.messages import DlqRecord
from notiflow.settings import Settings


@dataclass(frozen=True)
class DlqFilter:
    """Which dead letters an operator means; every given criterion must hold."""

    ids: frozenset[str] = frozenset()
    channel: Channel | None = None
    reason: str | None = None
    """Case-insensitive substring of the reason."""
    error_class: str | None = None
    category: str | None = None
    message_id: str | None = None
    tenant: str | None = None
    since: datetime | None = None
    """``failed_at >= since``."""
    until: datetime | None = None
    """``failed_at < until``."""

    def matches(self, record: DlqRecord) -> bool:
        """Every criterion except the channel (which may need the payload)."""
        if self.ids and record.dlq_id not in self.ids:
            return False
        if self.reason and self.reason.lower() not in record.reason.lower():
            return False
        if self.error_class and record.error_class != self.error_class:
            return False
        if self.category and record.category != self.category:
            return False
        if self.message_id and record.message_id != self.message_id:
            return False
        if self.tenant and record.tenant_id != self.tenant:
            return False
        if self.since and record.failed_at < self.since:
            return False
        return not (self.until and record.failed_at >= self.until)

    @property
    def narrows(self) -> bool:
        """True when anything beyond the DLQ choice is filtered on."""
        return any((self.ids, self.channel, self.reason, self.error_class, self.category,
                    self.message_id, self.tenant, self.since, self.until))


@dataclass(frozen=True)
class Found:
    """A dead letter that passed a filter, with its channel (if known) and resolution."""

    entry: DlqEntry
    channel: Channel | None
    resolution: Resolution | None


async def scan(settings: Settings, ledger: DlqLedger, topics: Iterable[str], flt: DlqFilter,
               cipher: DlqCipher | None = None, *, include_resolved: bool = False,
               stats: ReadStats | None = None) -> AsyncGenerator[Found, None]:
    """Stream the dead letters of ``topics`` that match ``flt`` (unresolved ones only unless
    ``include_resolved``). The channel filter decrypts a payload only when neither the
    source topic nor a header tells the channel, and only with ``cipher``."""
    channels = ingest_channels(settings)
    stats = stats if stats is not None else ReadStats()
    marks = await asyncio.to_thread(watermarks, settings, list(topics))
    records = read_dlq(settings, marks, stats)
    try:
        while True:
            chunk = await asyncio.to_thread(take, records, LOOKUP_CHUNK)
            if not chunk:
                return
            wanted = [e for e in chunk if flt.matches(e.record)]
            resolved = await resolved_of(ledger, wanted)
            for e in wanted:
                res = resolved.get((e.topic, e.dlq_id))
                if res is not None and not include_resolved:
                    continue
                ch = channel_of(e, channels, cipher)
                if flt.channel is not None:
                    if ch is None:
                        stats.undecidable_channel += 1
                    if ch is not flt.channel:
                        continue
                yield Found(e, ch, res)
    finally:
        with contextlib.suppress(ValueError):
            records.close()


async def resolved_of(ledger: DlqLedger,
                      entries: list[DlqEntry]) -> dict[tuple[str, str], Resolution]:
    """``{(topic, dlq_id): resolution}`` of the resolved ones among ``entries``."""
    by_topic: dict[str, list[str]] = defaultdict(list)
    for e in entries:
        by_topic[e.topic].append(e.dlq_id)
    found = await asyncio.gather(*(ledger.resolutions(t, ids) for t, ids in by_topic.items()))
    return {(t, i): r for t, res in zip(by_topic, found, strict=True) for i, r in res.items()}
