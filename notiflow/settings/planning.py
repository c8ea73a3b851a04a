"""Work released later: durable scheduling of future P2/P3 messages and campaign
expansion."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import Field

from notiflow.settings.section import _Frozen


class SchedulingRule(_Frozen):
    """Durable scheduling (``flows/scheduling/due_work.py``, docs/architecture.md "Scheduling"): a
    P2/P3 message due ``min_lead`` or more after acceptance waits in Cassandra's
    ``scheduled_work`` (partition ``(time_bucket, shard)``) instead of Kafka, and a scheduler
    process publishes it when due. Not scaled by ``time_scale`` (bucket layout is storage)."""

    bucket: timedelta = Field(timedelta(minutes=1), ge=timedelta(seconds=1))
    """Width of a time bucket: one partition per (bucket, shard)."""
    shards: int = Field(16, ge=1, le=1024)
    """Partitions per bucket; the unit a scheduler process leases."""
    min_lead: timedelta = Field(timedelta(seconds=2), gt=timedelta(0))
    """A message due sooner than this after its acceptance goes straight to Kafka (the send
    flow's hold step keeps it until due); a later one waits in a bucket, and its row must be
    written within half of this or the acceptance fails (503, completed later by the
    outbox), so a scheduler reading up to now never passes a row still being written."""
    lease: timedelta = Field(timedelta(seconds=1), ge=timedelta(milliseconds=300))
    """How long a scheduler's claim on its shards lasts unless renewed (every quarter of it,
    all its shards in one lightweight transaction). A killed scheduler's shards wait this
    long for another: the lateness its rows see."""
    poll: timedelta = Field(timedelta(milliseconds=250), gt=timedelta(0))
    """How often a scheduler reads its shards' due rows."""
    lookback: timedelta = Field(timedelta(hours=1), ge=timedelta(0))
    """Where a shard nobody ever released starts reading; afterwards every owner resumes
    from the shard's watermark (the oldest bucket not fully released)."""
    page: int = Field(500, ge=1, le=10_000)
    """Rows read per query and published per round trip to Kafka."""
    horizon: timedelta = Field(timedelta(hours=1), gt=timedelta(0))
    """How far ahead a recurring schedule's occurrences become messages (``SCHEDULED``, in
    buckets): pausing or deleting a schedule cancels those already made."""
    materialize_every: timedelta = Field(timedelta(seconds=10), gt=timedelta(0))
    """How often a scheduler materialises the schedules of its shards."""
    min_interval: timedelta = Field(timedelta(minutes=1), gt=timedelta(0))
    """Closest two occurrences of a recurring schedule may be (422 otherwise)."""
    long_wait: timedelta = Field(timedelta(seconds=30), gt=timedelta(0))
    """A retry (or a wait for a breaker) due this long or more after it is decided leaves
    the send flow through ``notify.delayed`` and waits in a bucket, not in flow state
    (compared with the scaled wait, so a test at a small ``time_scale`` keeps it in the
    flow)."""


class CampaignRule(_Frozen):
    """Campaign expansion (``flows/campaigns/expander.py``, docs/architecture.md "Campaigns"):
    expander processes lease running campaigns and turn manifest rows into P2/P3 messages at the
    campaign's rate, slowed by P0's latency signal and stopped while the tier's oldest
    unsent message is older than ``backlog_high`` of its shed bound."""

    poll: timedelta = Field(timedelta(seconds=1), gt=timedelta(0))
    """How often an expander looks for campaigns to take and checks the ones it holds."""
    lease: timedelta = Field(timedelta(seconds=10), ge=timedelta(seconds=1))
    """How long an expander's claim on a campaign lasts unless renewed (every batch): a
    killed expander's campaign waits this long for another."""
    batch: int = Field(500, ge=1, le=10_000)
    """Rows expanded between checkpoints (one Kafka round, one progress write)."""
    chunk_bytes: int = Field(1 << 20, ge=4096)
    """Bytes read from the manifest per request."""
    max_per_expander: int = Field(4, ge=1, le=64)
    """Campaigns one expander process expands at once."""
    default_rate: float = Field(500.0, gt=0)
    """Messages/s of a campaign that names no ``max_rate``."""
    max_rate: float = Field(5_000.0, gt=0)
    """Highest ``max_rate`` a campaign may ask for (422 above)."""
    default_duration: timedelta = Field(timedelta(days=1), gt=timedelta(0))
    """Window of a campaign that names no ``ends_at``."""
    max_duration: timedelta = Field(timedelta(days=30), gt=timedelta(0))
    backlog_high: float = Field(0.5, gt=0, le=1)
    """Expansion stops while the tier's oldest unsent message is older than this share of
    the tier's ``max_backlog_age`` (and resumes below it): the queue never becomes the
    incident. Admission refuses new campaigns (429) in the same state."""
    error_bucket: int = Field(100_000, ge=1)
    """Rows per partition of a campaign's error report."""
    file_root: Path | None = None
    """Directory ``file://`` manifests must lie in (embedded, single-machine use); None:
    only ``s3://`` manifests are accepted, so a tenant cannot name a file of the server."""
    manifest_bucket: str | None = None
    """The bucket tenants' ``s3://`` manifests are in; None: ``object_store.bucket``."""
    manifest_prefix: str = Field("tenants", pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
    """A tenant's manifests are the objects under ``<manifest_prefix>/<tenant id>/`` of
    ``manifest_bucket`` (or of ``file_root``); a campaign naming any other object is refused
    before it is read (``adapters/manifests.py``)."""
