"""Reading the dead-letter topics for operators (``notiflow dlq``, the depth alert).

- :mod:`.reader`: the DLQ topics (one per tier, the reconciler's and the client webhooks')
  and their records, read from the low to the high watermark without committing offsets, one
  lookup chunk at a time;
- :mod:`.ledger`: what operators did, in Cassandra: the resolved set (``dlq_resolved``), the
  audit trail (``dlq_audit``) and the reopening of a replayed message;
- :mod:`.filters`: :class:`DlqFilter` and :func:`scan`, the unresolved dead letters an
  operator means, with their channel;
- :mod:`.depth`: :class:`DepthMonitor`, the incremental count of unresolved dead letters and
  the depth alert (``DLQ_DEPTH_ALERT``, gauge ``notiflow.dlq.depth``), run by
  :func:`watch_depth` inside ``notiflow api``.

Every module logs on the logger ``notiflow.dlq``. The payload cipher is
:mod:`notiflow.adapters.dlq_crypto`.
"""

from __future__ import annotations

from notiflow.adapters.dlq.depth import (
    DEPTH_INTERVAL_S,
    DepthMonitor,
    Gauge,
    alert_line,
    dlq_depth,
    watch_depth,
)
from notiflow.adapters.dlq.filters import DlqFilter, Found, resolved_of, scan
from notiflow.adapters.dlq.ledger import (
    REOPEN_REASON,
    REPLAY_SOURCE,
    RESOLVED_SHARDS,
    AuditRow,
    DlqLedger,
    LedgerSession,
    MessageState,
    Resolution,
    resolved_shard,
)
from notiflow.adapters.dlq.reader import (
    IDLE_TIMEOUT_S,
    LOOKUP_CHUNK,
    SELECTORS,
    TIER_SELECTORS,
    DlqEntry,
    DlqReadError,
    PartitionKey,
    ReadStats,
    channel_of,
    dlq_topics,
    ingest_channels,
    offsets_at,
    read_dlq,
    selector_of,
    take,
    watermarks,
)

__all__ = [
    "DEPTH_INTERVAL_S", "IDLE_TIMEOUT_S", "LOOKUP_CHUNK", "REOPEN_REASON", "REPLAY_SOURCE",
    "RESOLVED_SHARDS", "SELECTORS", "TIER_SELECTORS", "AuditRow", "DepthMonitor", "DlqEntry",
    "DlqFilter", "DlqLedger", "DlqReadError", "Found", "Gauge", "LedgerSession", "MessageState",
    "PartitionKey", "ReadStats", "Resolution", "alert_line", "channel_of", "dlq_depth",
    "dlq_topics", "ingest_channels", "offsets_at", "read_dlq", "resolved_of", "resolved_shard",
    "scan", "selector_of", "take", "watch_depth", "watermarks",
]
