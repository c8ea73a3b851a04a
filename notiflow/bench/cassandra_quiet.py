"""Cassandra's background work, read from its virtual tables: what a benchmark waits for
before measuring a settled stack."""

from __future__ import annotations

from cassandra.cluster import Session

POOLS = ("CompactionExecutor", "MemtableFlushWriter", "MemtablePostFlush",
         "PerDiskMemtableFlushWriter_0")


def background(session: Session) -> list[str]:
    """Compactions and memtable flushes running or queued (``system_views.sstable_tasks``,
    ``system_views.thread_pools``), e.g. ``["compaction of notiflow_bench.messages",
    "MemtableFlushWriter: 1 active, 0 pending"]``; empty when Cassandra is idle."""
    out = [f"{row['kind']} of {row['keyspace_name']}.{row['table_name']}".lower()
           for row in session.execute("SELECT keyspace_name, table_name, kind "
                                      "FROM system_views.sstable_tasks")]
    for row in session.execute("SELECT name, active_tasks, pending_tasks "
                               "FROM system_views.thread_pools"):
        if row["name"] in POOLS and (row["active_tasks"] or row["pending_tasks"]):
            out.append(f"{row['name']}: {row['active_tasks']} active, "
                       f"{row['pending_tasks']} pending")
    return out
