"""The breaker's reference model, without Redis.

Properties, over random traces of outcomes, probe requests and peeks at random times
(including times that go backwards):

- permanent and throttled outcomes alone (permanent ones no slower than the threshold) never
  open a breaker; throttled ones never even count as calls;
- a breaker opens at exactly the ``failure_threshold``-th (5th) failure within ``window``
  (30 s), and in general at exactly the calls where an independent computation of the three
  rules (failure times, error rate, nearest-rank p99 over the window's buckets) says so;
- it half-opens at exactly ``opened + open_for`` (60 s): OPEN before, HALF_OPEN from then on;
- it closes only, and as soon as, ``>= min_probes`` (20) probes of the episode answered with
  ``>= close_ratio`` (98 %) fast successes; any probe failure reopens (``open_for`` restarts);
  HALF_OPEN ends within ``max_probes`` probes; non-probe and stale-episode outcomes change
  nothing;
- probe requests are admitted only in HALF_OPEN, the gap-floor kind at most once per gap;
- time never goes backwards; the route weight stays in ``[min_weight, 1]``, falls only on
  throttling and recovers linearly.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from fractions import Fraction

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from notiflow.adapters.breaker import (
    BreakerParams,
    ModelState,
    Op,
    State,
    Transition,
    Verdict,
    apply,
    classify,
    effective_state,
    run_model,
    snapshot,
    weight_at,
)
from notiflow.adapters.breaker.store import BreakerStore
from notiflow.adapters.providers.base import Outcome
from notiflow.settings import BreakerRule, Settings

T0 = 1_700_000_000_000_000
S = 1_000_000
DEFAULT = BreakerParams.from_rule(BreakerRule())
SMALL = BreakerParams.from_rule(BreakerRule(
    window=timedelta(seconds=10), buckets=5, failure_threshold=2, min_calls=4,
    min_latency_calls=5, open_for=timedelta(seconds=20), min_probes=3, close_ratio=0.75,
    max_probes=8, throttle_gap=timedelta(seconds=2), weight_recovery=timedelta(seconds=10)))

OUTCOMES: list[tuple[Outcome, str | None]] = [
    (Outcome.ACCEPTED, None),
    (Outcome.PERMANENT, "invalid_recipient"),
    (Outcome.PERMANENT, "unsubscribed"),
    (Outcome.TRANSIENT, "server_error"),
    (Outcome.TRANSIENT, "connect_error"),
    (Outcome.AMBIGUOUS, "timeout"),
    (Outcome.AMBIGUOUS, "server_error"),
    (Outcome.TRANSIENT, "rate_limited"),
]
LATENCIES = [0.02, 0.4, 2.5, 2.6, 7.0]


def rec(verdict: Verdict, slow: bool = False, probe: bool = False, episode: int = -1,
        reason: str = "") -> Op:
    return Op("r", verdict, slow, probe, episode, reason)


FAIL = rec(Verdict.FAILURE, reason="server_error")
OK = rec(Verdict.SUCCESS)


# the independent statement of the rules ----------------------------------------------------


def trips(p: BreakerParams, calls: Sequence[tuple[int, bool, float]], now: int) -> str | None:
    """Which rule the calls since the last close (time, failed, latency) trip at ``now``."""
    failures = [t for t, failed, _ in calls if failed]
    k = p.failure_threshold
    if len(failures) >= k and all(now - p.window_us < t <= now for t in failures[-k:]):
        return "failures"
    cur = now // p.bucket_us
    window = [(f, lat) for t, f, lat in calls if cur - p.buckets < t // p.bucket_us <= cur]
    n = len(window)
    if n >= p.min_calls and Fraction(sum(f for f, _ in window), n) > Fraction(p.error_bp, 10**4):
        return "error_rate"
    if n >= p.min_latency_calls:
        rank = math.ceil(Fraction(p.quantile_bp, 10**4) * n)
        quantile = sorted(lat for _, lat in window)[rank - 1]
        if round(quantile * S) > p.latency_us:
            return "latency"
    return None


@dataclass
class Event:
    dt: int
    kind: str
    outcome: tuple[Outcome, str | None] = (Outcome.ACCEPTED, None)
    latency: float = 0.02
    probe: bool = False
    episode: str = "none"


def op_for(event: Event, p: BreakerParams, s: ModelState) -> Op:
    if event.kind != "r":
        return Op(event.kind)
    outcome, reason = event.outcome
    episode = {"none": -1, "current": s.episode, "stale": s.episode - 1}[event.episode]
    return Op("r", classify(outcome, reason, p.throttle_reasons), p.is_slow(event.latency),
              event.probe, episode, reason or "")


def run_checked(p: BreakerParams, events: Sequence[Event]) -> list[Transition]:
    """Run ``events`` on the model and check every step against the rules."""
    s = ModelState()
    t, last = T0, None
    calls: list[tuple[int, bool, float]] = []
    probes = ok = slow = 0
    last_probe: int | None = None
    seen: list[Transition] = []
    for ev in events:
        t += ev.dt
        op = op_for(ev, p, s)
        now = t if last is None else max(t, last)
        prev, episode, until = s.state, s.episode, s.until_us
        out: list[Transition] = []
        granted = apply(s, p, op, t, out)
        after = snapshot(s, p)
        assert after.now_us == now and (last is None or now >= last)
        trs = list(out)
        if prev is State.OPEN and now >= until:
            assert trs[0] == Transition(State.OPEN, State.HALF_OPEN, until, "open_elapsed")
            trs, prev = trs[1:], State.HALF_OPEN
            probes = ok = slow = 0
            last_probe = None
        assert all(tr.at_us == now and tr.old is prev for tr in trs)
        if op.kind in ("n", "g"):
            expected = prev is State.HALF_OPEN and (
                op.kind == "n" or last_probe is None or now - last_probe >= p.probe_gap_us)
            assert granted == expected and not trs
            if granted:
                last_probe = now
        elif op.kind == "r" and op.verdict is Verdict.THROTTLED:
            assert not trs and after.weight < 1.0
        elif op.kind == "r" and prev is State.CLOSED:
            failed = op.verdict is Verdict.FAILURE
            calls.append((now, failed, ev.latency))
            rule = trips(p, calls, now)
            assert (rule is not None) == bool(trs), (rule, trs)
            if trs:
                assert trs == [Transition(State.CLOSED, State.OPEN, now, trs[0].why)]
                assert trs[0].why.startswith(rule)
                calls = []
        elif (op.kind == "r" and prev is State.HALF_OPEN and op.probe
              and op.episode in (-1, episode)):
            if op.verdict is Verdict.FAILURE:
                assert [(tr.new, tr.why.startswith("probe_failed")) for tr in trs] == [
                    (State.OPEN, True)]
            else:
                probes += 1
                ok, slow = ok + (not op.slow), slow + op.slow
                assert probes <= p.max_probes
                ratio = Fraction(p.close_bp, 10**4)
                if probes >= p.min_probes and Fraction(ok, probes) >= ratio:
                    assert [tr.new for tr in trs] == [State.CLOSED]
                    calls = []
                elif slow > (1 - ratio) * p.max_probes:
                    assert [tr.new for tr in trs] == [State.OPEN]
                else:
                    assert not trs
        else:
            assert not trs
        if trs and trs[-1].new is State.OPEN:
            assert s.until_us == now + p.open_us and s.episode == episode + 1
            assert after.calls == after.failures == after.slow == 0
        assert p.min_weight <= after.weight <= 1.0
        assert after.since_us <= after.now_us
        for tr in out:
            event(f"{tr.old.value} -> {tr.new.value} ({tr.why.split(':')[0]})")
        seen += out
        last = now
    assert all(a.at_us <= b.at_us for a, b in itertools.pairwise(seen))
    return seen


times = st.one_of(st.just(0), st.integers(-2 * S, 3 * S), st.integers(15 * S, 25 * S))
records = st.builds(Event, times, st.just("r"), st.sampled_from(OUTCOMES * 3 + [OUTCOMES[0]] * 30),
                    st.sampled_from(LATENCIES + [0.02] * 10), st.booleans(),
                    st.sampled_from(["none", "current", "current", "stale"]))
asks = st.builds(Event, times, st.sampled_from(["k", "n", "g"]))
events = st.lists(st.one_of(records, records, asks), min_size=30, max_size=300)


@settings(max_examples=200, deadline=None)
@given(events)
def test_random_traces_follow_the_rules_small(trace: list[Event]) -> None:
    run_checked(SMALL, trace)


def weighted(common: list[object], rare: list[object], odds: int) -> st.SearchStrategy[object]:
    return st.sampled_from(common * odds + rare)


@st.composite
def phased(draw: st.DrawFn) -> list[Event]:
    """Phases that reach every state under the default rule: calm traffic (rare failures and
    slow calls), an outage, the open period, probes (mostly fast successes), and again."""
    out: list[Event] = []
    calm = weighted([*OUTCOMES[:3], OUTCOMES[-1]], OUTCOMES[3:7], draw(st.sampled_from([12, 60])))
    for _ in range(draw(st.integers(1, 3))):
        for _ in range(draw(st.integers(0, 150))):
            out.append(Event(draw(st.integers(0, S // 5)), "r", draw(calm),
                             draw(weighted([0.02, 0.4, 2.5], [2.6], 20))))
        for _ in range(draw(st.integers(0, 7))):
            out.append(Event(draw(st.integers(0, 9 * S)), "r",
                             draw(st.sampled_from(OUTCOMES[3:7]))))
        out.append(Event(draw(st.integers(50 * S, 70 * S)), "k"))
        probe_outcomes = weighted([OUTCOMES[0]], OUTCOMES[1:], draw(st.sampled_from([30, 500])))
        probe_latencies = weighted([0.02], [2.6], draw(st.sampled_from([8, 40, 500])))
        for _ in range(draw(st.integers(0, 60))):
            out.append(Event(draw(st.integers(0, S // 2)), draw(st.sampled_from("ngk"))))
            out.append(Event(draw(st.integers(0, S // 4)), "r", draw(probe_outcomes),
                             draw(probe_latencies), True,
                             draw(weighted(["current"], ["none", "stale"], 20))))
    return out


@settings(max_examples=150, deadline=None)
@given(phased())
def test_random_traces_follow_the_rules_default(trace: list[Event]) -> None:
    run_checked(DEFAULT, trace)


# the named properties ----------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(times, st.sampled_from([OUTCOMES[0], OUTCOMES[1], OUTCOMES[2],
                                                   OUTCOMES[-1]]),
                          st.sampled_from(LATENCIES)), max_size=300),
       st.sampled_from([DEFAULT, SMALL]))
def test_never_opens_on_permanent_or_throttled_outcomes_alone(
        trace: list[tuple[int, tuple[Outcome, str | None], float]], p: BreakerParams) -> None:
    s = ModelState()
    t = T0
    for dt, (outcome, reason), latency in trace:
        t += dt
        verdict = classify(outcome, reason)
        if verdict is Verdict.SUCCESS:
            latency = min(latency, 2.5)
        else:
            assert verdict is Verdict.THROTTLED
        result = run_model(s, p, [Op("r", verdict, p.is_slow(latency), False, -1,
                                     reason or "")], t)
        assert result.snapshot.state is State.CLOSED and not result.transitions
    throttled = ModelState()
    for dt, _, latency in trace:
        t += dt
        run_model(throttled, p, [rec(Verdict.THROTTLED, p.is_slow(latency))], t)
        assert throttled.calls == 0 and throttled.state is State.CLOSED


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 12 * S), min_size=5, max_size=60))
def test_opens_at_exactly_the_fifth_failure_within_30_s(gaps: list[int]) -> None:
    s = ModelState()
    t, times_ = T0, []
    for i, gap in enumerate(gaps):
        t += gap
        times_.append(t)
        result = run_model(s, DEFAULT, [FAIL], t)
        fifth = i >= 4 and times_[i - 4] > t - 30 * S
        if fifth:
            assert result.transitions == (Transition(State.CLOSED, State.OPEN, t, "failures:5"),)
            assert result.snapshot.until_us == t + 60 * S
            return
        assert result.snapshot.state is State.CLOSED, (i, times_)
    assert not any(times_[i - 4] > times_[i] - 30 * S for i in range(4, len(times_)))


def test_five_failures_in_just_under_30_s_open_and_in_exactly_30_s_do_not() -> None:
    s = ModelState()
    for i in range(4):
        run_model(s, DEFAULT, [FAIL], T0 + i * S)
    assert run_model(s, DEFAULT, [FAIL], T0 + 30 * S).snapshot.state is State.CLOSED
    assert run_model(s, DEFAULT, [FAIL], T0 + 30 * S + 999_999).snapshot.state is State.OPEN


def _opened_at(p: BreakerParams, t: int) -> ModelState:
    s = ModelState()
    run_model(s, p, [FAIL] * p.failure_threshold, t)
    assert s.state is State.OPEN and s.since_us == t
    return s


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 59 * S), st.sampled_from([Op("k"), Op("n"), Op("g"),
                                                                   FAIL, OK])), max_size=20),
       st.integers(0, 5 * S))
def test_half_opens_exactly_after_60_s(before: list[tuple[int, Op]], late: int) -> None:
    opened = T0 + 7
    s = _opened_at(DEFAULT, opened)
    for offset, op in sorted(before, key=lambda x: x[0]):
        result = run_model(s, DEFAULT, [op], opened + offset)
        assert result.snapshot.state is State.OPEN and result.granted == (False,)
        assert effective_state(result.snapshot, opened + 60 * S - 1) is State.OPEN
        assert effective_state(result.snapshot, opened + 60 * S) is State.HALF_OPEN
    result = run_model(s, DEFAULT, [Op("k")], opened + 60 * S + late)
    assert result.transitions == (
        Transition(State.OPEN, State.HALF_OPEN, opened + 60 * S, "open_elapsed"),)
    assert result.snapshot.since_us == opened + 60 * S


def _half_open(p: BreakerParams) -> tuple[ModelState, int]:
    s = _opened_at(p, T0)
    t = T0 + p.open_us
    run_model(s, p, [Op("k")], t)
    assert s.state is State.HALF_OPEN
    return s, t


def test_closes_at_the_20th_fast_probe_not_before() -> None:
    s, t = _half_open(DEFAULT)
    for i in range(19):
        assert not run_model(s, DEFAULT, [rec(Verdict.SUCCESS, probe=True, episode=1)],
                             t + i).transitions
    result = run_model(s, DEFAULT, [rec(Verdict.SUCCESS, probe=True, episode=1)], t + 19)
    assert [tr.why for tr in result.transitions] == ["probes_ok:20/20"]


def test_one_slow_probe_needs_50_probes_and_three_reopen() -> None:
    s, t = _half_open(DEFAULT)
    run_model(s, DEFAULT, [rec(Verdict.SUCCESS, True, True, 1)], t)
    for i in range(48):
        assert run_model(s, DEFAULT, [rec(Verdict.SUCCESS, False, True, 1)],
                         t + i).snapshot.state is State.HALF_OPEN
    result = run_model(s, DEFAULT, [rec(Verdict.SUCCESS, False, True, 1)], t + 50)
    assert [tr.why for tr in result.transitions] == ["probes_ok:49/50"]

    s, t = _half_open(DEFAULT)
    for _ in range(2):
        run_model(s, DEFAULT, [rec(Verdict.SUCCESS, True, True, 1)], t)
    result = run_model(s, DEFAULT, [rec(Verdict.SUCCESS, True, True, 1)], t)
    assert [tr.why for tr in result.transitions] == ["probes_slow:3/3"]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 19), st.sampled_from(["server_error", "timeout", ""]), st.integers(0, S))
def test_any_probe_failure_reopens(position: int, reason: str, dt: int) -> None:
    s, t = _half_open(DEFAULT)
    for i in range(position):
        run_model(s, DEFAULT, [rec(Verdict.SUCCESS, probe=True, episode=1)], t + i)
    result = run_model(s, DEFAULT, [rec(Verdict.FAILURE, probe=True, episode=1, reason=reason)],
                       t + position + dt)
    now = t + position + dt
    why = f"probe_failed:{reason}" if reason else "probe_failed"
    assert result.transitions == (Transition(State.HALF_OPEN, State.OPEN, now, why),)
    assert result.snapshot.until_us == now + 60 * S and result.snapshot.episode == 2


def test_outcomes_that_are_not_probes_of_this_episode_change_nothing() -> None:
    s, t = _half_open(DEFAULT)
    for op in (rec(Verdict.FAILURE), rec(Verdict.FAILURE, probe=True, episode=0),
               rec(Verdict.SUCCESS, probe=True, episode=7)):
        result = run_model(s, DEFAULT, [op], t)
        assert not result.transitions and result.snapshot.probes == 0
    s = _opened_at(DEFAULT, T0)
    assert not run_model(s, DEFAULT, [FAIL, OK], T0 + S).transitions


def test_probe_admission() -> None:
    s = ModelState()
    assert run_model(s, DEFAULT, [Op("n"), Op("g")], T0).granted == (False, False)
    s, t = _half_open(DEFAULT)
    assert run_model(s, DEFAULT, [Op("g"), Op("g"), Op("n"), Op("n")], t).granted == (
        True, False, True, True)
    assert run_model(s, DEFAULT, [Op("g")], t + S - 1).granted == (False,)
    assert run_model(s, DEFAULT, [Op("g")], t + S).granted == (True,)
    assert run_model(s, DEFAULT, [Op("n"), Op("g")], t + 2 * S - 1).granted == (True, False)
    assert run_model(s, DEFAULT, [Op("g")], t + 3 * S - 1).granted == (True,)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-S, 3 * S), st.booleans()), max_size=80))
def test_weight_falls_only_on_throttling_and_recovers_linearly(
        trace: list[tuple[int, bool]]) -> None:
    p = SMALL
    s = ModelState()
    t = T0
    last: int | None = None
    for dt, throttled in trace:
        t += dt
        cut_before = s.cut_us
        now = t if last is None else max(t, last)
        prior = 1.0 if last is None else weight_at(snapshot(s, p).weight, last, now,
                                                   p.recovery_us)
        result = run_model(s, p, [rec(Verdict.THROTTLED if throttled else Verdict.FAILURE)], t)
        w = result.snapshot.weight
        assert p.min_weight <= w <= 1.0
        if throttled and (cut_before < 0 or now - cut_before >= p.throttle_gap_us):
            assert w == pytest.approx(max(p.min_weight, prior * p.throttle_factor), abs=1e-12)
        else:
            assert w == pytest.approx(prior, abs=1e-12)
        last = now
    run_model(s, p, [Op("k")], (last or T0) + p.recovery_us)
    assert snapshot(s, p).weight == 1.0


def test_latency_rule_is_the_nearest_rank_p99() -> None:
    s = ModelState()
    for i in range(98):
        run_model(s, DEFAULT, [OK], T0 + i)
    run_model(s, DEFAULT, [rec(Verdict.SUCCESS, slow=True)], T0 + 98)
    assert run_model(s, DEFAULT, [OK], T0 + 99).snapshot.state is State.CLOSED
    result = run_model(s, DEFAULT, [rec(Verdict.SUCCESS, slow=True)], T0 + 100)
    assert [tr.why for tr in result.transitions] == ["latency:2/101"]


def test_error_rate_rule_needs_min_calls() -> None:
    s = ModelState()
    steps = [OK] * 15 + [FAIL] * 3 + [OK]
    for i, op in enumerate(steps):
        run_model(s, DEFAULT, [op], T0 + i * S)
    assert s.state is State.CLOSED
    result = run_model(s, DEFAULT, [FAIL], T0 + 20 * S)
    assert [tr.why for tr in result.transitions] == ["error_rate:4/20"]


def test_buckets_expire_after_the_window() -> None:
    s = ModelState()
    run_model(s, DEFAULT, [OK, FAIL], T0)
    assert snapshot(s, DEFAULT).calls == 2
    assert run_model(s, DEFAULT, [Op("k")], T0 + 29 * S).snapshot.calls == 2
    assert run_model(s, DEFAULT, [Op("k")], T0 + 31 * S).snapshot.calls == 0


# rule, params, classification ----------------------------------------------------------------


@pytest.mark.parametrize(("outcome", "reason", "verdict"), [
    (Outcome.ACCEPTED, None, Verdict.SUCCESS),
    (Outcome.PERMANENT, "invalid_recipient", Verdict.SUCCESS),
    (Outcome.PERMANENT, "unsubscribed", Verdict.SUCCESS),
    (Outcome.TRANSIENT, "server_error", Verdict.FAILURE),
    (Outcome.TRANSIENT, "connect_timeout", Verdict.FAILURE),
    (Outcome.TRANSIENT, "auth_failed", Verdict.FAILURE),
    (Outcome.AMBIGUOUS, "timeout", Verdict.FAILURE),
    (Outcome.AMBIGUOUS, "gateway_timeout", Verdict.FAILURE),
    (Outcome.TRANSIENT, None, Verdict.FAILURE),
    (Outcome.TRANSIENT, "rate_limited", Verdict.THROTTLED),
])
def test_classify(outcome: Outcome, reason: str | None, verdict: Verdict) -> None:
    assert classify(outcome, reason) is verdict


def test_params_from_settings_scale_policy_durations_only() -> None:
    p = BreakerParams.from_settings(Settings(time_scale=0.1))
    assert (p.window_us, p.bucket_us, p.open_us, p.probe_gap_us) == (3 * S, S // 10, 6 * S,
                                                                     S // 10)
    assert p.latency_us == 2_500_000 and p.probe_every == 20
    assert (p.error_bp, p.quantile_bp, p.close_bp) == (1500, 9900, 9800)
    assert (p.failure_threshold, p.min_calls, p.min_probes, p.max_probes) == (5, 20, 20, 100)
    assert not p.is_slow(2.5) and p.is_slow(2.500001)


def _state_after(p: BreakerParams, ops: Sequence[Op]) -> State:
    s = ModelState()
    for i, op in enumerate(ops):
        run_model(s, p, [op], T0 + i * 10_000)
    return s.state


def test_the_bulk_lane_counts_failures_and_latency_at_its_own_thresholds() -> None:
    """A CPU-starved bulk flow times out a few calls at once: five failures among many
    successes open the priority lane's breaker, the bulk lane's only at
    ``bulk_failure_threshold`` (20); a real outage still opens both on the error rate."""
    priority = BreakerStore.open(Settings()).params
    bulk = BreakerStore.open(Settings(), lane="bulk").params
    assert (priority.failure_threshold, priority.latency_us) == (5, 2_500_000)
    assert (bulk.failure_threshold, bulk.latency_us) == (20, 30_000_000)
    sparse = ([OK] * 40 + [FAIL]) * 5
    assert _state_after(priority, sparse) is State.OPEN
    assert _state_after(bulk, sparse) is State.CLOSED
    assert _state_after(bulk, ([OK] * 40 + [FAIL]) * 20) is State.OPEN
    assert _state_after(bulk, [FAIL] * 20) is State.OPEN


def test_rule_validation_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError):
        BreakerRule(min_probes=30, max_probes=20)
    with pytest.raises(ValueError):
        BreakerRule(open_for=timedelta(0))
    monkeypatch.setenv("NOTIFLOW_BREAKER__FAILURE_THRESHOLD", "3")
    assert Settings().breaker.failure_threshold == 3
