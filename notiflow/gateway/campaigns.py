"""Campaigns: ``POST /v1/campaigns``, ``GET /v1/campaigns[/{id}]``,
``GET /v1/campaigns/{id}/errors``, ``POST /v1/campaigns/{id}/pause|resume|cancel``
(tenant-scoped; bulk lane).

Creating checks, in order: JSON and schema (422 ``details``) → lane (421) → tenant policy
(403: tier, channel, template) → rate bounds (422) → the ``webhook`` (422
``webhook_url_not_allowed``: not https, or not public addresses only) → window bounds (422)
→ the manifest's place (422
``manifest_not_allowed`` unless it lies under the tenant's own prefix, decided from the URI
alone: nothing is asked of the store) → the template (422 ``unknown_template``; every
variable it declares must be mapped to a column) → the manifest (422
``manifest_unreadable``: missing, or a scheme the deployment does not serve) → the
tenant's campaign quotas (422 ``quota_too_large`` above ``max_campaign_recipients``; 429
``campaign_quota`` with ``Retry-After`` at ``max_active_campaigns``) → the bulk tier's health
(429 ``backlog`` / ``priority_pressure`` with ``Retry-After``: a campaign started into a
backlog would only deepen it). The campaign then waits for its start; expanders
(``flows/campaigns/expander.py``) take it from there.

Cancelling stops expansion at the next batch and closes the campaign's cancel gate in Redis:
every message of it that no provider took yet ends CANCELLED when the send flow reaches it.
Pausing stops expansion (messages already expanded still go); resuming continues from the
checkpoint.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Final

from fastapi import APIRouter, Path, Query, Request, Response

from notiflow.adapters.campaign_notices import notice_of
from notiflow.adapters.campaign_store import (
    EPOCH,
    TRANSITIONS,
    CampaignRow,
    CampaignStore,
    Progress,
)
from notiflow.adapters.cancel_gate import CancelGate
from notiflow.adapters.manifests import ManifestNotAllowed, ManifestUnreadable, tenant_refusal
from notiflow.adapters.outages import REDIS_DOWN
from notiflow.correlation import CorrelationKeyMissing, CorrelationKeys
from notiflow.gateway import examples
from notiflow.gateway.auth import RuntimeDep, Tenant, read_model
from notiflow.gateway.checks import check_lane, check_sender, check_template
from notiflow.gateway.egress_check import check_webhook_url
from notiflow.gateway.errors import (
    ApiError,
    not_found,
    rate_limited,
    unavailable,
    unprocessable,
)
from notiflow.gateway.openapi import json_body, link, location, success, tenant_errors
from notiflow.gateway.runtime import Runtime, now_ms
from notiflow.schemas.campaigns import (
    LIVE_STATES,
    MAX_ROW,
    CampaignCounts,
    CampaignList,
    CampaignRequest,
    CampaignState,
    CampaignView,
    ErrorReport,
    RowMessage,
    new_campaign_id,
    row_message_id,
)
from notiflow.schemas.topic_sends import TopicCampaign
from notiflow.settings import Settings, TenantConfig

router = APIRouter()
log = logging.getLogger("notiflow.gateway.campaigns")
JSON = "application/json"
QUOTA_RETRY_AFTER_S = 60.0
ERRORS_PAGE = 1000


_ID = "$response.body#/campaign_id"
CAMPAIGN_LINKS: Final = {
    "GetCampaign": link("get_campaign", "The campaign.", campaign_id=_ID),
    "CampaignErrors": link("campaign_errors", "Its rejected rows.", campaign_id=_ID),
    "PauseCampaign": link("pause_campaign", "Pause it.", campaign_id=_ID),
    "ResumeCampaign": link("resume_campaign", "Resume it.", campaign_id=_ID),
    "CancelCampaign": link("cancel_campaign", "Cancel it.", campaign_id=_ID),
}
MOVE_ERRORS: Final = tenant_errors(
    404, 409, r409="`conflict` / `campaign_state`: the state does not allow the move.",
    r503="`cancel_unavailable` (Redis, when cancelling).")


def view(row: CampaignRow, counts: CampaignCounts, now: datetime) -> CampaignView:
    """The campaign as the API shows it, with its remaining rows and ETA estimated from the
    bytes left, the mean row size so far and the rate so far."""
    p = row.progress
    remaining = rate = eta = None
    if p.manifest_bytes is not None and p.rows_read > 0 and p.bytes_read > 0:
        remaining = round((p.manifest_bytes - p.bytes_read) * p.rows_read / p.bytes_read)
    elif row.state == "completed":
        remaining = 0
    if p.first_expanded_at is not None and p.rows_read > 0:
        end = row.finished_at or now
        elapsed = (end - p.first_expanded_at).total_seconds()
        rate = p.rows_read / elapsed if elapsed > 0 else None
        if rate and remaining and row.state == "running":
            eta = now + timedelta(seconds=remaining / rate)
    return CampaignView(
        campaign_id=row.campaign_id, name=row.name, state=row.state, reason=row.reason,
        channel=row.request.channel, tier=row.request.tier,
        template_id=row.request.template_id, template_version=row.request.template_version,
        manifest=row.request.manifest,
        topic=row.request.audience.topic if isinstance(row.request, TopicCampaign) else None,
        starts_at=row.starts_at, ends_at=row.ends_at,
        max_rate=row.max_rate, quota=row.quota, created_at=row.created_at,
        updated_at=row.updated_at, finished_at=row.finished_at,
        manifest_bytes=p.manifest_bytes, bytes_read=p.bytes_read, counts=counts,
        remaining=remaining, rate=rate, eta=eta)


async def _counts(rt: Runtime, row: CampaignRow) -> CampaignCounts:
    """The row's expansion counts with the delivery funnel of its messages (Redis)."""
    base = row.counts()
    try:
        funnel = await rt.tally().counts(row.campaign_id)
    except REDIS_DOWN as exc:
        log.warning("campaign tally unavailable: %s", type(exc).__name__)
        return base
    return base.model_copy(update=funnel)


