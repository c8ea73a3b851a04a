"""What ``notiflow demo`` measures and prints: the warm-up's stop rule and summary line, the
per-tier rows of the measured run, the report's heading and table, and the lines that let a
newcomer call the API the demo leaves running. Pure: no process, no network, no clock."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from rich import box
from rich.console import Console
from rich.table import Table

from notiflow.schemas.enums import TERMINAL_STATUSES, Status, Tier

WARMUP_BOUND = 60.0
"""Seconds of warm-up waves after which the demo measures anyway (and says so)."""
SETTLE_TOLERANCE = 0.2
"""A wave's P0 p50 within this fraction of the previous wave's: latency stopped falling."""


@dataclass(frozen=True)
class Sent:
    """One request the API accepted (202)."""

    message_id: str
    tier: Tier
    accepted_at: datetime


@dataclass(frozen=True)
class Wave:
    """One warm-up wave: requests sent, seconds from its first request until it drained (or
    the bound), and its P0 latency quantiles in ms (None without any P0 latency)."""

    requests: int
    seconds: float
    p50: float | None
    p99: float | None


class Verdict(StrEnum):
    """After a warm-up wave: latency settled, the time bound is reached, or another wave."""

    SETTLED = "settled"
    BOUND = "bound"
    GO_ON = "go on"


@dataclass
class WarmUp:
    """Everything the warm-up sent (the readiness probe and the waves) and what it found."""

    sent: list[Sent] = field(default_factory=list)
    statuses: dict[str, Status] = field(default_factory=dict)
    rejected: Counter[str] = field(default_factory=Counter)
    waves: list[Wave] = field(default_factory=list)
    verdict: Verdict = Verdict.GO_ON
    requests: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class TierRow:
    """One tier of the measured run; latencies in ms, None without any."""

    tier: Tier
    sla: timedelta
    accepted: int
    provider_accepted: int
    failed: int
    expired_suppressed: int
    not_terminal: int
    p50: float | None
    p99: float | None
    max: float | None

    @property
    def meets_sla(self) -> bool | None:
        """Whether p99 is under the SLA; None when nothing was measured."""
        return None if self.p99 is None else self.p99 < self.sla.total_seconds() * 1000


def quantile(values: Sequence[float], p: int) -> float | None:
    """The ``p``-th percentile (inclusive method); None for no values."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def warmup_verdict(waves: Sequence[Wave], elapsed: float, *, sla_ms: float,
                   bound: float = WARMUP_BOUND,
                   tolerance: float = SETTLE_TOLERANCE) -> Verdict:
    """The stop rule, after each wave. SETTLED: the last wave's P0 p99 is under ``sla_ms``
    and its P0 p50 is within ``tolerance`` (a fraction) of the wave before's. Else BOUND when
    another wave as long as the last would end after ``bound`` seconds of warm-up
    (``elapsed`` so far). Else GO_ON."""
    if len(waves) >= 2:
        prev, last = waves[-2], waves[-1]
        if (last.p99 is not None and last.p50 is not None and prev.p50 is not None
                and last.p99 < sla_ms and abs(last.p50 - prev.p50) <= tolerance * prev.p50):
            return Verdict.SETTLED
    next_wave = waves[-1].seconds if waves else 0.0
    return Verdict.BOUND if elapsed + next_wave > bound else Verdict.GO_ON


def format_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def format_sla(sla: timedelta) -> str:
    """``"< 1 s"``, ``"< 5 min"``, ``"< 1 h"``: the largest unit that divides the SLA."""
    seconds = sla.total_seconds()
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"< {seconds / size:g} {unit}"
    return f"< {seconds:g} s"


def warmup_summary(warm: WarmUp, *, sla: timedelta, bound: float = WARMUP_BOUND,
                   tolerance: float = SETTLE_TOLERANCE) -> str:
    """One line: the warm-up's size and duration, each wave's P0 p50/p99 and why it stopped."""
    figures = " → ".join(f"{format_ms(w.p50)}/{format_ms(w.p99)}" for w in warm.waves) or "-"
    rejected = sum(warm.rejected.values())
    if warm.verdict is Verdict.SETTLED:
        why = f"settled (p50 ±{tolerance:.0%}, p99 {format_sla(sla)})"
    else:
        why = f"{bound:.0f} s bound reached, P0 latency not settled"
    return (f"warm-up, not reported: {warm.requests} messages / {warm.seconds:.0f} s"
            + (f" ({rejected} rejected)" if rejected else "")
            + f"; P0 p50/p99 ms by wave: {figures}; {why}")


