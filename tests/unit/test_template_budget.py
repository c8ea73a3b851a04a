"""Rendering with a budget: hostile templates are refused quickly, analysis evaluates
nothing, every rendering failure is a per-message outcome, a preparing stage's crash is
counted against the batch's records."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from typing import Any

import pytest
from cryptography.fernet import Fernet
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2 import meta
from jinja2.sandbox import SandboxedEnvironment

from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.rows import TemplateRow
from notiflow.flows.common.items import SourceRef, Work
from notiflow.flows.send.dispatch import ChannelPressure, Dispatcher
from notiflow.flows.send.stages import SendStages
from notiflow.flows.send.stages.admit import counts_as_crash
from notiflow.flows.send.stages.context import InfraUnavailable, SendContext
from notiflow.flows.send.stages.render import (
    RENDER_ERROR,
    Job,
    RenderFailure,
    render_all,
    rendered,
)
from notiflow.flows.send.stages.send_batch import Batch
from notiflow.gateway.errors import ApiError
from notiflow.gateway.templates import _checked
from notiflow.schemas.enums import Tier
from notiflow.schemas.messages import IngestRecord, TemplateCreate
from notiflow.settings import RenderLimits, Settings
from notiflow.templating import (
    OverBudget,
    RenderError,
    TemplateError,
    TemplateRefused,
    analyse,
    check,
    render,
)
from notiflow.templating.sandbox import BudgetedEnvironment
from tests.helpers import partial_ports

T0 = datetime(2026, 12, 7, tzinfo=UTC)


def stored(body: str) -> TemplateRow:
    """An SMS template version with ``body`` and no subject (its checksum computed)."""
    return TemplateRow(tenant_id="acme", template_id="t", version=1, channel="SMS",
                       subject=None, body=body, variables=(), checksum="", created_at=T0)

QUICK_S = 2.0
HARD_S = 30.0
LONG = "x" * 5000

HOSTILE: list[tuple[str, dict[str, Any]]] = [
    ("{% macro m(n) %}{{ m(n) }}{% endmacro %}{{ m(1) }}", {}),
    ("{% for x in y recursive %}{{ loop([x]) }}{% endfor %}", {"y": [1]}),
    ("{{ x * 2000000000 }}", {"x": "ab"}),
    ("{{ 'a' * 2000000000 }}", {}),
    ("{{ ('a' * 2000000000)|length }}", {}),
    ("{% for i in range(10000) %}{% for j in range(10000) %}{{ i }}{% endfor %}{% endfor %}",
     {}),
    ("{% for a in s %}{% for b in s %}{% for c in s %}{% endfor %}{% endfor %}{% endfor %}",
     {"s": LONG}),
    ("{% for i in range(10**5) %}{% for j in range(10**5) %}{% endfor %}{% endfor %}", {}),
    ("{{ 10**5000 }}", {}),
    ("{{ 7**400000000 }}", {}),
    ("{{ (7**400000000) > 1 }}", {}),
    ("{{ 'a'|center(2000000000) }}", {}),
    ("{{ '%2000000000d'|format(1) }}", {}),
    ("{{ '%.2000000000f' % 1.0 }}", {}),
    ("{{ '{:>2000000000}'.format(1) }}", {}),
    ("{{ '{:{}}'.format(1, 2000000000) }}", {}),
    ("{{ s.replace('', s) }}", {"s": "y" * 100_000}),
    ("{{ 'x'.ljust(2000000000) }}", {}),
    ("{{ 'a\tb'.expandtabs(2000000000) }}", {}),
    ("{{ s|wordwrap(1, wrapstring=s) }}", {"s": "ab " * 20_000}),
    ("{{ range(10)|batch(2000000000, 'x')|list }}", {}),
    ("{{ [1]|slice(2000000000)|list }}", {}),
    ("{{ ('f' * 100000)|int(base=16) }}", {}),
    ("{{ [s] * 100000 }}", {"s": "z" * 100_000}),
    ("{% set ns = namespace(s='a') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}", {}),
    ("{% set ns = namespace(s='a') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
     "{% endfor %}", {}),
    ("{% set l = [1] %}{% for i in range(64) %}{{ l.extend(l) }}{% endfor %}", {}),
    ("{% for i in range(10000) %}{% for j in range(10) %}" + "A" * 60_000
     + "{% endfor %}{% endfor %}", {}),
    ("{% macro m() %}{% for i in range(10000) %}" + "A" * 60_000
     + "{% endfor %}{% endmacro %}{{ m()|length }}", {}),
    ("{{ ' '.join(range(10000)|map('string')|list) * 1000 }}", {}),
]


def _attempt(source: str, variables: dict[str, Any], conn: Connection) -> None:
    started = time.monotonic()
    try:
        check(None, source)
        render(stored(source), variables)
        outcome = "rendered"
    except TemplateError as exc:
        outcome = f"refused: {type(exc).__name__}"
    except BaseException as exc:
        outcome = f"escaped: {type(exc).__name__}"
    conn.send((outcome, time.monotonic() - started))


def refusal(source: str, variables: dict[str, Any]) -> tuple[str, float]:
    """The outcome in a forked process, killed after ``HARD_S`` (a regression must fail the
    test, not hang the suite)."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_attempt, args=(source, variables, child))
    proc.start()
    try:
        if not parent.poll(HARD_S):
            return "hung", HARD_S
        outcome: tuple[str, float] = parent.recv()
        return outcome
    finally:
        proc.kill()
        proc.join()