def _check_limits(settings: Settings, tenant: TenantConfig, req: CampaignRequest) -> None:
    rule = settings.campaigns
    if req.max_rate is not None and req.max_rate > rule.max_rate:
        raise unprocessable("rate_too_high", f"max_rate is at most {rule.max_rate:g}/s",
                            field="max_rate")
    cap = tenant.max_campaign_recipients
    if cap is not None and req.quota is not None and req.quota > cap:
        raise unprocessable("quota_too_large", f"tenant {tenant.id}'s campaigns reach at "
                            f"most {cap} recipients", field="quota")


async def _check_quota(store: CampaignStore, tenant: TenantConfig) -> None:
    most = tenant.max_active_campaigns
    if most is None:
        return
    active = sum(1 for r in await store.of_tenant(tenant.id) if r.state in LIVE_STATES)
    if active >= most:
        raise rate_limited("campaign_quota", f"tenant {tenant.id} has {active} active "
                           f"campaigns (at most {most}); retry when one ends",
                           QUOTA_RETRY_AFTER_S)


@router.post(
    "/v1/campaigns", status_code=201, response_model=CampaignView,
    responses={**success(201, "The campaign (`state: scheduled`).",
                         headers=location("the campaign"), links=CAMPAIGN_LINKS),
               **tenant_errors(
                   400, 403, 413, 421, 422, 429,
                   r422="`invalid_body` (also, not stated by the schema: a local `window` "
                        "whose start and end are equal, `ends_at` not after `starts_at`); "
                        "not stated by the schema: `rate_too_high`, "
                        "`quota_too_large`, `webhook_url_not_allowed`, `window_too_long`, "
                        "`window_over`, "
                        "`channel_unavailable`, `category_tier_not_allowed`, "
                        "`manifest_not_allowed`, `unknown_template`, "
                        "`missing_template_variable`, `manifest_unreadable`.",
                   r429="`campaign_quota`, `backlog`, `priority_pressure`.")},
    openapi_extra=json_body(CampaignRequest, "One template to every row of a manifest.",
                            examples.CAMPAIGN))
