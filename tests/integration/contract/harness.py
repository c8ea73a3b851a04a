"""Contract suite: every real provider adapter against its emulator in ``notiflow fakes``.

Each adapter is one :class:`Harness` (how to build it, which recipients trigger which provider
answer, what wrong credentials look like on the wire), defined in its provider's
``test_contract_<provider>.py`` beside that provider's own cases (SendGrid's Event Webhook, FCM's
OAuth2 token handling, APNs' provider tokens, Vonage's delivery receipts, SMTP's replies, SES
through the AWS SDK), which run against that harness alone (:func:`for_harness` in the file's
``pytestmark``); add a provider by writing its file and appending its harness to
``HARNESSES`` in ``test_contract_common.py``, where the generic cases run for every harness and
Twilio-style per-message status callbacks for harnesses with a :class:`CallbackSpec` (so
``pytest tests/integration/contract -k twilio`` runs Twilio's whole contract, its generic cases
and its own file). Emulators share the knob names of ``docs/providers.md``.

This module is the part every file shares: the harness model, the emulator's admin API, the
loopback receivers, and the message and result helpers.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import httpx
import pytest
from aiohttp import web
from pydantic import SecretStr

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.devenv import free_port
from notiflow.schemas.enums import Channel, PushPlatform, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings

Overrides = Mapping[str, Any]
"""Generic provider overrides: ``base_url``, ``secret``, ``callback_url``, ``sender``."""
Recipient = str | PushRecipient


class TimedClient(Protocol):
    """A provider client whose ``send`` takes a per-call timeout (every adapter here)."""

    provider_id: str

    async def send(self, message: OutboundMessage, *,
                   timeout: float | None = None) -> SendResult: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class Rejection:
    """A recipient the provider refuses for good, and the expected classification."""

    scenario: str
    reason: str
    deactivate: bool = False


@dataclass(frozen=True)
class CallbackSpec:
    """Twilio-style status callbacks: per message, form-encoded, to the message's URL."""

    verify: Callable[[str, str, Mapping[str, str], Mapping[str, str]], bool]
    """(secret, url, form params, headers) → signature valid."""
    secret: Callable[[Settings], str]
    message_id_field: str
    """Form field that carries the provider message id."""
    status_field: str
    final_statuses: tuple[str, str] = ("delivered", "undelivered")
    error_field: str = "ErrorCode"


class RawAnswer(Protocol):
    """A raw answer to a request with a wrong secret (an HTTP response, or an SMTP reply)."""

    @property
    def status_code(self) -> int: ...

    def json(self) -> Any: ...


@dataclass(frozen=True)
class Harness:
    """What the contract suite needs to know about one adapter and its emulator."""

    name: str
    """The provider, and the path segment of its emulator's admin API (``/_admin/{name}/...``)."""
    channel: Channel
    recipients: Mapping[str, Recipient]
    """Scenario → recipient: ``ok`` plus one per :attr:`rejections` entry."""
    rejections: tuple[Rejection, ...]
    configure: Callable[[Settings, Overrides], Settings]
    adapter: Any
    """The adapter class: ``await adapter.open(settings, timeout=...)`` gives a client."""
    unauthorized: Callable[[Settings], Awaitable[RawAnswer]]
    """A raw request with a wrong secret."""
    unauthorized_body: Mapping[str, Any]
    wrong_secret: Callable[[], str]
    provider_message_id: re.Pattern[str]
    auth_rule: tuple[Outcome, str] = (Outcome.TRANSIENT, "auth_failed")
    unauthorized_records: tuple[str, ...] = ("unauthorized",)
    """Record outcomes the emulator keeps for one send with a wrong secret."""
    empty_body_rule: tuple[Outcome, str] | None = None
    """Classification of an empty body, if the provider refuses one."""
    exact_retry_after: bool = True
    """False when the provider gives a reset time (whole seconds) instead of Retry-After."""
    retry_after: bool = True
    """False when the provider's 429 states no wait at all (APNs)."""
    unauthorized_status: int = 401
    """HTTP status of a request with a wrong secret (APNs: 403; Vonage: 200, SMTP: 535)."""
    callbacks: CallbackSpec | None = None
    http: bool = True
    """False when the protocol has no HTTP status errors (SMTP: no ``error_rate_5xx``)."""
    recorded_to: Callable[[Recipient], str] | None = None
    """What the emulator records as ``to`` (default :func:`recipient_text`)."""
    sender: tuple[str, str, str] | None = None
    """A message's own sender: what the message names, the record field the emulator shows
    the recipient's view of it in, and how it shows it; None when the channel has none."""
    credentials: bool = True
    """False when the provider has no account secret (a chat webhook: the URL is it)."""
    rebase: Callable[[Recipient, str], Recipient] | None = None
    """The recipient at another origin, for a provider whose recipient is the URL it calls."""

    def recorded(self, recipient: Recipient) -> str:
        return (self.recorded_to or recipient_text)(recipient)

    async def open(self, settings: Settings, timeout: float) -> TimedClient:
        """A client of :attr:`adapter`, opened on ``settings`` with ``timeout``."""
        client: TimedClient = await self.adapter.open(settings, timeout=timeout)
        return client


