"""The ports the dataflows talk through: what each store, limiter and board does, not how.

A flow sees only these Protocols and the value types they exchange; the Redis, Cassandra,
Kafka and HTTP implementations live beside them in ``notiflow/adapters/`` and are injected
(:mod:`notiflow.adapters.send_ports` opens the send flow's set). Tests substitute fakes.

What an unreachable store raises is named in :mod:`notiflow.adapters.outages`. This module
imports no driver and no implementation, not even indirectly
(``tests/unit/test_ports_stand_alone.py``): the implementations import their values from here.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Protocol

import orjson

from notiflow.adapters.breaker.model import Admission, State, StateChange
from notiflow.adapters.providers.base import Outcome, ProviderClient
from notiflow.adapters.rows import AttemptRow, MessageRow, TemplateRow
from notiflow.schemas.enums import Tier
from notiflow.schemas.preferences import PreferenceState, Suppression
from notiflow.schemas.users import UserProfile, UserView
from notiflow.settings import PaceRule


class Verdict(enum.Enum):
    """A cap check's answer; a refusal's value is the SUPPRESSED event's reason."""

    OK = "ok"
    RECIPIENT = "frequency_cap"
    TENANT = "tenant_daily_cap"


@dataclass(frozen=True, slots=True)
class CapCheck:
    """What releasing one message is checked against. ``limit`` None: its category has no
    recipient cap (the recipient key only remembers that the message was counted);
    ``tenant_key`` None: no tenant cap applies."""

    recipient_key: str
    member: str
    window: timedelta
    limit: int | None
    tenant_key: str | None = None
    tenant_cap: int | None = None
    fail_closed: bool = False


class Caps(Protocol):
    """Recipient and tenant caps counted cluster-wide (``redis_caps.CapStore``)."""

    async def admit(self, checks: Sequence[CapCheck], now: datetime) -> list[Verdict]: ...


@dataclass(frozen=True, slots=True)
class LeaseState:
    """Result of trying to take a lease."""

    acquired: bool
    holder: str | None = None
    """``pending:{owner}:{ms}`` or ``done:{...}`` when not acquired."""

    @property
    def done(self) -> dict[str, object] | None:
        if self.holder and self.holder.startswith("done:"):
            value = orjson.loads(self.holder[5:])
            return value if isinstance(value, dict) else {}
        return None

    def pending_owner(self) -> str | None:
        if self.holder and self.holder.startswith("pending:"):
            return self.holder[8:].rpartition(":")[0] or self.holder[8:]
        return None

    def pending_since_ms(self) -> int | None:
        """When the holder took or last confirmed the lease (epoch ms)."""
        if self.holder and self.holder.startswith("pending:"):
            tail = self.holder.rpartition(":")[2]
            return int(tail) if tail.isdigit() else 0
        return None


class Confirm(enum.IntEnum):
    """The answer of a confirm: whether this attempt may call the provider."""

    LOST = 0
    """Another process took the lease over or finished the message: it sends (or sent),
    this one does not."""
    OURS = 1
    """Send: the lease is ours and the gate says ``sending``."""
    CANCELLED = 2
    """The message was cancelled: end the attempt CANCELLED, never send."""


class Leases(Protocol):
    """Per-attempt send leases, content fingerprints and crash counts (``redis_dedup``),
    and the send side of the cancel gate (``cancel_gate``)."""

    @property
    def owner(self) -> str: ...

    def lease_key(self, message_id: str, attempt: int) -> str: ...

    def gate_key(self, message_id: str) -> str: ...

    def content_key(self, tenant_id: str, fingerprint: str) -> str: ...

    async def acquire(self, keys: list[str], ttl: timedelta) -> list[LeaseState]: ...

    async def take_over(self, key: str, stale: str, ttl: timedelta) -> bool: ...

    def campaign_gate_key(self, message_id: str) -> str | None: ...

    async def confirm(self, key: str, gate: str, ttl: timedelta,
                      campaign: str | None = None) -> Confirm: ...

    async def finish(self, items: list[tuple[str, dict[str, object]]], ttl: timedelta,
                     clear: Sequence[str] = ()) -> None: ...

    async def release(self, keys: list[str]) -> None: ...

    async def claim_content(self, items: list[tuple[str, str]],
                            window: timedelta) -> list[str | None]: ...

    async def release_content(self, items: list[tuple[str, str]]) -> None: ...

    async def count_crash(self, flow: str, source: str, ttl: timedelta) -> int: ...

    async def crashes(self, flow: str) -> dict[str, int]: ...

    async def aclose(self) -> None: ...


class Messages(Protocol):
    """Reads of delivery state and templates (Cassandra, the source of truth)."""

    async def message(self, message_id: str) -> MessageRow | None: ...

    async def get_template(self, tenant_id: str, template_id: str,
                           version: int) -> TemplateRow | None: ...

    async def attempts(self, message_id: str) -> list[AttemptRow]: ...


class Preferences(Protocol):
    """Recipient state: read for strong consent, written when a provider says "dead"."""

    async def get_states(self, keys: Iterable[tuple[str, str]]
                         ) -> Mapping[str, PreferenceState]: ...

    async def suppress(self, tenant_id: str, recipient_hash: str,
                       reason: Suppression) -> Any: ...

    async def deactivate_token(self, tenant_id: str, token_hash: str, reason: str, *,
                               older: Sequence[str] = ()) -> Any: ...


