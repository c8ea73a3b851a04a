"""Enumerations shared by every wire contract."""

from enum import StrEnum


class Channel(StrEnum):
    SMS = "SMS"
    EMAIL = "EMAIL"
    PUSH = "PUSH"
    CHAT = "CHAT"
    """A team chat's incoming webhook (Slack, Microsoft Teams); the recipient is its URL."""
    INAPP = "INAPP"
    """A user's in-app inbox (``inapp:<user id>``), pushed live to the user's open apps."""


class Tier(StrEnum):
    P0 = "P0"
    P1 = "P1"
    P2 = "P2"
    P3 = "P3"


class Category(StrEnum):
    OTP = "otp"
    SECURITY = "security"
    TRANSACTIONAL = "transactional"
    ACCOUNT = "account"
    MARKETING = "marketing"


class PushPlatform(StrEnum):
    IOS = "ios"
    ANDROID = "android"
    WEB = "web"


class Status(StrEnum):
    """Message lifecycle (docs/design.md, "Message states"); ordering lives in ``status.py``."""

    CREATED = "CREATED"
    SCHEDULED = "SCHEDULED"
    QUEUED = "QUEUED"
    PROCESSING = "PROCESSING"
    RETRY_PENDING = "RETRY_PENDING"
    UNKNOWN = "UNKNOWN"
    PROVIDER_ACCEPTED = "PROVIDER_ACCEPTED"
    SENT = "SENT"
    DELIVERED = "DELIVERED"
    OPENED = "OPENED"
    CLICKED = "CLICKED"
    FAILED = "FAILED"
    EXPIRED = "EXPIRED"
    SUPPRESSED = "SUPPRESSED"
    BOUNCED = "BOUNCED"
    CANCELLED = "CANCELLED"


TERMINAL_STATUSES = frozenset(
    {
        Status.PROVIDER_ACCEPTED,
        Status.SENT,
        Status.DELIVERED,
        Status.OPENED,
        Status.CLICKED,
        Status.FAILED,
        Status.EXPIRED,
        Status.SUPPRESSED,
        Status.BOUNCED,
        Status.CANCELLED,
    }
)
"""Statuses after which the platform owes the message no further send attempt."""
