"""``POST /v1/templates`` and ``GET /v1/templates/{template_id}/versions/{version}``.

Versions are immutable: a version is written once (lightweight transaction). Re-posting a
version with identical content (same channel and checksum) answers ``200`` with the stored
representation; different content answers ``409 template_version_immutable``. Without a
version the next one (latest + 1) is created, unless the latest already has identical
content, which is then returned with ``200``.

A version may carry variants by locale (``locales``), written and immutable with it; each
must use exactly the default content's variables and have a subject exactly when the
default has one (``422`` otherwise), so any message that renders in one locale renders in
all.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from dataclasses import replace
from datetime import UTC, datetime
from typing import Annotated, Final

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel, ConfigDict

from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.rows import LocaleVariant, TemplateRow
from notiflow.audit import Action, AuditEvent
from notiflow.gateway import examples
from notiflow.gateway.auth import RuntimeDep, Tenant, actor_of, read_model
from notiflow.gateway.errors import (
    ApiError,
    forbidden,
    not_found,
    unavailable,
    unprocessable,
)
from notiflow.gateway.openapi import json_body, link, location, success, tenant_errors
from notiflow.gateway.runtime import Runtime, now_ms
from notiflow.schemas.enums import Channel
from notiflow.schemas.formats import TEMPLATE_ID_PATTERN
from notiflow.schemas.messages import LocaleContent, TemplateCreate, TemplateVersion
from notiflow.settings import RenderLimits
from notiflow.templating import (
    TemplateInfo,
    TemplateRefused,
    TemplateSyntaxError,
    check,
    version_checksum,
)

router = APIRouter()
TEMPLATE_ID: Final = re.compile(TEMPLATE_ID_PATTERN)

MAX_VERSION_RACES = 8
CHECK_THREADS = 2
_checks = concurrent.futures.ThreadPoolExecutor(CHECK_THREADS,
                                                thread_name_prefix="template-check")
"""Template checks run here, off the event loop; beyond these threads they queue."""
MAX_VERSION: Final = 1_000_000
JSON = "application/json"


class TemplateCreated(BaseModel):
    """Body of a successful ``POST /v1/templates`` (201 new, 200 identical existing)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    template_id: str
    version: int
    channel: Channel
    variables: tuple[str, ...]
    checksum: str
    created_at: datetime
    locales: tuple[str, ...] = ()
    """The locales of its variants."""


class TemplateView(TemplateVersion):
    """Body of ``GET /v1/templates/{template_id}/versions/{version}``."""

    description: str | None


TEMPLATE_LINKS: Final = {"GetTemplate": link(
    "get_template", "The stored version.", template_id="$response.body#/template_id",
    version="$response.body#/version")}
TEMPLATE_HEADERS: Final = location("the version (`/v1/templates/{id}/versions/{version}`)")


def _created(row: TemplateRow, status: int) -> Response:
    body = TemplateCreated(
        template_id=row.template_id, version=row.version, channel=Channel(row.channel),
        variables=row.variables, checksum=row.checksum, created_at=row.created_at,
        locales=tuple(sorted(row.locales)))
    headers = {"Location": f"/v1/templates/{row.template_id}/versions/{row.version}"}
    return Response(body.model_dump_json(), status_code=status, media_type=JSON,
                    headers=headers)


def _same_content(row: TemplateRow, new: TemplateRow) -> bool:
    return row.channel == new.channel and row.checksum == new.checksum


async def _insert_next(store: CassandraStore, new: TemplateRow) -> tuple[TemplateRow, int]:
    """The stored row and 201 (a new version) or 200 (the latest has this content)."""
    for _ in range(MAX_VERSION_RACES):
        latest = await store.templates.latest_template(new.tenant_id, new.template_id)
        if latest is not None and _same_content(latest, new):
            return latest, 200
        candidate = replace(new, version=(latest.version if latest else 0) + 1)
        if candidate.version > MAX_VERSION:
            raise ApiError(409, "conflict", "versions_exhausted",
                           f"template {new.template_id} has reached version "
                           f"{MAX_VERSION}; use another template id")
        applied, _ = await store.templates.put_template(candidate)
        if applied:
            return candidate, 201
    raise unavailable("template_version_contention",
                      "too many concurrent versions of this template; retry")


@router.post(
    "/v1/templates", status_code=201, response_model=TemplateCreated,
    responses={
        **success(201, "A new version.", headers=TEMPLATE_HEADERS, links=TEMPLATE_LINKS),
        **success(200, "This content is already stored as the given (or latest) version.",
                  headers=TEMPLATE_HEADERS, links=TEMPLATE_LINKS, model=TemplateCreated),
        **tenant_errors(
            400, 403, 409, 413, 422,
            r409="`template_version_immutable` / `content_differs`; `conflict` / "
                 "`versions_exhausted` (the next version would pass 1,000,000).",
            r422="Not stated by the schema: `template_syntax_error` (with `field`, `line`); "
                 "`template_refused` (with `field`): the sandbox refuses it whatever its "
                 "variables (a literal over the render budget, nesting too deep); "
                 "`locale_variables_differ`, `locale_subject_differs` (with `field`): a "
                 "locale variant uses other variables than the default content, or has a "
                 "subject when it has none or the reverse.",
            r503="`template_version_contention` (concurrent versions; retry).")},
    openapi_extra=json_body(TemplateCreate, "One immutable template version.",
                            examples.TEMPLATE))
