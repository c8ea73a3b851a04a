"""The cap rule in memory: :class:`LocalCaps`, the reference the Redis script
(``adapters/redis_caps.py``) is tested against and the fallback a send flow counts by while
Redis is down, and :class:`MemoryCaps`, the :class:`~notiflow.adapters.ports.Caps` port on it.

A message counts once per recipient window however often it comes back (the message id is
the member); it passes only while both the recipient cap and the tenant's daily cap have
room.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta

from notiflow.adapters.ports import CapCheck, Verdict


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


class MemoryCaps:
    """The :class:`~notiflow.adapters.ports.Caps` port on one :class:`LocalCaps` shared by
    every dispatcher of the process (the whole limit, as Redis counts it)."""

    def __init__(self) -> None:
        self.rule = LocalCaps()
        self._lock = threading.Lock()

    async def admit(self, checks: Sequence[CapCheck], now: datetime) -> list[Verdict]:
        with self._lock:
            return [self.rule.admit(c, now) for c in checks]
