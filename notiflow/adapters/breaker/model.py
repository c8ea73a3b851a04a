"""The breaker's rules as a pure state machine: the reference the Lua script mirrors.

Rules are :class:`~notiflow.settings.BreakerRule` (defaults below), durations multiplied by
``time_scale`` except the latency threshold; :class:`BreakerParams` holds them as the script
gets them. Time comes from the caller (``now_us``): the model reads no clock.

Verdicts (:func:`classify`)
    *throttled*: the reason is a throttling reason (``rate_limited``: HTTP 429, Twilio 20429,
    FCM ``QUOTA_EXCEEDED``) — it only lowers the route weight. *failure*: any other
    ``transient`` or ``ambiguous`` outcome (5xx, timeouts, connection errors, our own
    misconfiguration). *success*: ``accepted`` and ``permanent`` (the provider answered; the
    message was at fault). A call is *slow* when its latency exceeds ``latency_threshold``.

CLOSED (admits everything; every non-throttled outcome is a *call* at its decision time ``t``)
    Opens at the first call after which one of these holds:

    - failures: the latest ``failure_threshold`` (5) failures since the last close all lie in
      ``(t - W, t]`` (``W`` = 30 s; exact times);
    - error rate: ``failures * 10^4 > error_bp * calls`` and ``calls >= min_calls`` (20);
    - latency: ``slow > calls - ceil(q * calls)`` and ``calls >= min_latency_calls`` (100),
      i.e. the nearest-rank ``q``-quantile (p99) of the window's latencies exceeds 2.5 s.

    ``calls``, ``failures`` and ``slow`` of the last two rules count the window's buckets: the
    ``N`` (30) buckets of width ``b = ⌊W / N⌋`` with index ``⌊t / b⌋ - N < i <= ⌊t / b⌋`` —
    the current partial bucket and the ``N - 1`` before it, so a call at most ``(N - 1) b``
    old always counts and one more than ``N b <= W`` old never does. The latency rule is exact
    on these counts: no histogram is needed, because "p99 > T" only depends on how many
    latencies exceed ``T``.

OPEN (refuses everything, ``retry_in`` = time left)
    Entered with a new ``episode`` number; the window and failure times are cleared. At
    exactly ``opened + open_for`` (60 s) it is HALF_OPEN (materialised by the next script call;
    the transition carries that time, not the later call's). Outcomes recorded while OPEN are
    ignored (except throttling).

HALF_OPEN (admits probes, refuses the rest)
    A request is a probe candidate when it is the ``round(1 / probe_share)``-th (20th, 40th,
    ...) request of this process in this episode, or when no probe was admitted cluster-wide
    for ``probe_gap`` (1 s: at least one probe per gap, and the episode's first request). The
    script admits a candidate while the state is still HALF_OPEN. Probe outcomes (same
    ``episode``; throttled ones do not count) decide:

    - a failure reopens at once (``open_for`` restarts);
    - it closes as soon as ``probes >= min_probes`` (20) and ``ok * 10^4 >= close_bp * probes``
      (``ok`` = fast successes; 98 %);
    - slow successes count as probes that did not succeed; once ``slow * 10^4 >
      (10^4 - close_bp) * max_probes`` the ratio is out of reach within ``max_probes`` (100)
      and it reopens. So HALF_OPEN ends after at most ``max_probes`` probes.

    Outcomes of requests admitted as normal (before the breaker opened) are ignored.

Route weight (for the router; in ``[min_weight, 1]``)
    ``weight(t) = min(1, w + (t - t_w) / weight_recovery)``. A throttled outcome at ``t`` sets
    ``w = max(min_weight, weight(t) * throttle_factor)``, ``t_w = t`` unless the previous cut
    was less than ``throttle_gap`` ago.

Time: decision times never go backwards (``now`` is clamped to the provider's last decision
time). Ratios are compared in basis points with integers, so the script and the model agree
exactly.

:func:`apply` is the reference implementation in Python; ``scripts/step.lua`` mirrors it
operation for operation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol

from notiflow.adapters.providers.base import Outcome
from notiflow.settings import BreakerRule, Settings

BP = 10_000
"""Basis points in one."""


class State(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Verdict(StrEnum):
    """What one outcome means for the breaker."""

    SUCCESS = "s"
    FAILURE = "f"
    THROTTLED = "t"


def classify(outcome: Outcome, reason: str | None,
             throttle_reasons: frozenset[str] = frozenset({"rate_limited"})) -> Verdict:
    """Throttling reasons are THROTTLED whatever the outcome; TRANSIENT and AMBIGUOUS are
    FAILURE; ACCEPTED and PERMANENT (the provider answered) are SUCCESS."""
    if reason is not None and reason in throttle_reasons:
        return Verdict.THROTTLED
    if outcome in (Outcome.TRANSIENT, Outcome.AMBIGUOUS):
        return Verdict.FAILURE
    return Verdict.SUCCESS


# parameters ------------------------------------------------------------------------------


def _us(d: timedelta, scale: float = 1.0) -> int:
    return max(1, round(d / timedelta(microseconds=1) * scale))


@dataclass(frozen=True, slots=True)
class BreakerParams:
    """A :class:`BreakerRule` at one ``time_scale``: µs, counts and basis points, as the
    script gets them."""

    window_us: int
    bucket_us: int
    buckets: int
    failure_threshold: int
    error_bp: int
    min_calls: int
    latency_us: int
    quantile_bp: int
    min_latency_calls: int
    open_us: int
    probe_every: int
    probe_gap_us: int
    min_probes: int
    close_bp: int
    max_probes: int
    throttle_factor: float
    throttle_gap_us: int
    min_weight: float
    recovery_us: int
    throttle_reasons: frozenset[str] = frozenset({"rate_limited"})

    @classmethod
    def from_rule(cls, rule: BreakerRule, time_scale: float = 1.0) -> BreakerParams:
        """Scale every duration but the latency threshold by ``time_scale``."""
        window = _us(rule.window, time_scale)
        return cls(
            window_us=window,
            bucket_us=max(1, window // rule.buckets),
            buckets=rule.buckets,
            failure_threshold=rule.failure_threshold,
            error_bp=round(rule.error_rate * BP),
            min_calls=rule.min_calls,
            latency_us=_us(rule.latency_threshold),
            quantile_bp=round(rule.latency_quantile * BP),
            min_latency_calls=rule.min_latency_calls,
            open_us=_us(rule.open_for, time_scale),
            probe_every=max(1, round(1 / rule.probe_share)),
            probe_gap_us=_us(rule.probe_gap, time_scale),
            min_probes=rule.min_probes,
            close_bp=round(rule.close_ratio * BP),
            max_probes=rule.max_probes,
            throttle_factor=rule.throttle_factor,
            throttle_gap_us=_us(rule.throttle_gap, time_scale),
            min_weight=rule.min_weight,
            recovery_us=_us(rule.weight_recovery, time_scale),
            throttle_reasons=rule.throttle_reasons,
        )

    @classmethod
    def from_settings(cls, settings: Settings, lane: str = "") -> BreakerParams:
        """The parameters of ``lane``'s breakers: the bulk lane (any non-empty lane) counts
        slow calls above ``bulk_latency_threshold`` and opens at ``bulk_failure_threshold``
        failures (``adapters/breaker_lanes.py``)."""
        params = cls.from_rule(settings.breaker, settings.time_scale)
        if not lane:
            return params
        return dataclasses.replace(
            params, latency_us=_us(settings.breaker.bulk_latency_threshold),
            failure_threshold=settings.breaker.bulk_failure_threshold)

    def is_slow(self, latency_s: float) -> bool:
        return round(latency_s * 1_000_000) > self.latency_us

    def script_args(self) -> list[str | int]:
        return [self.window_us, self.bucket_us, self.buckets, self.failure_threshold,
                self.error_bp, self.min_calls, self.quantile_bp, self.min_latency_calls,
                self.open_us, self.probe_gap_us, self.min_probes, self.close_bp,
                self.max_probes, repr(float(self.throttle_factor)), self.throttle_gap_us,
                repr(float(self.min_weight)), self.recovery_us]


# value objects ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Op:
    """One step of the state machine: ``k`` peek, ``n`` probe (every n-th request), ``g``
    probe (gap floor), ``r`` record an outcome. ``episode`` -1 = the current one."""

    kind: str
    verdict: Verdict = Verdict.SUCCESS
    slow: bool = False
    probe: bool = False
    episode: int = -1
    reason: str = ""


PEEK = Op("k")


@dataclass(frozen=True, slots=True)
class Transition:
    old: State
    new: State
    at_us: int
    why: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The shared state of one provider right after a script call at ``now_us``; ``weight``
    is the route weight at ``now_us``; window counts are those of the buckets at ``now_us``."""

    state: State
    since_us: int
    until_us: int
    episode: int
    why: str
    now_us: int
    calls: int
    failures: int
    slow: int
    probes: int
    probe_ok: int
    probe_slow: int
    probe_last_us: int
    weight: float


