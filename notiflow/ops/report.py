"""``notiflow report``: delivery analytics over the history archive (``notiflow/archive.py``),
in ClickHouse SQL run by the embedded chDB engine, or the same sections in DuckDB's SQL
(``report_sql.py``).

The (day, tenant)s in range that have a manifest are fetched from object storage into a
temporary directory and queried there (``file(...)`` over their Parquet files): delivery
latency percentiles by provider, country and tier; error rates by provider and the codes
behind them (send refusals and failure receipts, carrier codes included); a funnel per
campaign. Printed as tables; written as ``report.json`` and PNG plots.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from notiflow.archive import DATASETS, VERSION
from notiflow.ops.report_sql import QUERIES

if TYPE_CHECKING:
    from notiflow.adapters.object_store import ObjectStore

TITLES: Final = {
    "latency_by_provider": "Accepted → DELIVERED latency by provider",
    "latency_by_country": "Accepted → DELIVERED latency by country (SMS)",
    "latency_by_tier": "Accepted → DELIVERED latency by tier",
    "provider_accepted_by_tier": "Accepted → PROVIDER_ACCEPTED latency by tier",
    "errors_by_provider": "Error rates by provider (send refusals + failure receipts)",
    "error_codes": "Error codes by provider",
    "campaign_funnel": "Funnel per campaign",
}


class Engine(Protocol):
    """Runs one query of its ``dialect`` (``report_sql.QUERIES``) over the archive's
    datasets."""

    name: str
    dialect: str

    def query(self, sql: str) -> list[dict[str, Any]]: ...


def sources(root: Path, reader: str) -> dict[str, str]:
    """Each dataset's reader expression: ``reader`` around the glob of its Parquet files."""
    return {d: reader.format(f"{root}/{VERSION}/{d}/**/*.parquet") for d in DATASETS}


class Chdb:
    """chDB (in-process ClickHouse) over a directory of fetched Parquet files."""

    name = "chdb"
    dialect = "clickhouse"

    def __init__(self, root: Path) -> None:
        self.root = root

    def query(self, sql: str) -> list[dict[str, Any]]:
        import chdb

        text = sql.format(**sources(self.root, "file('{}', Parquet)"))
        out = chdb.query(text, "JSONEachRow")
        return [json.loads(line) for line in out.bytes().decode().splitlines() if line.strip()]


class Duckdb:
    """DuckDB over the same directory (an in-memory database per report)."""

    name = "duckdb"
    dialect = "duckdb"

    def __init__(self, root: Path) -> None:
        self.root = root

    def query(self, sql: str) -> list[dict[str, Any]]:
        import duckdb

        text = sql.format(**sources(self.root, "read_parquet('{}')"))
        with duckdb.connect() as con:
            rel = con.sql(text)
            return [dict(zip(rel.columns, row, strict=True)) for row in rel.fetchall()]


ENGINES: Final[Mapping[str, Callable[[Path], Engine]]] = {"chdb": Chdb, "duckdb": Duckdb}


@dataclass(frozen=True, slots=True)
class Fetched:
    """What a report covers: the archived (day, tenant)s and the directory holding them."""

    root: Path
    parts: tuple[tuple[str, str], ...]


async def fetch(store: ObjectStore, prefix: str, manifests: Sequence[Mapping[str, Any]],
                root: Path) -> Fetched:
    """Copy the Parquet files ``manifests`` name under ``root``, keeping their keys
    (streamed: a chunk at a time in memory)."""
    parts = []
    for doc in manifests:
        for f in doc["files"].values():
            key = f"{prefix.rstrip('/')}/{f['key']}" if prefix else f["key"]
            path = root / f["key"]
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as out:
                async for chunk in store.stream(key):
                    out.write(chunk)
        parts.append((doc["day"], doc["tenant_id"]))
    return Fetched(root, tuple(parts))


def run(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    """Every section of ``report_sql.QUERIES``, in the engine's dialect."""
    return {name: engine.query(sql[engine.dialect]) for name, sql in QUERIES.items()}


def plot(results: Mapping[str, list[dict[str, Any]]], out: Path) -> list[Path]:
    """PNG plots of the latency, error-rate and funnel sections (those with rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    latency = [("latency_by_provider", "provider"), ("latency_by_tier", "tier"),
               ("latency_by_country", "country")]
    rows = [(n, k) for n, k in latency if results.get(n)]
    if rows:
        fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 4), squeeze=False)
        for ax, (name, key) in zip(axes[0], rows, strict=True):
            data = results[name][:12]
            xs = range(len(data))
            for i, q in enumerate(("p50_ms", "p90_ms", "p99_ms")):
                ax.bar([x + (i - 1) * 0.27 for x in xs], [r[q] for r in data], 0.27, label=q)
            ax.set_xticks(list(xs), [str(r[key]) or "(none)" for r in data], rotation=30)
            ax.set_title(TITLES[name], fontsize=9)
            ax.set_ylabel("ms")
            ax.legend(fontsize=7)
        fig.tight_layout()
        written.append(_save(fig, out / "latency.png", plt))
    if results.get("errors_by_provider"):
        data = results["errors_by_provider"]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.bar([r["provider"] for r in data], [100 * r["error_rate"] for r in data])
        ax.set_ylabel("% of attempts")
        ax.set_title(TITLES["errors_by_provider"], fontsize=9)
        fig.tight_layout()
        written.append(_save(fig, out / "errors.png", plt))
    if results.get("campaign_funnel"):
        stages = ("accepted", "provider_accepted", "delivered", "opened", "clicked")
        data = results["campaign_funnel"][:8]
        fig, ax = plt.subplots(figsize=(8, 1.2 + 0.8 * len(data)))
        for i, r in enumerate(data):
            name = str(r["campaign_id"])[:12]
            ax.barh([f"{name}… {s}" for s in stages], [r[s] for s in stages], color=f"C{i}")
        ax.invert_yaxis()
        ax.set_xlabel("messages")
        ax.set_title(TITLES["campaign_funnel"], fontsize=9)
        fig.tight_layout()
        written.append(_save(fig, out / "funnel.png", plt))
    return written


def _save(fig: Any, path: Path, plt: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def temporary_root() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="notiflow-report-")
