"""The channel-provider interface every adapter implements, its normalised outcome, and the
:class:`ProviderSpec` every provider package exposes to the registry.

An adapter turns one :class:`OutboundMessage` into one provider request on the provider's
real wire format and returns a :class:`SendResult`. It never raises for provider answers or
transport failures: those are outcomes (errors are data).
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings


class Outcome(StrEnum):
    ACCEPTED = "accepted"
    """The provider took responsibility for the message (has a provider message id)."""
    TRANSIENT = "transient"
    """Not sent; retrying may succeed (timeout before send, 5xx, 429, connection refused)."""
    PERMANENT = "permanent"
    """Not sent and never will be (invalid address, unsubscribed, rejected content)."""
    AMBIGUOUS = "ambiguous"
    """The request may or may not have been accepted (timeout after the request was sent)."""


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """A rendered message ready for a provider."""

    message_id: str
    attempt: int
    tenant_id: str
    channel: Channel
    tier: Tier
    recipient: str | PushRecipient
    body: str
    subject: str | None = None
    sender: str | None = None
    """Who the message comes from (an SMS number or id, an email address); None: the
    account's configured sender."""
    accepted_at: datetime | None = None
    """When the platform accepted the message (an inbox item's time)."""
    category: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    """Extra email headers, in order (``List-Unsubscribe``, ``List-Unsubscribe-Post``)."""

    @property
    def idempotency_key(self) -> str:
        """Provider idempotency key (message_id + logical attempt), where the API has one."""
        return f"{self.message_id}:{self.attempt}"


@dataclass(frozen=True, slots=True)
class SendResult:
    outcome: Outcome
    provider_id: str
    started_at: datetime
    completed_at: datetime
    provider_message_id: str | None = None
    reason: str | None = None
    """Normalised reason, e.g. ``invalid_recipient``, ``rate_limited``, ``server_error``."""
    error_code: str | None = None
    """The provider's own error code, as text."""
    retry_after_s: float | None = None
    deactivate_recipient: bool = False
    """True when the provider says the address/token is dead (unregistered, hard bounce)."""