async def create_campaign(request: Request, tenant: Tenant, rt: RuntimeDep) -> Response:
    """Create a campaign: 201 with its view (state ``scheduled`` until an expander takes
    it)."""
    req = await read_model(request, CampaignRequest)
    check_lane(rt.settings, req)
    check_sender(rt.settings, tenant, req)
    starts, ends = await check_campaign(rt, tenant, req)
    if (refusal := tenant_refusal(rt.settings, tenant.id, req.manifest)) is not None:
        raise unprocessable("manifest_not_allowed", refusal, field="manifest")
    await check_template(rt, tenant, req, req.mapping.variables, how="mapped to a column")
    try:
        size = await rt.manifests().size(req.manifest, tenant.id)
    except ManifestNotAllowed as exc:
        raise unprocessable("manifest_not_allowed", exc.reason, field="manifest") from None
    except ManifestUnreadable as exc:
        raise unprocessable("manifest_unreadable", exc.reason, field="manifest") from None
    return await start_campaign(rt, tenant, req, new_campaign_id(), starts, ends, size)


async def check_campaign(rt: Runtime, tenant: TenantConfig, req: CampaignRequest
                         ) -> tuple[datetime, datetime]:
    """The checks of every campaign's limits, webhook and window (422); its start and end."""
    settings = rt.settings
    _check_limits(settings, tenant, req)
    await check_webhook_url(rt, req.webhook, "webhook")
    now = now_ms()
    starts = max(req.starts_at or now, now)
    ends = req.ends_at or starts + settings.campaigns.default_duration
    if ends - starts > settings.campaigns.max_duration:
        raise unprocessable("window_too_long", "a campaign lasts at most "
                            f"{settings.campaigns.max_duration}", field="ends_at")
    if ends <= now:
        raise unprocessable("window_over", "ends_at is in the past", field="ends_at")
    return starts, ends


async def start_campaign(rt: Runtime, tenant: TenantConfig, req: CampaignRequest,
                         campaign_id: str, starts: datetime, ends: datetime,
                         size: int | None) -> Response:
    """Store a checked campaign (``size``: its manifest's bytes, None for a snapshot not
    written yet) after the tenant's and the tier's quotas (429); its ``201``."""
    store = rt.campaigns()
    await _check_quota(store, tenant)
    await rt.admission.check_campaign(req.tier)
    now = now_ms()
    quota = req.quota or tenant.max_campaign_recipients or 1_000_000_000
    row = CampaignRow(
        tenant_id=tenant.id, campaign_id=campaign_id, name=req.name, request=req,
        state="scheduled", reason=None, starts_at=starts, ends_at=ends,
        max_rate=req.max_rate or rt.settings.campaigns.default_rate, quota=quota,
        created_at=now, updated_at=now, finished_at=None,
        progress=Progress(manifest_bytes=size), lease_until=EPOCH)
    await store.create(row)
    notice = notice_of(row, row.counts(), now)
    if notice is not None:
        await rt.notices().add(notice)
    log.info("campaign %s of %s created: %s bytes of manifest, %s to %s", row.campaign_id,
             tenant.id, "?" if size is None else size, starts.isoformat(), ends.isoformat())
    return Response(view(row, row.counts(), now).model_dump_json(), status_code=201,
                    media_type=JSON, headers={"Location": f"/v1/campaigns/{row.campaign_id}"})


@router.get("/v1/campaigns", response_model=CampaignList, responses=tenant_errors())
async def list_campaigns(tenant: Tenant, rt: RuntimeDep) -> Response:
    now = now_ms()
    rows = await rt.campaigns().of_tenant(tenant.id)
    body = CampaignList(campaigns=tuple(
        [view(r, await _counts(rt, r), now) for r in sorted(
            rows, key=lambda r: r.created_at, reverse=True)]))
    return Response(body.model_dump_json(), media_type=JSON)


async def _own(rt: Runtime, tenant_id: str, campaign_id: str) -> CampaignRow:
    row = await rt.campaigns().get(tenant_id, campaign_id)
    if row is None:
        raise not_found()
    return row


@router.get("/v1/campaigns/{campaign_id}", response_model=CampaignView,
            responses=tenant_errors(404))
async def get_campaign(campaign_id: str, tenant: Tenant, rt: RuntimeDep) -> Response:
    row = await _own(rt, tenant.id, campaign_id)
    return Response(view(row, await _counts(rt, row), now_ms()).model_dump_json(),
                    media_type=JSON)


@router.get("/v1/campaigns/{campaign_id}/rows/{row}", response_model=RowMessage,
            responses=tenant_errors(404, 422, r422="`invalid_request` (`row`)."))
