"""A typed Python client of the Messaging API, sync (:class:`Client`) and async
(:class:`AsyncClient`), on httpx.

Every message gets an idempotency key (the caller's, or a fresh UUID) that is reused on every
retry of it, so a retry after a lost answer can never create a second message. ``429`` and
``503`` are retried after their ``Retry-After`` (at most :attr:`RetryPolicy.max_wait_s`), a
connection failure or timeout after an exponential backoff, up to :attr:`RetryPolicy.attempts`
tries in all; then, and for every other refusal, a typed :class:`ApiError` is raised (or, in
a batch, returned in the message's place). A batch retries only its items that were answered
429 or 503, with their own keys.

```python
from notiflow.client import Client

with Client("http://127.0.0.1:18080", token) as api:
    accepted = api.send({"channel": "SMS", "tier": "P1", "recipient": "+14155550123",
                         "template_id": "otp", "template_version": 1,
                         "variables": {"code": "123456"}})
    print(accepted.message_id, api.status(accepted.message_id)["status"])
```

A direct producer (a service writing straight to ``ingest.<channel>.<tier>``) binds each
record to its tenant with one of the tenant's ``ingest_keys`` (:func:`ingest_headers`);
a record without a valid binding is dead-lettered (``tenant_claim_refused``):

```python
import orjson
from confluent_kafka import Producer
from notiflow.client import ingest_headers

value = orjson.dumps({"channel": "SMS", "tier": "P1", "tenant_id": "acme", ...})
Producer(conf).produce("ingest.sms.p1", value, key=b"order-1",
                       headers=ingest_headers(acme_ingest_key, "SMS", "P1", value))
```
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import httpx

from notiflow.ingest_binding import Signer
from notiflow.schemas.messages import SendRequest

RETRIED_STATUSES: Final = frozenset({429, 503})
TRANSPORT_ERRORS: Final = (httpx.TransportError,)
BATCH_PATH: Final = "/v1/messages:batch"
Outcome = httpx.Response | Exception | None
"""What one try of a call gave: an answer, a transport failure, or nothing yet."""


def ingest_headers(key: str | bytes, channel: str, tier: str, value: bytes
                   ) -> list[tuple[str, bytes]]:
    """The Kafka headers that bind ``value`` (the exact bytes produced) to the tenant whose
    ``ingest_keys`` hold ``key``, for the topic of ``channel``/``tier``
    (``ingest.sms.p1``: ``"SMS"``, ``"P1"``). Sign after the value's last change."""
    return [Signer.of(key).header(channel, tier, value)]


class ApiError(Exception):
    """A refusal of the API: its HTTP ``status`` and error body (``error``, ``reason``,
    ``message``; the whole body in ``body``)."""

    def __init__(self, status: int, body: Mapping[str, Any]) -> None:
        self.status = status
        self.body = dict(body)
        self.error = str(body.get("error", "error"))
        self.reason = body.get("reason")
        self.message = body.get("message")
        super().__init__(f"{status} {self.error}" + (f" ({self.reason})" if self.reason else "")
                         + (f": {self.message}" if self.message else ""))


class InvalidRequest(ApiError):
    """400 / 413 / 422: the request is wrong; sending it again will not help."""


class Unauthorized(ApiError):
    """401: no or a wrong token."""


class Forbidden(ApiError):
    """403: the tenant may not send this (tier, channel, template)."""


class NotFound(ApiError):
    """404."""


class Conflict(ApiError):
    """409: the idempotency key was used with another request, or a move the state forbids."""


class Misdirected(ApiError):
    """421: this API process serves the other lane; call the other one."""


class RateLimited(ApiError):
    """429 after every retry; ``retry_after`` is the server's last wait."""

    retry_after: float | None = None


class Unavailable(ApiError):
    """503 (or no answer at all: ``status`` 0) after every retry."""

    retry_after: float | None = None


_ERRORS: Final[Mapping[int, type[ApiError]]] = {
    400: InvalidRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
    413: InvalidRequest, 421: Misdirected, 422: InvalidRequest, 429: RateLimited,
    503: Unavailable}


def error_of(status: int, body: Mapping[str, Any], retry_after: float | None = None
             ) -> ApiError:
    """The typed error of an answer."""
    err = _ERRORS.get(status, Unavailable if status >= 500 else InvalidRequest)(status, body)
    if isinstance(err, RateLimited | Unavailable):
        err.retry_after = retry_after
    return err