@dataclass(frozen=True, slots=True)
class StepResult:
    """Per op whether a probe was admitted (False for other ops), the state after the last
    op, and the transitions made, in order."""

    granted: tuple[bool, ...]
    snapshot: Snapshot
    transitions: tuple[Transition, ...]


# reference model -------------------------------------------------------------------------


@dataclass(slots=True)
class ModelState:
    """What the script keeps in the provider's hash."""

    state: State = State.CLOSED
    since_us: int = 0
    until_us: int = 0
    episode: int = 0
    why: str = ""
    last_us: int | None = None
    failures: list[int] = field(default_factory=list)
    head: int = -1
    slots: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    calls: int = 0
    fails: int = 0
    slow: int = 0
    probes: int = 0
    probe_ok: int = 0
    probe_slow: int = 0
    probe_last_us: int = -1
    weight: float = 1.0
    weight_us: int = 0
    cut_us: int = -1


def weight_at(weight: float, weight_us: int, now_us: int, recovery_us: int) -> float:
    """The route weight at ``now_us``, recovering linearly from ``weight`` at ``weight_us``."""
    return min(1.0, weight + (now_us - weight_us) / recovery_us)


def _enter(s: ModelState, p: BreakerParams, new: State, at: int, why: str,
           out: list[Transition]) -> None:
    out.append(Transition(s.state, new, at, why))
    s.state, s.since_us, s.why = new, at, why
    s.probes = s.probe_ok = s.probe_slow = 0
    s.probe_last_us = -1
    if new is State.OPEN:
        s.episode += 1
        s.until_us = at + p.open_us
        s.slots.clear()
        s.calls = s.fails = s.slow = 0
        s.failures.clear()


