"""The open-loop load generator of ``notiflow bench api`` and the figures of one step.

Request ``i`` of a step is due at ``t0 + i / rate`` and is sent then, whether or not earlier
requests have been answered; only ``cap`` requests are in flight at once (a request finding
the cap full waits for a slot, and is counted in ``capped``). Latency is completion - due
time: a server that stalls delays every request due during the stall, and each of them
reports the wait, not only the one request a closed-loop client would have had outstanding
(no coordinated omission). A request that fails or times out counts at its completion.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from notiflow.bench.stats import percentile
from notiflow.names import Stage


@dataclass(frozen=True)
class Answer:
    """What one request got: its HTTP status (or ``timeout``, ``error ...``), the messages it
    carried that were accepted, and the others counted by their code."""

    status: str
    accepted: int
    refused: Mapping[str, int] = field(default_factory=dict)
    stages: Mapping[str, float] = field(default_factory=dict)
    """The server's own latency budget in ms (its ``Server-Timing`` header), if any."""

    @classmethod
    def single(cls, status: str, server_timing: str | None = None) -> Answer:
        """The answer of a one-message request: accepted when ``202``."""
        stages = parse_server_timing(server_timing)
        if status == "202":
            return cls(status, 1, {}, stages)
        return cls(status, 0, {status: 1}, stages)

    @classmethod
    def failed(cls, status: str, messages: int) -> Answer:
        """A request none of whose ``messages`` was accepted, all for ``status``."""
        return cls(status, 0, {status: messages})


def parse_server_timing(header: str | None) -> dict[str, float]:
    """``{"api.reserve": 4.1, ...}`` from ``api.reserve;dur=4.1, ...``; entries without a
    readable ``dur`` are left out."""
    out: dict[str, float] = {}
    for entry in (header or "").split(","):
        name, _, params = entry.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur" and name:
                with contextlib.suppress(ValueError):
                    out[name] = float(value)
    return out


Send = Callable[[int], Awaitable[Answer]]
"""Sends request ``i`` and returns its answer (raising counts as ``error <type>``)."""


@dataclass(frozen=True)
class Sent:
    """One request: when it was due, when it got a slot, when its answer was read (seconds
    after the step's ``t0``), and its answer."""

    due: float
    sent: float
    done: float
    answer: Answer

    @property
    def latency_ms(self) -> float:
        return (self.done - self.due) * 1000


@dataclass
class LoopRun:
    """Every request of a step (in due order), how many found the cap full, and ``t0`` on
    the generator's clock."""

    sent: list[Sent]
    capped: int
    t0: float


def schedule(rate: float, seconds: float) -> list[float]:
    """Due times (seconds after ``t0``) of a step of ``seconds`` at ``rate`` requests/s:
    ``i / rate`` for every ``i`` with ``i / rate < seconds``."""
    if rate <= 0 or seconds <= 0:
        return []
    return [i / rate for i in range(math.ceil(rate * seconds - 1e-9))]


async def open_loop(send: Send, due: Sequence[float], *, cap: int, per_request: int = 1,
                    hooks: Mapping[int, Callable[[], None]] | None = None,
                    clock: Callable[[], float] = time.perf_counter,
                    lead: float = 0.01) -> LoopRun:
    """Send request ``i`` at ``t0 + due[i]`` (``t0``: now + ``lead``) with at most ``cap`` in
    flight; ``hooks[i]`` runs right before request ``i`` is issued; a ``send`` that raises
    counts its ``per_request`` messages as ``error <type>``. Returns once every request has
    its answer."""
    slots = asyncio.Semaphore(cap)
    out: list[Sent | None] = [None] * len(due)
    capped = 0
    t0 = clock() + lead

    async def one(i: int) -> None:
        async with slots:
            sent = clock() - t0
            try:
                answer = await send(i)
            except Exception as exc:
                answer = Answer.failed(f"error {type(exc).__name__}", per_request)
        out[i] = Sent(due[i], sent, clock() - t0, answer)

    tasks = []
    for i, d in enumerate(due):
        wait = t0 + d - clock()
        if wait > 0:
            await asyncio.sleep(wait)
        if hooks and i in hooks:
            hooks[i]()
        if slots.locked():
            capped += 1
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return LoopRun([s for s in out if s is not None], capped, t0)


