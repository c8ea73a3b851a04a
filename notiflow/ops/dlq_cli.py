"""``notiflow dlq``: inspect, replay and purge dead letters (docs/dlq.md).

Exit codes: 0 done; 1 a record was refused, failed or not found, or Kafka/Cassandra could
not be read; 2 bad usage, configuration or DLQ key; 3 a DLQ is deeper than
``dlq.depth_alert`` (``depth`` only).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypeVar

import orjson
import typer
from cassandra import DriverException
from confluent_kafka import KafkaException
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from notiflow.adapters.dlq import (
    SELECTORS,
    TIER_SELECTORS,
    DepthMonitor,
    DlqFilter,
    DlqReadError,
    Found,
    LedgerSession,
    ReadStats,
    alert_line,
    dlq_topics,
    scan,
    selector_of,
)
from notiflow.adapters.dlq_crypto import DlqCipher, DlqKeyMissing
from notiflow.adapters.envelope import envelope
from notiflow.adapters.kafka_io import AsyncProducer, DeliveryFailed
from notiflow.ops.dlq_actions import (
    DlqActions,
    Outcome,
    mask_text,
    payload_view,
    purge_before,
)
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings, load_settings

T = TypeVar("T")
console = Console(width=None if sys.stdout.isatty() else 200)
CATEGORIES = ("invalid_data", "provider_outage", "bug", "unavailable")
CONCURRENCY = 8
_NO_WRAP = frozenset({"dlq_id", "failed_at (UTC)", "message_id", "source"})

dlq_app = typer.Typer(no_args_is_help=True, help="Dead-letter queues: list, show, replay, purge, "
                      "depth (docs/dlq.md).")


class UsageError(Exception):
    """Bad options, configuration or key: exit 2."""


def default_actor() -> str:
    """The OS user running the command."""
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


TierOpt = Annotated[str | None, typer.Option(
    "--tier", help=f"Which DLQ: {', '.join(SELECTORS)} (default: every DLQ).")]
ChannelOpt = Annotated[Channel | None, typer.Option(
    case_sensitive=False, help="SMS, EMAIL or PUSH (from the source topic, a header or, with "
    "the key, the payload).")]
ReasonOpt = Annotated[str | None, typer.Option(help="Substring of the reason (any case).")]
ClassOpt = Annotated[str | None, typer.Option("--error-class", "--class",
                                              help="Exact error class, e.g. poison.")]
CategoryOpt = Annotated[str | None, typer.Option(help=", ".join(CATEGORIES))]
MessageOpt = Annotated[str | None, typer.Option("--message-id")]
TenantOpt = Annotated[str | None, typer.Option("--tenant")]
SinceOpt = Annotated[str | None, typer.Option(help="failed_at at or after (ISO 8601; UTC if "
                                              "no offset).")]
UntilOpt = Annotated[str | None, typer.Option(help="failed_at before (ISO 8601).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON object per line.")]
ActorOpt = Annotated[str, typer.Option(help="Who does this (recorded in the audit row).")]
WhyOpt = Annotated[str, typer.Option(help="Why (recorded in the audit row).")]
IdsArg = Annotated[list[str] | None, typer.Argument(help="dlq_id of each dead letter.",
                                                   show_default=False)]
LimitOpt = Annotated[int | None, typer.Option(min=1, help="At most this many.")]


def _audited(actor: str, why: str) -> None:
    """Raise a usage error unless a change names who makes it and why."""
    if not actor.strip() or not why.strip():
        raise UsageError("--actor and --why must not be empty")


def _when(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        d = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(f"{option}: not an ISO 8601 time: {value!r}") from None
    return d if d.tzinfo else d.replace(tzinfo=UTC)


def _filter(*, ids: list[str] | None = None, channel: Channel | None = None,
            reason: str | None = None, error_class: str | None = None,
            category: str | None = None, message_id: str | None = None,
            tenant: str | None = None, since: str | None = None,
            until: str | None = None) -> DlqFilter:
    if category is not None and category not in CATEGORIES:
        raise UsageError(f"--category must be one of {', '.join(CATEGORIES)}")
    return DlqFilter(ids=frozenset(ids or ()), channel=channel, reason=reason,
                     error_class=error_class, category=category, message_id=message_id,
                     tenant=tenant, since=_when(since, "--since"), until=_when(until, "--until"))


def _topics(settings: Settings, tier: str | None, default: tuple[str, ...] = SELECTORS
            ) -> list[str]:
    try:
        chosen = dlq_topics(settings, tier)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return list(chosen.values()) if tier else [chosen[s] for s in default]


def _cipher(settings: Settings, required: bool) -> DlqCipher | None:
    try:
        return DlqCipher.from_settings(settings)
    except DlqKeyMissing as exc:
        if required:
            raise UsageError(str(exc)) from None
        return None
    except ValueError as exc:
        raise UsageError(f"NOTIFLOW_DLQ_KEY is not a valid Fernet key: {exc}") from None


def _run(main: Callable[[Settings], Coroutine[Any, Any, int]]) -> None:
    """Load the settings, run ``main`` and exit with its code (or 1/2 on errors)."""
    try:
        settings = load_settings()
    except Exception as exc:
        console.print(f"[red]invalid configuration:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    try:
        code = asyncio.run(main(settings))
    except UsageError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    except (DlqReadError, DriverException, KafkaException, DeliveryFailed) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


@contextlib.asynccontextmanager
async def _ledger(settings: Settings) -> AsyncIterator[LedgerSession]:
    ls = await LedgerSession.open(settings)
    try:
        yield ls
    finally:
        ls.close()


def _source(found: Found) -> str:
    r = found.entry.record
    return f"{r.source_topic}[{r.source_partition}]@{r.source_offset}"


def _tier(settings: Settings, found: Found) -> str:
    r = found.entry.record
    return r.tier.value if r.tier else selector_of(settings, found.entry.topic)


def _summary(settings: Settings, found: Found) -> dict[str, Any]:
    """A dead letter without its encrypted parts, recipients masked."""
    r = found.entry.record
    doc = r.model_dump(mode="json", exclude={"payload_encrypted", "rendered_encrypted"})
    doc["reason"] = mask_text(r.reason)
    doc["headers"] = {k: mask_text(v) for k, v in r.headers.items()}
    doc.update(dlq=selector_of(settings, found.entry.topic), dlq_topic=found.entry.topic,
               dlq_partition=found.entry.partition, dlq_offset=found.entry.offset,
               channel=found.channel.value if found.channel else None)
    res = found.resolution
    doc["resolution"] = None if res is None else {
        "state": res.state, "at": res.at.isoformat(), "actor": res.actor, "why": res.reason,
        "attempt": res.attempt}
    return doc


def _warn(stats: ReadStats, flt: DlqFilter, cipher: DlqCipher | None) -> None:
    if stats.unreadable:
        console.print(f"[yellow]{stats.unreadable} value(s) in the DLQ are not DLQ records "
                      "(skipped; see the log)[/yellow]")
    if stats.undecidable_channel:
        hint = "" if cipher else " (set NOTIFLOW_DLQ_KEY to read the channel from payloads)"
        console.print(f"[yellow]{stats.undecidable_channel} record(s) of unknown channel left "
                      f"out by --channel{hint}[/yellow]")


@dlq_app.command("list")
def list_cmd(
    tier: TierOpt = None, channel: ChannelOpt = None, reason: ReasonOpt = None,
    error_class: ClassOpt = None, category: CategoryOpt = None,
    message_id: MessageOpt = None, tenant: TenantOpt = None, since: SinceOpt = None,
    until: UntilOpt = None,
    limit: Annotated[int, typer.Option(min=1, help="Rows to show.")] = 50,
    resolved: Annotated[bool, typer.Option("--resolved",
                                           help="Include replayed and purged ones.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """List unresolved dead letters (recipients are never shown)."""

    async def main(settings: Settings) -> int:
        flt = _filter(channel=channel, reason=reason, error_class=error_class,
                      category=category, message_id=message_id, tenant=tenant, since=since,
                      until=until)
        topics = _topics(settings, tier)
        cipher = _cipher(settings, required=False) if channel else None
        stats = ReadStats()
        shown: list[Found] = []
        total = 0
        async with _ledger(settings) as ls:
            async for found in scan(settings, ls.ledger, topics, flt, cipher,
                                    include_resolved=resolved, stats=stats):
                total += 1
                if len(shown) < limit:
                    shown.append(found)
        if as_json:
            for f in shown:
                sys.stdout.write(orjson.dumps(_summary(settings, f)).decode() + "\n")
            return 0
        table = Table(title=f"dead letters ({'all' if resolved else 'unresolved'})")
        for name in ("dlq_id", "failed_at (UTC)", "tier", "channel", "reason", "class",
                     "category", "message_id", "tenant", "source",
                     *(("resolved",) if resolved else ())):
            table.add_column(name, no_wrap=name in _NO_WRAP, overflow="fold")
        for f in shown:
            r = f.entry.record
            table.add_row(
                r.dlq_id, r.failed_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
                _tier(settings, f), f.channel.value if f.channel else "?",
                escape(mask_text(r.reason)), escape(r.error_class), r.category,
                r.message_id or "", r.tenant_id or "", escape(_source(f)),
                *((f.resolution.state if f.resolution else "",) if resolved else ()))
        console.print(table)
        console.print(f"{len(shown)} shown of {total} matching", highlight=False)
        _warn(stats, flt, cipher)
        return 0

    _run(main)


async def _find_one(settings: Settings, ls: LedgerSession, dlq_id: str,
                    tier: str | None) -> Found | None:
    flt = DlqFilter(ids=frozenset({dlq_id}))
    async with contextlib.aclosing(scan(settings, ls.ledger, _topics(settings, tier), flt,
                                        include_resolved=True)) as found:
        async for f in found:
            return f
    return None


@dlq_app.command("show")
def show_cmd(
    dlq_id: Annotated[str, typer.Argument(help="The dead letter's dlq_id.")],
    tier: TierOpt = None,
    reveal: Annotated[bool, typer.Option(help="Show recipients in clear (audited; needs "
                                         "--why).")] = False,
    actor: Annotated[str, typer.Option(help="Who reveals (audit row); default: the OS "
                                       "user.")] = "",
    why: Annotated[str | None, typer.Option(help="Why (required with --reveal).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one dead letter in full (payload decrypted, recipients masked unless --reveal)."""

    async def main(settings: Settings) -> int:
        if reveal and not (why and why.strip()):
            raise UsageError("--reveal needs --why (it is recorded in the audit trail)")
        async with _ledger(settings) as ls:
            found = await _find_one(settings, ls, dlq_id, tier)
            if found is None:
                console.print(f"[red]no dead letter {escape(dlq_id)}[/red]")
                return 1
            doc = _summary(settings, found)
            try:
                cipher = _cipher(settings, required=True)
                assert cipher is not None
                payload = cipher.decrypt(found.entry.record.payload_encrypted)
                rendered_token = getattr(found.entry.record, "rendered_encrypted", None)
                rendered = cipher.decrypt(rendered_token) if rendered_token else None
            except (UsageError, ValueError) as exc:
                _print_record(doc, as_json)
                console.print(f"[red]payload not shown:[/red] {escape(str(exc))}",
                              highlight=False)
                return 2
            if reveal:
                actions = DlqActions(settings, ls.ledger)
                await actions.reveal(found.entry, actor or default_actor(), why or "")
            doc["payload"] = payload_view(payload, reveal, envelope(settings))
            if rendered is not None:
                doc["rendered"] = payload_view(rendered, reveal)
            doc["revealed"] = reveal
        _print_record(doc, as_json)
        return 0

    _run(main)