async def campaign_row(campaign_id: str, tenant: Tenant, rt: RuntimeDep,
                       row: int = Path(ge=1, le=MAX_ROW)) -> Response:
    """The message id of manifest row ``row`` of the caller's campaign (row ids carry a
    keyed tag, so they are looked up, never composed)."""
    await _own(rt, tenant.id, campaign_id)
    try:
        keys = CorrelationKeys.from_settings(rt.settings)
    except CorrelationKeyMissing:
        raise unavailable("correlation_key_missing",
                          "no correlation key is configured") from None
    body = RowMessage(row=row, message_id=row_message_id(keys, campaign_id, row))
    return Response(body.model_dump_json(), media_type=JSON)


@router.get("/v1/campaigns/{campaign_id}/errors", response_model=ErrorReport,
            responses=tenant_errors(404, 422, r422="`invalid_request` (`after`, `limit`)."))
async def campaign_errors(campaign_id: str, tenant: Tenant, rt: RuntimeDep,
                          after: int = Query(0, ge=0),
                          limit: int = Query(ERRORS_PAGE, ge=1, le=ERRORS_PAGE)) -> Response:
    """The campaign's rejected rows (row number and reason), ``limit`` at a time after row
    ``after``; ``next_after`` pages on."""
    row = await _own(rt, tenant.id, campaign_id)
    errors = await rt.campaigns().errors(campaign_id, after, limit,
                                         max(row.progress.next_row, after))
    body = ErrorReport(errors=tuple(errors),
                       next_after=errors[-1].row if len(errors) == limit else None)
    return Response(body.model_dump_json(), media_type=JSON)


async def _move(rt: Runtime, tenant: TenantConfig, campaign_id: str,
                state: CampaignState, reason: str | None) -> Response:
    row = await _own(rt, tenant.id, campaign_id)
    now = now_ms()
    if row.state != state and row.state not in TRANSITIONS[state]:
        raise ApiError(409, "conflict", "campaign_state", f"campaign is {row.state}; it "
                       f"cannot become {state}")
    if state == "cancelled":
        await _close_gate(rt, row, now)
    moved: CampaignRow | None = await rt.campaigns().move(row, state, reason, now)
    if moved is None:
        current = await _own(rt, tenant.id, campaign_id)
        if current.state == state:
            moved = current
        else:
            raise ApiError(409, "conflict", "campaign_state", f"campaign is {current.state}; "
                           f"it cannot become {state}")
    counts = await _counts(rt, moved)
    if moved is not row and moved.updated_at == now:
        notice = notice_of(moved, counts, now)
        if notice is not None:
            await rt.notices().add(notice)
    return Response(view(moved, counts, now).model_dump_json(), media_type=JSON)


async def _close_gate(rt: Runtime, row: CampaignRow, now: datetime) -> None:
    """Close the campaign's cancel gate before its state changes, so no message of it is
    sent from the moment the API answers."""
    gate = CancelGate(rt.admission.store.r, rt.settings.topic_prefix)
    hold = max(row.ends_at - now, timedelta(0)) + timedelta(days=1)
    try:
        await gate.cancel_campaign(row.campaign_id, hold)
    except REDIS_DOWN as exc:
        log.warning("cancel gate unavailable: %s", type(exc).__name__)
        raise unavailable("cancel_unavailable", "cancellation is unavailable; retry "
                          "later") from None


@router.post("/v1/campaigns/{campaign_id}/pause", response_model=CampaignView,
             responses=MOVE_ERRORS)
async def pause_campaign(campaign_id: str, tenant: Tenant, rt: RuntimeDep) -> Response:
    return await _move(rt, tenant, campaign_id, "paused", None)


@router.post("/v1/campaigns/{campaign_id}/resume", response_model=CampaignView,
             responses=MOVE_ERRORS)
async def resume_campaign(campaign_id: str, tenant: Tenant, rt: RuntimeDep) -> Response:
    return await _move(rt, tenant, campaign_id, "running", None)


@router.post("/v1/campaigns/{campaign_id}/cancel", response_model=CampaignView,
             responses=MOVE_ERRORS)
async def cancel_campaign(campaign_id: str, tenant: Tenant, rt: RuntimeDep) -> Response:
    return await _move(rt, tenant, campaign_id, "cancelled", "cancelled")
