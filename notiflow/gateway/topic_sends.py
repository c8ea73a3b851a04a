"""``POST /v1/topics/{topic}/messages`` (``docs/users.md``, "Sending to a topic"): a campaign
whose rows are the topic's subscribers when an expander starts it
(:mod:`notiflow.schemas.topic_sends`). The request passes every channel's checks as a send
to a user does and a campaign's limits, window and quotas; it is answered ``201`` with the
campaign's view, and ``GET /v1/campaigns/{id}`` follows it like any campaign."""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError

from notiflow.adapters.manifests import tenant_location
from notiflow.gateway import examples
from notiflow.gateway.auth import RuntimeDep, Tenant, read_model
from notiflow.gateway.campaigns import CAMPAIGN_LINKS, check_campaign, start_campaign
from notiflow.gateway.checks import check_lane, check_sender, check_template
from notiflow.gateway.errors import unprocessable
from notiflow.gateway.openapi import json_body, location, success, tenant_errors
from notiflow.gateway.runtime import Runtime
from notiflow.gateway.topics import TopicPath, checked_topic
from notiflow.gateway.user_sends import Option
from notiflow.preference_links import LINK_VARIABLE
from notiflow.schemas.campaigns import CampaignView, new_campaign_id
from notiflow.schemas.topic_sends import TopicSendRequest
from notiflow.settings import TenantConfig

router = APIRouter()
SNAPSHOTS: Final = "topics"
"""Where in the tenant's manifest area topic snapshots are written."""


async def _check_channels(rt: Runtime, tenant: TenantConfig, body: TopicSendRequest
                          ) -> bool:
    """Every channel's checks (403/421/422); whether the messages need the preference page
    link (a template reads it, the variables do not set it and the deployment has a
    page)."""
    link = (LINK_VARIABLE not in body.variables
            and rt.settings.preference_page.base_url is not None)
    provided = {**body.variables, **({LINK_VARIABLE: ""} if link else {})}
    needed = False
    for o in body.channels:
        option = Option(body.tier, o.channel, body.category, o.template_id,
                        o.template_version, o.sender)
        check_lane(rt.settings, option)
        check_sender(rt.settings, tenant, option)
        await check_template(rt, tenant, option, provided)
        row = await rt.template(tenant.id, o.template_id, o.template_version)
        needed = needed or (link and row is not None and LINK_VARIABLE in row.variables)
    return needed


@router.post(
    "/v1/topics/{topic}/messages", status_code=201, response_model=CampaignView,
    responses={**success(201, "The topic send, a campaign (`state: scheduled`).",
                         headers=location("the campaign"), links=CAMPAIGN_LINKS),
               **tenant_errors(
                   400, 403, 413, 421, 422, 429, 503,
                   r422="`invalid_body`, `invalid_topic`; not stated by the schema: "
                        "`rate_too_high`, `quota_too_large`, `webhook_url_not_allowed`, "
                        "`window_too_long`, `window_over`, `channel_unavailable`, "
                        "`category_tier_not_allowed`, `unknown_template`, "
                        "`missing_template_variable`.",
                   r429="`campaign_quota`, `backlog`, `priority_pressure`.",
                   r503="`users_unavailable`, `cassandra_unavailable`.")},
    openapi_extra=json_body(TopicSendRequest, "One message to every subscriber of the topic.",
                            examples.TOPIC_SEND))
async def send_to_topic(topic: TopicPath, request: Request, tenant: Tenant,
                        rt: RuntimeDep) -> Response:
    """Send to a topic's subscribers: 201 with the campaign's view (state ``scheduled``
    until an expander takes it and snapshots the subscribers)."""
    checked_topic(topic)
    body = await read_model(request, TopicSendRequest)
    rt.users()
    link = await _check_channels(rt, tenant, body)
    campaign_id = new_campaign_id()
    snapshot = f"{tenant_location(rt.settings, tenant.id)}{SNAPSHOTS}/{campaign_id}.jsonl"
    try:
        req = body.campaign(topic, snapshot, link)
    except ValidationError as exc:
        reason = str(exc.errors(include_input=False)[0]["msg"])
        raise unprocessable("invalid_body", reason) from None
    starts, ends = await check_campaign(rt, tenant, req)
    return await start_campaign(rt, tenant, req, campaign_id, starts, ends, None)