def _print_record(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(orjson.dumps(doc).decode() + "\n")
        return
    table = Table("field", "value", title=f"dead letter {doc['dlq_id']}", show_header=False)
    skip = {"attempts", "headers", "payload", "rendered"}
    for key, value in doc.items():
        if key not in skip:
            table.add_row(key, escape(str(value if not isinstance(value, dict)
                                          else orjson.dumps(value).decode())))
    console.print(table)
    if doc.get("headers"):
        console.print("headers: " + escape(orjson.dumps(doc["headers"]).decode()),
                      highlight=False)
    if doc.get("attempts"):
        at = Table("#", "provider", "outcome", "error", "code", "started", "completed",
                   title="attempts")
        for a in doc["attempts"]:
            at.add_row(str(a["attempt_no"]), a["provider_id"], a["outcome"],
                       escape(str(a.get("normalized_error") or "")),
                       escape(str(a.get("error_code") or "")), a["started_at"],
                       a["completed_at"])
        console.print(at)
    for part in ("payload", "rendered"):
        if part in doc:
            label = "clear (revealed)" if doc.get("revealed") else "recipients masked"
            console.print(f"{part} ({label}):", highlight=False)
            body = doc[part]
            console.print(escape(body if isinstance(body, str) else orjson.dumps(
                body, option=orjson.OPT_INDENT_2).decode()), highlight=False)


def _selection(ids: list[str] | None, all_: bool, flt: DlqFilter) -> DlqFilter:
    if bool(ids) == all_:
        raise UsageError("give dead-letter ids or --all (with filters), not both")
    if ids and flt.narrows:
        raise UsageError("filters apply to --all only")
    return DlqFilter(ids=frozenset(ids)) if ids else flt


async def _each(found: AsyncGenerator[Found, None], limit: int | None,
                act: Callable[[Found], Awaitable[Outcome]]) -> tuple[list[Outcome], set[str]]:
    """Apply ``act`` to every item (``CONCURRENCY`` at a time, in order), at most ``limit``."""
    outcomes: list[Outcome] = []
    seen: set[str] = set()
    batch: list[Found] = []
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(f: Found) -> Outcome:
        async with sem:
            return await act(f)

    async def flush() -> None:
        outcomes.extend(await asyncio.gather(*(one(f) for f in batch)))
        batch.clear()

    async with contextlib.aclosing(found) as items:
        async for f in items:
            if limit is not None and len(seen) >= limit:
                break
            seen.add(f.entry.dlq_id)
            batch.append(f)
            if len(batch) >= 100:
                await flush()
    await flush()
    return outcomes, seen


def _report(outcomes: list[Outcome], missing: set[str], verb: str) -> int:
    table = Table("dlq_id", "message_id", "result", "detail", title=verb)
    for o in outcomes:
        color = {"refused": "yellow", "failed": "red"}.get(o.result, "green")
        table.add_row(o.dlq_id, o.message_id or "", f"[{color}]{o.result}[/{color}]",
                      escape(o.detail))
    for dlq_id in sorted(missing):
        table.add_row(dlq_id, "", "[red]not found[/red]", "no such dead letter in these DLQs")
    console.print(table)
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.result] = counts.get(o.result, 0) + 1
    if missing:
        counts["not found"] = len(missing)
    console.print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing matched",
                  highlight=False)
    bad = {"refused", "failed", "not found"}
    return 1 if any(k in bad for k in counts) else 0


