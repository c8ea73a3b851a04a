"""An API process's part of the audit trail (``notiflow/audit.py``): it records template
versions created, counts P0 acceptances per tenant and writes one ``p0.use`` row per tenant
and interval, and, once Cassandra is reached and after every credential reload, records
each piece of configuration that differs from the last one audited.

Events wait in memory until written: while Cassandra is unreachable they are kept (at most
``MAX_PENDING``, then the oldest are dropped with an error log) and written once it answers;
on shutdown the process tries once more."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections import Counter, deque
from collections.abc import Callable
from datetime import UTC, datetime

from notiflow.adapters.audit import AuditLog
from notiflow.audit import Action, AuditEvent, changed_fields, configuration, digest
from notiflow.settings import Settings

log = logging.getLogger(__name__)

MAX_PENDING = 100_000


class Auditor:
    def __init__(self, settings: Settings,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.settings, self.clock = settings, clock
        self.actor = f"api@{socket.gethostname()}/{os.getpid()}"
        self._log: AuditLog | None = None
        self._pending: deque[AuditEvent] = deque()
        self._p0: Counter[str] = Counter()
        self._p0_since = clock()
        self._wake = asyncio.Event()
        self._draining = asyncio.Lock()
        self._configured = False

    def record(self, event: AuditEvent) -> None:
        if len(self._pending) >= MAX_PENDING:
            lost = self._pending.popleft()
            log.error("audit: %d events waiting for Cassandra; dropped %s %s",
                      MAX_PENDING, lost.action, lost.subject)
        self._pending.append(event)
        self._wake.set()

    def count_p0(self, tenant_id: str) -> None:
        self._p0[tenant_id] += 1

    def reconfigure(self, settings: Settings) -> None:
        """The process reloaded its credentials: audit the configuration again (what
        changed is recorded, e.g. ``credentials.rotated`` with the fields)."""
        self.settings = settings
        self._configured = False
        self._wake.set()

    def attach(self, audit_log: AuditLog) -> None:
        """Cassandra is reached: write what waits, and audit the configuration once."""
        self._log = audit_log
        self._wake.set()

    async def run(self) -> None:
        """Until cancelled: write pending events as they come, and the P0 tallies every
        ``audit_p0_interval``."""
        interval = self.settings.audit_p0_interval.total_seconds()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=min(interval, 5.0))
            self._wake.clear()
            if (self.clock() - self._p0_since).total_seconds() >= interval:
                self.flush_p0()
            if self._log is not None and not self._configured:
                self._configured = await self._audit_configuration(self._log)
            await self.drain()

    def flush_p0(self) -> None:
        now, since = self.clock(), self._p0_since
        for tenant, count in sorted(self._p0.items()):
            self.record(AuditEvent(now, Action.P0_USE, self.actor, tenant, f"tenant:{tenant}",
                                   {"count": count, "since": since.isoformat(),
                                    "until": now.isoformat()}))
        self._p0.clear()
        self._p0_since = now

    async def drain(self) -> None:
        """Write the pending events, oldest first, one drain at a time (the loop's and
        :meth:`close`'s); an event dropped by :meth:`record` meanwhile is not re-popped."""
        async with self._draining:
            while self._pending and self._log is not None:
                event = self._pending[0]
                try:
                    await self._log.append(event)
                except Exception as exc:
                    log.warning("audit: %s not written yet (%s); retrying",
                                event.action, type(exc).__name__)
                    return
                if self._pending and self._pending[0] is event:
                    self._pending.popleft()

    async def close(self) -> None:
        self.flush_p0()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.drain(), timeout=5.0)
        if self._pending:
            log.error("audit: %d events not written at shutdown", len(self._pending))

    async def _audit_configuration(self, audit_log: AuditLog) -> bool:
        """Record each audited piece of configuration that differs from its last audited
        digest (one process wins each swap); whether every subject was checked."""
        try:
            for subject, (action, tenant, detail) in configuration(self.settings).items():
                now = digest(detail)
                known = await audit_log.digest(subject)
                if known is not None and known[0] == now:
                    continue
                before = None if known is None else known[1]
                at = self.clock()
                if await audit_log.swap_digest(subject, None if known is None else known[0],
                                               now, detail, at):
                    self.record(AuditEvent(at, action, self.actor, tenant, subject,
                                           {"changed": changed_fields(before, detail),
                                            "first": known is None, "now": detail}))
        except Exception as exc:
            log.warning("audit: configuration not checked yet (%s)", type(exc).__name__)
            return False
        return True
