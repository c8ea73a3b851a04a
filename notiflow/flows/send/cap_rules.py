"""Recipient frequency caps and the tenant's daily marketing cap: the rules, and their model.

The counts live in Redis (``adapters/redis_caps.py``), as docs/design.md ("Caps and rate
limits") puts every cluster-wide limit: the dispatcher checks a batch's messages in one round
trip just before sending them (after the dedup lease, before content dedup). They cost the
send flow no memory (a 50-million-recipient campaign keeps its 7-day marketing windows in
Redis, with TTLs), hold across every process of a tier, and survive restarts and
re-partitioning.

Exact: a cap counts every message it lets through, atomically per recipient, so several
processes can never let more than N through in any window. A message is counted once
however often it comes back (retries, replays): the message id is the member counted.

:class:`LocalCaps` (``adapters/memory/caps.py``) is the same rule in process memory: the
contract the Redis script is tested against, and the conservative fallback of a tier that
keeps sending while Redis is down (P0/P1; each process then lets through
``limit // workers``). Marketing caps fail closed: without Redis a marketing message waits.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from notiflow.adapters.memory.caps import LocalCaps
from notiflow.adapters.ports import CapCheck, Verdict
from notiflow.flows.common.items import Work
from notiflow.schemas.enums import Category
from notiflow.settings import Settings

TENANT_MARKER_WINDOW = timedelta(days=1)
"""How long a message counted only by its tenant's daily cap is remembered (no recipient
rule for its category)."""
FAIL_CLOSED = frozenset({Category.MARKETING})

__all__ = ["FAIL_CLOSED", "TENANT_MARKER_WINDOW", "CapCheck", "LocalCaps", "Verdict",
           "cap_check", "counted_as"]


def counted_as(work: Work) -> str:
    """Whom a message counts against: the user of a send to a user (across all of the
    user's addresses), else its recipient."""
    user = work.record.user
    return f"user:{user.user_hash}" if user is not None else work.recipient_hash


def cap_check(work: Work, settings: Settings, now: datetime) -> CapCheck | None:
    """The caps of ``work`` at ``now``, or None when none applies (windows time-scaled)."""
    r = work.record
    rule = settings.caps.get(r.category)
    tenant = settings.tenant(r.tenant_id) if r.category is Category.MARKETING else None
    daily = tenant.daily_marketing_cap if tenant is not None else None
    if rule is None and daily is None:
        return None
    return CapCheck(
        recipient_key=f"{r.tenant_id}:{counted_as(work)}:{r.category.value}",
        member=work.message_id,
        window=settings.scaled(rule.window) if rule is not None else TENANT_MARKER_WINDOW,
        limit=rule.limit if rule is not None else None,
        tenant_key=f"{r.tenant_id}:{now.date().isoformat()}" if daily is not None else None,
        tenant_cap=daily,
        fail_closed=r.category in FAIL_CLOSED,
    )