@dlq_app.command("replay")
def replay_cmd(
    actor: ActorOpt, why: WhyOpt,
    ids: IdsArg = None,
    all_: Annotated[bool, typer.Option("--all", help="Every unresolved dead letter that "
                                       "matches the filters (tier DLQs unless --tier).")
                    ] = False,
    tier: TierOpt = None, channel: ChannelOpt = None, reason: ReasonOpt = None,
    error_class: ClassOpt = None, category: CategoryOpt = None,
    message_id: MessageOpt = None, tenant: TenantOpt = None, since: SinceOpt = None,
    until: UntilOpt = None,
    limit: LimitOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would happen; change "
                                          "nothing.")] = False,
    again: Annotated[bool, typer.Option("--again", help="Replay ids that were already "
                                        "replayed or purged.")] = False,
    extend_ttl: Annotated[float | None, typer.Option(
        "--extend-ttl", min=1, help="Seconds: expire the message no sooner than this long "
        "from now (required to replay an expired message).")] = None,
) -> None:
    """Re-enqueue dead send requests to their ingest topic with a fresh attempt budget
    (a message that ended FAILED or EXPIRED is reopened; see docs/dlq.md for refusals)."""

    async def main(settings: Settings) -> int:
        _audited(actor, why)
        if again and all_:
            raise UsageError("--again applies to explicit ids only")
        flt = _selection(ids, all_, _filter(
            channel=channel, reason=reason, error_class=error_class, category=category,
            message_id=message_id, tenant=tenant, since=since, until=until))
        topics = _topics(settings, tier, SELECTORS if ids else TIER_SELECTORS)
        cipher = _cipher(settings, required=True)
        producer = None if dry_run else AsyncProducer(settings)
        try:
            async with _ledger(settings) as ls:
                actions = DlqActions(settings, ls.ledger, cipher, producer)
                ttl = timedelta(seconds=extend_ttl) if extend_ttl else None
                outcomes, seen = await _each(
                    scan(settings, ls.ledger, topics, flt, cipher, include_resolved=bool(ids)),
                    limit, lambda f: actions.replay(f, actor=actor, why=why, dry_run=dry_run,
                                                    again=again, extend_ttl=ttl))
        finally:
            if producer is not None:
                await asyncio.to_thread(producer.close)
        return _report(outcomes, set(ids or ()) - seen, "dry run: replay" if dry_run
                       else "replay")

    _run(main)


