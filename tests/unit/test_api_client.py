"""``notiflow.client`` on a scripted transport (httpx.MockTransport), sync and async: one
idempotency key per message reused on every retry, 429/503 retried after Retry-After, transport
failures after a backoff, typed errors, and a batch that resends only its 429/503 items."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from notiflow.client import (
    Accepted,
    AsyncClient,
    Client,
    Conflict,
    Forbidden,
    InvalidRequest,
    RateLimited,
    RetryPolicy,
    Unavailable,
)

BODY = {"channel": "SMS", "tier": "P1", "recipient": "+14155550123", "template_id": "otp",
        "template_version": 1, "variables": {"code": "123456"}}
OK = {"message_id": "msg_1", "status": "QUEUED", "accepted_at": "2026-12-04T15:00:00+00:00"}

Script = list[Callable[[httpx.Request], httpx.Response]]


def answer(status: int, body: dict[str, Any], **headers: str) -> Callable[
        [httpx.Request], httpx.Response]:
    return lambda _req: httpx.Response(status, json=body, headers=headers)


def fail(_req: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused")


class Recorder:
    """A transport handler answering from a script, recording requests and sleeps."""

    def __init__(self, script: Script) -> None:
        self.script = list(script)
        self.requests: list[httpx.Request] = []
        self.slept: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.script.pop(0)(request)

    def keys(self) -> list[str | None]:
        return [r.headers.get("Idempotency-Key") for r in self.requests]


def client(rec: Recorder, attempts: int = 5) -> Client:
    return Client("http://api", "tok", transport=httpx.MockTransport(rec),
                  sleep=rec.slept.append, retry=RetryPolicy(attempts=attempts, base_s=0.1),
                  rng=random.Random(1))


def test_a_retried_message_keeps_its_key_and_waits_as_told() -> None:
    rec = Recorder([answer(503, {"error": "unavailable"}, **{"Retry-After": "5"}), fail,
                    answer(429, {"error": "rate_limited"}, **{"Retry-After": "2"}),
                    answer(202, OK)])
    with client(rec) as api:
        got = api.send(BODY)
    assert isinstance(got, Accepted) and got.message_id == "msg_1"
    keys = rec.keys()
    assert len(keys) == 4 and len(set(keys)) == 1 and keys[0] == got.idempotency_key
    assert rec.slept[0] == 5.0 and 0 <= rec.slept[1] <= 0.2 and rec.slept[2] == 2.0
    assert rec.requests[0].headers["Authorization"] == "Bearer tok"
    assert json.loads(rec.requests[0].content) == BODY


def test_the_callers_key_is_sent_and_a_replay_is_reported() -> None:
    rec = Recorder([answer(202, OK, **{"Idempotent-Replayed": "true"})])
    got = client(rec).send(BODY, idempotency_key="order-7")
    assert rec.keys() == ["order-7"] and got.replayed and got.idempotency_key == "order-7"


@pytest.mark.parametrize(("status", "kind"), [(400, InvalidRequest), (422, InvalidRequest),
                                              (403, Forbidden), (409, Conflict)])
def test_refusals_are_typed_and_never_retried(status: int, kind: type[Exception]) -> None:
    rec = Recorder([answer(status, {"error": "x", "reason": "why", "message": "text"})])
    with pytest.raises(kind) as err:
        client(rec).send(BODY)
    assert len(rec.requests) == 1 and "why" in str(err.value)


def test_retries_end_in_a_typed_error() -> None:
    rec = Recorder([answer(429, {"error": "rate_limited"}, **{"Retry-After": "1"})] * 3)
    with pytest.raises(RateLimited) as err:
        client(rec, attempts=3).send(BODY)
    assert err.value.retry_after == 1.0 and len(rec.requests) == 3 and len(rec.slept) == 2
    down = Recorder([fail] * 2)
    with pytest.raises(Unavailable) as gone:
        client(down, attempts=2).send(BODY)
    assert gone.value.status == 0


def test_a_batch_resends_only_its_busy_items_with_their_keys() -> None:
    def batch(req: httpx.Request) -> httpx.Response:
        items = json.loads(req.content)["messages"]
        results = [{"code": 202, **OK, "message_id": f"msg_{i}"} for i in range(len(items))]
        results[1] = {"code": 503, "error": "unavailable", "retry_after": 5}
        results[2] = {"code": 422, "error": "validation_failed", "reason": "invalid_body"}
        return httpx.Response(200, json={"results": results})

    rec = Recorder([batch, answer(202, {**OK, "message_id": "msg_again"})])
    out = client(rec).send_batch([BODY, BODY, BODY], idempotency_keys=["a", None, "c"])
    sent = json.loads(rec.requests[0].content)["messages"]
    assert sent[0]["idempotency_key"] == "a" and sent[2]["idempotency_key"] == "c"
    assert rec.requests[1].headers["Idempotency-Key"] == sent[1]["idempotency_key"]
    assert json.loads(rec.requests[1].content) == BODY
    assert [type(o).__name__ for o in out] == ["Accepted", "Accepted", "InvalidRequest"]
    assert isinstance(out[1], Accepted) and out[1].message_id == "msg_again"


async def test_the_async_client_behaves_the_same() -> None:
    rec = Recorder([answer(503, {"error": "unavailable"}, **{"Retry-After": "3"}),
                    answer(202, OK)])
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    async with AsyncClient("http://api", "tok", transport=httpx.MockTransport(rec),
                           sleep=sleep) as api:
        got = await api.send(BODY)
    assert got.message_id == "msg_1" and slept == [3.0] and len(set(rec.keys())) == 1
