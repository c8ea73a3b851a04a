"""Small, pure figures: percentiles, rates over the steady part of a run, profile summaries."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (``p`` in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, p50, p99 and max of latencies (milliseconds)."""
    return {"n": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "max": max(values) if values else None}


def steady_rate(times: Iterable[float], lo: float = 0.1, hi: float = 0.9) -> float | None:
    """Events per second between the ``lo`` and ``hi`` quantiles of their timestamps (start-up
    and tail excluded); None with fewer than 10 events."""
    ordered = sorted(times)
    if len(ordered) < 10:
        return None
    a = ordered[int(lo * (len(ordered) - 1))]
    b = ordered[int(hi * (len(ordered) - 1))]
    if b <= a:
        return None
    return (int(hi * (len(ordered) - 1)) - int(lo * (len(ordered) - 1))) / (b - a)


_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_OURS = ("/flows/", "/adapters/", "/notiflow/", "/gateway/", "/schemas/")
_SKIP = ("/bench/", "/notiflow/cli.py", "/flows/runner.py", "/adapters/worker.py")


def _parse(frame: str) -> tuple[str, str]:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip(), ""
    return m["func"], m["file"]


def _short(func: str, file: str) -> str:
    parts = file.replace("\\", "/").split("/")
    tail = "/".join(parts[-2:]) if len(parts) >= 2 else file
    return f"{func} ({tail})" if file else func


def profile_top(collapsed: str, k: int = 5) -> dict[str, list[tuple[str, float]]]:
    """From py-spy's ``raw`` output (collapsed stacks: ``frame;frame;... count``): the top
    ``k`` functions by self time (any code), and the top ``k`` *stages*: each sample charged
    to the innermost function of the project's own code on its stack (so a step's library
    calls count for the step; the runner and CLI frames above every step are skipped), each
    as (name, share of all samples)."""
    self_time: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_parse(f) for f in stack.split(";") if f]
        if not frames:
            continue
        self_time[_short(*frames[-1])] += count
        stage = "(outside the project's steps: runtime, polling, idle loops)"
        for func, file in reversed(frames):
            path = "/" + file.replace("\\", "/")
            if (any(o in path for o in _OURS) and not any(o in path for o in _SKIP)):
                stage = _short(func, file)
                break
        stages[stage] += count
    if not total:
        return {"self": [], "stages": [], "samples": []}
    return {
        "self": [(n, c / total) for n, c in self_time.most_common(k)],
        "stages": [(n, c / total) for n, c in stages.most_common(k)],
        "samples": [("total", float(total))],
    }
