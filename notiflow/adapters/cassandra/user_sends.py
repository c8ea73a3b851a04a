"""Sends to a user (``user_sends``, migration 0015): one row per request, its decision as
JSON, written once its messages are accepted."""

from __future__ import annotations

from notiflow.adapters.cassandra.session import Statements
from notiflow.schemas.user_sends import UserSendRecord
from notiflow.settings import Settings


class UserSendStore:
    """The decisions of user sends, by the request's ``message_id``."""

    def __init__(self, cql: Statements, settings: Settings) -> None:
        self.cql = cql
        self.ttl_s = int(settings.operational_ttl.total_seconds())
        cql.prepare(STATEMENTS)

    async def put(self, record: UserSendRecord) -> None:
        await self.cql.run("user_send_insert", (record.message_id, record.tenant_id,
                                                record.model_dump_json(), self.ttl_s))

    async def get(self, message_id: str) -> UserSendRecord | None:
        row = await self.cql.first("user_send_get", (message_id,))
        return UserSendRecord.model_validate_json(row["record"]) if row else None


STATEMENTS: dict[str, str] = {
    "user_send_insert": "INSERT INTO user_sends (message_id, tenant_id, record) "
                        "VALUES (?, ?, ?) USING TTL ?",
    "user_send_get": "SELECT record FROM user_sends WHERE message_id = ?",
}