class SmsConsent(Protocol):
    """A phone number's SMS consent as an inbound keyword changes it (``PreferenceStore``)."""

    async def suppress(self, tenant_id: str, recipient_hash: str,
                       reason: Suppression) -> Any: ...

    async def unsuppress(self, tenant_id: str, recipient_hash: str, *,
                         only: Suppression | None = None) -> Any: ...


TOPIC_BUCKETS: Final = 16
"""The pieces a topic's subscribers are kept in (by a stable hash of the user id)."""


def topic_bucket(user_id: str) -> int:
    """The bucket of a user in every topic: stable across processes and versions."""
    return zlib.crc32(user_id.encode()) % TOPIC_BUCKETS


class TopicSubscriptions(Protocol):
    """Which of a tenant's users follow which topic (Cassandra ``topic_subscribers`` and
    ``user_topics``); every write is idempotent."""

    async def subscribe(self, tenant_id: str, topic: str, user_ids: Sequence[str],
                        now: datetime) -> None: ...

    async def unsubscribe(self, tenant_id: str, topic: str,
                          user_ids: Sequence[str]) -> None: ...

    async def subscribers(self, tenant_id: str, topic: str, bucket: int,
                          after: str | None, limit: int) -> list[str]:
        """User ids of one bucket in id order, those after ``after``, at most ``limit``."""
        ...

    async def topics_of(self, tenant_id: str, user_id: str) -> list[str]: ...

    async def forget_user(self, tenant_id: str, user_id: str) -> None:
        """Remove every subscription of the user (an erasure)."""
        ...


UserChange = Callable[[UserProfile | None], UserProfile | None]
"""Given the stored profile (None for a new user), the wanted profile, or None when nothing
changes."""


class UserContention(RuntimeError):
    """Too many concurrent writers on one user; the caller may retry."""


class UserRecords(Protocol):
    """The users of every tenant (Cassandra ``users``), each change a compare-and-set."""

    async def get(self, tenant_id: str, user_id: str) -> UserView | None: ...

    async def change(self, tenant_id: str, user_id: str, change: UserChange,
                     now: datetime | None = None) -> tuple[UserView | None, bool]:
        """(the user now stored, whether this call wrote it); a write makes ``version + 1``
        (1 for a new user). Raises :class:`UserContention`."""
        ...

    async def erase(self, tenant_id: str, user_id: str) -> UserView | None:
        """Delete the user; the user as it was, None when there was none."""
        ...


class Breakers(Protocol):
    """Circuit breakers per provider account (``breaker.CircuitBreakers`` or the bulk
    lane's ``breaker_lanes.BulkBreakers``)."""

    async def allow(self, provider_id: str) -> Admission: ...

    async def record(self, provider_id: str, outcome: Outcome, reason: str | None,
                     latency_s: float, probe: bool = False, *,
                     episode: int | None = None) -> State: ...

    def state(self, provider_id: str) -> State: ...

    def weight(self, provider_id: str) -> float: ...

    def on_change(self, listener: Callable[[StateChange], None]) -> Callable[[], None]: ...

    async def aclose(self) -> None: ...


class Quota(Protocol):
    """Provider and tenant capacity tokens (``ratelimit.CapacityLimiter``); ``acquire``
    returns None when a token was taken, else the seconds to wait."""

    async def acquire(self, provider_id: str, tier: Tier, tenant_id: str | None = None,
                      tenant_rate: float | None = None) -> float | None: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Slot:
    """The answer for one post: wait ``wait_us`` (0: now); ``reserved`` when the slot is the
    caller's (it may post at ``now + wait`` without asking again)."""

    wait_us: int
    reserved: bool

    @property
    def wait(self) -> float:
        return self.wait_us / 1e6


class Pace(Protocol):
    """What the send flow asks before a chat post (``flows/send/stages/route.py``)."""

    async def reserve(self, provider_id: str, webhook: str, rule: PaceRule, *,
                      tenant_id: str) -> Slot: ...

    async def aclose(self) -> None: ...


class Health(Protocol):
    """A process's shared view of whether Redis answers
    (:class:`notiflow.adapters.redis_health.RedisHealth`)."""

    @property
    def down(self) -> bool: ...

    def failed(self) -> None: ...

    def answered(self) -> None: ...


class Boards(Protocol):
    """The signals a send flow publishes and follows (Redis hashes with expiring fields):
    its oldest unsent message per tier, and P0's worst latency."""

    async def report_backlog(self, tier: Tier, oldest: float | None) -> None: ...

    async def report_p0_worst(self, worst_s: float) -> None: ...

    async def p0_worst(self) -> float | None: ...


@dataclass(frozen=True)
class SendPorts:
    """Everything the send step does I/O through, opened once per process."""

    leases: Leases
    caps: Caps
    messages: Messages
    preferences: Preferences
    breakers: Breakers
    quota: Quota
    boards: Boards
    providers: Mapping[str, ProviderClient]
    close: Callable[[], Awaitable[None]]
    """Releases every client (the providers' too)."""
    health: Health | None = None
    """The process's shared view of Redis (``adapters/redis_health.py``)."""
    pace: Pace | None = None
    """Per-webhook slots of the chat providers (``adapters/webhook_pace.py``); None: chat
    posts are not paced (their ``429`` still is)."""


OpenSendPorts = Callable[[], Awaitable[SendPorts]]
"""How a dispatcher opens its ports on its own event loop (injected by the flow's builder)."""
