"""Checks every request that names a tier, a channel and a template passes, whether it asks
for one message, a schedule or a campaign: the lane (421), what the tenant may send (403),
what the platform can send (422), and the template version with every variable it declares
provided (422)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from notiflow.gateway.errors import ApiError, forbidden, unprocessable
from notiflow.gateway.runtime import Runtime
from notiflow.recipient_checks import recipient_problem
from notiflow.schemas.enums import Category, Channel, Tier
from notiflow.settings import Settings, TenantConfig
from notiflow.templating import missing_variables


class Addressed(Protocol):
    """A request for messages of one tier, channel and template version."""

    @property
    def tier(self) -> Tier: ...

    @property
    def channel(self) -> Channel: ...

    @property
    def category(self) -> Category: ...

    @property
    def template_id(self) -> str: ...

    @property
    def template_version(self) -> int: ...

    @property
    def sender(self) -> str | None: ...


def check_lane(settings: Settings, req: Addressed) -> None:
    """421 when this process serves the other lane (``settings.api_lane``)."""
    if req.tier not in settings.lane_tiers(settings.api_lane):
        other = settings.policy(req.tier).lane
        raise ApiError(421, "misdirected", "wrong_lane",
                       f"this API process serves the {settings.api_lane} lane; tier "
                       f"{req.tier.value} is served by the {other} lane's API")


def check_sender(settings: Settings, tenant: TenantConfig, req: Addressed) -> None:
    """403 for a tier, channel, template or sender the tenant may not use; 422 for a category
    its tier may not carry (:func:`check_category`) and for a channel without a configured
    provider."""
    if req.tier not in tenant.tiers:
        allowed = ", ".join(sorted(t.value for t in tenant.tiers))
        raise forbidden("tier_not_allowed",
                        f"tenant {tenant.id} may not send tier {req.tier.value} "
                        f"(allowed: {allowed})")
    if req.channel not in tenant.channels:
        raise forbidden("channel_not_allowed",
                        f"tenant {tenant.id} may not send on channel {req.channel.value}")
    if not tenant.allows_template(req.template_id):
        raise forbidden("template_not_allowed",
                        f"tenant {tenant.id} may not use template {req.template_id}")
    if not tenant.allows_sender(req.sender):
        raise forbidden("sender_not_allowed",
                        f"tenant {tenant.id} may not send as {req.sender!r}")
    check_category(settings, req)
    if req.channel not in settings.enabled_channels():
        raise unprocessable("channel_unavailable",
                            f"channel {req.channel.value} has no configured provider")


def check_category(settings: Settings, req: Addressed) -> None:
    """422 ``category_tier_not_allowed`` for a category its tier may not carry
    (``settings.category_tiers``: marketing is never P0 or P1)."""
    allowed = settings.category_tiers.tiers(req.category)
    if req.tier not in allowed:
        raise unprocessable("category_tier_not_allowed",
                            f"category {req.category.value} may not be sent at tier "
                            f"{req.tier.value} (allowed: "
                            f"{', '.join(sorted(t.value for t in allowed)) or 'none'})",
                            field="tier")


def check_recipient(settings: Settings, tenant: TenantConfig, channel: Channel,
                    recipient: object) -> None:
    """422 with the code of :func:`~notiflow.recipient_checks.recipient_problem`
    (``recipient_not_served``, ``inbox_not_configured``) for a recipient the platform cannot
    serve; campaign rows pass the same check in the expander."""
    problem = recipient_problem(settings, tenant, channel, recipient)
    if problem is not None:
        raise unprocessable(problem.code, problem.message)


async def check_template(rt: Runtime, tenant: TenantConfig, req: Addressed,
                         provided: Mapping[str, object], how: str = "supplied") -> None:
    """422 unless the template version exists for this tenant and channel and every variable
    it declares is among ``provided`` (the message's variables, a campaign's mapped columns:
    ``how`` names which in the error)."""
    row = await rt.template(tenant.id, req.template_id, req.template_version)
    if row is None or row.channel != req.channel.value:
        what = "does not exist" if row is None else f"is not a {req.channel.value} template"
        raise unprocessable("unknown_template",
                            f"template {req.template_id} version {req.template_version} {what}")
    absent = missing_variables(row.variables, provided)
    if absent:
        raise unprocessable("missing_template_variable",
                            f"template variables not {how}: {', '.join(absent)}",
                            variables=list(absent))
