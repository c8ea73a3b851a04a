"""A flow's liveness probe: the age of its recovery store's last write
(``python -m notiflow.adapters.recovery_store DIR --alive SECONDS``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from notiflow.adapters.recovery_store import commit_age, main


def store(tmp_path: Path, *ages: float) -> Path:
    now = time.time()
    for i, age in enumerate(ages):
        f = tmp_path / f"part-{i}.sqlite3{'-wal' if i % 2 else ''}"
        f.write_bytes(b"x")
        os.utime(f, (now - age, now - age))
    (tmp_path / "unrelated.log").write_bytes(b"x")
    return tmp_path


def test_the_newest_partition_write_counts(tmp_path: Path) -> None:
    age = commit_age(store(tmp_path, 400, 7, 90), time.time())
    assert age is not None and 6 < age < 9


def test_a_store_without_partitions_has_no_age(tmp_path: Path) -> None:
    assert commit_age(tmp_path, time.time()) is None


def test_the_probe_passes_within_the_limit_and_fails_beyond(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "fresh").mkdir()
    (tmp_path / "stale").mkdir()
    fresh, stale = store(tmp_path / "fresh", 3), store(tmp_path / "stale", 300)
    assert main([str(fresh), "--alive", "60"]) == 0
    assert "last commit" in capsys.readouterr().out
    assert main([str(stale), "--alive", "60"]) == 1
    assert "limit 60 s" in capsys.readouterr().out
    assert main([str(tmp_path), "--alive", "60"]) == 1
    assert "no recovery partitions" in capsys.readouterr().out
    assert main([str(fresh), "--alive"]) == 2