class ProviderClient(Protocol):
    """One provider account of one channel."""

    provider_id: str
    channel: Channel

    async def send(self, message: OutboundMessage) -> SendResult:
        """Send one message; never raises for provider or transport errors."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


@runtime_checkable
class BatchSender(Protocol):
    """A provider client that can carry several messages in one request (SendGrid's
    personalizations). Each message keeps its own result: the provider accepts or refuses
    each recipient of the request on its own, and events name each one."""

    provider_id: str
    channel: Channel
    max_batch: int
    """Most messages one request may carry (the provider's limit)."""

    async def send_batch(self, messages: Sequence[OutboundMessage],
                         traceparents: Sequence[str | None]) -> list[SendResult]:
        """Send ``messages`` in as few requests as the provider allows; one result per
        message, in order (``traceparents`` pairs each with the trace it belongs to). Never
        raises for provider or transport errors."""
        ...


Opener = Callable[[Settings, float | timedelta], Awaitable[ProviderClient]]
"""(settings, per-send timeout) → the open client of the provider's configured account."""


class Emulator(Protocol):
    """A provider's emulator as ``notiflow fakes`` serves it (an ``aiohttp`` application's
    part: ``notiflow.fakes.common.Emulator``)."""

    def routes(self) -> Sequence[Any]:
        """Its ``aiohttp`` routes: the provider's API under its prefix and its admin API under
        ``/_admin/<name>/``."""
        ...

    def reset(self) -> None:
        """Forget every record, pending callback and knob."""
        ...

    def lifecycle(self, app: Any, /) -> AsyncIterator[None]:
        """``cleanup_ctx`` hook: what runs while the application runs (callbacks, other
        listeners)."""
        ...


EmulatorFactory = Callable[[Settings], Emulator]
"""settings → the provider's emulator."""


def imported(module: str, name: str) -> Callable[[], Any]:
    """A loader of ``name`` from ``module``, imported when first called: a plug-in's client,
    emulator and receipt routes load only in the processes that use them."""
    def load() -> Any:
        return getattr(importlib.import_module(module), name)

    return load


def opener(module: str, name: str) -> Opener:
    """An :data:`Opener` of the client class ``name`` of ``module``
    (``await cls.open(settings, timeout=timeout)``), imported when first called."""
    load = imported(module, name)

    async def open_client(settings: Settings, timeout: float | timedelta) -> ProviderClient:
        client: ProviderClient = await load().open(settings, timeout=timeout)
        return client

    return open_client


@dataclass(frozen=True, slots=True)
class ReceiptRoutes:
    """The API's routes for a provider's delivery webhooks (its plug-in's ``routes`` module)."""

    router: Any
    """A ``fastapi.APIRouter`` holding them."""
    max_body: int
    """The largest body (bytes) they read; the API's body ceiling covers it."""


@dataclass(frozen=True, slots=True)
class DevEndpoints:
    """Where a plug-in's development environment points: the loopback addresses of
    ``notiflow fakes`` and of the API that takes the emulators' receipts, and the APNs
    emulator's own port and TLS directory."""

    fakes_url: str
    """The emulators' base URL (``http://127.0.0.1:<fakes_port>``); each under its prefix."""
    fakes_port: int
    webhook_url: str
    """The base URL the emulators post receipts to (the API's, ``http://127.0.0.1:<port>``)."""
    apns_port: int
    """The APNs emulator's TLS port."""
    tls_dir: Path
    """Where the APNs emulator's throw-away CA and certificate are written."""

    @classmethod
    def loopback(cls, *, fakes_port: int, webhook_port: int, apns_port: int,
                 tls_dir: Path) -> DevEndpoints:
        """The endpoints of emulators on ``fakes_port`` and an API on ``webhook_port``, both on
        ``127.0.0.1``."""
        return cls(f"http://127.0.0.1:{fakes_port}", fakes_port,
                   f"http://127.0.0.1:{webhook_port}", apns_port, tls_dir)


DevEnvironment = Callable[[DevEndpoints], dict[str, str]]
"""endpoints → a plug-in's fresh development variables (``NOTIFLOW_<NAME>__...`` and its
emulator's ``NOTIFLOW_FAKES_<NAME>_...``): throw-away credentials made at each call, pointed
at the emulator."""


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """What a provider plug-in gives the adapters and the API (its package's ``SPEC``).

    ``open``, ``emulator``, ``receipt_routes`` and ``dev_environment`` import their modules on
    first use, so the registry stays cheap to import (emulators need the ``emulators`` extra,
    receipt routes belong to the API).
    ``receipts`` and ``verify`` name the package's delivery-webhook parser and signature (or
    auth) check; their arguments are the provider's own, so the receipt routes call them
    through their modules and these fields document what exists.
    """

    name: str
    """The plug-in's package and settings section (``settings.<name>``)."""
    channel: Channel
    open: Opener
    emulator: Callable[[], EmulatorFactory] | None = None
    """Imports the provider's emulator (served by ``notiflow fakes``)."""
    receipt_routes: Callable[[], ReceiptRoutes] | None = None
    """Imports the API's delivery-webhook routes of the provider (mounted by the API unless
    it serves the priority lane only)."""
    dev_environment: Callable[[], DevEnvironment] | None = None
    """Imports the provider's :data:`DevEnvironment` (its ``dev`` module's ``environment``;
    merged into ``notiflow.devenv.dev_environment``); None: it needs no variables there."""
    receipts: Callable[..., object] | None = None
    """Delivery webhook payload → :class:`~notiflow.schemas.messages.Receipt` (s)."""
    verify: Callable[..., object] | None = None
    """Webhook signature or auth check; raises
    :class:`~notiflow.adapters.providers.webhook.WebhookRefused`."""

    @classmethod
    def of_package(cls, spec_module: str, channel: Channel, client: str | Opener, *,
                   emulator: str | None = None, dev: bool = False, routes: bool = False,
                   receipts: Callable[..., object] | None = None,
                   verify: Callable[..., object] | None = None) -> ProviderSpec:
        """The spec of the plug-in whose ``spec`` module is named ``spec_module``, laid out as
        ``docs/providers.md`` says: named after its package; opened by the class ``client`` of
        its ``client`` module (or by ``client`` itself, an :data:`Opener`); served by the
        class ``emulator`` of its ``emulator`` module; with its ``dev`` module's
        ``environment`` when ``dev`` and its ``routes`` module's ``ROUTES`` when ``routes``."""
        package = spec_module.rpartition(".")[0]

        def part(module: str, name: str | None) -> Callable[[], Any] | None:
            return imported(f"{package}.{module}", name) if name else None

        return cls(package.rpartition(".")[2], channel,
                   opener(f"{package}.client", client) if isinstance(client, str) else client,
                   emulator=part("emulator", emulator),
                   receipt_routes=part("routes", "ROUTES" if routes else None),
                   dev_environment=part("dev", "environment" if dev else None),
                   receipts=receipts, verify=verify)
