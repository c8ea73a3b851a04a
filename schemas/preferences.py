"""Recipient preference and suppression state (consent, opt-outs, timezone, quiet hours).

Source of truth: Cassandra ``recipient_preferences``. Every change is also published, whole,
to the compacted topic ``notify.preferences`` (key ``{tenant_id}:{recipient_hash}``), which the
send flows join with messages by recipient.
"""

from __future__ import annotations

from datetime import time
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AwareDatetime, Field, field_validator

from notiflow.schemas.enums import Category, Channel
from notiflow.schemas.messages import SCHEMA_VERSION, TenantId, Wire


class OptOut(Wire):
    """No messages of ``category`` on ``channel``; ``"*"`` matches any."""

    channel: Channel | Literal["*"] = "*"
    category: Category | Literal["*"] = "*"

    def matches(self, channel: Channel, category: Category) -> bool:
        return self.channel in ("*", channel) and self.category in ("*", category)


class QuietWindow(Wire):
    """Local wall-clock window; ``start`` inclusive, ``end`` exclusive; may wrap midnight."""

    start: time
    end: time


class PreferencesUpdate(Wire):
    """Body of ``PUT /v1/recipients/{id}/preferences`` (replaces the stored preferences)."""

    timezone: str | None = None
    quiet_hours: QuietWindow | None = None
    opt_outs: tuple[OptOut, ...] = Field(default=(), max_length=64)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown IANA timezone {v!r}") from None
        return v


Suppression = Literal["token_deactivated", "hard_bounce", "unsubscribed", "complaint"]


class PreferenceState(Wire):
    """The whole state of one recipient of one tenant (value of ``notify.preferences``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    tenant_id: TenantId
    recipient_hash: str
    version: int = Field(ge=0)
    updated_at: AwareDatetime
    timezone: str | None = None
    quiet_hours: QuietWindow | None = None
    opt_outs: tuple[OptOut, ...] = ()
    suppressed: Suppression | None = None
    """Set for a dead address or device token: nothing is sent to it."""

    @property
    def key(self) -> str:
        return state_key(self.tenant_id, self.recipient_hash)

    def blocks(self, channel: Channel, category: Category) -> str | None:
        """The suppression reason for a message, or None when it may be sent."""
        if self.suppressed is not None:
            return self.suppressed
        for o in self.opt_outs:
            if o.matches(channel, category):
                return "opted_out"
        return None


def state_key(tenant_id: str, recipient_hash: str) -> str:
    return f"{tenant_id}:{recipient_hash}"
