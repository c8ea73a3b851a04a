"""The JVMs of the local stack (Kafka, Cassandra): the JDK they run on, their pause log, and
their stop-the-world collector threads in the real-time class."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from notiflow import tuning
from notiflow.ops.stack.base import StackError
from notiflow.settings import Settings

STW_THREADS = re.compile(r"^(GC Thread#\d+|VM Thread)$")
"""The JVM threads that do a stop-the-world pause: G1's parallel workers (all started at
launch with ``-XX:-UseDynamicNumberOfGCThreads``) and the VM thread that runs safepoints."""


def prioritise_collector(pid: int, priority: int) -> int:
    """Move JVM ``pid``'s stop-the-world collector threads to ``SCHED_RR`` at ``priority``;
    returns how many. The pause stops every other thread of the JVM, so raising these
    threads takes no CPU from anyone between pauses: under the flood, Cassandra's young
    collections of ~50 MB took 200-380 ms of wall time at the normal priority while the
    P0 processes (real-time) and the flood shared the two cores."""
    moved = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            if STW_THREADS.match(name):
                tuning.to_realtime(int(task.name), priority)
                moved += 1
        except (FileNotFoundError, ProcessLookupError):
            continue
    return moved


def gc_log(path: Path) -> str:
    """JVM flag: every stop-the-world pause (GC and safepoints) with its wall-clock time, so a
    latency stall can be matched with the pauses of the JVM it waited on (``bench/jvm.py``)."""
    return f"-Xlog:gc,safepoint:file={path}:time,uptimemillis:filecount=3,filesize=20m"


def java(settings: Settings) -> str:
    """The ``java`` of ``java_home`` (else ``JAVA_HOME``, else ``PATH``); refuses anything
    but JDK 17."""
    home = settings.java_home or (Path(os.environ["JAVA_HOME"]) if "JAVA_HOME" in os.environ
                                  else None)
    exe = str(home / "bin" / "java") if home else shutil.which("java")
    if not exe or not Path(exe).exists():
        raise StackError(
            "Java not found: install OpenJDK 17 (Debian: apt-get install openjdk-17-jre-headless)"
            " or set NOTIFLOW_JAVA_HOME"
        )
    out = subprocess.run([exe, "-version"], capture_output=True, text=True).stderr
    m = re.search(r'version "(\d+)', out)
    major = int(m.group(1)) if m else 0
    if major != 17:
        raise StackError(
            f"{exe} is Java {major or '?'}; Cassandra 5.0 needs JDK 17 (Kafka 4 needs >= 17). "
            "Set NOTIFLOW_JAVA_HOME to a JDK 17."
        )
    return exe