@dlq_app.command("purge")
def purge_cmd(
    actor: ActorOpt, why: WhyOpt,
    ids: IdsArg = None,
    all_: Annotated[bool, typer.Option("--all", help="Every unresolved dead letter that "
                                       "matches the filters.")] = False,
    before: Annotated[str | None, typer.Option(
        help="ISO time: resolve every record dead-lettered before it and delete those "
        "records from Kafka (delete_records).")] = None,
    tier: TierOpt = None, channel: ChannelOpt = None, reason: ReasonOpt = None,
    error_class: ClassOpt = None, category: CategoryOpt = None,
    message_id: MessageOpt = None, tenant: TenantOpt = None, since: SinceOpt = None,
    until: UntilOpt = None,
    limit: LimitOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run")] = False,
) -> None:
    """Resolve dead letters without replaying them; --before also deletes old records."""

    async def main(settings: Settings) -> int:
        _audited(actor, why)
        flt = _filter(channel=channel, reason=reason, error_class=error_class,
                      category=category, message_id=message_id, tenant=tenant, since=since,
                      until=until)
        cipher = _cipher(settings, required=False) if channel else None
        if before is not None:
            if ids or all_ or flt.narrows or limit:
                raise UsageError("--before selects by time alone (only --tier may narrow it)")
            cut = _when(before, "--before")
            assert cut is not None
            async with _ledger(settings) as ls:
                actions = DlqActions(settings, ls.ledger)
                parts = await purge_before(actions, tier, cut, actor=actor, why=why,
                                           dry_run=dry_run)
            table = Table("topic", "partition", "offsets", "purged now", "already resolved",
                          title=f"{'dry run: ' if dry_run else ''}purge before {cut.isoformat()}")
            for p in parts:
                table.add_row(p.topic, str(p.partition), f"{p.low}..{p.cut - 1}",
                              str(p.purged), str(p.already_resolved))
            console.print(table)
            verb = "would delete" if dry_run else "deleted"
            console.print(f"{verb} {sum(p.cut - p.low for p in parts)} record(s) from Kafka",
                          highlight=False)
            return 0
        sel = _selection(ids, all_, flt)
        async with _ledger(settings) as ls:
            actions = DlqActions(settings, ls.ledger)
            outcomes, seen = await _each(
                scan(settings, ls.ledger, _topics(settings, tier), sel, cipher,
                     include_resolved=bool(ids)),
                limit, lambda f: actions.purge(f, actor=actor, why=why, dry_run=dry_run))
        return _report(outcomes, set(ids or ()) - seen, "dry run: purge" if dry_run
                       else "purge")

    _run(main)


