"""``notiflow bench isolation|throughput|scale|soak|scheduler|campaign|outbox|api``: run a
benchmark on the local stack and write ``<out>/<name>.json``, ``<name>.md`` (and
``isolation.png``, ``scheduler.png``, ``campaign.png``, ``outbox.png``, ``api.png``). The
stack is started if it is not running, and stopped again afterwards in that case.
``notiflow bench envelope`` runs offline (``envelope.png``).
``notiflow bench summarize``: publish such a run's summary and its report into
``bench/figures/`` (offline)."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markdown import Markdown

bench_app = typer.Typer(help="Benchmarks on the local stack (figures, not tests).",
                        no_args_is_help=True)
console = Console()

Out = Annotated[Path, typer.Option(help="Where results and process logs go.")]
RESULTS = Path("bench/results")
WarmupRounds = Annotated[int | None, typer.Option(
    help="Most warm-up rounds (default 10): they repeat until the JIT compilers of Kafka and "
         "Cassandra use under 5 % of those JVMs' CPU in a round.")]
Warmup = Annotated[float | None, typer.Option(
    help="Seconds of warm-up waves at most, until P0's latency settles (default 180; "
         "0: one small wave).")]
Budget = Annotated[bool, typer.Option(
    help="Record the per-stage latency budget (the processes export their metrics to the "
         "benchmark every 2 s); --no-budget measures without that cost.")]


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    sys.exit(128 + signum)


@contextlib.contextmanager
def _stack() -> Iterator[None]:
    """The stack up for one benchmark. ``kill`` (SIGTERM) unwinds like Ctrl-C, so the phase's
    processes are stopped, not left running into the next benchmark's figures."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from notiflow.ops.stack import Stack
    from notiflow.settings import Settings

    stack = Stack(Settings(), log=lambda m: console.print(m, highlight=False))
    was_up = all(healthy for *_, healthy in stack.status())
    stack.up()
    try:
        yield
    finally:
        if not was_up:
            stack.down()


def _log(msg: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {msg}", highlight=False)


def _show(paths: list[Path], markdown: str) -> None:
    console.print(Markdown(markdown))
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False)


def _publish(out: Path, name: str, doc: dict[str, Any], markdown: str,
             plot: Callable[[dict[str, Any], Path], Path] | None = None) -> None:
    """Write a run's ``doc`` and ``markdown`` as ``out/<name>.json`` and ``.md`` (and its
    ``plot`` as ``out/<name>.png``), then show them."""
    from notiflow.bench.report import write

    paths = write(out, name, doc, markdown)
    if plot is not None:
        paths.append(plot(doc, out / f"{name}.png"))
    _show(paths, markdown)


@bench_app.command("isolation")
def isolation(
    n: Annotated[int, typer.Option("-n", help="P3 campaign size.")] = 200_000,
    otp_rate: Annotated[float, typer.Option(help="P0 OTPs per second.")] = 20.0,
    mode: Annotated[list[str] | None, typer.Option(
        help="tiered and/or shared (default both, in one run).")] = None,
    max_drain: Annotated[float, typer.Option(help="Give up a mode after this many s.")] = 1800,
    warmup: Warmup = None,
    budget: Budget = True,
    out: Out = RESULTS,
) -> None:
    """P0 latency while a P3 campaign floods the platform: tier-isolated vs shared."""
    from notiflow.bench import isolation as iso
    from notiflow.bench.report import isolation_markdown, isolation_plot

    modes = mode or ["tiered", "shared"]
    with _stack():
        doc = iso.run(out, n=n, otp_rate=otp_rate, modes=modes, max_drain=max_drain,
                      log=_log, warmup=warmup, record_budget=budget)
    _publish(out, "isolation", doc, isolation_markdown(doc), isolation_plot)


@bench_app.command("throughput")
def throughput(
    n: Annotated[int, typer.Option("-n", help="P2 messages per pipeline.")] = 50_000,
    profile: Annotated[bool, typer.Option(
        help="py-spy the send and reconcile flows (its sampling takes CPU from the end-to-end "
             "pipeline only, so the ratio is quoted from runs without it).")] = False,
    warmup: Annotated[int | None, typer.Option(
        help="Messages per warm-up round through each pipeline (default n/2).")] = None,
    warmup_rounds: WarmupRounds = None,
    out: Out = RESULTS,
) -> None:
    """P2 end to end next to the minimal-pipeline and passthrough ceilings (same run)."""
    from notiflow.bench import throughput as tp
    from notiflow.bench.report import throughput_markdown

    with _stack():
        doc = tp.run(out, n=n, profile=profile, log=_log, warmup=warmup,
                     warmup_rounds=warmup_rounds)
    _publish(out, "throughput", doc, throughput_markdown(doc))


