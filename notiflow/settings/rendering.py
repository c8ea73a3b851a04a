"""The budget of one template render."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from notiflow.settings.section import _Frozen


class RenderLimits(_Frozen):
    """The budget of one template render (docs/api.md, "Templates"); a render over any of
    them fails (``render_error``) instead of running on."""

    cpu_time: timedelta = Field(timedelta(milliseconds=50), gt=timedelta(0))
    """CPU time of the rendering thread per render (subject and body together)."""
    max_output: int = Field(256 * 1024, ge=1024, le=64 * 1024 * 1024)
    """Characters of a rendered subject or body, and of any string or sequence a template
    builds; everything its expressions output, at every macro level, may total four times
    this."""
    max_int_bits: int = Field(4096, ge=64, le=1 << 20)
    """Bits of any integer a template computes."""
    max_range: int = Field(10_000, ge=1, le=1_000_000)
    """Items of one ``range()``."""
    max_iterations: int = Field(100_000, ge=1)
    """Loop iterations per render, all loops together."""
    max_depth: int = Field(20, ge=1, le=100)
    """Nested calls (macros, ``caller()``, recursive loops)."""


class Unsubscribe(_Frozen):
    """One-click unsubscribe (RFC 8058) of bulk email (``NOTIFLOW_UNSUBSCRIBE__*``): where
    the links of ``List-Unsubscribe`` point, and how long a link works."""

    base_url: str | None = Field(None, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    """The public URL of the Messaging API (``https://notify.example.com``); the links are
    ``{base_url}/unsubscribe/{token}``. Unset: no email carries the headers (mailbox
    providers require them of bulk senders: set it in production)."""
    mailto: str | None = Field(None, pattern=r"^[^@\s<>]+@[^@\s<>]+$")
    """An address whose mail the operator treats as an unsubscribe request, listed as the
    ``mailto:`` link (RFC 2369) beside the https one; the token is its subject."""
    max_age: timedelta = Field(timedelta(days=400), gt=timedelta(0))
    """How long after the email was sent its link still unsubscribes."""


class SmsReplies(_Frozen):
    """What the platform texts back to an inbound SMS keyword (``NOTIFLOW_SMS_REPLIES__*``;
    carriers require an answer to each). Twilio numbers answer in the webhook's TwiML;
    an unset text sends no answer (the provider's own opt-out handling may answer)."""

    stop: str | None = Field(
        "You are unsubscribed and will receive no more messages from this number. "
        "Reply START to resubscribe.", max_length=320)
    start: str | None = Field(
        "You are subscribed again. Reply STOP to unsubscribe, HELP for help.", max_length=320)
    help: str | None = Field(
        "Reply STOP to unsubscribe, START to resubscribe. Msg&data rates may apply.",
        max_length=320)
    """Answer to HELP unless the number is one tenant's with its own ``sms_help``."""


class PreferencePage(_Frozen):
    """The hosted preference page (``NOTIFLOW_PREFERENCE_PAGE__*``): where its links point
    and how long one works."""

    base_url: str | None = Field(None, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    """The public URL of the Messaging API's bulk lane (``https://notify.example.com``); links
    are ``{base_url}/preferences/{token}``. Unset: no link is issued, and a template of a
    send to a user that reads ``preferences_url`` is refused."""
    max_age: timedelta = Field(timedelta(days=30), gt=timedelta(0))
    """How long a link works after it was issued."""
