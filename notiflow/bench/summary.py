"""What ``bench/figures/`` keeps of a benchmark run: its summary.

A run's full JSON (``bench/results/``) holds raw series recorded per message or per sample; a
summary replaces them with the per-window aggregates the PNG draws and keeps every other
field, all of which the Markdown report reads or which are summaries already (percentiles,
rates, per-process CPU and RSS, latency budgets, pauses, stall intervals):

- ``modes.<mode>.timeline`` (P0: every OTP's (t, latency); P3: every k-th message's) becomes
  ``modes.<mode>.latency``: per tier, one row :data:`LATENCY_COLUMNS` per window of
  ``window_s`` seconds in which a message reached an emulator (``sampled``: tiers whose
  windows count only the k-th messages an older full JSON kept, not every message).
- ``modes.<mode>.host.timeline`` (every host sample, eleven counters) becomes
  ``modes.<mode>.host.pressure``: the three pressure series the PNG plots, one row
  :data:`PRESSURE_COLUMNS` per sample, or per group of consecutive samples (their mean) when
  there are more than :data:`MAX_WINDOWS`.
- ``modes.<mode>.cpu_timeline`` (every process's CPU share at every sample) is dropped:
  nothing renders it.

:func:`summarize` is idempotent, and the report renders the same Markdown and PNG from a run's
full JSON and from its summary (the plot reads its series through :func:`latency_of` and
:func:`pressure_of`, which aggregate a full JSON's raw series the same way).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from notiflow.bench.stats import percentile

MAX_WINDOWS = 600
"""Rows per series at most: about one per pixel of a PNG panel (6.5 in at 110 dpi)."""
LATENCY_COLUMNS = ("t", "n", "min", "p50", "p99", "max")
"""A latency row: window start (s since the flood started), messages, latency ms."""
PRESSURE_COLUMNS = ("t", "cpu_some_ms", "io_some_ms", "io_full_ms")
"""A pressure row: s since the flood started, ms of pressure stall per second."""


def latency_windows(timeline: Mapping[str, Sequence[Sequence[float]]]) -> dict[str, Any]:
    """Per tier of a ``{tier: [(t, latency ms), ...]}`` timeline: rows of
    :data:`LATENCY_COLUMNS`, one per window (of ``window_s`` seconds, the same for every
    tier, at most :data:`MAX_WINDOWS` over the run) holding at least one message."""
    span = max((float(p[0]) for pts in timeline.values() for p in pts), default=0.0)
    width = max(1, math.ceil(span / MAX_WINDOWS))
    tiers: dict[str, list[list[float]]] = {}
    for tier, pts in timeline.items():
        groups: dict[int, list[float]] = {}
        for t, lat in pts:
            groups.setdefault(math.floor(t / width), []).append(float(lat))
        tiers[tier] = [[k * width, len(v), *(round(x, 1) for x in _spread(v))]
                       for k, v in sorted(groups.items())]
    return {"window_s": width, "columns": list(LATENCY_COLUMNS), "tiers": tiers}


def _spread(values: list[float]) -> tuple[float, float, float, float]:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    assert p50 is not None and p99 is not None
    return min(values), p50, p99, max(values)


def pressure_windows(rows: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """The plotted pressure series of a host timeline (:func:`notiflow.bench.host.timeline`):
    rows of :data:`PRESSURE_COLUMNS`; groups of ``samples_per_row`` consecutive rows are averaged
    (``t``: the group's last) so that at most :data:`MAX_WINDOWS` rows remain."""
    size = max(1, math.ceil(len(rows) / MAX_WINDOWS))
    out = []
    for i in range(0, len(rows), size):
        group = rows[i:i + size]
        out.append([group[-1]["t"], *(round(sum(r[k] for r in group) / len(group), 1)
                                      for k in PRESSURE_COLUMNS[1:])])
    return {"samples_per_row": size, "columns": list(PRESSURE_COLUMNS), "rows": out}


def latency_of(mode: Mapping[str, Any]) -> dict[str, Any] | None:
    """A mode's latency windows: the stored ones, else those of its raw timeline."""
    if mode.get("latency"):
        return dict(mode["latency"])
    if mode.get("timeline"):
        return latency_windows(mode["timeline"])
    return None


def pressure_of(mode: Mapping[str, Any]) -> dict[str, Any] | None:
    """A mode's pressure rows: the stored ones, else those of its host timeline."""
    machine = mode.get("host") or {}
    if machine.get("pressure"):
        return dict(machine["pressure"])
    if machine.get("timeline"):
        return pressure_windows(machine["timeline"])
    return None


def summarize(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The summary of a benchmark document (any ``bench``; those without raw series come back
    unchanged but for the ``summary`` marker): a new, JSON-plain document; ``summary.dropped``
    lists the raw fields removed, from this and earlier passes."""
    out: dict[str, Any] = json.loads(json.dumps(doc, default=str))
    marker = out.get("summary") or {}
    dropped: list[str] = list(marker.get("dropped") or [])
    for name, mode in (out.get("modes") or {}).items():
        latency = latency_of(mode)
        if latency is not None and not mode.get("latency"):
            sampled = [tier for tier, rows in latency["tiers"].items()
                       if sum(r[1] for r in rows) < ((mode.get(tier) or {}).get("n") or 0)]
            mode["latency"] = {**latency, **({"sampled": sampled} if sampled else {})}
        machine = mode.get("host") or {}
        pressure = pressure_of(mode)
        if pressure is not None:
            machine["pressure"] = pressure
        for path, holder, key in ((f"modes.{name}.timeline", mode, "timeline"),
                                  (f"modes.{name}.cpu_timeline", mode, "cpu_timeline"),
                                  (f"modes.{name}.host.timeline", machine, "timeline")):
            if key in holder:
                del holder[key]
                if path not in dropped:
                    dropped.append(path)
    timeline = out.get("timeline") if out.get("bench") == "campaign" else None
    if timeline and "p0_worst_per_s" not in timeline:
        worst: dict[int, float] = {}
        for t, lat in timeline.pop("p0", []):
            worst[int(t)] = max(lat, worst.get(int(t), 0.0))
        timeline["p0_worst_per_s"] = sorted(worst.items())
        progress = timeline.get("progress") or []
        timeline["progress"] = [{k: p[k] for k in ("t", "read", "expanded", "provider_accepted",
                                                  "state")}
                                for i, p in enumerate(progress)
                                if i % 5 == 0 or i == len(progress) - 1]
        dropped += ["timeline.p0", "timeline.progress (every 5th sample kept)"]
    out["summary"] = {**marker, "dropped": dropped}
    return out


def dumps(doc: Any) -> str:
    """``doc`` as JSON for a person and a diff: one object key a line, a list of scalars on
    one line, a list of lists or objects one item a line."""
    return _dumps(json.loads(json.dumps(doc, default=str)), 0) + "\n"


def _dumps(value: Any, depth: int) -> str:
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict) and value:
        body = ",\n".join(f"{inner}{json.dumps(k)}: {_dumps(v, depth + 1)}"
                          for k, v in value.items())
        return "{\n" + body + "\n" + pad + "}"
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        body = ",\n".join(inner + _dumps(v, depth + 1) for v in value)
        return "[\n" + body + "\n" + pad + "]"
    return json.dumps(value)
