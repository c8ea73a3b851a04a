"""Reading one (day, tenant) of history from the operational tables for the archive
(``notiflow/archive.py``): the day's message ids from ``messages_by_tenant_day`` (every page),
then, a slice of them at a time, the rows, events and attempts of
:data:`KEYS_PER_READ` messages per read, as many reads in flight as the caller says.

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
KEYS_PER_READ: Final = 50
"""Messages named in one read (``message_id IN ...``): a request per message cost the
driver's I/O thread more than decoding the rows
(``docs/decisions/2026-12-06-archive-batched-reads.md``)."""
_CQL: Final = {
    "ids": "SELECT message_id FROM messages_by_tenant_day WHERE tenant_id = ? AND day = ?",
    "message": "SELECT * FROM messages WHERE message_id IN ?",
    "events": "SELECT * FROM message_events WHERE message_id IN ?",
    "attempts": "SELECT * FROM attempts WHERE message_id IN ?",
}


class ArchiveReader:
    def __init__(self, session: Session) -> None:
        self.session = session
        self._stmts = {name: session.prepare(cql) for name, cql in _CQL.items()}
        self._stmts["ids"].fetch_size = PAGE

    def message_ids(self, tenant_id: str, day: date) -> list[str]:
        """Every message the tenant accepted on ``day`` (UTC), each once."""
        rows = self.session.execute(self._stmts["ids"], (tenant_id, day))
        return list(dict.fromkeys(str(r["message_id"]) for r in rows))

    def _each(self, name: str, ids: Sequence[str],
              concurrency: int) -> dict[str, list[dict[str, Any]]]:
        """``name``'s rows of each message in ``ids``, by message id (every page)."""
        groups = [(list(ids[i:i + KEYS_PER_READ]),) for i in range(0, len(ids), KEYS_PER_READ)]
        results = execute_concurrent_with_args(
            self.session, self._stmts[name], groups, concurrency=concurrency,
            raise_on_first_error=True)
        found: dict[str, list[dict[str, Any]]] = {mid: [] for mid in ids}
        for result in results:
            for row in result.result_or_exc:
                found[row["message_id"]].append(row)
        return found

    def rows(self, tenant_id: str, day: date, ids: Sequence[str],
             concurrency: int) -> DayRows:
        """Messages ``ids`` of the (day, tenant) with their events and attempts, at most
        ``concurrency`` reads in flight (a message whose row has expired is left out)."""
        messages = [rows[0] for rows in self._each("message", ids, concurrency).values() if rows]
        return DayRows(day, tenant_id, messages, self._each("events", ids, concurrency),
                       self._each("attempts", ids, concurrency))
