"""The open-loop generator of ``notiflow bench api``: its schedule, latency free of coordinated
omission (a real HTTP server that stalls), a step's figures, the stop rule, CPU accounting."""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from collections.abc import Iterator

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from notiflow.bench.api_requests import Target, batch_answer, session
from notiflow.bench.openloop import (
    Answer,
    Sent,
    ascent,
    cpu_ms_per_message,
    figures,
    open_loop,
    parse_server_timing,
    schedule,
    slowest_stages,
    stop_reason,
)
from tests.helpers import hold, hold_async


def test_schedule_is_evenly_spaced_and_ends_before_the_step() -> None:
    assert schedule(4, 1) == [0.0, 0.25, 0.5, 0.75]
    assert schedule(2, 0.4) == [0.0]
    assert schedule(0, 10) == [] and schedule(10, 0) == []


@given(st.floats(0.5, 2000), st.floats(0.01, 5))
def test_schedule_holds_rate_times_seconds_requests(rate: float, seconds: float) -> None:
    due = schedule(rate, seconds)
    assert len(due) == math.ceil(rate * seconds - 1e-9)
    assert all(0 <= d < seconds for d in due)
    assert all(b - a == pytest.approx(1 / rate) for a, b in itertools.pairwise(due))


async def test_requests_leave_at_their_due_time_while_earlier_ones_are_outstanding() -> None:
    async def slow(_i: int) -> Answer:
        await hold_async(0.4)
        return Answer.single("202")

    run = await open_loop(slow, schedule(50, 0.3), cap=1000)
    assert len(run.sent) == 15 and run.capped == 0
    assert all(s.sent - s.due < 0.05 for s in run.sent), "no request waited for another"
    assert all(0.39 < s.done - s.due < 0.5 for s in run.sent)


async def test_a_full_cap_delays_requests_and_the_delay_is_counted() -> None:
    async def slow(_i: int) -> Answer:
        await hold_async(0.2)
        return Answer.single("202")

    run = await open_loop(slow, schedule(40, 0.25), cap=2)
    assert run.capped == 8
    last = run.sent[-1]
    assert last.sent - last.due > 0.55, "it waited four rounds of two for a slot (0.8 s)"
    assert last.latency_ms > 765, "that wait counts: answered at 1.0 s, due at 0.225 s"


async def test_a_send_that_raises_counts_every_message_it_carried() -> None:
    async def broken(_i: int) -> Answer:
        raise RuntimeError("boom")

    run = await open_loop(broken, [0.0], cap=1, per_request=10)
    assert run.sent[0].answer == Answer("error RuntimeError", 0, {"error RuntimeError": 10})


async def test_hooks_run_right_before_their_request() -> None:
    seen: list[int] = []

    async def record(i: int) -> Answer:
        seen.append(i)
        return Answer.single("202")

    await open_loop(record, schedule(100, 0.05), cap=10, hooks={3: lambda: seen.append(-1)})
    assert seen == [0, 1, 2, -1, 3, 4]


class StallingServer:
    """An HTTP server on its own thread answering ``202`` at once, except that the first
    request ``stall_after`` seconds after :meth:`arm` holds its event loop for ``stall_s``
    (``time.sleep``: a GC pause of the whole process)."""

    def __init__(self, stall_after: float, stall_s: float) -> None:
        self.stall_after, self.stall_s = stall_after, stall_s
        self.armed_at = math.inf
        self.stall: tuple[float, float] | None = None
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def arm(self) -> None:
        self.armed_at = time.perf_counter()

    async def _handle(self, _request: web.Request) -> web.Response:
        now = time.perf_counter()
        if self.stall is None and now >= self.armed_at + self.stall_after:
            self.stall = (now, now + self.stall_s)
            hold(self.stall_s)
        return web.Response(status=202, text="{}")

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/messages", self._handle)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> StallingServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *_exc: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def stalling() -> Iterator[StallingServer]:
    with StallingServer(stall_after=0.5, stall_s=1.0) as server:
        yield server


async def test_a_server_stall_shows_in_every_request_due_during_it(
        stalling: StallingServer) -> None:
    """At 50/s a 1-s stall holds ~50 requests; each reports the rest of the stall from its
    due time (a closed-loop client with one connection would report one slow request)."""
    async with session(1000, 10) as client:
        target = Target(client, f"http://127.0.0.1:{stalling.port}/v1/messages", "t",
                        [{"n": 1}], "k")
        stalling.arm()
        run = await open_loop(target.send, schedule(50, 2.5), cap=1000)
    assert stalling.stall is not None
    start, end = stalling.stall
    during = [s for s in run.sent if start <= run.t0 + s.due <= end - 0.05]
    assert len(during) >= 40
    for s in during:
        assert s.done - s.due >= end - (run.t0 + s.due) - 0.02, s
    assert max(s.latency_ms for s in during) > 900
    step = figures(run.sent, since=0.0, until=2.5, per_request=1)
    assert step["accepted"] == 125 and step["statuses"] == {"202": 125}
    assert step["p99_ms"] is not None and step["p99_ms"] > 900
    assert step["p50_ms"] is not None and step["p50_ms"] < 100


