"""Idempotency through a Redis outage, against a real API process: with Redis killed the API
reserves keys by lightweight transaction (replays and 409s still hold, P1 is admitted), and
after Redis restarts empty, keys accepted before and during the outage are still answered
from Cassandra."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
import redis

from tests.helpers import wait_for
from tests.integration.conftest import RedisServer

pytestmark = pytest.mark.integration


def sms(version: int, code: str) -> dict[str, Any]:
    return {"channel": "SMS", "tier": "P1", "recipient": "+14155550123",
            "template_id": "otp", "template_version": version, "variables": {"code": code}}


def test_keys_keep_their_answers_through_a_redis_outage(
        isolated, tokens: dict[str, str], otp_template: dict[str, int],
        private_redis: RedisServer) -> None:
    iso = isolated("fence-outage", NOTIFLOW_REDIS_URL=private_redis.url)
    api = iso.api()
    version = otp_template["acme"]
    auth = {"Authorization": f"Bearer {tokens['acme']}"}
    before, during = uuid.uuid4().hex, uuid.uuid4().hex

    with httpx.Client(base_url=api, timeout=30) as c:
        def post(key: str, code: str) -> httpx.Response:
            return c.post("/v1/messages", json=sms(version, code),
                          headers={**auth, "Idempotency-Key": key})

        def fenced(key: str) -> bool:
            with redis.Redis.from_url(private_redis.url) as r:
                return bool(r.exists(f"{iso.settings.topic_prefix}fence:{{acme}}:{key}"))

        first = post(before, "111111")
        assert first.status_code == 202, first.text
        assert fenced(before)

        private_redis.stop(kill=True)
        assert post(before, "111111").content == first.content
        assert post(before, "222222").status_code == 409
        second = post(during, "333333")
        assert second.status_code == 202, second.text
        assert post(during, "333333").content == second.content
        assert post(during, "444444").status_code == 409

        private_redis.start()
        def fence_taken() -> bool:
            probe = uuid.uuid4().hex
            return post(probe, "000000").status_code == 202 and fenced(probe)

        wait_for(fence_taken, timeout=15, what="fences taken again once Redis is back")
        for key, code, answer in ((before, "111111", first), (during, "333333", second)):
            replay = post(key, code)
            assert replay.status_code == 202 and replay.content == answer.content
            assert replay.headers["Idempotent-Replayed"] == "true"
            assert post(key, "555555").status_code == 409
            assert not fenced(key)