def try_it(api: str, tokens: Mapping[str, str], version: int, recipient: str) -> list[str]:
    """What a newcomer needs to call the API the demo leaves running: each tenant's bearer
    token and one ``curl`` line that sends a P1 SMS as ``acme`` through its ``demo-code``
    template (version ``version``)."""
    body = json.dumps({"channel": "SMS", "tier": "P1", "recipient": recipient,
                       "template_id": "demo-code", "template_version": version,
                       "variables": {"brand": "Notiflow", "code": "123456", "minutes": 5}},
                      separators=(",", ":"))
    lines = ["tenant tokens (development only; each tenant may send the tiers it is "
             "configured for):"]
    lines += [f"  {tenant}: {token}" for tenant, token in sorted(tokens.items())]
    lines += [
        "send one (the same Idempotency-Key with the same body gets the original answer; "
        "change the key to send again):",
        f"  curl -sS -X POST {api}/v1/messages -H 'Authorization: Bearer {tokens['acme']}' "
        f"-H 'Idempotency-Key: try-1' -H 'Content-Type: application/json' -d '{body}'",
        f"then: curl -sS {api}/v1/messages/<message_id> -H 'Authorization: Bearer "
        f"{tokens['acme']}', or notiflow status <message_id>"]
    return lines


def report_heading(*, requests: int, seconds: float, warm_requests: int, warm_seconds: float,
                   cores: int, load: float | None = None) -> str:
    """What the table measured: the run, its load, the warm-up before it, the clock, the
    machine (``load``: its 1-minute load average when the run started)."""
    rate = requests / seconds if seconds > 0 else 0.0
    machine = f"{cores} cores" + ("" if load is None else
                                  f", 1-min load average {load:.1f} at the start")
    return (f"measured run of {requests} messages at {rate / len(Tier):.1f} msg/s per tier "
            f"({rate:.1f} msg/s through the API), after a warm-up of {warm_requests} messages"
            f" / {warm_seconds:.0f} s\nlatency = emulator receipt time - accepted_at; one "
            f"machine ({machine}), one clock")


def terminal(statuses: Mapping[str, Status], message_id: str) -> bool:
    """Whether ``statuses`` (message_id → status) holds ``message_id`` with a terminal
    status."""
    return statuses.get(message_id) in TERMINAL_STATUSES


def tier_rows(sent: Sequence[Sent], statuses: Mapping[str, Status],
              latency: Mapping[str, float], slas: Mapping[Tier, timedelta]) -> list[TierRow]:
    """Per tier, in tier order: counts by status from ``statuses`` (message_id → status),
    latency quantiles from ``latency`` (message_id → ms), each tier's SLA from ``slas``."""
    by_tier: dict[Tier, list[Sent]] = defaultdict(list)
    for s in sent:
        by_tier[s.tier].append(s)
    out = []
    for tier in Tier:
        items = by_tier.get(tier, [])
        counts = Counter(statuses.get(s.message_id, "MISSING") for s in items)
        ok = sum(counts[x] for x in (Status.PROVIDER_ACCEPTED, Status.SENT, Status.DELIVERED))
        other = counts[Status.EXPIRED] + counts[Status.SUPPRESSED]
        lat = sorted(latency[s.message_id] for s in items if s.message_id in latency)
        out.append(TierRow(
            tier=tier, sla=slas[tier], accepted=len(items), provider_accepted=ok,
            failed=counts[Status.FAILED], expired_suppressed=other,
            not_terminal=sum(not terminal(statuses, s.message_id) for s in items),
            p50=quantile(lat, 50), p99=quantile(lat, 99), max=lat[-1] if lat else None))
    return out


REPORT_COLUMNS = ("tier", "SLA\n(p99)", "accepted", "provider\naccepted", "failed",
                  "expired or\nsuppressed", "not\nterminal", "p50\nms", "p99\nms", "max\nms",
                  "meets\nSLA")


def row_cells(row: TierRow) -> list[str]:
    """The table's cells for ``row``, in :data:`REPORT_COLUMNS` order."""
    meets = {True: "yes", False: "no", None: "-"}[row.meets_sla]
    return [row.tier.value, format_sla(row.sla), str(row.accepted), str(row.provider_accepted),
            str(row.failed), str(row.expired_suppressed), str(row.not_terminal),
            format_ms(row.p50), format_ms(row.p99), format_ms(row.max), meets]


def report(console: Console, heading: str, rows: Sequence[TierRow]) -> None:
    """Print the heading and the per-tier table."""
    console.print(heading, highlight=False)
    table = Table(title="measured run: acceptance → provider acceptance", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True, title_justify="left")
    for i, name in enumerate(REPORT_COLUMNS):
        table.add_column(name, justify="left" if i < 2 else "right", no_wrap=i == 1)
    style = {True: "green", False: "red", None: ""}
    for row in rows:
        cells = row_cells(row)
        colour = style[row.meets_sla]
        table.add_row(*cells[:-1], f"[{colour}]{cells[-1]}[/{colour}]" if colour else cells[-1])
    console.print(table)
