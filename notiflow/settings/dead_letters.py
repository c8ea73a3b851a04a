"""When dead letters stop a flow or quarantine a source."""

from __future__ import annotations

from pydantic import Field

from notiflow.settings.section import _Frozen


class DlqRule(_Frozen):
    """When dead-lettering signals a systemic bug rather than bad data."""

    depth_alert: int = Field(10_000, ge=1)
    """Alert (log + metric) above this many unresolved records in a DLQ topic."""
    max_consecutive: int = Field(100, ge=1)
    """Halt the consumer after this many dead letters in a row."""
    max_ratio: float = Field(0.5, gt=0, le=1)
    """... or when more than this share of the last ``ratio_window`` records went there."""
    ratio_window: int = Field(1000, ge=10)
    quarantine_after: int = Field(50, ge=1)
    """Invalid records from one source (tenant or producer) within the last ``ratio_window``
    outputs that quarantine it: a ``PRODUCER_QUARANTINE`` alert, its records dead-lettered,
    the flow going on (``flows/common/guard.py``)."""
    systemic_sources: int = Field(3, ge=2)
    """Distinct sources of invalid records within the window from which invalid records
    count toward the halt (a schema change breaks every producer; one producer's bad deploy
    breaks one)."""
    max_crashes: int = Field(3, ge=1)
    """A source batch that crashed the flow this often is dead-lettered on the next start."""
