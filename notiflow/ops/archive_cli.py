"""``notiflow archive``: copy each day's history to Parquet in object storage before the
operational tables' TTL removes it (layout: ``notiflow/archive.py``).

``run`` archives every (day, tenant) that is due and has no manifest yet: by default the days
from ``operational_ttl`` ago to ``archive.settle`` ago, so a daily run (a cron job, the Helm
chart's ``archive`` CronJob) archives each day once, and a run after an outage of a few days
catches up while the rows are still there. ``--day`` and ``--force`` archive a given day
again (files are overwritten, the manifest last). ``status`` lists the manifests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import typer
from rich.console import Console
from rich.table import Table

from notiflow.adapters.admission import AdmissionUnavailable
from notiflow.archive import (
    DATASETS,
    DatasetFile,
    data_key,
    due_days,
    manifest,
    manifest_key,
    manifest_of,
    records,
)
from notiflow.correlation import CorrelationKeys
from notiflow.flows.common.yielding import YieldWindow
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings, load_settings

if TYPE_CHECKING:
    from notiflow.adapters.archive_reader import ArchiveReader
    from notiflow.adapters.object_store import ObjectStore

console = Console()
archive_app = typer.Typer(no_args_is_help=True, help=__doc__)


@dataclass(frozen=True, slots=True)
class Archived:
    day: date
    tenant_id: str
    rows: dict[str, int]
    skipped: bool = False


def _join(prefix: str, key: str) -> str:
    return f"{prefix.rstrip('/')}/{key}" if prefix else key


class P0Signal(Protocol):
    async def p0_worst(self) -> float | None: ...


class Yielding:
    """How many reads the archive may have in flight for its next slice: the bulk lane's
    AIMD window (``flows/common/yielding.py``) on P0's latency signal, up to
    ``archive.concurrency``; while the window is shut, it waits a tick at a time for the
    signal to fall. No signal (no P0 traffic, or Redis unreachable) counts as calm."""

    def __init__(self, settings: Settings, signals: P0Signal | None) -> None:
        self.window = YieldWindow(settings.bulk_yield,
                                  settings.policy(Tier.P0).sla.total_seconds(),
                                  settings.archive.concurrency)
        self.tick_s = settings.bulk_yield.tick.total_seconds()
        self.signals = signals
        self.waited_s = 0.0

    async def _worst(self) -> float | None:
        if self.signals is None:
            return None
        try:
            return await self.signals.p0_worst()
        except AdmissionUnavailable:
            return None

    async def concurrency(self) -> int:
        while (limit := self.window.step(await self._worst())) == 0:
            await asyncio.sleep(self.tick_s)
            self.waited_s += self.tick_s
        return limit


async def _async_chunks(f: DatasetFile) -> AsyncIterator[bytes]:
    for chunk in f.chunks():
        yield chunk


async def archive_day(reader: ArchiveReader, store: ObjectStore, prefix: str,
                      tenant_id: str, day: date, slice_size: int, now: datetime,
                      gate: Yielding, keys: CorrelationKeys) -> Archived:
    """Write one (day, tenant): the four datasets, then the manifest (``keys`` tell the
    campaigns' messages)."""
    ids = await asyncio.to_thread(reader.message_ids, tenant_id, day)
    files = {name: DatasetFile(name) for name in DATASETS}
    for start in range(0, len(ids), slice_size):
        rows = await asyncio.to_thread(reader.rows, tenant_id, day,
                                       ids[start:start + slice_size], await gate.concurrency())
        for name, recs in records(rows, keys).items():
            files[name].add(recs)
    written: dict[str, tuple[str, DatasetFile]] = {}
    try:
        for name, f in files.items():
            key = data_key(name, day, tenant_id)
            f.finish()
            await store.put(_join(prefix, key), _async_chunks(f))
            written[name] = (key, f)
    finally:
        for f in files.values():
            f.close()
    doc = manifest(day, tenant_id, written, now)
    await store.put(_join(prefix, manifest_key(day, tenant_id)), json.dumps(doc).encode())
    return Archived(day, tenant_id, {name: f.rows for name, f in files.items()})


async def run_archive(settings: Settings, days: Sequence[date], tenants: Sequence[str], *,
                      force: bool = False) -> list[Archived]:
    """Archive each (day, tenant) without a manifest (every one with ``force``)."""
    from notiflow.adapters.admission import AdmissionStore
    from notiflow.adapters.archive_reader import ArchiveReader
    from notiflow.adapters.cassandra.session import connect
    from notiflow.adapters.object_store import ObjectStore

    keys = CorrelationKeys.from_settings(settings)
    store, prefix = ObjectStore.open(settings.archive.uri, settings.object_store)
    archived = set() if force else set(await manifest_keys(store, prefix))
    signals = AdmissionStore.open(settings)
    gate = Yielding(settings, signals)
    cluster, session = await asyncio.to_thread(connect, settings)
    try:
        reader = await asyncio.to_thread(ArchiveReader, session)
        done: list[Archived] = []
        for day in days:
            for tenant_id in tenants:
                if (day, tenant_id) in archived:
                    done.append(Archived(day, tenant_id, {}, skipped=True))
                    continue
                done.append(await archive_day(reader, store, prefix, tenant_id, day,
                                              settings.archive.slice, datetime.now(UTC), gate,
                                              keys))
        return done
    finally:
        await signals.aclose()
        await asyncio.to_thread(cluster.shutdown)


async def manifest_keys(store: ObjectStore, prefix: str) -> dict[tuple[date, str], str]:
    """(day, tenant) → manifest key, for every manifest of the archive (one listing)."""
    keys = await store.list(_join(prefix, "v1/_manifests"))
    return {part: key for key in keys if (part := manifest_of(key)) is not None}


async def manifests(settings: Settings,
                    keep: Callable[[date, str], bool] = lambda _d, _t: True,
                    ) -> list[dict[str, Any]]:
    """The manifests of the (day, tenant)s ``keep`` accepts, oldest day first (those others
    are never read)."""
    from notiflow.adapters.object_store import ObjectStore

    store, prefix = ObjectStore.open(settings.archive.uri, settings.object_store)
    found = await manifest_keys(store, prefix)
    docs = []
    for part in sorted(found):
        if keep(*part):
            docs.append(json.loads(b"".join([c async for c in store.stream(found[part])])))
    return docs


def _days(given: list[str] | None, settings: Settings) -> list[date]:
    if given:
        try:
            return [date.fromisoformat(d) for d in given]
        except ValueError as exc:
            console.print(f"[red]--day:[/red] {exc}")
            raise typer.Exit(2) from None
    return due_days(datetime.now(UTC).date(), settings.operational_ttl,
                    settings.archive.settle)


@archive_app.command("run")
def run_command(
    day: Annotated[list[str] | None, typer.Option(
        help="Archive this day (YYYY-MM-DD, UTC); repeat for several. Default: every due "
             "day.")] = None,
    tenant: Annotated[list[str] | None, typer.Option(
        help="Only this tenant; repeat for several. Default: every configured tenant.")
    ] = None,
    force: Annotated[bool, typer.Option(help="Archive again days that have a manifest.")
                     ] = False,
) -> None:
    """Archive what is due; prints one line per (day, tenant)."""
    settings = load_settings()
    tenants = tenant or [t.id for t in settings.tenants]
    done = asyncio.run(run_archive(settings, _days(day, settings), tenants, force=force))
    table = Table("day", "tenant", *DATASETS)
    for a in done:
        table.add_row(a.day.isoformat(), a.tenant_id,
                      *(("archived before" if a.skipped else str(a.rows[n])) for n in DATASETS))
    console.print(table)
    console.print(f"{sum(not a.skipped for a in done)} archived, "
                  f"{sum(a.skipped for a in done)} had a manifest, under "
                  f"{settings.archive.uri}")


@archive_app.command("status")
def status_command() -> None:
    """The archived (day, tenant)s with their rows per dataset."""
    settings = load_settings()
    docs = asyncio.run(manifests(settings))
    table = Table("day", "tenant", *DATASETS, "written at")
    for doc in docs:
        table.add_row(doc["day"], doc["tenant_id"],
                      *(str(doc["files"][n]["rows"]) for n in DATASETS), doc["written_at"])
    console.print(table)