def _roll(s: ModelState, p: BreakerParams, now: int) -> None:
    cur = now // p.bucket_us
    if cur <= s.head:
        return
    n = p.buckets
    if s.head < 0 or cur - s.head >= n:
        s.slots.clear()
        s.calls = s.fails = s.slow = 0
    else:
        for j in range(s.head - n + 1, cur - n + 1):
            entry = s.slots.get(j % n)
            if entry is not None and entry[0] == j:
                s.calls -= entry[1]
                s.fails -= entry[2]
                s.slow -= entry[3]
                del s.slots[j % n]
    s.head = cur


def _add_call(s: ModelState, p: BreakerParams, fail: bool, slow: bool) -> None:
    slot = s.head % p.buckets
    entry = s.slots.get(slot)
    _, c, x, sl = entry if entry is not None and entry[0] == s.head else (s.head, 0, 0, 0)
    s.slots[slot] = (s.head, c + 1, x + int(fail), sl + int(slow))
    s.calls += 1
    s.fails += int(fail)
    s.slow += int(slow)


def _record_closed(s: ModelState, p: BreakerParams, op: Op, now: int,
                   out: list[Transition]) -> None:
    fail = op.verdict is Verdict.FAILURE
    _add_call(s, p, fail, op.slow)
    if fail:
        s.failures.append(now)
        k = p.failure_threshold
        if len(s.failures) >= k and s.failures[-k] > now - p.window_us:
            _enter(s, p, State.OPEN, now, f"failures:{k}", out)
            return
        if len(s.failures) > k - 1:
            del s.failures[:len(s.failures) - (k - 1)]
    if s.calls >= p.min_calls and s.fails * BP > p.error_bp * s.calls:
        _enter(s, p, State.OPEN, now, f"error_rate:{s.fails}/{s.calls}", out)
        return
    rank = (p.quantile_bp * s.calls + BP - 1) // BP
    if s.calls >= p.min_latency_calls and s.slow > s.calls - rank:
        _enter(s, p, State.OPEN, now, f"latency:{s.slow}/{s.calls}", out)


def _record_probe(s: ModelState, p: BreakerParams, op: Op, now: int,
                  out: list[Transition]) -> None:
    if op.verdict is Verdict.FAILURE:
        why = f"probe_failed:{op.reason}" if op.reason else "probe_failed"
        _enter(s, p, State.OPEN, now, why, out)
        return
    s.probes += 1
    if op.slow:
        s.probe_slow += 1
    else:
        s.probe_ok += 1
    if s.probes >= p.min_probes and s.probe_ok * BP >= p.close_bp * s.probes:
        _enter(s, p, State.CLOSED, now, f"probes_ok:{s.probe_ok}/{s.probes}", out)
    elif s.probe_slow * BP > (BP - p.close_bp) * p.max_probes:
        _enter(s, p, State.OPEN, now, f"probes_slow:{s.probe_slow}/{s.probes}", out)


