"""Who may open one more live inbox connection in this process (pure; the clock is
injected).

Three bounds, checked before the upgrade, in this order:

- ``max_connections``: the process's live connections, all tenants together (``503
  server_full``: the client should try later, or another process);
- ``max_connections_per_tenant``: one tenant's live connections (``429 tenant_connections``),
  so that one tenant's users (or a tenant minting tokens for made-up users) cannot take the
  process's room;
- ``connect_rate`` / ``connect_burst``: a token bucket per tenant of connections opened
  (``429 connect_rate``, ``Retry-After`` when the next token comes), so that a reconnect
  storm of one tenant costs the others nothing.

A refused connection takes no token. Buckets are kept per tenant id; only configured tenants
get this far (their user tokens are verified first), so there are as many as tenants.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from notiflow.providers.inbox.config import InboxSettings
from notiflow.token_bucket import TokenBucket

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a connection is not opened: the HTTP status, the reason, and when to try again."""

    status: int
    reason: str
    retry_after_s: int


class Gate:
    """The live connections of one process by tenant, and each tenant's connect bucket."""

    def __init__(self, rules: InboxSettings, clock: Clock = time.monotonic) -> None:
        self.rules = rules
        self.clock = clock
        self.live = 0
        self.by_tenant: dict[str, int] = {}
        self.buckets: dict[str, TokenBucket] = {}

    def admit(self, tenant: str) -> Refusal | None:
        """Take a place for one more connection of ``tenant`` (release it with
        :meth:`release`), or say why not."""
        rules = self.rules
        if self.live >= rules.max_connections:
            return Refusal(503, "server_full", 5)
        if self.by_tenant.get(tenant, 0) >= rules.max_connections_per_tenant:
            return Refusal(429, "tenant_connections", 5)
        now = self.clock()
        bucket = self.buckets.get(tenant)
        if bucket is None:
            bucket = self.buckets[tenant] = TokenBucket.full(
                rules.connect_rate, rules.connect_burst, now)
        wait = bucket.take(now)
        if wait > 0:
            return Refusal(429, "connect_rate", max(1, math.ceil(wait)))
        self.live += 1
        self.by_tenant[tenant] = self.by_tenant.get(tenant, 0) + 1
        return None

    def release(self, tenant: str) -> None:
        """Give back a place :meth:`admit` took."""
        left = self.by_tenant.get(tenant, 0) - 1
        if left < 0:
            return
        self.live -= 1
        if left:
            self.by_tenant[tenant] = left
        else:
            del self.by_tenant[tenant]

    @contextmanager
    def held(self, tenant: str) -> Iterator[None]:
        """Release ``tenant``'s place (taken by :meth:`admit`) when the block ends."""
        try:
            yield
        finally:
            self.release(tenant)
