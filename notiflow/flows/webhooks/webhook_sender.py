"""Sending: the POSTs of one process on its own event loop, bounded overall and per
tenant endpoint, each asked of and told to the tenant endpoint's circuit breaker."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import SecretStr

from notiflow import names, telemetry
from notiflow.adapters.client_webhooks import AttemptResult, Verdict, WebhookClient
from notiflow.adapters.egress import EgressGuard
from notiflow.adapters.secret_watch import watcher
from notiflow.adapters.worker import loop_thread, register, stop_loop_thread
from notiflow.secrets import Keyring
from notiflow.settings import Settings

log = logging.getLogger("notiflow.flows.client_webhooks")

SATURATION = 4
"""The source pauses while more than ``SATURATION * max_in_flight`` POSTs wait for a slot
or run (those queued behind their own endpoint's limit do not count)."""
BREAKER_PREFIX = "webhook:"
"""Breaker ids of client endpoints (``webhook:<tenant>:https://host:443``), apart from
providers'."""


AttemptOutcome = Literal["accepted", "transient", "permanent", "ambiguous"]
OUTCOME: dict[Verdict, AttemptOutcome] = {
    Verdict.DELIVERED: "accepted", Verdict.RETRY: "transient", Verdict.GONE: "permanent",
    Verdict.REFUSED: "permanent"}
"""An attempt's outcome, as attempts are recorded and spans say."""


def breaker_id(tenant_id: str, endpoint: str) -> str:
    """The circuit breaker of ``tenant_id``'s ``endpoint``: one per tenant and endpoint, so a
    tenant's failing receiver never opens the breaker of another tenant's receiver on the
    same host (a shared webhook service, one host for all its customers)."""
    return f"{BREAKER_PREFIX}{tenant_id}:{endpoint}"


@dataclass(frozen=True, slots=True)
class Request:
    """One POST to make."""

    endpoint: str
    url: str
    webhook_id: str
    body: bytes
    secrets: tuple[SecretStr, ...]
    traceparent: str | None = None
    """Trace context of the status change (the POST's span continues it)."""
    attributes: dict[str, Any] | None = None
    """Attributes of the ``notiflow.client_webhook`` span (ids and status, never content)."""
    tenant_id: str = field(kw_only=True)
    """Whose endpoint: its breaker and concurrency bound are the tenant's own."""

    @property
    def unit(self) -> str:
        """What the breaker and the per-endpoint bound are keyed by (:func:`breaker_id`)."""
        return breaker_id(self.tenant_id, self.endpoint)


@dataclass(frozen=True, slots=True)
class Refused:
    """The endpoint's circuit breaker refused the attempt; ask again in ``retry_in`` s."""

    retry_in: float


Result = AttemptResult | Refused


class Sender(Protocol):
    """Makes POSTs off the worker thread; :meth:`submit` never blocks."""

    def submit(self, request: Request) -> concurrent.futures.Future[Result]: ...

    def saturated(self) -> bool: ...


class WebhookDispatcher:
    """Makes every POST of this process on one background event loop: one aiohttp session,
    at most ``max_in_flight`` requests at once and ``max_per_endpoint`` per tenant endpoint,
    the tenant endpoint's circuit breaker (shared through Redis, like the providers') asked
    before and told after each request. Thread-safe :meth:`submit`; results arrive as
    ``concurrent.futures`` so the Bytewax worker never blocks on the network."""

    def __init__(self, settings: Settings,
                 breakers: Callable[[], Any] | None = None, *,
                 keyring: Keyring | None = None) -> None:
        """``keyring``: reloaded from ``NOTIFLOW_SECRETS_DIR`` on this loop while it runs (the
        tenants' signing secrets then take effect without a restart)."""
        self.settings = settings
        self.keyring = keyring
        self._watching: asyncio.Task[None] | None = None
        self.rule = settings.client_webhooks
        self._breaker_factory = breakers
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._opened: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._client: WebhookClient | None = None
        self._breakers: Any = None
        self._sem: asyncio.Semaphore | None = None
        self._endpoints: dict[str, asyncio.Semaphore] = {}
        self._users: Counter[str] = Counter()
        self._queued = 0
        register(self)

    def start(self) -> asyncio.AbstractEventLoop:
        """Start the loop thread and open the client and breakers (idempotent)."""
        with self._lock:
            if self._loop is None:
                loop, self._thread = loop_thread("webhook-dispatch")
                self._opened = asyncio.run_coroutine_threadsafe(self._open(), loop)
                self._loop = loop
            return self._loop

    def ready(self, timeout: float = 30.0) -> None:
        """Start, and return once the client, the breakers and the secrets watcher are
        open."""
        self.start()
        self._opened.result(timeout)

    async def _open(self) -> None:
        from notiflow.adapters.breaker.facade import CircuitBreakers

        self._client = await WebhookClient(self.rule.timeout, self.rule.max_in_flight,
                                           egress=EgressGuard(self.settings.egress)).open()
        self._breakers = (self._breaker_factory() if self._breaker_factory is not None
                          else CircuitBreakers(self.settings))
        self._sem = asyncio.Semaphore(self.rule.max_in_flight)
        watch = watcher(self.keyring) if self.keyring is not None else None
        if watch is not None:
            self._watching = asyncio.get_running_loop().create_task(watch.run())
        log.info("webhook dispatcher ready (max %d in flight, %d per endpoint, timeout %ss)",
                 self.rule.max_in_flight, self.rule.max_per_endpoint,
                 self.rule.timeout.total_seconds())

    def saturated(self) -> bool:
        return self._queued >= SATURATION * self.rule.max_in_flight

    def submit(self, request: Request) -> concurrent.futures.Future[Result]:
        loop = self.start()
        fut: concurrent.futures.Future[Result] = concurrent.futures.Future()
        loop.call_soon_threadsafe(lambda: loop.create_task(self._deliver(request, fut)))
        return fut

    async def _deliver(self, req: Request, fut: concurrent.futures.Future[Result]) -> None:
        unit = req.unit
        endpoint_sem = self._endpoints.get(unit)
        if endpoint_sem is None:
            endpoint_sem = self._endpoints[unit] = asyncio.Semaphore(
                self.rule.max_per_endpoint)
        self._users[unit] += 1
        try:
            if self._sem is None:
                await asyncio.wrap_future(self._opened)
            assert self._sem is not None and self._client is not None
            async with endpoint_sem:
                self._queued += 1
                try:
                    async with self._sem:
                        result = await self._attempt(req)
                finally:
                    self._queued -= 1
            fut.set_result(result)
        except Exception as exc:
            log.exception("webhook %s: delivery failed", req.webhook_id)
            if not fut.done():
                fut.set_exception(exc)
        finally:
            self._users[unit] -= 1
            if self._users[unit] <= 0:
                del self._users[unit]
                self._endpoints.pop(unit, None)

    async def _attempt(self, req: Request) -> Result:
        """Vet the URL (a refused or unresolvable one never reaches the breaker nor the
        network), ask the breaker, POST to the vetted addresses, tell the breaker."""
        assert self._client is not None
        target = await self._client.vet(req.url)
        if isinstance(target, AttemptResult):
            return target
        admission = await self._admit(req.unit)
        if admission is not None and not admission.admitted:
            return Refused(admission.retry_in)
        with telemetry.span(names.CLIENT_WEBHOOK, req.attributes,
                            parent=req.traceparent) as span:
            result = await self._client.post(target, req.webhook_id, req.body, req.secrets)
            if span.is_recording():
                span.set_attribute(names.ATTR_OUTCOME, OUTCOME[result.verdict])
                if result.status_code is not None:
                    span.set_attribute("http.response.status_code", result.status_code)
        await self._record(req.unit, result, admission)
        return result

    async def _admit(self, unit: str) -> Any:
        try:
            return await self._breakers.allow(unit)
        except Exception as exc:
            log.warning("webhook breaker of %s unavailable (%r); sending", unit, exc)
            return None

    async def _record(self, unit: str, result: AttemptResult, admission: Any) -> None:
        outcome, reason = result.breaker_outcome()
        try:
            await self._breakers.record(unit, outcome, reason,
                                        result.latency_s, bool(admission and admission.probe),
                                        episode=admission.episode if admission else None)
        except Exception as exc:
            log.warning("webhook breaker of %s: outcome not recorded (%r)", unit, exc)

    def close(self) -> None:
        """Stop the loop and close the session and breakers (POSTs in flight are abandoned:
        they are in the flow's state and are sent again after a restart)."""
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            if self._watching is not None:
                self._watching.cancel()
            if self._client is not None:
                await self._client.aclose()
            if self._breakers is not None:
                await self._breakers.aclose()

        stop_loop_thread(loop, self._thread, shutdown(), log, "webhook dispatcher")
        self._loop = None