def apply(s: ModelState, p: BreakerParams, op: Op, now_us: int,
          out: list[Transition]) -> bool:
    """Apply one op at ``now_us`` (>= 0), appending transitions to ``out``; returns whether a
    probe was admitted. The reference for the Lua script."""
    now = now_us if s.last_us is None else max(now_us, s.last_us)
    s.last_us = now
    if s.state is State.OPEN and now >= s.until_us:
        _enter(s, p, State.HALF_OPEN, s.until_us, "open_elapsed", out)
    _roll(s, p, now)
    if op.kind in ("n", "g"):
        if s.state is State.HALF_OPEN and (
                op.kind == "n" or s.probe_last_us < 0
                or now - s.probe_last_us >= p.probe_gap_us):
            s.probe_last_us = now
            return True
        return False
    if op.kind != "r":
        return False
    if op.verdict is Verdict.THROTTLED:
        if s.cut_us < 0 or now - s.cut_us >= p.throttle_gap_us:
            w = weight_at(s.weight, s.weight_us, now, p.recovery_us)
            s.weight = max(p.min_weight, w * p.throttle_factor)
            s.weight_us = s.cut_us = now
    elif s.state is State.CLOSED:
        _record_closed(s, p, op, now, out)
    elif (s.state is State.HALF_OPEN and op.probe
          and (op.episode < 0 or op.episode == s.episode)):
        _record_probe(s, p, op, now, out)
    return False


def snapshot(s: ModelState, p: BreakerParams) -> Snapshot:
    now = s.last_us if s.last_us is not None else 0
    return Snapshot(s.state, s.since_us, s.until_us, s.episode, s.why, now, s.calls, s.fails,
                    s.slow, s.probes, s.probe_ok, s.probe_slow, s.probe_last_us,
                    weight_at(s.weight, s.weight_us, now, p.recovery_us))


def run_model(s: ModelState, p: BreakerParams, ops: Sequence[Op], now_us: int) -> StepResult:
    """Apply ``ops`` in order at one time, as one script call does."""
    out: list[Transition] = []
    granted = tuple(apply(s, p, op, now_us, out) for op in ops)
    return StepResult(granted, snapshot(s, p), tuple(out))


def effective_state(snap: Snapshot, at_us: int) -> State:
    """The state at ``at_us`` >= ``snap.now_us`` if nothing else happens (OPEN half-opens)."""
    if snap.state is State.OPEN and at_us >= snap.until_us:
        return State.HALF_OPEN
    return snap.state


class AdmissionKind(StrEnum):
    NORMAL = "normal"
    PROBE = "probe"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Admission:
    """:meth:`CircuitBreakers.allow`'s answer; pass ``probe`` and ``episode`` back to
    :meth:`CircuitBreakers.record` (or use :meth:`CircuitBreakers.record_result`)."""

    kind: AdmissionKind
    retry_in: float = 0.0
    """Seconds until admission may change (refused only)."""
    episode: int = 0

    @property
    def admitted(self) -> bool:
        return self.kind is not AdmissionKind.REFUSED

    @property
    def probe(self) -> bool:
        return self.kind is AdmissionKind.PROBE


NORMAL = Admission(AdmissionKind.NORMAL)


@dataclass(frozen=True, slots=True)
class StateChange:
    """A transition of one provider's breaker; ``shared`` is False for a process's local
    breaker (Redis down) and for ``why == "converged"`` (local view → shared state)."""

    provider_id: str
    old: State
    new: State
    at: datetime
    why: str
    at_us: int
    shared: bool = True
    lane: str = ""
    """"" for the priority lane's breaker, ``bulk`` for the bulk lane's."""


class BreakerSource(Protocol):
    """Where :class:`~notiflow.adapters.breaker.facade.CircuitBreakers` runs its ops:
    :class:`BreakerStore` or :class:`ModelStore`."""

    params: BreakerParams

    async def run(self, provider_id: str, ops: Sequence[Op],
                  now_us: int | None = None) -> StepResult: ...

    async def aclose(self) -> None: ...


def wall_us() -> int:
    """Wall-clock time in µs: the default clock of :class:`ModelStore` and
    :class:`~notiflow.adapters.breaker.facade.CircuitBreakers`."""
    return time.time_ns() // 1000


class ModelStore:
    """The reference model behind the store interface: one process only (tests, dev)."""

    def __init__(self, params: BreakerParams, clock_us: Callable[[], int] = wall_us) -> None:
        self.params = params
        self.clock_us = clock_us
        self.states: dict[str, ModelState] = {}

    async def run(self, provider_id: str, ops: Sequence[Op],
                  now_us: int | None = None) -> StepResult:
        state = self.states.setdefault(provider_id, ModelState())
        return run_model(state, self.params, ops, self.clock_us() if now_us is None else now_us)

    async def aclose(self) -> None:
        return None
