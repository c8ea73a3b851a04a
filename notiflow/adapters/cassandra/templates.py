"""Template versions: immutable once written (``INSERT ... IF NOT EXISTS``), newest
version first in their partition."""

from __future__ import annotations

from typing import Any

from notiflow.adapters.cassandra.session import Row, Statements


class TemplateStore:
    """A tenant's template versions."""

    def __init__(self, cql: Statements) -> None:
        self.cql = cql
        cql.prepare(STATEMENTS)

    async def put_template(self, values: dict[str, Any]) -> tuple[bool, Row | None]:
        """Write a version unless it exists: (True, None), else (False, the stored row as
        the transaction returned it)."""
        row = await self.cql.first("template_insert", (
            values["tenant_id"], values["template_id"], values["version"], values["channel"],
            values["subject"], values["body"], list(values["variables"]),
            values.get("description"), values["checksum"], values["created_at"],
        )) or {}
        return bool(row.get("[applied]")), (None if row.get("[applied]") else row)

    async def get_template(self, tenant_id: str, template_id: str, version: int) -> Row | None:
        return await self.cql.first("template_get", (tenant_id, template_id, version))

    async def latest_template_version(self, tenant_id: str, template_id: str) -> int:
        row = await self.cql.first("template_latest", (tenant_id, template_id))
        return int(row["version"]) if row else 0

    async def latest_template(self, tenant_id: str, template_id: str) -> Row | None:
        """The highest version of a template, or None."""
        return await self.cql.first("template_latest_row", (tenant_id, template_id))


STATEMENTS: dict[str, str] = {
    "template_insert": "INSERT INTO templates (tenant_id, template_id, version, channel, subject, "
    "body, variables, description, checksum, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "IF NOT EXISTS",
    "template_get": "SELECT * FROM templates WHERE tenant_id = ? AND template_id = ? "
    "AND version = ?",
    "template_latest": "SELECT version FROM templates WHERE tenant_id = ? AND template_id = ? "
    "LIMIT 1",
    "template_latest_row": "SELECT * FROM templates WHERE tenant_id = ? AND template_id = ? "
    "LIMIT 1",
}