@bench_app.command("scale")
def scale(
    n: Annotated[int, typer.Option("-n", help="P2 messages per run.")] = 30_000,
    processes: Annotated[list[int] | None, typer.Option(
        "--processes", "-p", help="Bytewax processes per run (default 1, 2, 4).")] = None,
    warmup: Annotated[int | None, typer.Option(
        help="Messages per warm-up round of the platform (default n/2).")] = None,
    warmup_rounds: WarmupRounds = None,
    out: Out = RESULTS,
) -> None:
    """The P2 send flow on 1, 2 and 4 Bytewax processes: the speed-up curve."""
    from notiflow.bench import throughput as tp
    from notiflow.bench.report import scale_markdown

    with _stack():
        doc = tp.run_scale(out, n=n, processes=processes or [1, 2, 4], log=_log,
                           warmup=warmup, warmup_rounds=warmup_rounds)
    _publish(out, "scale", doc, scale_markdown(doc))


@bench_app.command("scheduler")
def scheduler(
    n: Annotated[int, typer.Option("-n", help="Rows of the load phase.")] = 1_000_000,
    rate: Annotated[float, typer.Option(help="Rows falling due per second (load).")] = 2000.0,
    failover_n: Annotated[int, typer.Option(help="Rows of the failover phase.")] = 1000,
    window: Annotated[float, typer.Option(
        help="Seconds the failover phase's rows fall due over.")] = 120.0,
    out: Out = RESULTS,
) -> None:
    """Durable scheduling: a scheduler SIGKILLed mid-run (lost, early, late), then ``n``
    rows released at ``rate``/s (published per second, lateness, scheduler CPU and RSS)."""
    from notiflow.bench import scheduler as sb
    from notiflow.bench.scheduler_report import scheduler_markdown, scheduler_plot

    with _stack():
        doc = sb.run(out, n=n, rate=rate, failover_n=failover_n, window=window, log=_log)
    _publish(out, "scheduler", doc, scheduler_markdown(doc), scheduler_plot)


@bench_app.command("campaign")
def campaign(
    n: Annotated[int, typer.Option("-n", help="Rows of the manifest.")] = 1_000_000,
    otp_rate: Annotated[float, typer.Option(help="P0 OTPs per second.")] = 20.0,
    max_rate: Annotated[float, typer.Option(help="The campaign's max_rate (rows/s).")
                        ] = 5000.0,
    max_drain: Annotated[float, typer.Option(help="Seconds to wait for the campaign to "
                                                  "drain.")] = 3600.0,
    channel: Annotated[str, typer.Option(help="SMS, or EMAIL (through SendGrid alone).")
                       ] = "SMS",
    provider_batch: Annotated[int | None, typer.Option(
        help="P3's provider_batch (messages per provider request; default the tier's).")
    ] = None,
    out: Out = RESULTS,
) -> None:
    """A campaign of ``n`` rows from a manifest in S3, through the API and an expander,
    while P0 OTPs go through the API: expansion rate, expander CPU and RSS, P3 drain and the
    send flow's CPU per message (email: SendGrid requests per message), P0 latency."""
    from notiflow.bench import campaign as cb
    from notiflow.bench.campaign_report import campaign_markdown, campaign_plot
    from notiflow.schemas.enums import Channel

    with _stack():
        doc = cb.run(out, n=n, otp_rate=otp_rate, max_rate=max_rate, max_drain=max_drain,
                     log=_log, channel=Channel(channel.upper()),
                     provider_batch=provider_batch)
    name = "campaign" if doc["channel"] == "SMS" else "campaign-email"
    _publish(out, name, doc, campaign_markdown(doc), campaign_plot)


@bench_app.command("outbox")
def outbox(
    n: Annotated[int, typer.Option("-n", help="Accept-and-complete cycles of history.")
                 ] = 1_000_000,
    pending: Annotated[int, typer.Option(help="Crashed acceptances to sweep.")] = 100,
    spread: Annotated[float, typer.Option(help="Seconds the history spans.")] = 3600.0,
    out: Out = RESULTS,
) -> None:
    """What one outbox sweep reads after ``n`` completed acceptances: the former layout
    (shards read from the oldest row) next to the time buckets with the sweeper's cursor."""
    from notiflow.bench import outbox as ob

    with _stack():
        doc = ob.run(n=n, pending=pending, spread_s=spread, log=_log)
    _publish(out, "outbox", doc, ob.outbox_markdown(doc), ob.outbox_plot)


@bench_app.command("envelope")
def envelope(
    n: Annotated[int, typer.Option("-n", help="Workload records per round.")] = 20_000,
    rounds: Annotated[int, typer.Option(help="Timed rounds (after one warm-up).")] = 7,
    out: Out = RESULTS,
) -> None:
    """CPU per message of sealing and opening the recipient and variables of ingest
    records, next to the same records in clear (offline: no stack)."""
    from notiflow.bench import envelope as ev

    doc = ev.run(n=n, rounds=rounds, log=_log)
    _publish(out, "envelope", doc, ev.envelope_markdown(doc), ev.envelope_plot)


