"""The order the test command hands files to its workers (``tests/file_order.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from tests.file_order import Tally, merge, order


@dataclass
class Item:
    nodeid: str
    markers: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.markers else None


@dataclass
class Report:
    nodeid: str
    duration: float


def test_the_parts_of_a_run_are_summed_per_file(tmp_path: Path) -> None:
    tallies = [Tally(), Tally()]
    for part, (nodeid, seconds) in [(0, ("tests/x/test_a.py::t[1]", 1.5)),
                                    (0, ("tests/x/test_a.py::t[2]", 2.0)),
                                    (1, ("tests/x/test_a.py::solo", 10.0)),
                                    (1, ("tests/unit/test_b.py::C::t", 0.25))]:
        tallies[part].add(cast(pytest.TestReport, Report(nodeid, seconds)))
    paths = [tmp_path / "one.json", tmp_path / "two.json"]
    for tally, path in zip(tallies, paths, strict=True):
        tally.write(path)
    assert json.loads(paths[0].read_text()) == {"tests/x/test_a.py": 3.5}
    assert merge(paths) == {"tests/unit/test_b.py": 0.25, "tests/x/test_a.py": 13.5}


def test_costliest_files_first_new_files_before_known_ones_disruptive_last() -> None:
    items = [Item("tests/unit/test_cheap.py::a"), Item("tests/x/test_dear.py::a"),
             Item("tests/x/test_kill.py::a", {"disruptive"}), Item("tests/x/test_new.py::a"),
             Item("tests/unit/test_cheap.py::b"), Item("tests/x/test_dear.py::b")]
    costs = {"tests/unit/test_cheap.py": 1.0, "tests/x/test_dear.py": 90.0,
             "tests/x/test_kill.py": 500.0}
    order(cast(list[pytest.Item], items), costs)
    assert [i.nodeid for i in items] == [
        "tests/x/test_new.py::a", "tests/x/test_dear.py::a", "tests/x/test_dear.py::b",
        "tests/unit/test_cheap.py::a", "tests/unit/test_cheap.py::b", "tests/x/test_kill.py::a"]
