"""Circuit breakers per provider account, shared by every worker through Redis.

Every send worker asks :class:`CircuitBreakers` before a provider call (:meth:`~CircuitBreakers.
allow`) and reports the outcome after it (:meth:`~CircuitBreakers.record`). The state of each
provider account lives in one Redis hash and changes only inside one Lua script call, on Redis's
clock (``TIME``; tests pass ``now_us``), so all processes see one state machine. Rules are
:class:`~notiflow.settings.BreakerRule` (defaults below), durations multiplied by
``time_scale`` except the latency threshold.

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

Redis key layout (namespace = ``settings.topic_prefix``), one hash per provider account::

    {ns}cb:{provider}  st since until ep why last    state (0 closed, 1 open, 2 half-open), µs
                       fl                            times of the latest failures, "t1,t2,..."
                       head c x s                    newest bucket index; calls, failures, slow
                       b0 .. b{N-1}                  bucket i % N: "i:calls:failures:slow"
                       pn pok psl pl                 probes, fast successes, slow; last admitted
                       w wt wc                       weight (%.17g) at wt; time of last cut
                       n bw                          bucket count and width the counts use

Redis down (connection error or timeout): each process continues on local breakers (the
reference model, same rules, seeded with the last shared state it saw) and logs once; a
background probe retries Redis at most every ``retry_interval``; once it answers, each provider
adopts the shared state on its next op and drops its local one (a ``converged`` change event
when the two differed).

:func:`apply` is the reference implementation in Python; the script mirrors it operation for
operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Protocol

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from notiflow.adapters.providers.base import Outcome, SendResult
from notiflow.adapters.ratelimit import DOWN_ERRORS
from notiflow.adapters.redis_health import RedisHealth
from notiflow.adapters.redis_pool import LUA_NOW_US, redis_client
from notiflow.settings import BreakerRule, Settings

log = logging.getLogger(__name__)

BP = 10_000
"""Basis points in one."""


class State(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


_CODE: dict[State, int] = {State.CLOSED: 0, State.OPEN: 1, State.HALF_OPEN: 2}
_STATE: dict[int, State] = {v: k for k, v in _CODE.items()}


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
_SUCCESS = Op("r", Verdict.SUCCESS)
_SLOW_SUCCESS = Op("r", Verdict.SUCCESS, slow=True)


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


# Redis -----------------------------------------------------------------------------------

STEP_LUA = LUA_NOW_US + """
local key = KEYS[1]
local W, B, N = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local FT, EBP, MINC = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local QBP, MINL, OPENUS = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local GAP, MINP, CBP = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local MAXP, TF, TGAP = tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16])
local WMIN, REC, TTL = tonumber(ARGV[17]), tonumber(ARGV[18]), tonumber(ARGV[19])
local NOPS = tonumber(ARGV[20])
local BP = 10000

local v = redis.call('HMGET', key, 'st', 'since', 'until', 'ep', 'why', 'last', 'fl', 'head',
  'c', 'x', 's', 'pn', 'pok', 'psl', 'pl', 'w', 'wt', 'wc', 'n', 'bw')
