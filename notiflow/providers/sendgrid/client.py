"""SendGrid v3 Mail Send (email) adapter, on SendGrid's real wire format.

``POST {base_url}/v3/mail/send`` with ``Authorization: Bearer <API key>`` and a JSON body: one
personalization addressed to the recipient, ``from``, ``subject``, one ``text/plain`` content
block and ``custom_args`` carrying ``message_id`` and ``attempt``. SendGrid answers ``202`` with
an empty body and the ``X-Message-Id`` header: that is the provider's acceptance.

Every other answer, and every transport failure, is mapped to an :class:`Outcome` through the
tables of :mod:`~notiflow.providers.sendgrid.classify` and the shared transport table;
``docs/providers.md`` explains each row. SendGrid has no idempotency key for Mail Send: a
timeout after the request was sent is AMBIGUOUS and cannot be settled by resending with a key.
SendGrid echoes ``custom_args`` as top-level keys of every Event Webhook event, which is how a
later ``processed`` / ``delivered`` event settles it.

:meth:`SendGridEmail.send_batch` carries up to ``max_personalizations`` messages in one
request (``docs/providers.md``, "Bulk batching"): one personalization per message, with its
own ``to``, ``subject``, ``custom_args`` and its rendered body as the value of one
substitution tag that the shared ``text/plain`` content block consists of. Each message keeps
its own result: a 400 naming personalizations refuses those messages, and the others go
again without them.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final

import aiohttp
import orjson
from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import HttpAnswer, HttpProvider, utcnow
from notiflow.providers.sendgrid.classify import (
    STATUS_CLASSES,
    classify_response,
    error_fields_of,
    rate_limit_wait,
)
from notiflow.providers.sendgrid.config import SendGridSettings
from notiflow.schemas.enums import Channel
from notiflow.telemetry import current_traceparent

log = logging.getLogger(__name__)

MAIL_SEND_PATH: Final = "/v3/mail/send"
BODY_TAG: Final = "%notiflow_body%"
"""The substitution tag a batched request's content block consists of."""
MAX_SUBSTITUTIONS_BYTES: Final = 10_000
"""SendGrid's limit on the substitutions of one personalization (UTF-8 bytes)."""
RESEND_ROUNDS: Final = 2
"""Requests a batch makes without the personalizations a 400 named, before the rest go one
by one."""
_PERSONALIZATION = re.compile(r"personalizations\.(\d+)\.")


