"""Reading one (day, tenant) of history from the operational tables for the archive
(``notiflow/archive.py``): the day's message ids from ``messages_by_tenant_day`` (every page),
then, a slice of them at a time, each message's row, events and attempts, ``concurrency``
requests at a time.

Blocking (the driver's synchronous API): callers run it in a thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any, Final

from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args

from notiflow.archive import DayRows

PAGE: Final = 5000
_CQL: Final = {
    "ids": "SELECT message_id FROM messages_by_tenant_day WHERE tenant_id = ? AND day = ?",
    "message": "SELECT * FROM messages WHERE message_id = ?",
    "events": "SELECT * FROM message_events WHERE message_id = ?",
    "attempts": "SELECT * FROM attempts WHERE message_id = ?",
}


class ArchiveReader:
    def __init__(self, session: Session, *, concurrency: int = 64) -> None:
        self.session = session
        self.concurrency = concurrency
        self._stmts = {name: session.prepare(cql) for name, cql in _CQL.items()}
        self._stmts["ids"].fetch_size = PAGE

    def message_ids(self, tenant_id: str, day: date) -> list[str]:
        """Every message the tenant accepted on ``day`` (UTC), each once."""
        rows = self.session.execute(self._stmts["ids"], (tenant_id, day))
        return list(dict.fromkeys(str(r["message_id"]) for r in rows))

    def _each(self, name: str, ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        results = execute_concurrent_with_args(
            self.session, self._stmts[name], [(mid,) for mid in ids],
            concurrency=self.concurrency, raise_on_first_error=True)
        return {mid: list(result.result_or_exc) for mid, result in zip(ids, results, strict=True)
                if result.success}

    def rows(self, tenant_id: str, day: date, ids: Sequence[str]) -> DayRows:
        """Messages ``ids`` of the (day, tenant) with their events and attempts (a message
        whose row has expired is left out)."""
        messages = [rows[0] for rows in self._each("message", ids).values() if rows]
        return DayRows(day, tenant_id, messages, self._each("events", ids),
                       self._each("attempts", ids))