def recipient_text(recipient: Recipient) -> str:
    """What the emulator records as ``to``."""
    return recipient.device_token if isinstance(recipient, PushRecipient) else recipient


def configure_section(section: str,
                      names: Mapping[str, str]) -> Callable[[Settings, Overrides], Settings]:
    """A ``configure`` that sets the fields ``names`` maps the generic overrides to in
    ``settings.{section}`` (``secret`` as a ``SecretStr``; overrides not named are ignored)."""

    def configure(settings: Settings, overrides: Overrides) -> Settings:
        update = {names[k]: SecretStr(v) if k == "secret" else v for k, v in overrides.items()
                  if k in names}
        config = getattr(settings, section).model_copy(update=update)
        return settings.model_copy(update={section: config})

    return configure


def device(prefix: str = "d", platform: PushPlatform = PushPlatform.ANDROID) -> PushRecipient:
    return PushRecipient(device_token=f"{prefix}-{uuid.uuid4().hex}{uuid.uuid4().hex}",
                         platform=platform)


def _ids(value: object) -> str:
    if isinstance(value, Harness):
        return value.name
    if isinstance(value, Rejection):
        return value.scenario
    return str(value)


def for_harness(harness: Harness) -> pytest.MarkDecorator:
    """Runs the tests it marks (a provider's own cases) against ``harness`` alone."""
    return pytest.mark.parametrize("harness", [harness], ids=_ids)


async def raw_post(url: str, **request: Any) -> httpx.Response:
    """The answer to one POST of ``request`` (``httpx`` arguments) by a client of its own."""
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(url, **request)


# emulator admin and callback receivers -------------------------------------------------------


@dataclass
class Emulator:
    """The admin API of one emulator in ``notiflow fakes``."""

    base: str
    admin: str
    http: httpx.AsyncClient

    async def configure(self, **knobs: Any) -> dict[str, Any]:
        r = await self.http.post(f"{self.base}/_admin/{self.admin}/config", json=knobs)
        r.raise_for_status()
        return dict(r.json())

    async def config(self) -> dict[str, Any]:
        return dict((await self.http.get(f"{self.base}/_admin/{self.admin}/config")).json())

    async def records(self, message_id: str) -> list[dict[str, Any]]:
        r = await self.http.get(f"{self.base}/_admin/{self.admin}/messages",
                                params={"message_id": message_id})
        r.raise_for_status()
        return list(r.json())

    async def stats(self) -> dict[str, Any]:
        r = await self.http.get(f"{self.base}/_admin/{self.admin}/stats")
        r.raise_for_status()
        return dict(r.json())

    async def reset(self) -> None:
        (await self.http.post(f"{self.base}/_admin/reset")).raise_for_status()