@dataclass(frozen=True, slots=True)
class Accepted:
    """A durably accepted message (``202``)."""

    message_id: str
    status: str
    accepted_at: datetime
    idempotency_key: str
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard the client tries: ``attempts`` tries in all per message; a 429/503 waits its
    ``Retry-After`` (else the backoff), capped at ``max_wait_s``; a transport failure waits
    ``base_s · 2^(try-1)`` with full jitter, capped at ``max_wait_s``."""

    attempts: int = 5
    base_s: float = 0.2
    max_wait_s: float = 30.0

    def wait_s(self, tried: int, retry_after: float | None, rng: random.Random) -> float:
        if retry_after is not None:
            return min(max(0.0, retry_after), self.max_wait_s)
        return rng.uniform(0, min(self.max_wait_s, self.base_s * 2 ** (tried - 1)))


def _payload(request: SendRequest | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(request, SendRequest):
        return request.model_dump(mode="json", exclude_none=True)
    return dict(request)


def _retry_after(headers: Mapping[str, str], body: Mapping[str, Any]) -> float | None:
    value = headers.get("retry-after", body.get("retry_after"))
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {"error": "unreadable", "message": resp.text[:200]}
    return body if isinstance(body, dict) else {"error": "unreadable"}


def _accepted(body: Mapping[str, Any], key: str, replayed: bool) -> Accepted:
    return Accepted(str(body["message_id"]), str(body["status"]),
                    datetime.fromisoformat(str(body["accepted_at"])), key, replayed)


def _item_outcome(result: Mapping[str, Any], key: str) -> Accepted | ApiError:
    code = int(result.get("code", 500))
    if code == 202:
        return _accepted(result, key, bool(result.get("replayed")))
    return error_of(code, result, _retry_after({}, result))


@dataclass(frozen=True, slots=True)
class _Call:
    """One request as the client sends it (every try the same)."""

    method: str
    path: str
    json: Any = None
    headers: Mapping[str, str] | None = None


class _Base:
    def __init__(self, token: str, retry: RetryPolicy, rng: random.Random | None) -> None:
        self.headers = {"Authorization": f"Bearer {token}", "User-Agent": "notiflow-client/1"}
        self.retry = retry
        self.rng = rng or random.Random()

    def _send_call(self, request: SendRequest | Mapping[str, Any], key: str | None
                   ) -> tuple[_Call, str]:
        key = key or uuid.uuid4().hex
        return _Call("POST", "/v1/messages", _payload(request), {"Idempotency-Key": key}), key

    @staticmethod
    def _keyed(requests: Sequence[SendRequest | Mapping[str, Any]],
               keys: Sequence[str | None] | None) -> list[dict[str, Any]]:
        items = []
        for i, r in enumerate(requests):
            item = _payload(r)
            item["idempotency_key"] = (keys[i] if keys else None) or item.get(
                "idempotency_key") or uuid.uuid4().hex
            items.append(item)
        return items

    def _wait(self, outcome: Outcome, tried: int) -> float | None:
        """Seconds to wait before the next try of a call, None when it is over."""
        if tried >= self.retry.attempts:
            return None
        if isinstance(outcome, Exception):
            return self.retry.wait_s(tried, None, self.rng)
        if outcome is not None and outcome.status_code in RETRIED_STATUSES:
            return self.retry.wait_s(tried, _retry_after(outcome.headers, _json(outcome)),
                                     self.rng)
        return None

    @staticmethod
    def _result(outcome: Outcome) -> httpx.Response:
        if not isinstance(outcome, httpx.Response):
            raise Unavailable(0, {"error": "unreachable", "message": repr(outcome)}) from (
                outcome if isinstance(outcome, Exception) else None)
        resp = outcome
        if resp.status_code >= 400:
            raise error_of(resp.status_code, _json(resp),
                           _retry_after(resp.headers, _json(resp)))
        return resp


class Client(_Base):
    """The Messaging API, synchronously. Use as a context manager, or :meth:`close`."""

    def __init__(self, base_url: str, token: str, *, retry: RetryPolicy = RetryPolicy(),
                 timeout: float = 30.0, transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        super().__init__(token, retry, rng)
        self.http = httpx.Client(base_url=base_url, headers=self.headers, timeout=timeout,
                                 transport=transport)
        self.sleep = sleep

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _call(self, call: _Call) -> httpx.Response:
        outcome: Outcome = None
        for tried in range(1, self.retry.attempts + 1):
            try:
                outcome = self.http.request(call.method, call.path, json=call.json,
                                            headers=call.headers)
            except TRANSPORT_ERRORS as exc:
                outcome = exc
            if (wait := self._wait(outcome, tried)) is None:
                break
            self.sleep(wait)
        return self._result(outcome)

    def send(self, request: SendRequest | Mapping[str, Any], *,
             idempotency_key: str | None = None) -> Accepted:
        """Send one message; :class:`Accepted`, or a typed :class:`ApiError`."""
        call, key = self._send_call(request, idempotency_key)
        resp = self._call(call)
        return _accepted(resp.json(), key, resp.headers.get("Idempotent-Replayed") == "true")

    def send_batch(self, requests: Sequence[SendRequest | Mapping[str, Any]], *,
                   idempotency_keys: Sequence[str | None] | None = None
                   ) -> list[Accepted | ApiError]:
        """Send up to 1,000 messages in one call; per message its :class:`Accepted` or its
        :class:`ApiError`, in order. Items answered 429/503 are sent again (alone, with their
        keys) as a single request would be."""
        items = self._keyed(requests, idempotency_keys)
        results = self._call(_Call("POST", BATCH_PATH, {"messages": items})).json()["results"]
        out: list[Accepted | ApiError] = []
        for item, result in zip(items, results, strict=True):
            outcome = _item_outcome(result, item["idempotency_key"])
            if isinstance(outcome, RateLimited | Unavailable):
                body = {k: v for k, v in item.items() if k != "idempotency_key"}
                try:
                    outcome = self.send(body, idempotency_key=item["idempotency_key"])
                except ApiError as exc:
                    outcome = exc
            out.append(outcome)
        return out

    def status(self, message_id: str) -> dict[str, Any]:
        """``GET /v1/messages/{id}``: status, attempts and timestamps."""
        return dict(self._call(_Call("GET", f"/v1/messages/{message_id}")).json())

    def cancel(self, message_id: str) -> dict[str, Any]:
        """``DELETE /v1/messages/{id}``; :class:`Conflict` once a provider has it."""
        return dict(self._call(_Call("DELETE", f"/v1/messages/{message_id}")).json())


class AsyncClient(_Base):
    """The Messaging API, asynchronously (one event loop). ``async with``, or
    :meth:`aclose`."""

    def __init__(self, base_url: str, token: str, *, retry: RetryPolicy = RetryPolicy(),
                 timeout: float = 30.0, transport: httpx.AsyncBaseTransport | None = None,
                 sleep: Callable[[float], Any] = asyncio.sleep,
                 rng: random.Random | None = None, max_connections: int = 32) -> None:
        super().__init__(token, retry, rng)
        self.http = httpx.AsyncClient(
            base_url=base_url, headers=self.headers, timeout=timeout, transport=transport,
            limits=httpx.Limits(max_connections=max_connections))
        self.sleep = sleep

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _call(self, call: _Call) -> httpx.Response:
        outcome: Outcome = None
        tried = 0
        while (tried := tried + 1) <= self.retry.attempts:
            try:
                outcome = await self.http.request(call.method, call.path, json=call.json,
                                                  headers=call.headers)
            except TRANSPORT_ERRORS as exc:
                outcome = exc
            wait = self._wait(outcome, tried)
            if wait is None:
                break
            await self.sleep(wait)
        return self._result(outcome)

    async def send(self, request: SendRequest | Mapping[str, Any], *,
                   idempotency_key: str | None = None) -> Accepted:
        """As :meth:`Client.send`."""
        call, key = self._send_call(request, idempotency_key)
        resp = await self._call(call)
        return _accepted(resp.json(), key, resp.headers.get("Idempotent-Replayed") == "true")

    async def send_batch(self, requests: Sequence[SendRequest | Mapping[str, Any]], *,
                         idempotency_keys: Sequence[str | None] | None = None
                         ) -> list[Accepted | ApiError]:
        """As :meth:`Client.send_batch`."""
        items = self._keyed(requests, idempotency_keys)
        resp = await self._call(_Call("POST", BATCH_PATH, {"messages": items}))
        outcomes: list[Accepted | ApiError] = [
            _item_outcome(r, i["idempotency_key"])
            for i, r in zip(items, resp.json()["results"], strict=True)]

        async def again(k: int) -> None:
            item = items[k]
            body = {key: v for key, v in item.items() if key != "idempotency_key"}
            try:
                outcomes[k] = await self.send(body, idempotency_key=item["idempotency_key"])
            except ApiError as exc:
                outcomes[k] = exc

        await asyncio.gather(*(again(k) for k, o in enumerate(outcomes)
                               if isinstance(o, RateLimited | Unavailable)))
        return outcomes

    async def status(self, message_id: str) -> dict[str, Any]:
        return dict((await self._call(_Call("GET", f"/v1/messages/{message_id}"))).json())

    async def cancel(self, message_id: str) -> dict[str, Any]:
        return dict((await self._call(_Call("DELETE", f"/v1/messages/{message_id}"))).json())
