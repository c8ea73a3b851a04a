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

:class:`LocalCaps` is the same rule in process memory: the contract the Redis script is
tested against, and the conservative fallback of a tier that keeps sending while Redis is
down (P0/P1; each process then lets through ``limit // workers``). Marketing caps fail
closed: without Redis a marketing message waits.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from notiflow.adapters.ports import CapCheck, Verdict
from notiflow.flows.model import Work
from notiflow.schemas.enums import Category
from notiflow.settings import Settings

TENANT_MARKER_WINDOW = timedelta(days=1)
"""How long a message counted only by its tenant's daily cap is remembered (no recipient
rule for its category)."""
FAIL_CLOSED = frozenset({Category.MARKETING})


def cap_check(work: Work, settings: Settings, now: datetime) -> CapCheck | None:
    """The caps of ``work`` at ``now``, or None when none applies (windows time-scaled)."""
    r = work.record
    rule = settings.caps.get(r.category)
    tenant = settings.tenant(r.tenant_id) if r.category is Category.MARKETING else None
    daily = tenant.daily_marketing_cap if tenant is not None else None
    if rule is None and daily is None:
        return None
    return CapCheck(
        recipient_key=f"{r.tenant_id}:{work.recipient_hash}:{r.category.value}",
        member=work.message_id,
        window=settings.scaled(rule.window) if rule is not None else TENANT_MARKER_WINDOW,
        limit=rule.limit if rule is not None else None,
        tenant_key=f"{r.tenant_id}:{now.date().isoformat()}" if daily is not None else None,
        tenant_cap=daily,
        fail_closed=r.category in FAIL_CLOSED,
    )


class LocalCaps:
    """:class:`CapCheck` answered from this process's memory. ``share`` divides every limit
    (the fallback's ``1 / workers``, rounded down, at least one message). Entries leave
    with their window; :meth:`admit` sweeps every ``sweep_every`` calls, so memory follows
    the recipients seen within a window, not all recipients ever seen."""

    def __init__(self, share: int = 1, sweep_every: int = 1024) -> None:
        self.share = max(1, share)
        self.sweep_every = sweep_every
        self.sent: dict[str, list[tuple[datetime, str]]] = {}
        self.windows: dict[str, timedelta] = {}
        self.tenant_days: dict[str, int] = {}
        self._calls = 0

    def _limit(self, n: int) -> int:
        return n if self.share == 1 else max(1, n // self.share)

    def admit(self, check: CapCheck, now: datetime) -> Verdict:
        self._calls += 1
        if self._calls % self.sweep_every == 0:
            self.sweep(now)
        key = check.recipient_key
        kept = [(t, m) for t, m in self.sent.get(key, ()) if now - t < check.window]
        if any(m == check.member for _, m in kept):
            self.sent[key] = kept
            return Verdict.OK
        if check.limit is not None and len(kept) >= self._limit(check.limit):
            self._store(key, kept, check.window)
            return Verdict.RECIPIENT
        if check.tenant_key is not None and check.tenant_cap is not None:
            used = self.tenant_days.get(check.tenant_key, 0)
            if used >= self._limit(check.tenant_cap):
                self._store(key, kept, check.window)
                return Verdict.TENANT
            self.tenant_days[check.tenant_key] = used + 1
        kept.append((now, check.member))
        self._store(key, kept, check.window)
        return Verdict.OK

    def _store(self, key: str, kept: list[tuple[datetime, str]], window: timedelta) -> None:
        if kept:
            self.sent[key], self.windows[key] = kept, window
        else:
            self.sent.pop(key, None)
            self.windows.pop(key, None)

    def sweep(self, now: datetime) -> None:
        """Forget every recipient whose newest entry left its window, and past days."""
        for key in [k for k, v in self.sent.items() if now - v[-1][0] >= self.windows[k]]:
            del self.sent[key], self.windows[key]
        today = now.date().isoformat()
        for key in [k for k in self.tenant_days if not k.endswith(today)]:
            del self.tenant_days[key]