class SendGridEmail(HttpProvider[SendGridSettings]):
    """One SendGrid account as a :class:`~notiflow.adapters.providers.base.ProviderClient`
    (opened and bounded as :class:`~notiflow.adapters.providers.common.HttpProvider` says)."""

    channel = Channel.EMAIL
    name = "sendgrid"
    log = log
    answer_headers = ("X-Message-Id", "Retry-After", "X-RateLimit-Reset")

    def __init__(self, config: SendGridSettings, session: aiohttp.ClientSession, *,
                 timeout: float, connect_timeout: float | None = None,
                 clock: Callable[[], datetime] = utcnow) -> None:
        if config.api_key is None:
            raise ValueError("sendgrid.api_key is not configured")
        super().__init__(config, session, timeout=timeout, connect_timeout=connect_timeout,
                         clock=clock)
        self._url = URL(config.base_url.rstrip("/") + MAIL_SEND_PATH)
        self._from: dict[str, str] = {"email": config.from_email}
        if config.from_name:
            self._from["name"] = config.from_name
        self.max_batch = config.max_personalizations

    @classmethod
    def _headers(cls, config: SendGridSettings) -> dict[str, str]:
        """``Authorization: Bearer <API key>``; ``ValueError`` when ``sendgrid.api_key`` is not
        configured."""
        if config.api_key is None:
            raise ValueError("sendgrid.api_key is not configured")
        return {"Authorization": f"Bearer {config.api_key.get_secret_value()}",
                "Content-Type": "application/json", "Accept": "application/json",
                "User-Agent": "notiflow-sendgrid/1"}

    def payload(self, message: OutboundMessage) -> dict[str, Any]:
        """The Mail Send body SendGrid receives for ``message`` (``subject`` omitted when the
        message has none: SendGrid then rejects it as invalid content; the message's extra
        headers as ``headers``)."""
        body: dict[str, Any] = {
            "personalizations": [{"to": [{"email": str(message.recipient)}]}],
            "from": self._from_of(message),
            "content": [{"type": "text/plain", "value": message.body}],
            "custom_args": {"message_id": message.message_id,
                            "attempt": str(message.attempt)},
        }
        if trace := current_traceparent():
            body["custom_args"]["traceparent"] = trace
        if message.subject is not None:
            body["subject"] = message.subject
        if message.headers:
            body["headers"] = dict(message.headers)
        return body

    def _from_of(self, message: OutboundMessage) -> dict[str, str]:
        """The message's own sender (an address alone), else the account's."""
        return {"email": message.sender} if message.sender else self._from

    def _encode(self, message: OutboundMessage) -> bytes:
        return orjson.dumps(self.payload(message))

    def _classify(self, answer: HttpAnswer, message: OutboundMessage,
                  started: datetime) -> SendResult:
        """``202`` with ``X-Message-Id`` is accepted; anything else goes through the tables."""
        status, headers = answer.status, answer.headers
        if status == 202 and headers.get("X-Message-Id"):
            return self._accepted(started, headers["X-Message-Id"])
        if 200 <= status < 300:
            return self._result(STATUS_CLASSES[2], message, started, error_code=f"http_{status}")
        fields = error_fields_of(answer.json())
        rule = classify_response(status, fields)
        wait = (rate_limit_wait(headers, now=self._clock())
                if rule.outcome is Outcome.TRANSIENT else None)
        named = next((f for f in fields if f), None)
        return self._result(rule, message, started,
                            error_code=f"http_{status}:{named}" if named else f"http_{status}",
                            retry_after_s=wait)

    # ---------------------------------------------------------------- bulk batching

    @staticmethod
    def joinable(message: OutboundMessage) -> bool:
        """Whether ``message`` can share a request: an address, a subject, a body that is
        neither empty nor over the substitution limit, and no text the tag would rewrite."""
        return (isinstance(message.recipient, str) and bool(message.subject)
                and bool(message.body)
                and len(message.body.encode()) + len(BODY_TAG) <= MAX_SUBSTITUTIONS_BYTES
                and BODY_TAG not in message.body and BODY_TAG not in (message.subject or ""))

    def batch_payload(self, messages: Sequence[OutboundMessage],
                      traceparents: Sequence[str | None]) -> dict[str, Any]:
        """One Mail Send body for several :meth:`joinable` messages of one sender."""
        personalizations = []
        for m, trace in zip(messages, traceparents, strict=True):
            args = {"message_id": m.message_id, "attempt": str(m.attempt)}
            if trace:
                args["traceparent"] = trace
            personalizations.append({"to": [{"email": str(m.recipient)}],
                                     "subject": m.subject,
                                     "substitutions": {BODY_TAG: m.body},
                                     "custom_args": args})
        return {"personalizations": personalizations, "from": self._from_of(messages[0]),
                "content": [{"type": "text/plain", "value": BODY_TAG}]}

    async def send_batch(self, messages: Sequence[OutboundMessage],
                         traceparents: Sequence[str | None]) -> list[SendResult]:
        """Send ``messages``, the :meth:`joinable` ones of one sender ``max_batch`` to a
        request, the others one by one; one result per message, in order."""
        results: list[SendResult | None] = [None] * len(messages)
        together: dict[str | None, list[int]] = {}
        alone: list[int] = []
        for i, m in enumerate(messages):
            if self.joinable(m):
                together.setdefault(m.sender, []).append(i)
            else:
                alone.append(i)
        chunks = [group[k:k + self.max_batch] for group in together.values()
                  for k in range(0, len(group), self.max_batch)]

        async def one(i: int) -> None:
            results[i] = await self.send(messages[i])

        async def chunk(idx: list[int]) -> None:
            done = await self._chunk([messages[i] for i in idx], [traceparents[i] for i in idx])
            for i, r in zip(idx, done, strict=True):
                results[i] = r

        await asyncio.gather(*(one(i) for i in alone), *(chunk(c) for c in chunks))
        return [r for r in results if r is not None]

    async def _chunk(self, messages: Sequence[OutboundMessage],
                     traceparents: Sequence[str | None]) -> list[SendResult]:
        """One request for ``messages`` (a single message goes as :meth:`send` would); after
        a 400 that names personalizations, those get its classification and the rest go
        again, at most :data:`RESEND_ROUNDS` times, then one by one; after a 413 (request too
        large) each half goes on its own."""
        results: dict[int, SendResult] = {}
        live = list(range(len(messages)))
        for _ in range(RESEND_ROUNDS + 1):
            if len(live) <= 1:
                for i in live:
                    results[i] = await self.send(messages[i])
                break
            started = self._clock()
            batch = [messages[i] for i in live]
            body = orjson.dumps(self.batch_payload(batch, [traceparents[i] for i in live]))
            answer = await self._post(self._url, body, self._default_limits, batch[0], started)
            if isinstance(answer, SendResult):
                results.update(dict.fromkeys(live, answer))
                break
            if answer.status == 202 and answer.headers.get("X-Message-Id"):
                sid = answer.headers["X-Message-Id"]
                results.update({i: self._accepted(started, f"{sid}#{k}")
                                for k, i in enumerate(live)})
                break
            if answer.status == 413:
                half = len(live) // 2
                parts = await asyncio.gather(*(self._chunk(
                    [messages[i] for i in part], [traceparents[i] for i in part])
                    for part in (live[:half], live[half:])))
                results.update(zip(live, [*parts[0], *parts[1]], strict=True))
                break
            named = self._named(answer, len(live))
            if named is None:
                results.update({i: self._classify(answer, messages[i], started) for i in live})
                break
            for k, fields in named.items():
                i = live[k]
                rule = classify_response(400, fields)
                results[i] = self._result(rule, messages[i], started,
                                          error_code=f"http_400:{fields[0]}")
            live = [i for k, i in enumerate(live) if k not in named]
            if not live:
                break
        else:
            singles = await asyncio.gather(*(self.send(messages[i]) for i in live))
            results.update(zip(live, singles, strict=True))
        return [results[i] for i in range(len(messages))]

    @staticmethod
    def _named(answer: HttpAnswer, size: int) -> dict[int, list[str]] | None:
        """A 400 whose every error names one of the ``size`` personalizations: index → its
        error fields; None for any other answer (it concerns the whole request)."""
        if answer.status != 400:
            return None
        fields = error_fields_of(answer.json())
        named: dict[int, list[str]] = {}
        for field in fields:
            hit = _PERSONALIZATION.match(field or "")
            if hit is None or int(hit.group(1)) >= size:
                return None
            named.setdefault(int(hit.group(1)), []).append(str(field))
        return named or None