local st = tonumber(v[1]) or 0
local since = tonumber(v[2]) or 0
local untl = tonumber(v[3]) or 0
local ep = tonumber(v[4]) or 0
local why = v[5] or ''
local last = tonumber(v[6])
local fl = {}
if v[7] then
  for t in string.gmatch(v[7], '[^,]+') do fl[#fl + 1] = tonumber(t) end
end
local head = tonumber(v[8]) or -1
local c, x, s = tonumber(v[9]) or 0, tonumber(v[10]) or 0, tonumber(v[11]) or 0
local pn, pok, psl = tonumber(v[12]) or 0, tonumber(v[13]) or 0, tonumber(v[14]) or 0
local pl = tonumber(v[15]) or -1
local w, wt, wc = tonumber(v[16]) or 1, tonumber(v[17]) or 0, tonumber(v[18]) or -1

if last and now < last then now = last end
local oldn = tonumber(v[19])
if oldn and (oldn ~= N or tonumber(v[20]) ~= B) then
  local f = {}
  for i = 0, oldn - 1 do f[#f + 1] = 'b' .. i end
  redis.call('HDEL', key, unpack(f))
  head, c, x, s = -1, 0, 0, 0
end

local function fmt(n) return string.format('%d', n) end
local tr = {}

local bk = nil

local function clear_buckets()
  if c > 0 then
    local f = {}
    for i = 0, N - 1 do f[#f + 1] = 'b' .. i end
    redis.call('HDEL', key, unpack(f))
  end
  c, x, s = 0, 0, 0
  bk = nil
end

local function enter(new, at, reason)
  tr[#tr + 1] = {st, new, at, reason}
  st, since, why = new, at, reason
  pn, pok, psl, pl = 0, 0, 0, -1
  if new == 1 then
    ep = ep + 1
    untl = at + OPENUS
    clear_buckets()
    fl = {}
  end
end

local function parse(e)
  local bi, bc, bx, bs = string.match(e, '^(%-?%d+):(%d+):(%d+):(%d+)$')
  return tonumber(bi), tonumber(bc), tonumber(bx), tonumber(bs)
end

local function roll()
  local cur = math.floor(now / B)
  if cur <= head then return end
  if head < 0 or cur - head >= N then
    clear_buckets()
  else
    for j = head - N + 1, cur - N do
      local f = 'b' .. (j % N)
      local e = redis.call('HGET', key, f)
      if e then
        local bi, bc, bx, bs = parse(e)
        if bi == j then
          c, x, s = c - bc, x - bx, s - bs
          redis.call('HDEL', key, f)
        end
      end
    end
  end
  head = cur
end

local function add_call(fail, slow)
  if not bk then
    bk = {head, 0, 0, 0}
    local e = redis.call('HGET', key, 'b' .. (head % N))
    if e then
      local bi, bc, bx, bs = parse(e)
      if bi == head then bk = {head, bc, bx, bs} end
    end
  end
  bk[2], c = bk[2] + 1, c + 1
  if fail then bk[3], x = bk[3] + 1, x + 1 end
  if slow then bk[4], s = bk[4] + 1, s + 1 end
end

local function record_closed(fail, slow)
  add_call(fail, slow)
  if fail then
    fl[#fl + 1] = now
    if #fl >= FT and fl[#fl - FT + 1] > now - W then
      enter(1, now, 'failures:' .. fmt(FT))
      return
    end
    if #fl > FT - 1 then
      local keep = {}
      for i = #fl - FT + 2, #fl do keep[#keep + 1] = fl[i] end
      fl = keep
    end
  end
  if c >= MINC and x * BP > EBP * c then
    enter(1, now, 'error_rate:' .. fmt(x) .. '/' .. fmt(c))
    return
  end
  local rank = math.floor((QBP * c + BP - 1) / BP)
  if c >= MINL and s > c - rank then
    enter(1, now, 'latency:' .. fmt(s) .. '/' .. fmt(c))
  end
end

local function record_probe(fail, slow, reason)
  if fail then
    if reason == '' then enter(1, now, 'probe_failed')
    else enter(1, now, 'probe_failed:' .. reason) end
    return
  end
  pn = pn + 1
  if slow then psl = psl + 1 else pok = pok + 1 end
  if pn >= MINP and pok * BP >= CBP * pn then
    enter(0, now, 'probes_ok:' .. fmt(pok) .. '/' .. fmt(pn))
  elseif psl * BP > (BP - CBP) * MAXP then
    enter(1, now, 'probes_slow:' .. fmt(psl) .. '/' .. fmt(pn))
  end
end

local granted = {}
for i = 0, NOPS - 1 do
  local base = 21 + i * 6
  local kind, verdict = ARGV[base], ARGV[base + 1]
  local slow, probe = ARGV[base + 2] == '1', ARGV[base + 3] == '1'
  local pep, reason = tonumber(ARGV[base + 4]), ARGV[base + 5]
  if st == 1 and now >= untl then enter(2, untl, 'open_elapsed') end
  roll()
  local g = '0'
  if kind == 'n' or kind == 'g' then
    if st == 2 and (kind == 'n' or pl < 0 or now - pl >= GAP) then
      pl = now
      g = '1'
    end
  elseif kind == 'r' then
    if verdict == 't' then
      if wc < 0 or now - wc >= TGAP then
        local cw = math.min(1, w + (now - wt) / REC)
        w = math.max(WMIN, cw * TF)
        wt, wc = now, now
      end
    elseif st == 0 then
      record_closed(verdict == 'f', slow)
    elseif st == 2 and probe and (pep < 0 or pep == ep) then
      record_probe(verdict == 'f', slow, reason)
    end
  end
  granted[#granted + 1] = g
end

if bk then
  redis.call('HSET', key, 'b' .. (bk[1] % N),
    fmt(bk[1]) .. ':' .. fmt(bk[2]) .. ':' .. fmt(bk[3]) .. ':' .. fmt(bk[4]))
end
local flo = {}
for i = 1, #fl do flo[i] = fmt(fl[i]) end
redis.call('HSET', key, 'st', fmt(st), 'since', fmt(since), 'until', fmt(untl), 'ep', fmt(ep),
  'why', why, 'last', fmt(now), 'fl', table.concat(flo, ','), 'head', fmt(head),
  'c', fmt(c), 'x', fmt(x), 's', fmt(s), 'pn', fmt(pn), 'pok', fmt(pok), 'psl', fmt(psl),
  'pl', fmt(pl), 'w', string.format('%.17g', w), 'wt', fmt(wt), 'wc', fmt(wc),
  'n', fmt(N), 'bw', fmt(B))
redis.call('PEXPIRE', key, TTL)

local out = {table.concat(granted), st, since, untl, ep, why, now, c, x, s, pn, pok, psl, pl,
  string.format('%.17g', math.min(1, w + (now - wt) / REC)), #tr}
for i = 1, #tr do
  for j = 1, 4 do out[#out + 1] = tr[i][j] end
end
return out
"""


class BreakerSource(Protocol):
    """Where :class:`CircuitBreakers` runs its ops: :class:`BreakerStore` or
    :class:`ModelStore`."""

    params: BreakerParams

    async def run(self, provider_id: str, ops: Sequence[Op],
                  now_us: int | None = None) -> StepResult: ...

    async def aclose(self) -> None: ...


class BreakerStore:
    """The Lua state machine over Redis; one instance per worker event loop."""

    def __init__(self, client: aioredis.Redis, params: BreakerParams, namespace: str = "",
                 key_ttl_ms: int = 86_400_000, lane: str = "") -> None:
        longest = max(params.window_us, params.open_us, params.recovery_us) // 1000
        if key_ttl_ms < 2 * longest:
            raise ValueError("key_ttl_ms must be at least twice the longest breaker duration")
        self.r = client
        self.params = params
        self.ns = namespace
        self.lane = lane
        self.key_ttl_ms = key_ttl_ms
        self._args = params.script_args()
        self._script = client.register_script(STEP_LUA)

    @classmethod
    def open(cls, settings: Settings, timeout: float = 0.5, lane: str = "") -> BreakerStore:
        """A store with its own client: short timeouts and no retry (a retried script call
        could count an outcome twice), so an unreachable Redis is noticed within
        ``timeout``. ``lane``: "" for the priority lane's breakers, ``bulk`` for the bulk
        lane's (``adapters/breaker_lanes.py``)."""
        client = redis_client(settings, timeout=timeout,
                              retry=Retry(NoBackoff(), 0), health_check_interval=30)
        return cls(client, BreakerParams.from_settings(settings, lane), settings.topic_prefix,
                   lane=lane)

    def key(self, provider_id: str) -> str:
        """``{ns}cb:{provider}``, or ``{ns}cb:{provider}@{lane}`` for a lane's own breaker."""
        return f"{self.ns}cb:{provider_id}{'@' + self.lane if self.lane else ''}"

    async def run(self, provider_id: str, ops: Sequence[Op],
                  now_us: int | None = None) -> StepResult:
        """Apply ``ops`` in one atomic script call; ``now_us`` overrides Redis's clock."""
        args: list[str | int] = ["" if now_us is None else int(now_us), *self._args,
                                 self.key_ttl_ms, len(ops)]
        for op in ops:
            args += [op.kind, op.verdict.value, int(op.slow), int(op.probe), op.episode,
                     op.reason]
        raw = await self._script(keys=[self.key(provider_id)], args=args)
        return _parse(raw)

    async def aclose(self) -> None:
        await self.r.aclose()


def _text(x: object) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _parse(raw: list[object]) -> StepResult:
    v = [_text(x) for x in raw]
    ints = [int(x) for x in v[1:5]]
    counts = [int(x) for x in v[6:14]]
    snap = Snapshot(_STATE[ints[0]], ints[1], ints[2], ints[3], v[5], counts[0], counts[1],
                    counts[2], counts[3], counts[4], counts[5], counts[6], counts[7], float(v[14]))
    transitions = tuple(
        Transition(_STATE[int(v[16 + 4 * i])], _STATE[int(v[17 + 4 * i])], int(v[18 + 4 * i]),
                   v[19 + 4 * i])
        for i in range(int(v[15])))
    return StepResult(tuple(ch == "1" for ch in v[0]), snap, transitions)


def _wall_us() -> int:
    return time.time_ns() // 1000


class ModelStore:
    """The reference model behind the store interface: one process only (tests, dev)."""

    def __init__(self, params: BreakerParams, clock_us: Callable[[], int] = _wall_us) -> None:
        self.params = params
        self.clock_us = clock_us
        self.states: dict[str, ModelState] = {}

    async def run(self, provider_id: str, ops: Sequence[Op],
                  now_us: int | None = None) -> StepResult:
        state = self.states.setdefault(provider_id, ModelState())
        return run_model(state, self.params, ops, self.clock_us() if now_us is None else now_us)

    async def aclose(self) -> None:
        return None


# per-process breakers --------------------------------------------------------------------


@dataclass(slots=True)
class BreakerStats:
    """Counters of one :class:`CircuitBreakers` (for metrics and benchmarks)."""

    round_trips: int = 0
    ops: int = 0
    deferred: int = 0
    local_ops: int = 0
    refreshes: int = 0
    dropped_events: int = 0


_Pending = tuple[Op, "asyncio.Future[bool] | None"]


@dataclass(slots=True)
class _Entry:
    snap: Snapshot | None = None
    got_us: int = 0
    pending: list[_Pending] = field(default_factory=list)
    urgent: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    latest: asyncio.Future[bool] | None = None
    flusher: asyncio.Task[None] | None = None
    seen: int = 0
    seen_episode: int = -1
    local: ModelState | None = None


class CircuitBreakers:
    """The breakers of every provider account, for one process (one event loop).

    :meth:`allow` answers from a local copy of the shared state while it is younger than
    ``cache_ttl`` (no Redis call); it asks Redis when the copy is stale and for probe
    candidates. :meth:`record` applies failures, throttling and probe outcomes in Redis
    before it returns; plain successes (not probes) are deferred: they ride, in order, with
    the next script call for that provider, at most ``flush_interval`` later (every prompt
    outcome flushes the successes recorded before it; a success decides an opening only by
    completing ``min_calls`` or as a slow call, which then happens at most that much later).
    Ops for one provider share one script call (at most ``max_batch``, in arrival order), so
    there is at most one script call in flight per provider and process. When a script call
    fails with a connection error or timeout, its ops and all later ones run on local
    breakers; a background probe retries Redis at most every ``retry_interval`` (callers
    never wait for it), and on success each provider adopts the shared state on its next op.
    ``clock_us`` (tests) drives the local clock and the script's ``now_us``.
    """

    def __init__(self, source: Settings | BreakerSource, *, cache_ttl: float = 0.2,
                 flush_interval: float = 0.1, retry_interval: float = 0.5,
                 max_batch: int = 512, event_queue: int = 1000,
                 clock_us: Callable[[], int] | None = None, lane: str = "",
                 store_timeout: float = 0.5, health: RedisHealth | None = None,
                 max_entries: int = 10_000) -> None:
        """``source``: the settings (opens its own :class:`BreakerStore` of ``lane`` whose
        Redis calls time out after ``store_timeout`` seconds), or a store. ``health``: the
        process's shared view of Redis (default: one of its own); while it says down,
        decide locally without asking. ``max_entries``: breakers kept in this process (ids
        of tenants' endpoints come from tenant input); beyond it the oldest idle copies are
        forgotten (the shared state stays in Redis and is read again when asked)."""
        if (cache_ttl < 0 or flush_interval < 0 or retry_interval <= 0 or max_batch < 1
                or event_queue < 1 or max_entries < 1):
            raise ValueError("bad breaker parameters")
        self._flush_interval = flush_interval
        self.lane = lane
        self.store: BreakerSource = (BreakerStore.open(source, store_timeout, lane=lane)
                                     if isinstance(source, Settings) else source)
        self.params = self.store.params
        self.stats = BreakerStats()
        self._driven = clock_us is not None
        self._clock = clock_us or _wall_us
        self._cache_us = round(cache_ttl * 1_000_000)
        self._retry_us = round(retry_interval * 1_000_000)
        self._max_batch = max_batch
        self._event_queue = event_queue
        self._entries: dict[str, _Entry] = {}
        self._max_entries = max_entries
        self._listeners: list[Callable[[StateChange], None]] = []
        self._queues: list[asyncio.Queue[StateChange]] = []
        self._redis_ok = True
        self._retry_at = 0
        self._probe: asyncio.Future[None] | None = None
        self.health = health or RedisHealth()

    @property
    def redis_ok(self) -> bool:
        """False while Redis is unreachable (local breakers decide)."""
        return self._redis_ok

    # decisions

    async def _fresh(self, provider_id: str) -> tuple[_Entry, int]:
        """The provider's entry with a snapshot no older than the cache allows, and now."""
        e = self._entry(provider_id)
        now = self._clock()
        if e.snap is None or not 0 <= now - e.got_us < self._cache_us:
            await self._refresh(provider_id, e)
            now = self._clock()
        return e, now

    async def allow(self, provider_id: str) -> Admission:
        """Admit as normal (CLOSED), as a probe (HALF_OPEN), or refuse with ``retry_in``."""
        e, now = await self._fresh(provider_id)
        assert e.snap is not None
        if e.snap.state is State.CLOSED:
            return NORMAL
        t = self._redis_time(e, now)
        if effective_state(e.snap, t) is State.OPEN:
            return Admission(AdmissionKind.REFUSED, (e.snap.until_us - t) / 1_000_000,
                             e.snap.episode)
        if e.seen_episode != e.snap.episode:
            e.seen_episode, e.seen = e.snap.episode, 0
        e.seen += 1
        last = e.snap.probe_last_us if e.snap.state is State.HALF_OPEN else -1
        floor = last < 0 or t - last >= self.params.probe_gap_us
        if floor or e.seen % self.params.probe_every == 0:
            if await self._submit(provider_id, e, Op("g" if floor else "n")):
                return Admission(AdmissionKind.PROBE, 0.0, e.snap.episode)
            now = self._clock()
            t = self._redis_time(e, now)
            state = effective_state(e.snap, t)
            if state is State.CLOSED:
                return NORMAL
            if state is State.OPEN:
                return Admission(AdmissionKind.REFUSED, (e.snap.until_us - t) / 1_000_000,
                                 e.snap.episode)
        return Admission(AdmissionKind.REFUSED, self._probe_wait(e.snap, t) / 1_000_000,
                         e.snap.episode)

    async def peek(self, provider_id: str) -> Admission:
        """What :meth:`allow` would say for a breaker this process only watches: REFUSED
        with ``retry_in`` while OPEN, NORMAL otherwise (HALF_OPEN included: probing is the
        business of the processes that record outcomes). Never admits a probe."""
        e, now = await self._fresh(provider_id)
        assert e.snap is not None
        t = self._redis_time(e, now)
        if effective_state(e.snap, t) is State.OPEN:
            return Admission(AdmissionKind.REFUSED, (e.snap.until_us - t) / 1_000_000,
                             e.snap.episode)
        return NORMAL

    async def record(self, provider_id: str, outcome: Outcome, reason: str | None,
                     latency_s: float, probe: bool = False, *,
                     episode: int | None = None) -> State:
        """Apply one outcome (shared state, or the local breaker while Redis is down) and
        return the state after it. ``probe``/``episode`` come from the :class:`Admission`;
        a probe outcome of another episode is ignored (``episode=None``: the current one)."""
        verdict = classify(outcome, reason, self.params.throttle_reasons)
        slow = self.params.is_slow(latency_s)
        e = self._entry(provider_id)
        if verdict is Verdict.SUCCESS and not probe:
            self._defer(provider_id, e, _SLOW_SUCCESS if slow else _SUCCESS)
        else:
            await self._submit(provider_id, e, Op("r", verdict, slow, probe,
                                                  -1 if episode is None else episode,
                                                  reason or ""))
        return self.state(provider_id)

    async def record_result(self, result: SendResult, admission: Admission) -> State:
        """:meth:`record` for an adapter's :class:`SendResult` (latency = completed -
        started)."""
        latency = (result.completed_at - result.started_at).total_seconds()
        return await self.record(result.provider_id, result.outcome, result.reason, latency,
                                 admission.probe, episode=admission.episode)

    def state(self, provider_id: str) -> State:
        """The state as this process knows it (CLOSED for a provider never seen); an OPEN
        breaker whose time is up reads HALF_OPEN."""
        e = self._entries.get(provider_id)
        if e is None or e.snap is None:
            return State.CLOSED
        return effective_state(e.snap, self._redis_time(e, self._clock()))

    def weight(self, provider_id: str) -> float:
        """Route weight in ``[min_weight, 1]``: lowered by throttling, recovering over time
        (1.0 for a provider never seen)."""
        e = self._entries.get(provider_id)
        if e is None or e.snap is None:
            return 1.0
        t = self._redis_time(e, self._clock())
        return weight_at(e.snap.weight, e.snap.now_us, t, self.params.recovery_us)

    def snapshot(self, provider_id: str) -> Snapshot | None:
        """The last state this process received (None before the first call)."""
        e = self._entries.get(provider_id)
        return None if e is None else e.snap

    # events

    def on_change(self, listener: Callable[[StateChange], None]) -> Callable[[], None]:
        """Call ``listener`` for every transition made by this process's script calls (each
        shared transition is made by exactly one process), by its local breakers, and for
        each ``converged`` adoption; returns an unsubscribe function. Listener errors are
        logged, never raised."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def changes(self) -> AsyncIterator[StateChange]:
        """The changes of :meth:`on_change` from now on, endlessly (a bounded queue: the
        oldest are dropped when a slow consumer falls ``event_queue`` behind)."""
        queue: asyncio.Queue[StateChange] = asyncio.Queue(self._event_queue)
        self._queues.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._queues.remove(queue)

    async def flush(self, provider_id: str | None = None) -> None:
        """Apply deferred successes now (of one provider, or of all)."""
        ids = [provider_id] if provider_id is not None else list(self._entries)
        for pid in ids:
            e = self._entries.get(pid)
            if e is not None and e.pending:
                await self._submit(pid, e, PEEK)

    async def aclose(self) -> None:
        """Flush deferred outcomes, then close the store."""
        await self.flush()
        if self._probe is not None:
            self._probe.cancel()
        flushers = [e.flusher for e in self._entries.values() if e.flusher is not None]
        if flushers:
            await asyncio.gather(*flushers, return_exceptions=True)
        await self.store.aclose()

    # internals

    def _entry(self, provider_id: str) -> _Entry:
        e = self._entries.get(provider_id)
        if e is None:
            if len(self._entries) >= self._max_entries:
                self._prune()
            e = self._entries[provider_id] = _Entry()
        return e

    def _prune(self) -> None:
        """Forget the oldest idle entries (nothing queued or in flight, no local breaker)
        until a quarter of ``max_entries`` is free."""
        target = self._max_entries - max(1, self._max_entries // 4)
        for pid in list(self._entries):
            if len(self._entries) <= target:
                return
            e = self._entries[pid]
            if (not e.pending and e.flusher is None and e.local is None
                    and (e.latest is None or e.latest.done())):
                del self._entries[pid]

    def _redis_time(self, e: _Entry, now: int) -> int:
        assert e.snap is not None
        return e.snap.now_us + max(0, now - e.got_us)

    def _probe_wait(self, snap: Snapshot, t: int) -> int:
        gap = self.params.probe_gap_us
        if snap.state is not State.HALF_OPEN or snap.probe_last_us < 0:
            return gap
        return max(1, snap.probe_last_us + gap - t)

    async def _refresh(self, provider_id: str, e: _Entry) -> None:
        self.stats.refreshes += 1
        if e.latest is not None and not e.latest.done():
            await asyncio.shield(e.latest)
        else:
            await self._submit(provider_id, e, PEEK)

    def _defer(self, provider_id: str, e: _Entry, op: Op) -> None:
        self.stats.deferred += 1
        e.pending.append((op, None))
        if len(e.pending) >= self._max_batch:
            e.wake.set()
        if e.flusher is None:
            e.flusher = asyncio.ensure_future(self._flush(provider_id, e))

    async def _submit(self, provider_id: str, e: _Entry, op: Op) -> bool:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        e.urgent += 1
        e.latest = fut
        e.wake.set()
        e.pending.append((op, fut))
        if e.flusher is None:
            e.flusher = asyncio.ensure_future(self._flush(provider_id, e))
        return await asyncio.shield(fut)

    async def _flush(self, provider_id: str, e: _Entry) -> None:
        batch: list[_Pending] = []
        try:
            while e.pending:
                if e.urgent == 0 and len(e.pending) < self._max_batch:
                    e.wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(e.wake.wait(), self._flush_interval)
                batch = e.pending[:self._max_batch]
                del e.pending[:self._max_batch]
                e.urgent -= sum(fut is not None for _, fut in batch)
                try:
                    result = await self._run(provider_id, e, [op for op, _ in batch])
                except Exception as exc:
                    if all(fut is None for _, fut in batch):
                        log.exception("breaker %s: deferred outcomes lost", provider_id)
                    for _, fut in batch:
                        if fut is not None and not fut.done():
                            fut.set_exception(exc)
                    batch = []
                    continue
                for (_, fut), granted in zip(batch, result.granted, strict=True):
                    if fut is not None and not fut.done():
                        fut.set_result(granted)
                batch = []
        finally:
            e.flusher = None
            leftovers = [*batch, *e.pending]
            e.pending.clear()
            e.urgent = 0
            for _, fut in leftovers:
                if fut is not None:
                    fut.cancel()

    async def _run(self, provider_id: str, e: _Entry, ops: list[Op]) -> StepResult:
        now = self._clock()
        if self._redis_ok and not self.health.down:
            try:
                result = await self.store.run(provider_id, ops, now if self._driven else None)
            except DOWN_ERRORS as exc:
                self._mark_down(exc, self._clock())
            else:
                self.health.answered()
                self.stats.round_trips += 1
                self.stats.ops += len(ops)
                self._adopt(provider_id, e, result, shared=True)
                return result
        elif not self._redis_ok and self._probe is None and now >= self._retry_at:
            self._probe = asyncio.ensure_future(self._probe_redis(provider_id, e))
        if e.local is None:
            e.local = self._seed(e.snap)
        result = run_model(e.local, self.params, ops, self._clock())
        self.stats.local_ops += len(ops)
        self._adopt(provider_id, e, result, shared=False)
        return result

    async def _probe_redis(self, provider_id: str, e: _Entry) -> None:
        """Try Redis once in the background (callers keep deciding locally meanwhile)."""
        try:
            result = await self.store.run(provider_id, [PEEK],
                                          self._clock() if self._driven else None)
        except Exception as exc:
            if not isinstance(exc, DOWN_ERRORS):
                log.exception("circuit breakers: Redis probe failed")
            self._retry_at = self._clock() + self._retry_us
        else:
            log.warning("circuit breakers: Redis reachable again; shared state resumes")
            self._redis_ok = True
            self.health.answered()
            self.stats.round_trips += 1
            self._adopt(provider_id, e, result, shared=True)
        finally:
            self._probe = None

    @staticmethod
    def _seed(snap: Snapshot | None) -> ModelState:
        if snap is None:
            return ModelState()
        return ModelState(state=snap.state, since_us=snap.since_us, until_us=snap.until_us,
                          episode=snap.episode, why=snap.why, probes=snap.probes,
                          probe_ok=snap.probe_ok, probe_slow=snap.probe_slow,
                          probe_last_us=snap.probe_last_us, weight=snap.weight,
                          weight_us=snap.now_us)

    def _adopt(self, provider_id: str, e: _Entry, result: StepResult, shared: bool) -> None:
        now = self._clock()
        if shared and e.local is not None:
            local = effective_state(snapshot(e.local, self.params),
                                    max(now, e.local.last_us or 0))
            e.local = None
            before = result.transitions[0].old if result.transitions else result.snapshot.state
            if local is not before:
                self._emit(StateChange(provider_id, local, before,
                                       _at(result.snapshot.now_us), "converged",
                                       result.snapshot.now_us, shared=False, lane=self.lane))
        e.snap = result.snapshot
        e.got_us = now
        for tr in result.transitions:
            self._emit(StateChange(provider_id, tr.old, tr.new, _at(tr.at_us), tr.why,
                                   tr.at_us, shared, self.lane))

    def _emit(self, change: StateChange) -> None:
        log.info("breaker %s%s: %s -> %s (%s)%s", change.provider_id,
                 f"@{change.lane}" if change.lane else "", change.old.value,
                 change.new.value, change.why, "" if change.shared else " [local]")
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:
                log.exception("breaker state listener failed")
        for queue in self._queues:
            if queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
                self.stats.dropped_events += 1
            queue.put_nowait(change)

    def _mark_down(self, exc: BaseException, now: int) -> None:
        if self._redis_ok:
            log.warning("circuit breakers: Redis unreachable (%s); local breakers decide "
                        "until it returns", exc)
        self._redis_ok = False
        self._retry_at = now + self._retry_us
        self.health.failed()


def _at(at_us: int) -> datetime:
    return datetime.fromtimestamp(at_us / 1_000_000, UTC)


__all__ = [
    "NORMAL", "PEEK", "Admission", "AdmissionKind", "BreakerParams", "BreakerSource",
    "BreakerStats", "BreakerStore", "CircuitBreakers", "ModelState", "ModelStore", "Op",
    "Snapshot", "State", "StateChange", "StepResult", "Transition", "Verdict", "apply",
    "classify", "effective_state", "run_model", "snapshot", "weight_at",
]