@dlq_app.command("depth")
def depth_cmd(tier: TierOpt = None, as_json: JsonOpt = False) -> None:
    """Unresolved dead letters per DLQ topic; exit 3 with DLQ_DEPTH_ALERT above the limit."""

    async def main(settings: Settings) -> int:
        _topics(settings, tier)
        async with _ledger(settings) as ls:
            monitor = DepthMonitor(settings, ls.ledger, tier)
            counts = await monitor.check()
        threshold = settings.dlq.depth_alert
        alerts = {t: n for t, n in counts.items() if t in monitor.alerting}
        if as_json:
            sys.stdout.write(orjson.dumps({"threshold": threshold, "depth": counts,
                                           "alert": sorted(alerts)}).decode() + "\n")
            return 3 if alerts else 0
        table = Table("dlq", "topic", "unresolved", title=f"DLQ depth (alert above "
                      f"{threshold})")
        for topic, n in counts.items():
            style = "bold red" if topic in alerts else ""
            table.add_row(selector_of(settings, topic), topic, str(n), style=style)
        console.print(table)
        for topic, n in alerts.items():
            line = alert_line(selector_of(settings, topic), topic, n, threshold)
            console.print(f"[bold red]{line}[/bold red]", highlight=False)
        _warn(monitor.stats, DlqFilter(), None)
        return 3 if alerts else 0

    _run(main)
