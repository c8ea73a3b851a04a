"""The report's sections as SQL, in ClickHouse's dialect (chDB) and DuckDB's: one query per
section over ``{messages}``, ``{events}``, ``{attempts}`` and ``{receipts}``, which each
engine replaces with its reader of the archive's Parquet files. Both dialects answer the same
columns; ``tests/unit/test_archive_report.py`` runs both over one archive and compares."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

_LATENCY: Final = """
SELECT {key} AS {key}, count(*) AS messages,
       round({q50}) AS p50_ms, round({q90}) AS p90_ms, round({q99}) AS p99_ms
FROM (SELECT coalesce(provider_id, '') AS provider, coalesce(country, '') AS country,
             coalesce(tier, '') AS tier, {diff} AS ms
      FROM {{messages}} WHERE {until} IS NOT NULL AND accepted_at IS NOT NULL) AS t
GROUP BY {key} ORDER BY messages DESC, {key}
"""
_DIALECT: Final = {
    "clickhouse": {"q": "quantile({p})(ms)",
                   "diff": "dateDiff('millisecond', accepted_at, {until})",
                   "refused": "toUInt64(outcome != 'accepted')",
                   "count_if": "countIf({cond})"},
    "duckdb": {"q": "quantile_cont(ms, {p})",
               "diff": "date_diff('millisecond', accepted_at, {until})",
               "refused": "CAST(outcome <> 'accepted' AS BIGINT)",
               "count_if": "count(*) FILTER (WHERE {cond})"},
}


def _latency(dialect: str, key: str, until: str) -> str:
    d = _DIALECT[dialect]
    return _LATENCY.format(key=key, until=until, diff=d["diff"].format(until=until),
                           **{f"q{n}": d["q"].format(p=p)
                              for n, p in (("50", "0.5"), ("90", "0.9"), ("99", "0.99"))})


def _errors(dialect: str) -> str:
    return f"""
SELECT provider, sum(a) AS attempts, sum(r) AS refused, sum(f) AS delivery_failed,
       round((sum(r) + sum(f)) / greatest(sum(a), 1), 4) AS error_rate
FROM (SELECT coalesce(provider_id, '') AS provider, 1 AS a, {_DIALECT[dialect]["refused"]} AS r,
             0 AS f FROM {{attempts}}
      UNION ALL
      SELECT coalesce(provider_id, '') AS provider, 0, 0, 1 FROM {{receipts}}
      WHERE status IN ('FAILED', 'BOUNCED')) AS t
GROUP BY provider ORDER BY attempts DESC, provider
"""


_CODES: Final = """
SELECT provider, stage, code, count(*) AS n
FROM (SELECT coalesce(provider_id, '') AS provider, 'send' AS stage,
             coalesce(error_code, normalized_error, outcome) AS code
      FROM {attempts} WHERE outcome <> 'accepted'
      UNION ALL
      SELECT coalesce(provider_id, '') AS provider, 'receipt' AS stage,
             concat(coalesce(status, ''), ' ', coalesce(error_code, '')) AS code
      FROM {receipts} WHERE status IN ('FAILED', 'BOUNCED')) AS t
GROUP BY provider, stage, code ORDER BY n DESC, provider, code LIMIT 50
"""


def _funnel(dialect: str) -> str:
    def c(cond: str) -> str:
        return _DIALECT[dialect]["count_if"].format(cond=cond)

    return f"""
SELECT campaign_id, count(*) AS accepted,
       {c("provider_accepted_at IS NOT NULL")} AS provider_accepted,
       {c("delivered_at IS NOT NULL")} AS delivered, {c("opened_at IS NOT NULL")} AS opened,
       {c("clicked_at IS NOT NULL")} AS clicked, {c("failed_at IS NOT NULL")} AS failed,
       {c("status = 'SUPPRESSED'")} AS suppressed
FROM {{messages}} WHERE campaign_id IS NOT NULL
GROUP BY campaign_id ORDER BY accepted DESC, campaign_id
"""


def _sections(dialect: str) -> dict[str, str]:
    return {
        "latency_by_provider": _latency(dialect, "provider", "delivered_at"),
        "latency_by_country": _latency(dialect, "country", "delivered_at"),
        "latency_by_tier": _latency(dialect, "tier", "delivered_at"),
        "provider_accepted_by_tier": _latency(dialect, "tier", "provider_accepted_at"),
        "errors_by_provider": _errors(dialect),
        "error_codes": _CODES,
        "campaign_funnel": _funnel(dialect),
    }


QUERIES: Final[Mapping[str, Mapping[str, str]]] = {
    name: {dialect: _sections(dialect)[name] for dialect in _DIALECT}
    for name in _sections("clickhouse")
}
"""Section → dialect → SQL."""
