"""An in-memory provider account: records every :class:`OutboundMessage` it is given and
answers from a script, accepted by default.

A test scripts answers (:meth:`MemoryProvider.script`: outcomes for the next calls, or a
function of the message), or an outage (:meth:`MemoryProvider.outage`: every call transient
``connect_error``, as a provider that refuses connections); :attr:`MemoryProvider.received`
keeps every message in the order the calls began, :attr:`MemoryProvider.calls` every call
with its answer, in the order they ended.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from notiflow.adapters.memory.clock import Clock, wall
from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.schemas.enums import Channel


@dataclass(frozen=True, slots=True)
class Answer:
    """One scripted answer: an outcome with its reason, provider error code and
    ``Retry-After``, given after ``delay_s`` (real seconds; 0: at once)."""

    outcome: Outcome = Outcome.ACCEPTED
    reason: str | None = None
    error_code: str | None = None
    retry_after_s: float | None = None
    deactivate_recipient: bool = False
    delay_s: float = 0.0


ACCEPT = Answer()
OUTAGE = Answer(Outcome.TRANSIENT, "connect_error")
Script = Callable[[OutboundMessage], Answer | None]
"""A function of the message: its answer, or None for the next queued (or default) one."""


@dataclass(frozen=True, slots=True)
class Call:
    message: OutboundMessage
    result: SendResult


class MemoryProvider:
    """A :class:`~notiflow.adapters.providers.base.ProviderClient` of ``provider_id`` on
    ``channel``; safe to call from several event loops."""

    def __init__(self, provider_id: str, channel: Channel, clock: Clock = wall) -> None:
        self.provider_id = provider_id
        self.channel = channel
        self.clock = clock
        self.calls: list[Call] = []
        self.received: list[OutboundMessage] = []
        self.default = ACCEPT
        self.rule: Script | None = None
        self._queue: deque[Answer] = deque()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def script(self, *answers: Answer | Outcome, rule: Script | None = None) -> None:
        """Answer the next calls with ``answers`` in order (an :class:`Outcome` alone has no
        reason but its default one), then the default; ``rule`` is asked first."""
        with self._lock:
            self._queue.extend(a if isinstance(a, Answer) else default_answer(a)
                               for a in answers)
            if rule is not None:
                self.rule = rule

    def outage(self, on: bool = True) -> None:
        """Every call fails transiently (``connect_error``) while on."""
        self.default = OUTAGE if on else ACCEPT

    def sent(self, message_id: str | None = None) -> list[Call]:
        with self._lock:
            return [c for c in self.calls
                    if message_id is None or c.message.message_id == message_id]

    def _answer(self, message: OutboundMessage) -> Answer:
        with self._lock:
            self.received.append(message)
            scripted = self.rule(message) if self.rule is not None else None
            if scripted is None:
                scripted = self._queue.popleft() if self._queue else self.default
            return scripted

    async def send(self, message: OutboundMessage) -> SendResult:
        started: datetime = self.clock()
        answer = self._answer(message)
        if answer.delay_s > 0:
            await asyncio.sleep(answer.delay_s)
        accepted = answer.outcome is Outcome.ACCEPTED
        result = SendResult(
            answer.outcome, self.provider_id, started, self.clock(),
            provider_message_id=f"{self.provider_id}-{next(self._ids)}" if accepted else None,
            reason=answer.reason, error_code=answer.error_code,
            retry_after_s=answer.retry_after_s,
            deactivate_recipient=answer.deactivate_recipient)
        with self._lock:
            self.calls.append(Call(message, result))
        return result

    async def aclose(self) -> None:
        return None


def default_answer(outcome: Outcome) -> Answer:
    """An answer of ``outcome`` with the reason an adapter typically gives it."""
    reasons = {Outcome.TRANSIENT: "server_error", Outcome.PERMANENT: "invalid_recipient",
               Outcome.AMBIGUOUS: "timeout"}
    return Answer(outcome, reasons.get(outcome))


def memory_providers(accounts: Mapping[str, Channel] | Iterable[tuple[str, Channel]],
                     clock: Clock = wall) -> dict[str, MemoryProvider]:
    pairs = accounts.items() if isinstance(accounts, Mapping) else accounts
    return {pid: MemoryProvider(pid, channel, clock) for pid, channel in pairs}