@bench_app.command("api")
def api(
    mode: Annotated[list[str] | None, typer.Option(
        help="ceiling, batch-ceiling, single-p0, single-p3, user-p3, batch-p3 (default all, "
             "in one run; single-p0 adds p0-half).")] = None,
    quick: Annotated[bool, typer.Option(
        help="A smoke run: two steps of 0.5 + 2 s per mode, no pre-warming.")] = False,
    duration: Annotated[float | None, typer.Option(help="Measured seconds per step.")] = None,
    warmup: Annotated[float | None, typer.Option(
        help="Unmeasured seconds at the step's rate before its measured ones.")] = None,
    steps: Annotated[int | None, typer.Option(help="Most steps per mode.")] = None,
    start: Annotated[float | None, typer.Option(
        help="First offered rate, messages/s (batch-p3: ten times it).")] = None,
    factor: Annotated[float | None, typer.Option(help="Rate of a step ÷ the step before.")
                      ] = None,
    batch_size: Annotated[int | None, typer.Option(help="Messages per batch request.")
                          ] = None,
    p99_bound: Annotated[float | None, typer.Option(
        help="Stop a mode's ascent after a step whose p99 (ms) is above this.")] = None,
    prewarm: Annotated[float | None, typer.Option(
        help="Seconds of unmeasured single P3 load before the first mode.")] = None,
    api_processes: Annotated[int, typer.Option(
        min=1, max=64, help="Worker processes of each API lane (notiflow api --processes).")
                             ] = 1,
    out: Out = RESULTS,
) -> None:
    """The acceptance path (POST /v1/messages, single and batch, P0 and P3) under open-loop
    load at ascending fixed rates, next to the minimal acceptance ceiling (one Cassandra
    write and one Kafka produce per message) in the same run: accepted/s, p50/p99 from each
    request's intended send time, CPU per acceptance per process; then P0 at half its
    maximum."""
    from dataclasses import replace

    from notiflow.bench import api as ab
    from notiflow.bench.api_report import api_markdown, api_plot

    given: dict[str, Any] = {
        "duration_s": duration, "warmup_s": warmup, "steps": steps, "start": start,
        "factor": factor, "batch_size": batch_size, "p99_bound_ms": p99_bound,
        "prewarm_s": prewarm}
    plan = replace(ab.QUICK if quick else ab.Plan(),
                   **{k: v for k, v in given.items() if v is not None})
    with _stack():
        doc = ab.run(out, plan=plan, modes=mode or list(ab.MODES), log=_log,
                     api_processes=api_processes)
    _publish(out, "api", doc, api_markdown(doc), api_plot)


@bench_app.command("soak")
def soak(
    minutes: Annotated[float, typer.Option(help="How long the load runs.")] = 10.0,
    p3_rate: Annotated[float, typer.Option(help="P3 messages per second.")] = 50.0,
    otp_rate: Annotated[float, typer.Option(help="P0 OTPs per second.")] = 20.0,
    cap_window: Annotated[float, typer.Option(
        help="Seconds every recipient cap counts over (production: OTP 10 min, marketing "
             "7 days), so the caps' Redis sets reach their steady size early.")] = 60.0,
    warmup: Warmup = None,
    budget: Budget = True,
    out: Out = RESULTS,
) -> None:
    """Steady load on the tier-isolated platform: is each process's memory flat?"""
    from datetime import timedelta

    from notiflow.bench import isolation as iso
    from notiflow.bench.report import soak_markdown

    with _stack():
        doc = iso.run_soak(out, minutes=minutes, p3_rate=p3_rate, otp_rate=otp_rate, log=_log,
                           cap_window=timedelta(seconds=cap_window), warmup=warmup,
                           record_budget=budget)
    _publish(out, "soak", doc, soak_markdown(doc))


@bench_app.command("summarize")
def summarize(
    src: Annotated[Path, typer.Argument(
        help="A run's full JSON (bench/results/<name>.json).", exists=True, dir_okay=False)],
    dst: Annotated[Path, typer.Argument(
        help="Base path of the published files, e.g. bench/figures/isolation-30k-r11.")],
) -> None:
    """Publish a run into bench/figures/: DST.json (the run's summary: no per-message or
    per-sample series), DST.md and, for an isolation run, DST.png, rendered from it."""
    import json

    from notiflow.bench.report import publish

    base = dst.with_suffix("") if dst.suffix in (".json", ".md", ".png") else dst
    paths = publish(json.loads(src.read_text()), base)
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False)


@bench_app.command("ceiling", hidden=True)
def ceiling(
    kind: Annotated[str, typer.Argument(help="minimal or passthrough")],
    n: Annotated[int, typer.Option("-n")],
) -> None:
    """One ceiling pipeline (run by ``bench throughput`` in its own process)."""
    from notiflow.bench.ceilings import main
    from notiflow.schemas.enums import Tier

    if kind not in ("minimal", "passthrough"):
        raise typer.BadParameter("minimal or passthrough")
    main(kind, Tier.P2, n)


@bench_app.command("api-ceiling", hidden=True)
def api_ceiling(port: Annotated[int, typer.Option(help="Listen port.")]) -> None:
    """The minimal acceptance ceiling's server (run by ``bench api`` in its own process)."""
    from notiflow.bench.api_ceiling import serve
    from notiflow.settings import Settings

    serve(Settings(), port)
