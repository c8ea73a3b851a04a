"""Consent, suppression and quiet hours: the join of messages with recipient preferences.

``PreferenceJoin`` is a Bytewax ``StatefulLogic`` keyed by ``{tenant}:{recipient_hash}``: it
keeps the latest :class:`PreferenceState` of ``notify.preferences`` (so it is warm again after
a restart from the recovery snapshot) and pairs each message with it. ``apply_policy`` then
decides, purely: suppressed or opted out → SUPPRESSED; inside the recipient's quiet hours and
the tier honours them → deferred to the end of the window (held by the timer step).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bytewax.operators import StatefulLogic

from notiflow.flows.model import Work
from notiflow.flows.ordering import Skip
from notiflow.flows.steps import Clock, status_event
from notiflow.schemas.enums import Channel, Status
from notiflow.schemas.messages import StatusEvent
from notiflow.schemas.preferences import PreferenceState, QuietWindow, phone_timezone, state_key
from notiflow.settings import QuietHours, Settings


@dataclass(frozen=True, slots=True)
class WithPreferences:
    """A message and the recipient's preference state at the time it was joined."""

    work: Work
    state: PreferenceState | None


def join_key(item: Work | PreferenceState) -> str:
    if isinstance(item, PreferenceState):
        return item.key
    return state_key(item.record.tenant_id, item.recipient_hash)


class PreferenceJoin(StatefulLogic[Work | PreferenceState, WithPreferences,
                                   PreferenceState | None]):
    """State: the latest preference state of one recipient (highest version wins)."""

    def __init__(self, resume: PreferenceState | None) -> None:
        self.state = resume

    def on_item(self, value: Work | PreferenceState) -> tuple[Iterable[WithPreferences], bool]:
        if isinstance(value, PreferenceState):
            if self.state is None or value.version >= self.state.version:
                self.state = value
            return [], StatefulLogic.RETAIN
        return [WithPreferences(value, self.state)], (
            StatefulLogic.RETAIN if self.state is not None else StatefulLogic.DISCARD)

    def snapshot(self) -> PreferenceState | None:
        return self.state


def _in_window(t: time, start: time, end: time) -> bool:
    if start == end:
        return False
    if start < end:
        return start <= t < end
    return t >= start or t < end


def _first_instant_at_or_after(day: datetime, wall: time, tz: ZoneInfo) -> datetime:
    """First UTC instant whose local wall time on ``day``'s date is ≥ ``wall`` (DST-correct:
    an ambiguous wall time resolves to its first occurrence; one in a spring-forward gap
    resolves to the transition)."""
    naive = datetime.combine(day.date(), wall)
    first = naive.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == naive:
        return first
    lo = naive.replace(tzinfo=tz, fold=1).astimezone(UTC)
    hi = first
    while hi - lo > timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        if mid.astimezone(tz).replace(tzinfo=None) >= naive:
            hi = mid
        else:
            lo = mid
    return hi.replace(microsecond=0)


def quiet_until(now: datetime, zone: str, window: QuietWindow | QuietHours) -> datetime | None:
    """End of the quiet window containing ``now`` (as a UTC instant), or None when ``now`` is
    outside the recipient's quiet hours."""
    try:
        tz = ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None
    local = now.astimezone(tz)
    if not _in_window(local.time().replace(tzinfo=None), window.start, window.end):
        return None
    end_day = local
    if window.start > window.end and local.time().replace(tzinfo=None) >= window.start:
        end_day = local + timedelta(days=1)
    return _first_instant_at_or_after(end_day.replace(tzinfo=None), window.end, tz)


class PolicyStep:
    """``WithPreferences`` → the message (possibly deferred) or a SUPPRESSED event (and, for
    a message its key's order waits for, a :class:`~notiflow.flows.ordering.Skip`)."""

    def __init__(self, settings: Settings, clock: Clock) -> None:
        self.settings = settings
        self.clock = clock

    def __call__(self, item: WithPreferences) -> list[Work | StatusEvent | Skip]:
        w, state = item.work, item.state
        r = w.record
        now = self.clock()
        source = f"send.{r.tier.value.lower()}"
        if state is not None and (reason := state.blocks(r.channel, r.category)):
            ended: list[Work | StatusEvent | Skip] = [
                status_event(w, Status.SUPPRESSED, now, source, reason=reason)]
            return [*ended, Skip(w)] if r.order_seq is not None else ended
        if not self.settings.policy(r.tier).quiet_hours:
            return [w]
        zone = state.timezone if state is not None else None
        if zone is None and r.channel is Channel.SMS and isinstance(r.recipient, str):
            zone = phone_timezone(r.recipient)
        if zone is None:
            return [w]
        window = (state.quiet_hours if state is not None and state.quiet_hours
                  else self.settings.default_quiet_hours)
        due = quiet_until(now, zone, window)
        if due is None or (w.due_at is not None and w.due_at >= due):
            return [w]
        deferred = Work(r.model_copy(update={"not_before": due}), w.source, w.raw, w.key,
                        w.headers, w.seen_at)
        return [status_event(w, Status.SCHEDULED, now, source, reason="quiet_hours",
                             next_attempt_at=due), deferred]
