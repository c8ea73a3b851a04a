"""The recovery store's janitor (``adapters/recovery_store.py``) against Bytewax's own
SQLite store: committed tombstones go, live state stays, and a flow resumed from the swept
store restores exactly the state it had (1 and 2 workers)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

import bytewax.operators as op
import pytest
from bytewax.dataflow import Dataflow
from bytewax.operators import StatefulLogic
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSink, TestingSource, cluster_main, run_main

from notiflow.adapters.recovery_store import commit_age, start_janitor, sweep

pytestmark = pytest.mark.flow
REPO = Path(__file__).resolve().parents[2]


class Count(StatefulLogic[str, tuple[str, int], int]):
    """``keep-*`` keys count their items across restarts; ``drop-*`` keys are discarded at
    once (a recipient without preferences in the send flow's join)."""

    def __init__(self, resume: int | None) -> None:
        self.n = resume or 0

    def on_item(self, value: str) -> tuple[Iterable[tuple[str, int]], bool]:
        self.n += 1
        keep = value.startswith("keep-")
        return [(value, self.n)], StatefulLogic.RETAIN if keep else StatefulLogic.DISCARD

    def snapshot(self) -> int:
        return self.n


def run(items: list[str], store: Path, workers: int) -> list[tuple[str, int]]:
    out: list[tuple[str, tuple[str, int]]] = []
    flow = Dataflow("janitor")
    keyed = op.key_on("key", op.input("in", flow, TestingSource(items, batch_size=50)),
                      lambda x: x)
    counted = op.stateful("count", keyed, Count)
    op.output("out", counted, TestingSink(out))
    config = RecoveryConfig(store)
    if workers == 1:
        run_main(flow, epoch_interval=timedelta(0), recovery_config=config)
    else:
        cluster_main(flow, [], 0, worker_count_per_proc=workers,
                     epoch_interval=timedelta(0), recovery_config=config)
    return [v for _, v in out]


def rows(store: Path) -> tuple[int, int]:
    """(tombstones, live snapshots) of step ``count`` over every partition."""
    dead = live = 0
    for part in store.glob("part-*.sqlite3"):
        with sqlite3.connect(part) as c:
            d, n = c.execute("SELECT SUM(ser_change IS NULL), COUNT(*) FROM snaps "
                             "WHERE step_id LIKE '%count%'").fetchone()
            dead, live = dead + (d or 0), live + (n or 0) - (d or 0)
    return dead, live


@pytest.mark.parametrize("workers", [1, 2])
def test_committed_tombstones_go_and_resume_restores_the_same_state(
        tmp_path: Path, workers: int) -> None:
    store = tmp_path / "recovery"
    store.mkdir()
    init_db_dir(store, 2)
    first = ["keep-a", *(f"drop-{i}" for i in range(300)), "keep-a", "keep-b"]
    out = run(first, store, workers)
    assert sorted(out)[-3:] == [("keep-a", 1), ("keep-a", 2), ("keep-b", 1)]
    dead, live = rows(store)
    assert dead >= 290 and live >= 2

    swept = subprocess.run([sys.executable, "-m", "notiflow.adapters.recovery_store",
                            str(store)], capture_output=True, text=True, check=True)
    assert int(swept.stdout) == dead - rows(store)[0] > 0
    dead_after, live_after = rows(store)
    assert dead_after < 10 and live_after == live

    more = [*first, "keep-a", "drop-0", "keep-b", "keep-c"]
    resumed = run(more, store, workers)
    assert sorted(resumed) == [("drop-0", 1), ("keep-a", 3), ("keep-b", 2), ("keep-c", 1)]


def test_the_janitor_sweeps_a_running_flow_without_harm(tmp_path: Path) -> None:
    """The janitor sweeps every 50 ms while a flow discards 100,000 keys: the store stays
    sound (Bytewax and the sweeps use separate SQLite copies in separate processes), the
    sweeps ran during the flow (Bytewax itself never deletes a tombstone) and the kept
    state survives them."""
    store = tmp_path / "recovery"
    store.mkdir()
    init_db_dir(store, 2)
    n = 100_000
    stop = start_janitor(store, every_s=0.05)
    try:
        out = run(["keep-a", *(f"drop-{i}" for i in range(n)), "keep-a"], store, 1)
    finally:
        stop.set()
    assert ("keep-a", 2) in out and len(out) == n + 2
    for part in store.glob("part-*.sqlite3"):
        with sqlite3.connect(part) as c:
            assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    dead, live = rows(store)
    assert dead < n // 2 and live == 1
    resumed = run(["keep-a", *(f"drop-{i}" for i in range(n)), "keep-a", "keep-a"], store, 1)
    assert resumed == [("keep-a", 3)]


def test_sweep_without_a_commit_deletes_nothing(tmp_path: Path) -> None:
    store = tmp_path / "recovery"
    store.mkdir()
    init_db_dir(store, 1)
    part = next(store.glob("part-*.sqlite3"))
    with sqlite3.connect(part) as c:
        c.execute("INSERT INTO snaps (step_id, state_key, snap_epoch, ser_change) "
                  "VALUES ('s', 'k', 1, NULL)")
    assert sweep(part) == 0
    with sqlite3.connect(part) as c:
        c.execute("INSERT INTO commits (part_index, commit_epoch) VALUES (0, 1)")
        c.execute("INSERT INTO snaps (step_id, state_key, snap_epoch, ser_change) "
                  "VALUES ('s', 'k2', 2, NULL), ('s', 'k3', 1, x'00')")
    assert sweep(part, chunk=1) == 1
    with sqlite3.connect(part) as c:
        assert sorted(c.execute("SELECT state_key FROM snaps").fetchall()) == [("k2",), ("k3",)]


def test_an_idle_flow_still_commits_every_epoch(tmp_path: Path) -> None:
    """The premise of ``notiflow flow alive``: with no record arriving, Bytewax still writes
    its store at each epoch, so the store's age stays within a few epochs."""
    store = tmp_path / "store"
    store.mkdir()
    init_db_dir(store, 2)
    proc = subprocess.Popen([sys.executable, "-m", "bytewax.run", "tests.idle_flow:flow", "-r",
                             str(store), "-s", "1", "-b", "0"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(4)
        ages = []
        for _ in range(4):
            time.sleep(1.5)
            age = commit_age(store, time.time())
            assert age is not None
            ages.append(age)
    finally:
        proc.kill()
        proc.wait()
    assert max(ages) < 3.5, ages
    time.sleep(2)
    assert (commit_age(store, time.time()) or 0) >= 2

