"""What a keyed Bytewax step costs per key it has never seen: RSS and CPU, with and without
recovery.

The send flow joins every message with its recipient's preferences in a step keyed by
recipient; a campaign's recipients are new keys, each discarded at once (no preferences).
``python -m notiflow.bench.keyed_state`` runs such a step over N items with unique keys and
with 100 repeating keys, each without a recovery store, with one, and with one that the
project's janitor (``adapters/recovery_store.py``) sweeps; one child process per case so RSS
is the case's own; prints a table
(``docs/decisions/2026-11-30-keyed-state-out-of-the-send-flow.md``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

import psutil

CASES = [(n, unique, recovery) for n in (50_000, 200_000, 600_000)
         for unique in (True, False) for recovery in ("no", "yes", "swept")]
"""(items, unique keys or 100 repeating, recovery: none / Bytewax's store / the store with
the project's janitor sweeping it every second)."""


def _rss_mib() -> float:
    return float(psutil.Process().memory_info().rss) / 2**20


def run_case(n: int, unique: bool, recovery: str) -> str:
    """One case in this process: ``n,unique,recovery,rss_before,rss_after,cpu_s``."""
    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.operators import StatefulLogic
    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.testing import TestingSource, run_main

    class Once(StatefulLogic[int, int, None]):
        def on_item(self, value: int) -> tuple[Iterable[int], bool]:
            return [value], StatefulLogic.DISCARD

        def snapshot(self) -> None:
            return None

    flow = Dataflow("keyed-state")
    items = op.input("in", flow, TestingSource(range(n), batch_size=500))
    keyed = op.key_on("key", items, (lambda x: f"k{x}") if unique else (lambda x: f"k{x % 100}"))
    op.inspect("out", op.stateful("step", keyed, lambda _resume: Once()),
               lambda _step, _x: None)
    config = janitor = None
    store = Path(tempfile.mkdtemp(prefix="keyed-state-"))
    if recovery != "no":
        init_db_dir(store, 1)
        config = RecoveryConfig(store)
    if recovery == "swept":
        from notiflow.adapters.recovery_store import start_janitor

        janitor = start_janitor(store, every_s=1.0)
    before, cpu = _rss_mib(), time.process_time()
    run_main(flow, epoch_interval=timedelta(milliseconds=200), recovery_config=config)
    if janitor is not None:
        janitor.set()
    shutil.rmtree(store, ignore_errors=True)
    return (f"{n},{unique},{recovery},{before:.1f},{_rss_mib():.1f},"
            f"{time.process_time() - cpu:.2f}")


def main() -> None:
    print("| items | keys | recovery | RSS before MiB | RSS after MiB | CPU s | CPU µs/item |")
    print("|---|---|---|---|---|---|---|")
    for n, unique, recovery in CASES:
        out = subprocess.run([sys.executable, "-m", "notiflow.bench.keyed_state", "case",
                              str(n), str(int(unique)), recovery],
                             capture_output=True, text=True, check=True).stdout
        _, _, _, before, after, cpu = out.strip().splitlines()[-1].split(",")
        print(f"| {n:,} | {'unique' if unique else '100'} | {recovery} "
              f"| {before} | {after} | {cpu} | {float(cpu) / n * 1e6:.1f} |")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "case":
        print(run_case(int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]))
    else:
        main()