@pytest.mark.parametrize(("source", "variables"), HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_template_is_refused_quickly(source: str, variables: dict[str, Any]) -> None:
    outcome, elapsed = refusal(source, variables)
    assert outcome.startswith("refused"), outcome
    assert elapsed < QUICK_S


def test_compiling_folds_no_constant() -> None:
    env = BudgetedEnvironment()
    for source in ("{{ 7**400000000 }}", "{{ ('a' * 2000000000)|length }}",
                   "{{ 'a'|center(2000000000) }}", "{{ (7**400000000) > 1 }}"):
        started = time.monotonic()
        env.compile_guarded(env.parse(source))
        assert time.monotonic() - started < QUICK_S


def test_analyse_evaluates_nothing() -> None:
    started = time.monotonic()
    assert analyse(None, "{{ (7**400000000) > 1 }}{{ ('a'*2000000000)|length }}").variables == ()
    assert time.monotonic() - started < QUICK_S


def test_check_refuses_a_literal_over_budget_and_names_the_field() -> None:
    with pytest.raises(TemplateRefused) as exc:
        check("{{ 10**5000 }}", "fine {{ x }}")
    assert exc.value.field == "subject"
    assert check(None, "Hi {{ name }} {{ 2**10 }}").variables == ("name",)


def test_cpu_budget_uses_the_given_clock() -> None:
    ticks = iter(range(1000))
    limits = RenderLimits(cpu_time=timedelta(seconds=5))
    with pytest.raises(OverBudget):
        render(stored("{% for i in range(100) %}{{ i }}{% endfor %}"), {}, limits,
               clock=lambda: float(next(ticks)))


def test_one_cpu_overrun_is_a_pause_not_a_verdict() -> None:
    """A process pause (a garbage collection) can push one render past its CPU time: it is
    rendered again; a template over its time twice in a row is refused."""
    readings = iter([0.0, 10.0, 0.0] + [0.0] * 100)
    limits = RenderLimits(cpu_time=timedelta(seconds=5))
    row = stored("{% for i in range(3) %}{{ i }}{% endfor %}")
    assert render(row, {}, limits, clock=lambda: next(readings))[1] == "012"
    ticks = iter(range(10_000))
    with pytest.raises(OverBudget):
        render(row, {}, limits, clock=lambda: float(next(ticks) * 10))


def test_limits_are_configurable() -> None:
    row = stored("{% for i in range(50) %}.{% endfor %}")
    assert render(row, {})[1] == "." * 50
    with pytest.raises(OverBudget):
        render(row, {}, RenderLimits(max_iterations=10))
    with pytest.raises(RenderError):
        render(stored("{{ range(50)|list }}"), {}, RenderLimits(max_range=10))
    with pytest.raises(RenderError):
        render(stored("{{ s }}"), {"s": "a" * 2000}, RenderLimits(max_output=1024))


@pytest.mark.parametrize(("source", "variables", "expected"), [
    ("Hi {{ name|title }}, {{ '%05d'|format(n) }} {{ '{:>4}'.format(n) }}",
     {"name": "ann", "n": 42}, "Hi Ann, 00042   42"),
    ("{% for i in items %}{{ loop.index }}={{ i ~ '!' }}{% if not loop.last %},{% endif %}"
     "{% endfor %}", {"items": ["a", "b"]}, "1=a!,2=b!"),
    ("{% macro b(x) %}[{{ x }}{{ caller() }}]{% endmacro %}{% call b(1) %}c{% endcall %}", {},
     "[1c]"),
    ("{{ items|join(', ') }} {{ (n * 3) ** 2 }} {{ 'ab' * 2 }} {{ [1] + [2] }}",
     {"items": ["x", "y"], "n": 2}, "x, y 36 abab [1, 2]"),
    ("{% for k, v in d|dictsort %}{{ k }}{{ v }}{% endfor %}{{ d.a }}", {"d": {"a": 1, "b": 2}},
     "a1b21"),
    ("{% set ns = namespace(t=0) %}{% for i in range(4) %}{% set ns.t = ns.t + i %}{% endfor %}"
     "{{ ns.t }}", {}, "6"),
])
def test_ordinary_templates_render_as_before(source: str, variables: dict[str, Any],
                                             expected: str) -> None:
    assert render(stored(source), variables) == (None, expected)


_NAMES = st.sampled_from(["a", "b", "c", "items", "loop", "caller", "x"])


@st.composite
def small_templates(draw: st.DrawFn, depth: int = 0) -> str:
    name = draw(_NAMES)
    other = draw(_NAMES)
    leaves = [f"{{{{ {name} }}}}", f"{{% set {name} = {other} %}}", "text",
              f"{{{{ {name}.attr|default({other}) }}}}", f"{{% set ns.{name} = 1 %}}"]
    if depth >= 2:
        return draw(st.sampled_from(leaves))
    inner = draw(st.lists(small_templates(depth + 1), min_size=0, max_size=3))
    body = "".join(inner)
    shapes = [
        *leaves,
        f"{{% for {name} in {other} %}}{body}{{% endfor %}}",
        f"{{% for {name} in {other} %}}{body}{{% else %}}{body}{{% endfor %}}",
        f"{{% if {name} %}}{body}{{% elif {other} %}}{body}{{% else %}}{body}{{% endif %}}",
        f"{{% if {name} %}}{body}{{% endif %}}",
        f"{{% macro m({name}, z={other}) %}}{body}{{% endmacro %}}{{{{ m(1) }}}}",
        f"{{% call({name}) m2({other}) %}}{body}{{% endcall %}}",
        f"{{% with {name} = {other} %}}{body}{{% endwith %}}",
        f"{{% filter upper %}}{body}{{% endfilter %}}",
        f"{{% set {name} %}}{body}{{% endset %}}",
        f"{{% block blk{depth} %}}{body}{{% endblock %}}",
        body,
    ]
    return draw(st.sampled_from(shapes)) + (draw(small_templates(depth + 1))
                                           if draw(st.booleans()) else "")


@settings(max_examples=300, deadline=None)
@given(small_templates())
def test_the_walk_finds_what_jinja_finds(source: str) -> None:
    env = SandboxedEnvironment()
    try:
        expected = meta.find_undeclared_variables(env.parse(source)) - set(env.globals)
    except Exception:
        return
    assert set(analyse(None, source).variables) == expected


# ---------------------------------------------------------------- the send flow


def work(template_id: str = "t", n: int = 1, **variables: Any) -> Work:
    doc = {"channel": "SMS", "tier": "P1", "recipient": "+14155552671",
           "template_id": template_id, "template_version": 1, "tenant_id": "acme",
           "category": "transactional", "message_id": f"msg_{n}",
           "accepted_at": "2026-12-06T05:00:00Z", "variables": variables}
    return Work(IngestRecord.model_validate(doc), SourceRef("t", 0, n), b"", None)


def test_a_template_failure_is_an_outcome_never_an_exception() -> None:
    for body, variables in [HOSTILE[0], HOSTILE[2], HOSTILE[8], HOSTILE[11]]:
        out = rendered(work(**variables), stored(body))
        assert isinstance(out, RenderFailure)
    out = rendered(work(v=None), stored("{{ v.x }}"))
    assert isinstance(out, RenderFailure) and not out.spent


def test_a_template_that_spent_its_budget_fails_the_rest_of_its_batch_without_rendering(
        ) -> None:
    costly = stored("{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}"
                 "{% endfor %}")
    jobs: list[Job] = [(work("t", i), ("acme", "t", 1), costly, None) for i in range(20)]
    jobs.append((work("ok", 99, code=7), ("acme", "ok", 1), stored("code {{ code }}"), None))
    started = time.monotonic()
    out = render_all(jobs, RenderLimits())
    assert time.monotonic() - started < QUICK_S
    assert all(isinstance(o, RenderFailure) and o.spent for o in out[:20])
    assert all(o is out[0] for o in out[1:20])
    assert not isinstance(out[20], (str, RenderFailure)) and out[20].body == "code 7"


class Finished:
    """``finish`` stand-in: the FAILED events the stage decides."""

    def __init__(self) -> None:
        self.reasons: list[str | None] = []


def test_the_render_stage_ends_a_failing_template_failed_render_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from notiflow.flows.send.stages import render as stage

    seen = Finished()

    async def finish(ctx: Any, w: Work, event: Any, content_key: Any) -> list[Any]:
        seen.reasons.append(event.reason)
        return [event]

    monkeypatch.setattr(stage, "finish", finish)
    s = Settings(dlq_key=Fernet.generate_key().decode())
    ctx = SendContext(s, Tier.P1, s.policy(Tier.P1), DlqCipher(Fernet.generate_key()),
                      lambda: datetime.now(UTC), random.Random(0), "send.p1", 1)

    class Store:
        async def get_template(self, tenant: str, tid: str, version: int) -> TemplateRow:
            return stored("{{ 10**5000 }}" if tid == "bad" else "ok {{ code }}")

    ctx.attach(partial_ports(messages=Store()))
    works = [work("bad", 1), work("good", 2, code=1)]
    batch = Batch(list(works), datetime.now(UTC))
    render_stage = stage.Render(cache_size=1)
    asyncio.run(render_stage(batch, ctx))
    assert seen.reasons == [RENDER_ERROR]
    assert [m.body for m in batch.rendered.values()] == ["ok 1"]
    assert len(render_stage.templates) == 1


# ---------------------------------------------------------------- crash counting


class Leases:
    owner = "me"

    def __init__(self) -> None:
        self.counted: list[str] = []
        self.released: list[str] = []

    def lease_key(self, message_id: str, attempt: int) -> str:
        return f"lease:{message_id}:{attempt}"

    async def crashes(self, source: str) -> dict[str, int]:
        return {}

    async def count_crash(self, source: str, field: str, memory: timedelta) -> int:
        self.counted.append(field)
        return 1

    async def release(self, keys: list[str]) -> None:
        self.released += keys


class Breakers:
    def on_change(self, callback: Any) -> None:
        return None


class Boom(Exception):
    pass


def dispatcher(leases: Leases, error: Exception) -> Dispatcher:
    s = Settings()

    async def stage(batch: Batch, ctx: SendContext) -> None:
        raise error

    async def open_ports() -> Any:
        return partial_ports(leases=leases, breakers=Breakers())

    return Dispatcher(s, Tier.P1, s.policy(Tier.P1), DlqCipher(Fernet.generate_key()),
                      ChannelPressure(100), lambda: datetime.now(UTC), open_ports, "me",
                      SendStages((stage,), (), ()))


@pytest.mark.parametrize(("error", "counted"), [
    (Boom("a prepare stage broke"), True),
    (InfraUnavailable("cassandra"), False),
    (ConnectionError("redis"), False),
])
def test_a_prepare_failure_counts_a_crash_for_each_record(error: Exception,
                                                          counted: bool) -> None:
    leases = Leases()
    d = dispatcher(leases, error)
    try:
        futures = d.submit([work("t", 1), work("t", 2)])
        for fut in futures:
            with pytest.raises(type(error)):
                fut.result(timeout=10)
    finally:
        d.close()
    assert counts_as_crash(error) is counted
    assert leases.counted == (["msg_1:1", "msg_2:1"] if counted else [])
    assert leases.released == (["lease:msg_1:1", "lease:msg_2:1"] if counted else [])


def test_the_api_answers_422_for_a_template_the_sandbox_refuses() -> None:
    class Rt:
        settings = Settings()

    async def post(body: str) -> ApiError:
        tc = TemplateCreate(template_id="t1", channel="SMS", body=body)
        with pytest.raises(ApiError) as exc:
            await _checked(Rt(), tc)  # type: ignore[arg-type]
        return exc.value

    refused = asyncio.run(post("{{ 10**5000 }}"))
    assert refused.status == 422 and refused.reason == "template_refused"
    assert asyncio.run(post("{{ x")).reason == "template_syntax_error"
