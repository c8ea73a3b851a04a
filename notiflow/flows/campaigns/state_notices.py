"""Campaign state webhooks: each state change of a campaign that names a ``webhook`` is POSTed
there by an expander, signed with the tenant's Standard Webhooks secrets, on the client
webhooks' retry schedule (``client_webhooks.schedule``, scaled), at least once: the
``webhook-id`` is stable across attempts, so receivers deduplicate by it.

Per tick: read the due notices, claim each attempt (a lightweight transaction on its due
time: two expanders never make the same attempt), POST, then delete it (``2xx``), give it up
(``410 Gone``, a URL the egress rules refuse, the schedule exhausted, or a tenant without a
secret; kept for operators until its TTL, logged) or reschedule it (any other answer, or
``Retry-After`` when later).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from pydantic import SecretStr

from notiflow.adapters.campaign_notices import Notice
from notiflow.adapters.client_webhooks import AttemptResult, Verdict
from notiflow.flows.common.items import utcnow
from notiflow.flows.webhooks.status_webhooks import tenant_secrets
from notiflow.settings import Settings

log = logging.getLogger("notiflow.flows.campaign_notices")


class NoticeBoard(Protocol):
    """``adapters/campaign_notices.py``."""

    async def add(self, n: Notice) -> None: ...

    async def due(self, now: datetime) -> list[Notice]: ...

    async def claim(self, n: Notice, until: datetime) -> bool: ...

    async def retry(self, n: Notice, attempt: int, at: datetime, error: str) -> None: ...

    async def give_up(self, n: Notice, attempt: int, at: datetime, error: str) -> None: ...

    async def done(self, n: Notice) -> None: ...


Post = Callable[[str, str, bytes, Sequence[SecretStr]], Awaitable[AttemptResult]]
"""One signed attempt (``WebhookClient.post``)."""


class Notifier:
    """Delivers due campaign notices, one tick at a time."""

    def __init__(self, settings: Settings, board: NoticeBoard, post: Post,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.settings = settings
        self.board = board
        self.post = post
        self.clock = clock
        rule = settings.client_webhooks
        self.schedule = tuple(settings.scaled(d) for d in rule.schedule)
        self.hold = rule.timeout * 2

    async def tick(self) -> int:
        """Make every due attempt; how many were made."""
        made = 0
        for n in await self.board.due(self.clock()):
            if await self.board.claim(n, self.clock() + self.hold):
                await self.attempt(n)
                made += 1
        return made

    async def attempt(self, n: Notice) -> None:
        tries = n.attempt + 1
        try:
            secrets = tenant_secrets(self.settings, n.tenant_id)
        except ValueError as exc:
            await self.board.give_up(n, n.attempt, self.clock(), str(exc))
            log.error("campaign notice %s not sent: %s", n.webhook_id, exc)
            return
        result = await self.post(n.url, n.webhook_id, n.body, secrets)
        now = self.clock()
        if result.verdict is Verdict.DELIVERED:
            await self.board.done(n)
            return
        if result.verdict in (Verdict.GONE, Verdict.REFUSED) or tries >= len(self.schedule):
            await self.board.give_up(n, tries, now, result.reason)
            log.warning("campaign notice %s given up after %d attempts (%s)", n.webhook_id,
                        tries, result.reason)
            return
        wait = self.schedule[tries]
        if result.retry_after_s is not None:
            wait = max(wait, timedelta(seconds=result.retry_after_s))
        await self.board.retry(n, tries, now + wait, result.reason)
