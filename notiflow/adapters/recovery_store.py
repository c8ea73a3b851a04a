"""Housekeeping of Bytewax's recovery store: committed tombstones are deleted.

Bytewax 0.21 records a *tombstone* (a ``snaps`` row whose ``ser_change`` is NULL) for every
key a stateful step discards, and its garbage collection keeps the newest row of every key,
tombstones included; each epoch's commit then runs a ``GROUP BY`` over every row ever
written. The send flow's preference join is keyed by recipient and discards every recipient
without preferences, so a campaign left one row per recipient in the store forever: CPU per
epoch and the store's page cache grew with every recipient ever messaged
(``python -m notiflow.bench.keyed_state``: 200,000 new keys cost 12 µs each, 600,000
cost 364 µs each).

A tombstone at or before its partition's committed epoch carries nothing: Bytewax resumes
from an epoch at or after that commit and loads each key's newest row before it, and its own
collection has already deleted every older row of that key, so "tombstone" and "no row" load
the same (no state). :func:`sweep` deletes exactly those rows, in short transactions (the
store is in WAL mode and Bytewax waits up to 5 s for a lock), from another process
(:func:`start_janitor`).
"""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 30.0
CHUNK = 2000

_DELETE = """
DELETE FROM snaps WHERE rowid IN (
    SELECT rowid FROM snaps
    WHERE ser_change IS NULL
      AND snap_epoch <= (SELECT MAX(commit_epoch) FROM commits)
    LIMIT ?)
"""


def sweep(partition: Path, chunk: int = CHUNK) -> int:
    """Delete the committed tombstones of one recovery partition file; returns how many."""
    conn = sqlite3.connect(partition, timeout=5.0, isolation_level=None)
    try:
        deleted = 0
        while True:
            n = conn.execute(_DELETE, (chunk,)).rowcount
            deleted += n
            if n < chunk:
                return deleted
    finally:
        conn.close()


def commit_age(recovery_dir: Path, now: float) -> float | None:
    """Seconds since Bytewax last wrote any partition of the store (its files or their
    write-ahead logs), ``None`` when it has no partition. Bytewax commits every epoch even
    when no record arrives, so a running flow keeps this within about one epoch; a wedged
    one (a worker stuck, a cluster waiting for a peer that never comes) lets it grow: the
    flows' liveness probe (:func:`main` with ``--alive``)."""
    stamps = [f.stat().st_mtime for f in recovery_dir.glob("part-*.sqlite3*")]
    return max(0.0, now - max(stamps)) if stamps else None


def sweep_all(recovery_dir: Path) -> int:
    """:func:`sweep` every partition of a recovery store."""
    return sum(sweep(p) for p in sorted(recovery_dir.glob("part-*.sqlite3")))


def start_janitor(recovery_dir: Path, every_s: float = SWEEP_EVERY_S) -> threading.Event:
    """Sweep ``recovery_dir`` every ``every_s`` seconds until the returned event is set.

    Each sweep runs in a short-lived child process (``python -m
    notiflow.adapters.recovery_store DIR``), never in the flow's process: Bytewax links its
    own copy of SQLite, and two SQLite copies in one process corrupt a database (POSIX locks
    belong to the process, so one copy closing the file drops the other's locks; measured: a
    sweep from a thread of the flow's process made the store "malformed" within seconds). A
    failed sweep is logged and tried again next time; it never stops the flow."""
    stop = threading.Event()
    command = [sys.executable, "-m", "notiflow.adapters.recovery_store", str(recovery_dir)]

    def loop() -> None:
        while not stop.wait(every_s):
            try:
                done = subprocess.run(command, capture_output=True, text=True,
                                      timeout=max(every_s, 60.0), check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("recovery store sweep failed: %r", exc)
                continue
            if done.returncode != 0:
                log.warning("recovery store sweep failed: %s", done.stderr.strip()[-500:])
            elif done.stdout.strip() not in ("", "0"):
                log.debug("recovery store: %s committed tombstones deleted",
                          done.stdout.strip())

    threading.Thread(target=loop, name="recovery-janitor", daemon=True).start()
    return stop


def main(argv: list[str]) -> int:
    """``python -m notiflow.adapters.recovery_store DIR``: one sweep; prints the count.
    ``... DIR --alive SECONDS``: the flows' liveness probe, exit 0 while the store was
    written within SECONDS (:func:`commit_age`), else 1; it imports no more than this
    module, so a probe costs a few milliseconds of the flow's CPU."""
    if len(argv) == 3 and argv[1] == "--alive":
        age, limit = commit_age(Path(argv[0]), time.time()), float(argv[2])
        if age is None:
            print(f"no recovery partitions in {argv[0]}")
            return 1
        print(f"last commit {age:.1f} s ago (limit {limit:g} s)")
        return 0 if age <= limit else 1
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python -m notiflow.adapters.recovery_store RECOVERY_DIR "
              "[--alive SECONDS]", file=sys.stderr)
        return 2
    print(sweep_all(Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
