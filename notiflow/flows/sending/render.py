"""Render: the template of each message (read once per process and version from Cassandra)
filled with its variables (a Slack message's escaped, :func:`escaping`). A missing template,
a channel mismatch or a missing variable ends the message FAILED; a renderer that breaks an
invariant sends it to the DLQ (a bug)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from notiflow.adapters.providers.base import OutboundMessage
from notiflow.chat_hooks import served, slack_escaped
from notiflow.flows.model import Work
from notiflow.flows.sending.batch import Batch, attempt_key
from notiflow.flows.sending.context import SendContext
from notiflow.flows.sending.emit import finish, release
from notiflow.schemas.enums import Channel, Status
from notiflow.templating import MissingVariable, RenderError, render

TemplateKey = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class RenderFailure:
    """The renderer broke an invariant (not a missing variable): a DLQ case, not FAILED."""

    reason: str


def rendered(w: Work, template: dict[str, Any] | None,
             escape: Callable[[str], str] | None = None) -> OutboundMessage | str | RenderFailure:
    """``w`` rendered with ``template`` (its string variables through ``escape`` first), the
    FAILED reason, or a renderer failure."""
    r = w.record
    if template is None:
        return "unknown_template"
    if template["channel"] != r.channel.value:
        return "template_channel_mismatch"
    try:
        variables = r.variables if escape is None else {
            k: escape(v) if isinstance(v, str) else v for k, v in r.variables.items()}
        subject, body = render(template, variables)
    except MissingVariable as exc:
        return f"missing_template_variable:{exc.name}"
    except RenderError as exc:
        return RenderFailure(str(exc))
    return OutboundMessage(message_id=w.message_id, attempt=r.attempt, tenant_id=r.tenant_id,
                           channel=r.channel, tier=r.tier, recipient=r.recipient, body=body,
                           subject=subject, sender=r.sender, accepted_at=w.accepted_at,
                           category=r.category.value)


def escaping(ctx: SendContext, w: Work) -> Callable[[str], str] | None:
    """How a message's variables are escaped: for a Slack webhook, Slack's control characters
    (a template's own text may mention or link; a variable may not)."""
    r = w.record
    if r.channel is Channel.CHAT and isinstance(r.recipient, str) and served(
            r.recipient, ctx.webhook_prefixes.get(ctx.settings.slack.provider_id, ())):
        return slack_escaped
    return None


class Render:
    """Fills ``batch.rendered``; keeps the templates it read (they are immutable per
    version)."""

    def __init__(self) -> None:
        self.templates: dict[TemplateKey, dict[str, Any]] = {}

    async def __call__(self, batch: Batch, ctx: SendContext) -> None:
        await self._fetch(batch.live, ctx)
        for w in batch.live:
            r = w.record
            out = rendered(w, self.templates.get((r.tenant_id, r.template_id,
                                                  r.template_version)), escaping(ctx, w))
            if isinstance(out, RenderFailure):
                batch.decide(w, [ctx.dead_letter(w, f"renderer failed: {out.reason}",
                                                 "render_error", "bug", batch.now)])
                await release(ctx, w)
            elif isinstance(out, str):
                batch.decide(w, await finish(ctx, w, ctx.event(
                    w, Status.FAILED, batch.now, reason=out),
                    batch.content_keys.get(attempt_key(w))))
            else:
                batch.rendered[attempt_key(w)] = out

    async def _fetch(self, works: list[Work], ctx: SendContext) -> None:
        wanted = sorted({(w.record.tenant_id, w.record.template_id, w.record.template_version)
                         for w in works} - self.templates.keys())
        if not wanted:
            return
        store = ctx.ports.messages
        rows = await ctx.infra("cassandra", lambda: asyncio.gather(
            *(store.get_template(*k) for k in wanted)))
        for k, row in zip(wanted, rows, strict=True):
            if row is not None:
                self.templates[k] = row
