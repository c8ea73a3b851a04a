"""Render: the template of each message (read once per process and version from Cassandra),
in the variant for the message's ``locale`` (``TemplateRow.in_locale``), filled with its
variables (a Slack message's escaped, :func:`escaping`), off the dispatcher's
event loop and within the render budget (``settings.render_limits``). A missing template, a
channel mismatch, a missing variable or any rendering failure (the template's own error, a
sandbox refusal, the budget) ends the message FAILED: a template is tenant input, so it never
fails the batch nor counts as a platform bug."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from cachetools import LRUCache

from notiflow.adapters.providers.base import OutboundMessage
from notiflow.adapters.rows import TemplateRow
from notiflow.chat_hooks import served, slack_escaped, teams_escaped
from notiflow.flows.common.items import Work
from notiflow.flows.send.stages.context import SendContext
from notiflow.flows.send.stages.emit import finish
from notiflow.flows.send.stages.send_batch import Batch, attempt_key
from notiflow.schemas.enums import Channel, Status
from notiflow.settings import RenderLimits
from notiflow.templating import MissingVariable, OverBudget, RenderError, render
from notiflow.unsubscribe import Unsubscription, list_unsubscribe, wants_unsubscribe

log = logging.getLogger("notiflow.flows.sending.render")

TemplateKey = tuple[str, str, int]
TEMPLATE_CACHE = 4096
"""Template versions a send process keeps (least recently used leave first)."""
RENDER_THREADS = 2
RENDER_ERROR = "render_error"


@dataclass(frozen=True, slots=True)
class RenderFailure:
    """Rendering failed (``detail`` for the log); the message ends FAILED ``render_error``.
    ``spent``: the template ran out of CPU time or loop iterations."""

    detail: str
    spent: bool = False


def rendered(w: Work, template: TemplateRow | None,
             escape: Callable[[str], str] | None = None,
             limits: RenderLimits | None = None) -> OutboundMessage | str | RenderFailure:
    """``w`` rendered with ``template`` (its string variables through ``escape`` first)
    within ``limits``, the FAILED reason, or a rendering failure. Never raises."""
    r = w.record
    if template is None:
        return "unknown_template"
    if template.channel != r.channel.value:
        return "template_channel_mismatch"
    try:
        variables = r.variables if escape is None else {
            k: escape(v) if isinstance(v, str) else v for k, v in r.variables.items()}
        _, content = template.in_locale(r.locale)
        subject, body = render(content, variables, limits or RenderLimits())
    except MissingVariable as exc:
        return f"missing_template_variable:{exc.name}"
    except OverBudget as exc:
        return RenderFailure(str(exc), spent=True)
    except RenderError as exc:
        return RenderFailure(str(exc))
    except Exception as exc:
        return RenderFailure(f"render failed: {type(exc).__name__}")
    return OutboundMessage(message_id=w.message_id, attempt=r.attempt, tenant_id=r.tenant_id,
                           channel=r.channel, tier=r.tier, recipient=r.recipient, body=body,
                           subject=subject, sender=r.sender, accepted_at=w.accepted_at,
                           category=r.category.value)


def escaping(ctx: SendContext, w: Work) -> Callable[[str], str] | None:
    """How a message's variables are escaped: for a Slack or Teams webhook, that service's
    control characters (a template's own text may mention, style or link; a variable may
    not)."""
    r = w.record
    if r.channel is not Channel.CHAT or not isinstance(r.recipient, str):
        return None
    for chat, escape in ((ctx.settings.slack, slack_escaped),
                         (ctx.settings.teams, teams_escaped)):
        if served(r.recipient, ctx.webhook_prefixes.get(chat.provider_id, ())):
            return escape
    return None


Job = tuple[Work, TemplateKey, TemplateRow | None, Callable[[str], str] | None]


def render_all(jobs: list[Job],
               limits: RenderLimits) -> list[OutboundMessage | str | RenderFailure]:
    """Every job rendered in order. Once a template version has spent its budget in one
    locale, the rest of its messages in that locale here fail without rendering (one costly
    template costs one budget per batch, not one per message)."""
    spent: dict[tuple[TemplateKey, str | None], RenderFailure] = {}
    out: list[OutboundMessage | str | RenderFailure] = []
    for w, key, template, escape in jobs:
        done = spent.get((key, w.record.locale))
        result = done if done is not None else rendered(w, template, escape, limits)
        if isinstance(result, RenderFailure) and result.spent:
            spent[key, w.record.locale] = result
        out.append(result)
    return out


def with_unsubscribe(ctx: SendContext, w: Work, message: OutboundMessage,
                     now: datetime) -> OutboundMessage:
    """``message`` with the one-click unsubscribe headers when it is an email that needs
    them (``notiflow/unsubscribe.py``) and the deployment has a public URL for the links."""
    r, keys, rule = w.record, ctx.unsubscribe_keys, ctx.settings.unsubscribe
    if keys is None or rule.base_url is None or not wants_unsubscribe(r.channel, r.tier,
                                                                      r.category):
        return message
    token = keys.issue(Unsubscription(r.tenant_id, w.recipient_hash, r.category, now))
    return replace(message, headers=(*message.headers,
                                     *list_unsubscribe(token, rule.base_url, rule.mailto)))


def template_key(w: Work) -> TemplateKey:
    r = w.record
    return (r.tenant_id, r.template_id, r.template_version)


class Render:
    """Fills ``batch.rendered``; keeps the templates it read (they are immutable per
    version), at most :data:`TEMPLATE_CACHE` of them. Renders on its own threads, so the
    dispatcher's loop goes on with other batches meanwhile."""

    def __init__(self, cache_size: int = TEMPLATE_CACHE) -> None:
        self.templates: LRUCache[TemplateKey, TemplateRow] = LRUCache(maxsize=cache_size)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            RENDER_THREADS, thread_name_prefix="render")

    async def __call__(self, batch: Batch, ctx: SendContext) -> None:
        templates = await self._fetch(batch.live, ctx)
        works = list(batch.live)
        jobs: list[Job] = [(w, template_key(w), templates.get(template_key(w)),
                            escaping(ctx, w)) for w in works]
        results = await asyncio.get_running_loop().run_in_executor(
            self._pool, render_all, jobs, ctx.settings.render_limits)
        for w, out in zip(works, results, strict=True):
            if isinstance(out, RenderFailure):
                log.warning("message %s (tenant %s, template %s@%s): %s", w.message_id,
                            w.record.tenant_id, w.record.template_id,
                            w.record.template_version, out.detail)
                out = RENDER_ERROR
            if isinstance(out, str):
                batch.decide(w, await finish(ctx, w, ctx.event(
                    w, Status.FAILED, batch.now, reason=out),
                    batch.content_keys.get(attempt_key(w))))
            else:
                batch.rendered[attempt_key(w)] = with_unsubscribe(ctx, w, out, batch.now)

    async def _fetch(self, works: list[Work],
                     ctx: SendContext) -> dict[TemplateKey, TemplateRow]:
        """The templates of ``works`` (cached or read now; an unknown one is absent)."""
        keys = {template_key(w) for w in works}
        found = {k: row for k in keys if (row := self.templates.get(k)) is not None}
        wanted = sorted(keys - found.keys())
        if not wanted:
            return found
        store = ctx.ports.messages
        rows = await ctx.infra("cassandra", lambda: asyncio.gather(
            *(store.get_template(*k) for k in wanted)))
        for k, row in zip(wanted, rows, strict=True):
            if row is not None:
                self.templates[k] = found[k] = row
        return found
