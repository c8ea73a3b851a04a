"""Recipient frequency caps and the tenant's daily marketing cap, as keyed Bytewax state.

Exact: a cap counts every message it lets through (at release, just before sending), per
key on one worker, so several processes of a tier can never let more than N through in any
window. A message is counted once however often it comes back (retries, replays).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from bytewax.operators import StatefulLogic

from notiflow.flows.model import Work
from notiflow.flows.steps import Clock, status_event
from notiflow.schemas.enums import Category, Status
from notiflow.schemas.messages import StatusEvent
from notiflow.settings import CapRule, Settings

Counted = list[tuple[datetime, str]]


def cap_key(work: Work) -> str:
    r = work.record
    return f"{r.tenant_id}:{work.recipient_hash}:{r.category.value}"


class RecipientCap(StatefulLogic[Work, Work | StatusEvent, Counted]):
    """State: (time, message_id) of the messages let through in the current window. The
    state of a recipient is discarded when its last entry leaves the window (a timer), not
    only when the recipient's next message arrives: a campaign reaches millions of
    recipients once each, and ``notiflow bench soak`` saw the send flows grow with every new
    recipient."""

    def __init__(self, resume: Counted | None, settings: Settings, clock: Clock) -> None:
        self.sent: Counted = list(resume or [])
        self.settings = settings
        self.clock = clock
        self.window: timedelta | None = None
        """The key's cap window (known from its first item; a resumed state uses the
        longest window of any cap until then)."""
        self.longest = max((settings.scaled(r.window) for r in settings.caps.values()),
                           default=timedelta(0))

    def _rule(self, category: Category) -> CapRule | None:
        return self.settings.caps.get(category)

    def on_item(self, value: Work) -> tuple[Iterable[Work | StatusEvent], bool]:
        rule = self._rule(value.record.category)
        if rule is None:
            return [value], StatefulLogic.DISCARD
        now = self.clock()
        window = self.window = self.settings.scaled(rule.window)
        self.sent = [(t, m) for t, m in self.sent if now - t < window]
        if any(m == value.message_id for _, m in self.sent):
            return [value], StatefulLogic.RETAIN
        if len(self.sent) >= rule.limit:
            ev = status_event(value, Status.SUPPRESSED, now,
                              f"send.{value.record.tier.value.lower()}", reason="frequency_cap")
            return [ev], self._keep()
        self.sent.append((now, value.message_id))
        return [value], StatefulLogic.RETAIN

    def _keep(self) -> bool:
        return StatefulLogic.RETAIN if self.sent else StatefulLogic.DISCARD

    def on_notify(self) -> tuple[Iterable[Work | StatusEvent], bool]:
        now = self.clock()
        window = self.window or self.longest
        self.sent = [(t, m) for t, m in self.sent if now - t < window]
        return [], self._keep()

    def notify_at(self) -> datetime | None:
        """When the oldest entry leaves the window, on the wall clock (Bytewax's timers run
        on it; the injected clock may differ, so the remaining time is carried over)."""
        if not self.sent:
            return None
        remaining = min(t for t, _ in self.sent) + (self.window or self.longest) - self.clock()
        return datetime.now(UTC) + max(remaining, timedelta(0))

    def snapshot(self) -> Counted:
        return list(self.sent)


def tenant_cap_key(work: Work) -> str:
    return f"{work.record.tenant_id}:daily-marketing"


class TenantDailyCap(StatefulLogic[Work, Work | StatusEvent, tuple[str, list[str]]]):
    """State: (UTC day, message ids let through that day) for one tenant's marketing. The ids
    are a set (a campaign's cap can be millions: membership is checked per message); the
    snapshot lists them."""

    def __init__(self, resume: tuple[str, list[str]] | None, settings: Settings,
                 clock: Clock) -> None:
        day, ids = resume if resume else ("", [])
        self.day, self.ids = day, set(ids)
        self.settings = settings
        self.clock = clock

    def on_item(self, value: Work) -> tuple[Iterable[Work | StatusEvent], bool]:
        tenant = self.settings.tenant(value.record.tenant_id)
        cap = tenant.daily_marketing_cap if tenant else None
        if value.record.category is not Category.MARKETING or cap is None:
            return [value], StatefulLogic.RETAIN if self.ids else StatefulLogic.DISCARD
        now = self.clock()
        day = now.date().isoformat()
        if day != self.day:
            self.day, self.ids = day, set()
        if value.message_id in self.ids:
            return [value], StatefulLogic.RETAIN
        if len(self.ids) >= cap:
            ev = status_event(value, Status.SUPPRESSED, now,
                              f"send.{value.record.tier.value.lower()}",
                              reason="tenant_daily_cap")
            return [ev], StatefulLogic.RETAIN
        self.ids.add(value.message_id)
        return [value], StatefulLogic.RETAIN

    def snapshot(self) -> tuple[str, list[str]]:
        return (self.day, list(self.ids))
