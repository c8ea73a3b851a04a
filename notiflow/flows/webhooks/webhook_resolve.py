"""Resolution: each status change's tenant and ``status_webhook``, from the event's
snapshot or from Cassandra (cached per process)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from datetime import timedelta
from typing import Any

from notiflow.adapters.outages import OUTAGE
from notiflow.adapters.retrying import until_up
from notiflow.adapters.worker import WorkerLoop
from notiflow.flows.webhooks.webhook_items import StatusChange, WebhookJob
from notiflow.settings import Settings

log = logging.getLogger("notiflow.flows.client_webhooks")

INFRA_RETRY_FOR = timedelta(minutes=5)
LOOKUP_CONCURRENCY = 64
CACHE_SIZE = 100_000


Target = tuple[str, str | None]
"""(tenant_id, status_webhook) of a message."""


class Resolver:
    """``flat_map_batch`` mapper: changes → jobs. Snapshot-carrying events are complete;
    the others get the message's tenant and ``status_webhook`` from Cassandra (concurrently
    per batch; both kinds are cached per process, LRU). A message without a webhook is not
    announced. A change of a message without a row yet becomes a job without URL (its key
    waits for another change to tell it); a receipt without message id whose provider
    message id is not indexed yet is left out and logged (the reconciler parks it and
    publishes it again, and that copy is resolved then)."""

    def __init__(self, settings: Settings, cache_size: int = CACHE_SIZE) -> None:
        self.settings = settings
        self.cache_size = cache_size
        self.runtime = WorkerLoop()
        self._rows: OrderedDict[str, Target] = OrderedDict()
        self._index: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, batch: list[StatusChange]) -> list[WebhookJob]:
        for c in batch:
            if c.resolved and c.message_id and c.tenant_id:
                self._remember(c.message_id, (c.tenant_id, c.url))
        missing = [c for c in batch if not c.resolved and self._cached(c) is None]
        if missing:
            store = self._store()
            self.runtime.run(self._with_retries(missing, store))
        jobs = []
        for c in batch:
            job = self._job(c)
            if job is not None:
                jobs.append(job)
        return jobs

    def _job(self, c: StatusChange) -> WebhookJob | None:
        if c.resolved:
            tenant, url, mid = c.tenant_id, c.url, c.message_id
        else:
            hit = self._cached(c)
            if hit is not None:
                mid, (tenant, url) = hit
            elif c.message_id is not None:
                return WebhookJob(c.message_id, None, None, c.status, c.attempt, c.reason,
                                  c.occurred_at, c.source, c.tier, c.traceparent)
            else:
                log.info("receipt %s %s: its provider message id is not indexed yet; "
                         "announced when the reconciler publishes it again", c.provider_ref,
                         c.status.value)
                return None
        if not url or tenant is None or mid is None:
            return None
        return WebhookJob(mid, tenant, url, c.status, c.attempt, c.reason, c.occurred_at,
                          c.source, c.tier, c.traceparent)

    def _cached(self, c: StatusChange) -> tuple[str, Target] | None:
        with self._lock:
            mid = c.message_id
            if mid is None and c.provider_ref is not None:
                mid = self._index.get(c.provider_ref)
            if mid is None:
                return None
            row = self._rows.get(mid)
            if row is None:
                return None
            self._rows.move_to_end(mid)
            return mid, row

    def _remember(self, mid: str, row: Target, ref: tuple[str, str] | None = None) -> None:
        with self._lock:
            self._rows[mid] = row
            self._rows.move_to_end(mid)
            if ref is not None:
                self._index[ref] = mid
            while len(self._rows) > self.cache_size:
                self._rows.popitem(last=False)
            while len(self._index) > self.cache_size:
                self._index.popitem(last=False)

    def _store(self) -> Any:
        from notiflow.adapters.cassandra.store import ClusterStore

        return self.runtime.resource("cassandra", lambda: ClusterStore.open(self.settings)).store

    async def _with_retries(self, changes: list[StatusChange], store: Any) -> None:
        """Cassandra down or timing out (``OUTAGE``) → wait and retry (nothing is committed
        meanwhile); the flow stops, raising the last error, after ``INFRA_RETRY_FOR``. Any
        other exception stops it at once."""
        await until_up("webhook URL lookup", lambda: self._lookup(changes, store), log,
                       first=0.5, most=10.0, give_up_after=INFRA_RETRY_FOR, on=OUTAGE)

    async def _lookup(self, changes: list[StatusChange], store: Any) -> None:
        sem = asyncio.Semaphore(LOOKUP_CONCURRENCY)

        async def row_of(mid: str, ref: tuple[str, str] | None = None) -> None:
            async with sem:
                row = await store.messages.get_message(mid)
            if row is not None:
                self._remember(mid, (str(row.tenant_id), row.status_webhook), ref)

        async def by_provider(ref: tuple[str, str]) -> None:
            async with sem:
                idx = await store.delivery.message_for_provider_id(*ref)
            if idx is not None:
                await row_of(idx.message_id, ref)

        ids = {c.message_id for c in changes if c.message_id is not None}
        refs = {c.provider_ref for c in changes
                if c.message_id is None and c.provider_ref is not None}
        await asyncio.gather(*(row_of(m) for m in ids), *(by_provider(r) for r in refs))


# delivery ----------------------------------------------------------------------------------
