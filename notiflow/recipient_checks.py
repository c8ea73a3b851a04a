"""The recipient checks every message passes before it is accepted, whether it arrives as an
API request or as a campaign row: pure functions that return why a recipient cannot be
served (the API answers 422 with it, the expander rejects the row with it), never raising.

Format checks (E.164 numbers, email addresses, device tokens, ``inapp:`` ids, the shape of a
chat webhook URL) are the wire contract's (``schemas/messages.py``); these add what depends
on the deployment and the tenant."""

from __future__ import annotations

from dataclasses import dataclass

from notiflow.chat_hooks import served
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings, TenantConfig


@dataclass(frozen=True, slots=True)
class RecipientProblem:
    """Why a recipient cannot be served: a stable ``code`` and a ``message`` that never
    quotes the recipient."""

    code: str
    message: str


def recipient_problem(settings: Settings, tenant: TenantConfig, channel: Channel,
                      recipient: object) -> RecipientProblem | None:
    """``recipient_not_served`` for a chat recipient no enabled chat provider posts to (the
    platform calls no URL outside its providers' webhook prefixes); ``inbox_not_configured``
    for an in-app message of a tenant whose users cannot open their inbox (no
    ``inbox_keys``); None when the recipient can be served."""
    if channel is Channel.INAPP and not tenant.inbox_keys:
        return RecipientProblem("inbox_not_configured",
                                f"tenant {tenant.id} has no inbox_keys: its users could not "
                                "open their inbox")
    if channel is not Channel.CHAT or not isinstance(recipient, str):
        return None
    enabled = settings.enabled_providers()
    prefixes = [p for provider, ps in settings.webhook_prefixes().items() if provider in enabled
                for p in ps]
    if served(recipient, prefixes):
        return None
    return RecipientProblem("recipient_not_served",
                            "no chat provider of this deployment posts to that webhook URL; "
                            f"it must start with one of: {', '.join(prefixes) or '(none)'}")
