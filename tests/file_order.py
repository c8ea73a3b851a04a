"""The order a session runs its test files in: the costliest first.

``pytest -n 2 --dist loadfile`` hands a worker one whole file at a time, in collection order.
Files started last decide when the session ends, so the run is shortest when the long files
go first and the many short ones fill in behind them. ``tests/file_costs.json`` holds each
file's seconds (setup, call and teardown summed) from a full run; a file not in it (new) is
treated as the costliest, so it is never the one left running alone at the end.

Every session writes what it measured to ``<stack dir>/logs/test-costs-<run id>.json``
(``Tally``); refresh the table from the files of one full run::

    .venv/bin/python -m tests.file_order .stack/logs/test-costs-*.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

COSTS = Path(__file__).with_name("file_costs.json")


def load_costs(path: Path = COSTS) -> dict[str, float]:
    """File (relative to the repository) → seconds; empty if the table is missing."""
    if not path.exists():
        return {}
    return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}


def order(items: list[pytest.Item], costs: dict[str, float]) -> None:
    """Sort ``items`` in place: tests marked ``disruptive`` last (they kill shared servers),
    then by their file's cost, costliest first; the order within a file is kept."""
    def key(item: pytest.Item) -> tuple[bool, float]:
        return (item.get_closest_marker("disruptive") is not None,
                -costs.get(file_of(item.nodeid), float("inf")))

    items.sort(key=key)


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class Tally:
    """Seconds per test file, summed from the reports of one session (with xdist: the
    controller's, which receives every worker's reports)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, report: pytest.TestReport) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rounded(self.seconds), indent=0, sort_keys=True) + "\n")


def rounded(seconds: dict[str, float]) -> dict[str, float]:
    return {name: round(total, 2) for name, total in sorted(seconds.items())}


def merge(paths: list[Path]) -> dict[str, float]:
    """Several sessions' tallies (the parts of one run) summed per file."""
    totals: dict[str, float] = defaultdict(float)
    for path in paths:
        for name, seconds in json.loads(path.read_text()).items():
            totals[name] += float(seconds)
    return rounded(totals)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests.file_order TEST_COSTS_JSON...", file=sys.stderr)
        return 2
    costs = merge([Path(a) for a in argv])
    COSTS.write_text(json.dumps(costs, indent=0, sort_keys=True) + "\n")
    print(f"{len(costs)} files, {sum(costs.values()):.0f} s in all -> {COSTS.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
