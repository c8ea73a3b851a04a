"""Strict ordering, opt-in: messages with the same ``(tenant, ordering_key)`` in one channel
and tier reach the provider in acceptance order.

Two steps do it. **sequence** (keyed by :func:`order_key`, right after parse, where the
records of one key still arrive in their Kafka partition's order) numbers the first record of
each message ``{epoch}:{n}`` (``IngestRecord.order_seq``); its retries keep the number. The
**send** step is keyed by the same key for these messages, and :class:`KeyOrder` hands the
dispatcher one message of the key at a time, in number order, whatever order the steps in
between (the preference join is keyed by recipient, timers hold scheduled messages) let them
arrive in. The next message goes once the head's attempt ended for good; a head that will be
tried again (a retry or check record, a wait for a breaker or a stale lease) keeps its key
waiting until its next record comes back and ends: head-of-line blocking, for that key only.
A message that ends before the send step (the policy step's SUPPRESSED) sends a :class:`Skip`
on, so its key moves past it.

A key's numbering starts a new epoch once nothing of it was seen for ``idle`` (the tier's
lease lifetime, longer than any message of the key can live): both steps then forget it.

**Bounds.** While its head waits (a retry over hours), a key would hold every later message
of its key: :class:`KeyOrder` holds at most ``cap`` messages waiting
(``Settings.ordering_max_waiting``); one more ends FAILED ``ordering_backlog`` at once (a
per-message outcome, :func:`refused_events`) and its number is passed like a skipped one, so
the messages that do go still go in order. Numbers passed are kept as merged ranges, so a long
run of refusals or suppressions costs one range. An idle key's state is a few fields, kept
for ``idle`` after its last message and then forgotten by both steps; how many keys are live
is bounded by what the API admits in that time.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

import bytewax.operators as op
from bytewax.dataflow import Stream
from bytewax.operators import StatefulLogic

from notiflow.flows.common.items import Work
from notiflow.flows.common.steps import Clock, status_event
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import IngestRecord, StatusEvent

MAX_WAITING: Final = 1000
"""Messages one key holds waiting by default (``Settings.ordering_max_waiting``)."""
OVERFLOW_REASON: Final = "ordering_backlog"

Ranges = tuple[tuple[int, int], ...]
"""Sorted, disjoint, non-adjacent inclusive ranges of numbers."""


def order_key(record: IngestRecord) -> str | None:
    """``order:{tier}:{channel}:{tenant}:{ordering_key}``, or None for an unordered record."""
    if record.ordering_key is None:
        return None
    return (f"order:{record.tier.value}:{record.channel.value}:{record.tenant_id}:"
            f"{record.ordering_key}")


def is_ordered(w: Work) -> bool:
    return w.record.ordering_key is not None


def sequence_of(w: Work) -> tuple[str, int]:
    """``(epoch, n)`` of a numbered record."""
    assert w.record.order_seq is not None, "record not numbered by the sequence step"
    epoch, n = w.record.order_seq.split(":", 1)
    return epoch, int(n)


def attempt_of(w: Work) -> str:
    return f"{w.message_id}:{w.record.attempt}"


def with_number(ranges: Ranges, n: int) -> Ranges:
    """``ranges`` with ``n`` in them (merged with a neighbour it touches)."""
    i = bisect.bisect_left(ranges, (n, n))
    lo, hi = n, n
    if i > 0 and ranges[i - 1][1] >= n - 1:
        i -= 1
        lo, hi = ranges[i][0], max(ranges[i][1], n)
    j = i
    while j < len(ranges) and ranges[j][0] <= hi + 1:
        hi = max(hi, ranges[j][1])
        j += 1
    return (*ranges[:i], (lo, hi), *ranges[j:])


def past(ranges: Ranges, n: int) -> tuple[int, Ranges]:
    """The first number from ``n`` on not in ``ranges``, and the ranges above it."""
    while ranges and ranges[0][0] <= n:
        n = max(n, ranges[0][1] + 1)
        ranges = ranges[1:]
    return n, ranges


@dataclass(frozen=True, slots=True)
class Skip:
    """A numbered message that ended before the send step (its outcome is already on its
    way to the sink): its key moves past it."""

    work: Work


@dataclass(slots=True)
class Numbering:
    """The sequence step's state of one key."""

    epoch: str
    next: int
    last_at: datetime


class Sequence(StatefulLogic[Work, Work, Numbering]):
    """Numbers the first record of each message of one key; a record already numbered (a
    retry, a check record) passes unchanged."""

    def __init__(self, resume: Numbering | None, clock: Clock, idle: timedelta) -> None:
        self.state = resume
        self.clock = clock
        self.idle = idle

    def on_item(self, value: Work) -> tuple[Iterable[Work], bool]:
        if value.record.order_seq is not None:
            return [value], self._keep()
        now = self.clock()
        if self.state is None:
            self.state = Numbering(uuid.uuid4().hex[:12], 1, now)
        st = self.state
        numbered = value.record.model_copy(update={"order_seq": f"{st.epoch}:{st.next}"})
        st.next += 1
        st.last_at = now
        return [Work(numbered, value.source, value.raw, value.key, value.headers,
                     value.seen_at)], StatefulLogic.RETAIN

    def on_notify(self) -> tuple[Iterable[Work], bool]:
        if self.state is not None and self.clock() >= self.state.last_at + self.idle:
            self.state = None
        return [], self._keep()

    def notify_at(self) -> datetime | None:
        return self.state.last_at + self.idle if self.state is not None else None

    def _keep(self) -> bool:
        return StatefulLogic.RETAIN if self.state is not None else StatefulLogic.DISCARD

    def snapshot(self) -> Numbering:
        assert self.state is not None
        return self.state