def _sent(due: float, done: float, answer: Answer) -> Sent:
    return Sent(due, due, done, answer)


def test_figures_measure_after_the_warmup_and_until_the_last_answer() -> None:
    ok, shed = Answer.single("202"), Answer.single("429")
    run = [_sent(0.0, 0.01, ok), _sent(0.5, 0.51, ok),
           *(_sent(1.0 + i / 10, 1.0 + i / 10 + 0.02, ok) for i in range(8)),
           _sent(1.8, 1.81, shed), _sent(1.9, 3.0, Answer("200", 7, {"503": 3}))]
    f = figures(run, since=1.0, until=2.0, per_request=1)
    assert f["requests"] == 10 and f["offered_per_s"] == 10.0
    assert f["accepted"] == 15
    assert f["window_s"] == 2.0 and f["accepted_per_s"] == 7.5
    assert f["statuses"] == {"200": 1, "202": 8, "429": 1}
    assert f["refused"] == {"429": 1, "503": 3}
    assert f["p50_ms"] == 20.0 and f["max_ms"] == 1100.0


def test_figures_of_an_empty_window() -> None:
    f = figures([], since=0.0, until=1.0, per_request=1)
    assert f["requests"] == 0 and f["accepted_per_s"] == 0.0 and f["p99_ms"] is None


def test_stop_rule() -> None:
    def step(offered: float, accepted: float, p99: float | None) -> dict[str, float | None]:
        return {"offered_per_s": offered, "accepted_per_s": accepted, "p99_ms": p99}

    kw = {"min_share": 0.95, "p99_bound_ms": 500.0}
    assert stop_reason(step(100, 96, 200), **kw) is None
    assert stop_reason(step(100, 94, 200), **kw) == "accepted 94/s < 95% of offered 100/s"
    assert stop_reason(step(100, 100, 501), **kw) == "p99 501 ms > 500 ms"
    assert stop_reason(step(0, 0, None), **kw) is None
    assert ascent(20, 1.5, 4) == [20.0, 30.0, 45.0, 67.5]


def test_cpu_per_accepted_message_per_process() -> None:
    before = {"api": 10.0, "cassandra": 100.0, "gone": 1.0}
    after = {"api": 10.5, "cassandra": 100.25, "new": 3.0}
    assert cpu_ms_per_message(before, after, 100) == {"api": 5.0, "cassandra": 2.5}
    assert cpu_ms_per_message(before, after, 0) == {"api": None, "cassandra": None}


def test_answers_of_single_and_batch_requests() -> None:
    assert Answer.single("202") == Answer("202", 1, {})
    assert Answer.single("503") == Answer("503", 0, {"503": 1})
    doc = {"results": [{"code": 202}, {"code": 202}, {"code": 429}]}
    assert batch_answer(doc, 3) == Answer("200", 2, {"429": 1})
    assert batch_answer({"results": [{"code": 202}]}, 3) == Answer("200", 1, {"missing": 2})


def test_server_timing_parsed() -> None:
    assert parse_server_timing("api.reserve;dur=4.1, api.write;dur=2.0") == {
        "api.reserve": 4.1, "api.write": 2.0}
    assert parse_server_timing("cache;desc=hit, db;dur=x, total;dur=7") == {"total": 7.0}
    assert parse_server_timing(None) == {}


def test_slowest_one_percent_by_stage() -> None:
    fast = [Sent(i / 1000, i / 1000, i / 1000 + 0.005,
                 Answer.single("202", "api.accept;dur=3, api.kafka_ack;dur=1"))
            for i in range(100)]
    slow = [Sent(1.0, 1.0, 1.18, Answer.single("202", "api.accept;dur=150, api.kafka_ack;dur=10")),
            Sent(1.1, 1.1, 1.31, Answer.single("202", "api.accept;dur=170, api.kafka_ack;dur=20"))]
    out = slowest_stages([*fast, *slow])
    assert out["api.accept"] == 150.0 and out["api.kafka_ack"] == 10.0
    assert out["outside"] == pytest.approx(20.0, abs=0.2)
    assert slowest_stages([Sent(0, 0, 1, Answer.single("503"))]) == {}