async def create_template(request: Request, tenant: Tenant, rt: RuntimeDep) -> Response:
    """Create an immutable template version; 201, 200 (identical), 409, 422."""
    tc = await read_model(request, TemplateCreate)
    if not tenant.allows_template(tc.template_id):
        raise forbidden("template_not_allowed",
                        f"tenant {tenant.id} may not use template {tc.template_id}")
    info, variants = await _checked(rt, tc)
    new = TemplateRow(
        tenant_id=tenant.id, template_id=tc.template_id, version=tc.version or 0,
        channel=tc.channel.value, subject=tc.subject, body=tc.body,
        variables=tuple(info.variables),
        checksum=version_checksum(info.checksum, {t: v.checksum for t, v in variants.items()}),
        created_at=now_ms(), description=tc.description, locales=variants)
    store = rt.store()
    if tc.version is None:
        row, status = await _insert_next(store, new)
        if status == 201:
            _audit(rt, request, row)
        return _created(row, status)
    applied, existing = await store.templates.put_template(new)
    if applied:
        _audit(rt, request, new)
        return _created(new, 201)
    if existing is None:
        existing = await store.templates.get_template(tenant.id, tc.template_id, tc.version)
    if existing is not None and _same_content(existing, new):
        return _created(existing, 200)
    raise ApiError(409, "template_version_immutable", "content_differs",
                   f"template {tc.template_id} version {tc.version} already exists with "
                   "different content")


def _check_one(field: str, content: TemplateCreate | LocaleContent,
               limits: RenderLimits) -> TemplateInfo:
    """:func:`check` of one content, its errors' ``field`` prefixed with ``field``."""
    try:
        return check(content.subject, content.body, limits)
    except TemplateSyntaxError as exc:
        raise unprocessable("template_syntax_error", str(exc), field=field + exc.field,
                            line=exc.lineno) from None
    except TemplateRefused as exc:
        raise unprocessable("template_refused", str(exc), field=field + exc.field) from None


def check_version(tc: TemplateCreate, limits: RenderLimits
                  ) -> tuple[TemplateInfo, dict[str, LocaleVariant]]:
    """The default content's analysis and each locale variant's, checked alike (``422``
    :class:`~notiflow.gateway.errors.ApiError` for any refusal)."""
    info = _check_one("", tc, limits)
    variants = {}
    for tag, content in sorted(tc.locales.items()):
        field = f"locales.{tag}."
        got = _check_one(field, content, limits)
        if set(got.variables) != set(info.variables):
            raise unprocessable(
                "locale_variables_differ",
                f"locale {tag} uses {sorted(got.variables)}, the default content "
                f"{sorted(info.variables)}", field=f"locales.{tag}")
        if (content.subject is None) != (tc.subject is None):
            raise unprocessable("locale_subject_differs",
                                f"locale {tag} must have a subject exactly when the default "
                                "content has one", field=f"locales.{tag}.subject")
        variants[tag] = LocaleVariant(content.subject, content.body, got.checksum)
    return info, variants


async def _checked(rt: Runtime, tc: TemplateCreate
                   ) -> tuple[TemplateInfo, dict[str, LocaleVariant]]:
    """The analysis and test compile of the template and its variants, off the event loop;
    422 when refused."""
    return await asyncio.get_running_loop().run_in_executor(
        _checks, check_version, tc, rt.settings.render_limits)


def _audit(rt: Runtime, request: Request, created: TemplateRow) -> None:
    rt.auditor.record(AuditEvent(
        datetime.now(UTC), Action.TEMPLATE_CREATE, actor_of(request), created.tenant_id,
        f"template:{created.template_id}@{created.version}",
        {"channel": created.channel, "checksum": created.checksum}))


@router.get("/v1/templates/{template_id}/versions/{version}", response_model=TemplateView,
            responses=tenant_errors(404, 422, r422="`invalid_request`: `version` is not an "
                                                   "integer."))
async def get_template(
    template_id: Annotated[str, Path(json_schema_extra={"pattern": TEMPLATE_ID.pattern})],
    version: Annotated[int, Path(json_schema_extra={"minimum": 1, "maximum": MAX_VERSION})],
    tenant: Tenant, rt: RuntimeDep) -> Response:
    """One immutable template version of the caller's tenant; 404 otherwise."""
    if not 1 <= version <= MAX_VERSION or not TEMPLATE_ID.fullmatch(template_id):
        raise not_found()
    row = await rt.store().templates.get_template(tenant.id, template_id, version)
    if row is None:
        raise not_found()
    view = TemplateView(
        tenant_id=row.tenant_id, template_id=row.template_id, version=row.version,
        channel=Channel(row.channel), subject=row.subject, body=row.body,
        variables=row.variables, checksum=row.checksum, created_at=row.created_at,
        description=row.description,
        locales={t: LocaleContent(subject=v.subject, body=v.body)
                 for t, v in sorted(row.locales.items())},
    )
    return Response(view.model_dump_json(), media_type=JSON)