def number_ordered(step_id: str, up: Stream[Work], *, clock: Clock,
                   idle: timedelta) -> Stream[Work]:
    """The records of ``up`` with the messages that have an ``ordering_key`` numbered by
    :class:`Sequence` (stateful step ``step_id``, keyed by :func:`order_key`)."""
    split = op.branch(f"{step_id}-ordered", up, is_ordered)
    numbered = op.stateful(step_id, op.key_on(f"{step_id}-key", split.trues, _order_key_of),
                           lambda resume: Sequence(resume, clock, idle))
    return op.merge(f"{step_id}-all", split.falses, op.key_rm(f"{step_id}-unkey", numbered))


def _order_key_of(w: Work) -> str:
    key = order_key(w.record)
    assert key is not None
    return key


@dataclass
class KeyOrder:
    """The send step's order of one key: which numbered message may go to the dispatcher.

    ``offer``/``skip`` take what arrives; ``ended`` what the dispatcher finished (``retried``:
    its outputs hold the message's next record). Each returns the messages to submit now."""

    epoch: str | None = None
    next: int = 1
    waiting: dict[int, list[Work]] = field(default_factory=dict)
    skipped: set[int] = field(default_factory=set)
    later: list[Work | Skip] = field(default_factory=list)
    """Records of a newer epoch, held until this one has nothing waiting."""
    head: str | None = None
    """The attempt (``message_id:attempt``) submitted and not ended yet."""
    head_n: int = 0
    awaiting: str | None = None
    """The message whose next record the key waits for."""
    last_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    cap: int = MAX_WAITING
    """Messages held waiting (this epoch's and a newer one's) beyond which one is refused."""
    passed: Ranges = ()
    """Numbers of this epoch the key moves past (skipped or refused)."""
    passed_later: Ranges = ()
    """The same for the newer epoch ``later`` holds."""
    refused: tuple[Work, ...] = ()
    """Messages refused for ``cap`` not taken by :func:`refused_events` yet."""

    def offer(self, w: Work) -> list[Work]:
        current, n = self._arrived(w)
        if not current:
            if self.full():
                self.refused += (w,)
                self.passed_later = with_number(self.passed_later, n)
                return []
            self.later.append(w)
            return self._release()
        if w.message_id == self.awaiting:
            self.awaiting = None
            self.head, self.head_n = attempt_of(w), n
            return [w]
        if n < self.next or attempt_of(w) == self.head:
            return [w]
        if n not in self.waiting and self.full():
            self.refused += (w,)
            self.passed = with_number(self.passed, n)
            return self._release()
        self.waiting.setdefault(n, []).append(w)
        return self._release()

    def _arrived(self, w: Work) -> tuple[bool, int]:
        """Note that ``w`` arrived (the first arrival sets the key's epoch): whether it is of
        the key's epoch, and its number."""
        self.last_at = datetime.now(UTC)
        epoch, n = sequence_of(w)
        if self.epoch is None:
            self.epoch = epoch
        return epoch == self.epoch, n

    def full(self) -> bool:
        """Whether the key holds ``cap`` messages waiting."""
        return len(self.waiting) + len(self.later) >= self.cap

    def skip(self, w: Work) -> list[Work]:
        current, n = self._arrived(w)
        if not current:
            self.later.append(Skip(w))
            return self._release()
        if w.message_id == self.awaiting:
            self.awaiting = None
            self.next = max(self.next, n + 1)
        elif n >= self.next:
            self.passed = with_number(self.passed, n)
        return self._release()

    def ended(self, w: Work, retried: bool) -> list[Work]:
        self.last_at = datetime.now(UTC)
        if attempt_of(w) != self.head:
            return []
        self.head = None
        if retried:
            self.awaiting = w.message_id
        else:
            self.next = max(self.next, self.head_n + 1)
        return self._release()

    def idle(self) -> bool:
        return (self.head is None and self.awaiting is None and not self.waiting
                and not self.later)

    def _release(self) -> list[Work]:
        if self.head is not None or self.awaiting is not None:
            return []
        while self.next in self.skipped:
            self.skipped.discard(self.next)
            self.next += 1
        self.next, self.passed = past(self.passed, self.next)
        if self.next in self.waiting:
            copies = self.waiting.pop(self.next)
            self.head, self.head_n = attempt_of(copies[0]), self.next
            return copies
        if self.later and not self.waiting:
            items, self.later = self.later, []
            self.epoch, self.next = None, 1
            self.skipped.clear()
            self.passed, self.passed_later = self.passed_later, ()
            out: list[Work] = []
            for item in items:
                out += self.skip(item.work) if isinstance(item, Skip) else self.offer(item)
            return out
        return []


def refused_events(order: KeyOrder, now: datetime) -> list[StatusEvent]:
    """FAILED ``ordering_backlog`` of each message ``order`` refused since the last call."""
    refused, order.refused = order.refused, ()
    return [status_event(w, Status.FAILED, now, f"send.{w.record.tier.value.lower()}",
                         reason=OVERFLOW_REASON) for w in refused]


@dataclass(slots=True)
class OrderedState:
    """The send step's snapshot of an order key: its order and the attempts in flight."""

    order: KeyOrder
    in_flight: list[Work]