T = TypeVar("T")


async def first_found(arrived: asyncio.Event, find: Callable[[], list[T]], count: int,
                      timeout: float) -> list[T]:
    """The first ``count`` items ``find`` returns, re-checked whenever ``arrived`` is set, for at
    most ``timeout`` seconds."""

    async def until() -> list[T]:
        while True:
            found = find()
            if len(found) >= count:
                return found[:count]
            arrived.clear()
            await arrived.wait()

    return await asyncio.wait_for(until(), timeout)


@dataclass
class Callback:
    url: str
    params: dict[str, str]
    headers: dict[str, str]


@dataclass
class Listener(ABC):
    """A loopback webhook receiver at :attr:`url` (while :func:`listening`): it records each
    request (:meth:`keep`), sets :attr:`arrived` and answers :attr:`status`."""

    url: str = ""
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    status: ClassVar[int] = 200

    @abstractmethod
    async def keep(self, request: web.Request) -> None: ...

    async def handle(self, request: web.Request) -> web.Response:
        await self.keep(request)
        self.arrived.set()
        return web.Response(status=self.status)


L = TypeVar("L", bound=Listener)


@asynccontextmanager
async def listening(listener: L, path: str, method: str = "POST") -> AsyncIterator[L]:
    """``listener``, served on a free loopback port at ``path`` until the block ends."""
    listener.url, runner = await _serve(path, listener.handle, method)
    try:
        yield listener
    finally:
        await runner.cleanup()


@dataclass
class Receiver(Listener):
    """A loopback webhook receiver that records every form callback."""

    calls: list[Callback] = field(default_factory=list)

    async def keep(self, request: web.Request) -> None:
        form = await request.post()
        self.calls.append(Callback(str(request.url), {k: str(v) for k, v in form.items()},
                                   dict(request.headers)))

    async def wait(self, message_id: str, count: int, timeout: float = 10.0) -> list[Callback]:
        """The first ``count`` callbacks whose URL names ``message_id``."""
        return await first_found(
            self.arrived, lambda: [c for c in self.calls if f"message_id={message_id}" in c.url],
            count, timeout)


async def _serve(path: str, handler: Callable[[web.Request], Awaitable[web.Response]],
                 method: str = "POST") -> tuple[str, web.AppRunner]:
    port = free_port()
    app = web.Application()
    app.router.add_route(method, path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return f"http://127.0.0.1:{port}{path}", runner


def message(harness: Harness, scenario: str = "ok", body: str = "Your code is 123456", *,
            attempt: int = 1, message_id: str | None = None, tier: Tier = Tier.P0,
            recipient: Recipient | None = None, subject: str | None = "Your code",
            sender: str | None = None) -> OutboundMessage:
    return OutboundMessage(
        message_id=message_id or uuid.uuid4().hex, attempt=attempt, tenant_id="acme",
        channel=harness.channel, tier=tier,
        recipient=recipient if recipient is not None else harness.recipients[scenario],
        body=body, subject=subject if harness.channel is not Channel.SMS else None,
        sender=sender)


async def send_once(harness: Harness, settings: Settings, msg: OutboundMessage, *,
                    timeout: float = 5.0, call_timeout: float | None = None) -> SendResult:
    """Send ``msg`` with a client of its own, opened on ``settings`` with ``timeout``."""
    return await send_and_close(await harness.open(settings, timeout), msg, call_timeout)


async def send_and_close(client: TimedClient, msg: OutboundMessage,
                         timeout: float | None = None) -> SendResult:
    """Send ``msg`` once with ``client`` (per-call ``timeout``), then close ``client``."""
    try:
        return await client.send(msg, timeout=timeout)
    finally:
        await client.aclose()


def assert_result(result: SendResult, outcome: Outcome, reason: str | None) -> None:
    assert (result.outcome, result.reason) == (outcome, reason), result
    assert result.started_at <= result.completed_at
