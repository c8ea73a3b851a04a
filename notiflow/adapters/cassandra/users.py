"""Users (``users``, migration 0014): the profile sealed, every write a compare-and-set on
``version`` (a lightweight transaction), so a read at ``LOCAL_QUORUM`` after a write returns
sees it, and the erasure's delete too."""

from __future__ import annotations

from datetime import UTC, datetime

from cassandra import ConsistencyLevel, WriteTimeout
from cassandra.policies import WriteType

from notiflow.adapters.cassandra.session import Row, Statements
from notiflow.adapters.cassandra.values import to_ms, utc
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.ports import UserChange, UserContention
from notiflow.schemas.users import UserProfile, UserView, next_version

MAX_USER_RACES = 16
"""Compare-and-set attempts on one user before :class:`UserContention`."""


class CassandraUsers:
    """The :class:`~notiflow.adapters.ports.UserRecords` port on Cassandra."""

    def __init__(self, cql: Statements, cipher: DlqCipher) -> None:
        self.cql = cql
        self.cipher = cipher
        cql.prepare(STATEMENTS)
        cql.prepare({"user_get_serial": STATEMENTS["user_get"]},
                    consistency=ConsistencyLevel.LOCAL_SERIAL)

    def _view(self, row: Row) -> UserView:
        profile = UserProfile.model_validate_json(self.cipher.decrypt(row["profile"]))
        return UserView.of(profile, row["user_id"], int(row["version"]),
                           utc(row["created_at"]), utc(row["updated_at"]))

    async def get(self, tenant_id: str, user_id: str, *,
                  serial: bool = False) -> UserView | None:
        row = await self.cql.first("user_get_serial" if serial else "user_get",
                                   (tenant_id, user_id))
        return self._view(row) if row else None

    async def change(self, tenant_id: str, user_id: str, change: UserChange,
                     now: datetime | None = None) -> tuple[UserView | None, bool]:
        stamp = to_ms(now or datetime.now(UTC))
        current = await self.get(tenant_id, user_id)
        for _ in range(MAX_USER_RACES):
            wanted = change(current)
            if wanted is None:
                return current, False
            new = next_version(current, wanted, user_id, stamp)
            sealed = self.cipher.encrypt(new.profile().model_dump_json().encode())
            unknown = False
            try:
                if current is None:
                    rows = await self.cql.run("user_insert", (
                        tenant_id, user_id, new.version, sealed, new.created_at,
                        new.updated_at))
                else:
                    rows = await self.cql.run("user_update", (
                        new.version, sealed, new.updated_at, tenant_id, user_id,
                        current.version))
            except WriteTimeout as exc:
                _cas_only(exc)
                rows, unknown = [], True
            if rows and rows[0].get("[applied]"):
                return new, True
            try:
                current = await self._settled(tenant_id, user_id)
            except WriteTimeout as exc:
                _cas_only(exc)
                continue
            if unknown and current == new:
                return new, True
        raise UserContention(f"user {tenant_id}/{user_id} keeps changing")

    async def erase(self, tenant_id: str, user_id: str) -> UserView | None:
        for _ in range(MAX_USER_RACES):
            try:
                current = await self._settled(tenant_id, user_id)
                if current is None:
                    return None
                rows = await self.cql.run("user_delete", (tenant_id, user_id, current.version))
            except WriteTimeout as exc:
                _cas_only(exc)
                continue
            if rows and rows[0].get("[applied]"):
                return current
        raise UserContention(f"user {tenant_id}/{user_id} keeps changing")

    async def _settled(self, tenant_id: str, user_id: str) -> UserView | None:
        """The stored user after any in-flight transaction completed (a serial read)."""
        return await self.get(tenant_id, user_id, serial=True)


def _cas_only(exc: WriteTimeout) -> None:
    """Re-raise ``exc`` unless a Paxos round timed out (its outcome is read next)."""
    if exc.write_type != WriteType.CAS:
        raise exc


STATEMENTS = {
    "user_get": "SELECT * FROM users WHERE tenant_id = ? AND user_id = ?",
    "user_insert": "INSERT INTO users (tenant_id, user_id, version, profile, created_at, "
                   "updated_at) VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    "user_update": "UPDATE users SET version = ?, profile = ?, updated_at = ? "
                   "WHERE tenant_id = ? AND user_id = ? IF version = ?",
    "user_delete": "DELETE FROM users WHERE tenant_id = ? AND user_id = ? IF version = ?",
}
