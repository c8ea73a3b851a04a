"""Template versions: immutable once written (``INSERT ... IF NOT EXISTS``), newest
version first in their partition."""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from notiflow.adapters.cassandra.session import Row, Statements
from notiflow.adapters.cassandra.values import utc
from notiflow.adapters.rows import LocaleVariant, TemplateRow


def locales_json(locales: Mapping[str, LocaleVariant]) -> str | None:
    """The ``locales`` column of a version's variants (None: it has none)."""
    if not locales:
        return None
    return orjson.dumps({tag: {"subject": v.subject, "body": v.body, "checksum": v.checksum}
                         for tag, v in sorted(locales.items())}).decode()


def locales_of(text: str | None) -> dict[str, LocaleVariant]:
    if not text:
        return {}
    return {tag: LocaleVariant(v.get("subject"), v["body"], v["checksum"])
            for tag, v in orjson.loads(text).items()}


def template_row(row: Row) -> TemplateRow:
    """A ``templates`` row as a :class:`TemplateRow`."""
    return TemplateRow(
        tenant_id=row["tenant_id"], template_id=row["template_id"],
        version=int(row["version"]), channel=row["channel"], subject=row.get("subject"),
        body=row["body"], variables=tuple(row.get("variables") or ()),
        checksum=row.get("checksum") or "", created_at=utc(row["created_at"]),
        description=row.get("description"), locales=locales_of(row.get("locales")))


class TemplateStore:
    """A tenant's template versions."""

    def __init__(self, cql: Statements) -> None:
        self.cql = cql
        cql.prepare(STATEMENTS)

    async def put_template(self, t: TemplateRow) -> tuple[bool, TemplateRow | None]:
        """Write a version unless it exists: (True, None), else (False, the stored version
        when the transaction returned it with its checksum, else None)."""
        row = await self.cql.first("template_insert", (
            t.tenant_id, t.template_id, t.version, t.channel, t.subject, t.body,
            list(t.variables), t.description, t.checksum, t.created_at,
            locales_json(t.locales),
        )) or {}
        if row.get("[applied]"):
            return True, None
        return False, template_row(row) if row.get("checksum") else None

    async def get_template(self, tenant_id: str, template_id: str,
                           version: int) -> TemplateRow | None:
        row = await self.cql.first("template_get", (tenant_id, template_id, version))
        return template_row(row) if row else None

    async def latest_template_version(self, tenant_id: str, template_id: str) -> int:
        row = await self.cql.first("template_latest", (tenant_id, template_id))
        return int(row["version"]) if row else 0

    async def latest_template(self, tenant_id: str, template_id: str) -> TemplateRow | None:
        """The highest version of a template, or None."""
        row = await self.cql.first("template_latest_row", (tenant_id, template_id))
        return template_row(row) if row else None


STATEMENTS: dict[str, str] = {
    "template_insert": "INSERT INTO templates (tenant_id, template_id, version, channel, subject, "
    "body, variables, description, checksum, created_at, locales) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    "template_get": "SELECT * FROM templates WHERE tenant_id = ? AND template_id = ? "
    "AND version = ?",
    "template_latest": "SELECT version FROM templates WHERE tenant_id = ? AND template_id = ? "
    "LIMIT 1",
    "template_latest_row": "SELECT * FROM templates WHERE tenant_id = ? AND template_id = ? "
    "LIMIT 1",
}