def figures(run: Sequence[Sent], *, since: float, until: float, per_request: int
            ) -> dict[str, Any]:
    """The figures of the requests due in ``[since, until)`` (the measured part of a step):
    offered and accepted messages per second (accepted over the window from ``since`` to
    the later of ``until`` and the last answer, so a server falling behind shows its own
    rate), latency p50/p99/max in ms over every request (failures included), requests by
    status, messages not accepted by code, and the generator's lag (slot - due)."""
    measured = [s for s in run if since <= s.due < until]
    span = until - since
    accepted = sum(s.answer.accepted for s in measured)
    end = max([until, *(s.done for s in measured)])
    latencies = [s.latency_ms for s in measured]
    lags = [(s.sent - s.due) * 1000 for s in measured]
    refused: Counter[str] = Counter()
    for s in measured:
        refused.update(s.answer.refused)
    return {
        "requests": len(measured),
        "offered_per_s": round(len(measured) * per_request / span, 1) if span > 0 else 0.0,
        "accepted": accepted,
        "accepted_per_s": round(accepted / (end - since), 1) if end > since else 0.0,
        "window_s": round(end - since, 3),
        "p50_ms": _round(percentile(latencies, 50)),
        "p99_ms": _round(percentile(latencies, 99)),
        "max_ms": _round(max(latencies, default=None)),
        "statuses": dict(sorted(Counter(s.answer.status for s in measured).items())),
        "refused": dict(sorted(refused.items())),
        "lag_p99_ms": _round(percentile(lags, 99)),
        "lag_max_ms": _round(max(lags, default=None)),
        "slowest": slowest_stages(measured),
    }


OUTSIDE = "outside"
"""In :func:`slowest_stages`: latency minus the server's ``api.accept`` and ``api.kafka_ack``
(the request's wait for the generator, the network, the server's HTTP and event loop, its
parsing, authentication and validation before ``accepted_at``)."""


def slowest_stages(sent: Sequence[Sent]) -> dict[str, float]:
    """Where the slowest 1 % (latency at or above the p99) of the requests that reported a
    ``Server-Timing`` spent their time: the median ms of each stage and of :data:`OUTSIDE`;
    empty when none reported one."""
    timed = [s for s in sent if s.answer.stages]
    bound = percentile([s.latency_ms for s in timed], 99)
    if bound is None:
        return {}
    slow = [s for s in timed if s.latency_ms >= bound]
    names = sorted({n for s in slow for n in s.answer.stages})
    out = {n: percentile([s.answer.stages.get(n, 0.0) for s in slow], 50) for n in names}
    handler = (Stage.API_ACCEPT.value, Stage.API_KAFKA_ACK.value)
    out[OUTSIDE] = percentile([s.latency_ms - sum(s.answer.stages.get(n, 0.0) for n in handler)
                               for s in slow], 50)
    return {n: round(v, 1) for n, v in out.items() if v is not None}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def stop_reason(step: Mapping[str, Any], *, min_share: float, p99_bound_ms: float
                ) -> str | None:
    """Why the ascent stops after ``step`` (None: go on): accepted below ``min_share`` of
    offered, or p99 above ``p99_bound_ms``."""
    offered = step["offered_per_s"]
    if offered > 0 and step["accepted_per_s"] < min_share * offered:
        return f"accepted {step['accepted_per_s']:,.0f}/s < {min_share:.0%} of offered " \
               f"{offered:,.0f}/s"
    p99 = step["p99_ms"]
    if p99 is not None and p99 > p99_bound_ms:
        return f"p99 {p99:,.0f} ms > {p99_bound_ms:,.0f} ms"
    return None


def ascent(start: float, factor: float, steps: int) -> list[float]:
    """Offered rates of an ascent: ``start``, ``start * factor``, ... (``steps`` of them)."""
    return [round(start * factor ** k, 1) for k in range(steps)]


def cpu_ms_per_message(before: Mapping[str, float], after: Mapping[str, float],
                       accepted: int) -> dict[str, float | None]:
    """CPU milliseconds per accepted message of each process sampled at both ends (CPU
    seconds in ``before`` and ``after``); None for every process when nothing was
    accepted."""
    return {name: (round(max(0.0, after[name] - cpu) * 1000 / accepted, 3) if accepted
                   else None)
            for name, cpu in before.items() if name in after}
