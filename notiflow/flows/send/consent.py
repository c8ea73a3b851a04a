r"""Consent, suppression and quiet hours: the join of messages with recipient preferences.

``PreferenceJoin`` is a Bytewax ``StatefulLogic`` keyed by ``{tenant}:{recipient_hash}``: it
keeps the latest :class:`PreferenceState` of ``notify.preferences`` (so it is warm again after
a restart from the recovery snapshot) and pairs each message with it. A recipient's state may
be stored under any of its hashes (``redact.recipient_hashes``: every configured key, the
legacy hash while that is on), so a message is joined as one :class:`Probe` per hash; with
one hash the pairing is final at once, with several the :class:`Part`\s meet again in
:class:`GatherParts` (keyed by :func:`part_key`) and are combined by
:func:`~notiflow.schemas.preferences.combined_state`. ``PolicyStep`` then decides, purely:
suppressed or opted out → SUPPRESSED; inside the recipient's quiet hours and the tier
honours them → deferred to the end of the window (held by the timer step). The zone is the
address's own, else the user's (a message of a send to a user), else the one a phone
number's country implies.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import TypeGuard
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import bytewax.operators as op
from bytewax.dataflow import Stream
from bytewax.operators import StatefulLogic

from notiflow.flows.common.items import Work
from notiflow.flows.common.steps import Clock, status_event
from notiflow.flows.send.ordering import Skip
from notiflow.redact import recipient_hashes
from notiflow.schemas.enums import Channel, Status
from notiflow.schemas.messages import StatusEvent
from notiflow.schemas.preferences import (
    PreferenceState,
    QuietWindow,
    combined_state,
    phone_timezone,
    state_key,
)
from notiflow.settings import QuietHours, Settings


@dataclass(frozen=True, slots=True)
class WithPreferences:
    """A message and the recipient's preference state at the time it was joined."""

    work: Work
    state: PreferenceState | None


@dataclass(frozen=True, slots=True)
class Probe:
    """A message looking for its recipient's state under one of its hashes: hash ``index``
    of ``of``."""

    work: Work
    recipient_hash: str
    index: int = 0
    of: int = 1


@dataclass(frozen=True, slots=True)
class Part:
    """What a :class:`Probe` found (``state``, None when nothing is stored under its hash)."""

    probe: Probe
    state: PreferenceState | None


def probes_of(w: Work) -> list[Probe]:
    """One probe per hash the message's recipient may be stored under, current hash first."""
    hashes = recipient_hashes(w.record.tenant_id, w.record.recipient_key())
    return [Probe(w, h, i, len(hashes)) for i, h in enumerate(hashes)]


def join_key(item: Probe | PreferenceState) -> str:
    if isinstance(item, PreferenceState):
        return item.key
    return state_key(item.work.record.tenant_id, item.recipient_hash)


def part_key(part: Part) -> str:
    """The probes of one record (the same message may arrive twice: a retry, a duplicate)."""
    w, src = part.probe.work, part.probe.work.source
    return f"{w.message_id}@{src.topic}/{src.partition}/{src.offset}/{w.record.attempt}"


class PreferenceJoin(StatefulLogic[Probe | PreferenceState, WithPreferences | Part,
                                   PreferenceState | None]):
    """State: the latest preference state of one recipient hash (highest version wins)."""

    def __init__(self, resume: PreferenceState | None) -> None:
        self.state = resume

    def on_item(self, value: Probe | PreferenceState
                ) -> tuple[Iterable[WithPreferences | Part], bool]:
        if isinstance(value, PreferenceState):
            if self.state is None or value.version >= self.state.version:
                self.state = value
            return [], StatefulLogic.RETAIN
        found: WithPreferences | Part = (WithPreferences(value.work, self.state)
                                         if value.of == 1 else Part(value, self.state))
        return [found], (
            StatefulLogic.RETAIN if self.state is not None else StatefulLogic.DISCARD)

    def snapshot(self) -> PreferenceState | None:
        return self.state


class GatherParts(StatefulLogic[Part, WithPreferences, dict[int, PreferenceState | None]]):
    """State: the parts of one record found so far, by hash index; once every hash has
    answered, the message with :func:`combined_state` of them (current hash first)."""

    def __init__(self, resume: dict[int, PreferenceState | None] | None) -> None:
        self.found: dict[int, PreferenceState | None] = dict(resume or {})

    def on_item(self, value: Part) -> tuple[Iterable[WithPreferences], bool]:
        self.found[value.probe.index] = value.state
        if len(self.found) < value.probe.of:
            return [], StatefulLogic.RETAIN
        states = [self.found.get(i) for i in range(value.probe.of)]
        return [WithPreferences(value.probe.work, combined_state(states))], \
            StatefulLogic.DISCARD

    def snapshot(self) -> dict[int, PreferenceState | None]:
        return dict(self.found)


def join_preferences(works: Stream[Work], prefs: Stream[PreferenceState]
                     ) -> Stream[WithPreferences]:
    """Each message paired with its recipient's state (steps ``probe-hashes``,
    ``join-preferences``, keyed by recipient hash, and ``gather-hashes``, keyed by
    :func:`part_key`, for messages with several hashes)."""
    probes = op.flat_map("probe-hashes", works, probes_of)
    joined = op.stateful("join-preferences",
                         op.key_on("by-recipient", op.merge("messages+prefs", probes, prefs),
                                   join_key),
                         PreferenceJoin)
    split = op.branch("paired", op.key_rm("unkey-recipient", joined), _is_paired)
    parts = op.map("parts", split.falses, _as_part)
    gathered = op.stateful("gather-hashes", op.key_on("by-record", parts, part_key),
                           GatherParts)
    return op.merge("paired+gathered", split.trues, op.key_rm("unkey-record", gathered))


def _is_paired(item: WithPreferences | Part) -> TypeGuard[WithPreferences]:
    return isinstance(item, WithPreferences)


def _as_part(item: WithPreferences | Part) -> Part:
    assert isinstance(item, Part)
    return item


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
    a message its key's order waits for, a :class:`~notiflow.flows.send.ordering.Skip`)."""

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
        if zone is None and r.user is not None:
            zone = r.user.timezone
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
