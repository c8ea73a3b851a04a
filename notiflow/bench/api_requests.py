"""The requests of ``notiflow bench api``: SMS send-request bodies and the raw HTTP senders the
open-loop generator (:mod:`notiflow.bench.openloop`) drives.

The senders are aiohttp's, not :mod:`notiflow.client`: the typed client retries (a key per
message kept across retries, ``Retry-After`` honoured, a batch's 429/503 items resent), a
closed loop that would hide the very refusals and waits this bench counts, and it waits for
an answer before a caller can send again. Here every request is one attempt at its due time
with its own ``Idempotency-Key``, its answer recorded as it came. (aiohttp also because
httpx's pool cost the OTP sender of the other benches 0.3 of a core, ``traffic.py``.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

from notiflow.bench.openloop import Answer
from notiflow.bench.workload import CATEGORY_BY_TIER, TEMPLATE_IDS
from notiflow.schemas.enums import Channel, Tier


def sms_body(tier: Tier, recipient: str, version: int, code: int) -> dict[str, Any]:
    """A send request of the bench SMS template (an OTP for P0, marketing for P3)."""
    return {"channel": Channel.SMS.value, "tier": tier.value,
            "category": CATEGORY_BY_TIER[tier].value, "recipient": recipient,
            "template_id": TEMPLATE_IDS[Channel.SMS], "template_version": version,
            "variables": {"brand": "Notiflow", "headline": "code", "code": f"{code:06d}"}}


def user_body(user_id: str, version: int, code: int) -> dict[str, Any]:
    """The P3 send of :func:`sms_body` to a user (``user:<id>``), SMS allowed only, so each
    accepted request is one message as an address send is."""
    body = sms_body(Tier.P3, "", version, code)
    return {"recipient": f"user:{user_id}", "tier": body["tier"],
            "category": body["category"], "variables": body["variables"],
            "channels": [{"channel": body["channel"], "template_id": body["template_id"],
                          "template_version": version}]}


def session(cap: int, timeout_s: float) -> aiohttp.ClientSession:
    """A client session of at most ``cap`` connections, ``timeout_s`` per request."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=cap),
                                 timeout=aiohttp.ClientTimeout(total=timeout_s))


class Target:
    """One endpoint under load: request ``i`` carries body ``i mod len(bodies)`` (one message)
    or ``size`` consecutive ones (a batch), under keys ``<key_prefix>-<i>[-<k>]``."""

    def __init__(self, client: aiohttp.ClientSession, url: str, token: str,
                 bodies: Sequence[dict[str, Any]], key_prefix: str, size: int = 1) -> None:
        self.client = client
        self.url = url
        self.bodies = list(bodies)
        self.encoded = [orjson.dumps(b) for b in self.bodies]
        self.key_prefix = key_prefix
        self.size = size
        self.headers = {"Authorization": f"Bearer {token}",
                        "Content-Type": "application/json"}

    async def send(self, i: int) -> Answer:
        """Request ``i``: a single send request when ``size`` is 1, else a batch."""
        try:
            return await (self._single(i) if self.size == 1 else self._batch(i))
        except TimeoutError:
            return Answer.failed("timeout", self.size)
        except aiohttp.ClientError as exc:
            return Answer.failed(f"error {type(exc).__name__}", self.size)

    async def _single(self, i: int) -> Answer:
        headers = {**self.headers, "Idempotency-Key": f"{self.key_prefix}-{i}"}
        async with self.client.post(self.url, data=self.encoded[i % len(self.encoded)],
                                    headers=headers) as r:
            await r.read()
            return Answer.single(str(r.status), r.headers.get("Server-Timing"))

    async def _batch(self, i: int) -> Answer:
        n = len(self.bodies)
        items = [{**self.bodies[(i * self.size + k) % n],
                  "idempotency_key": f"{self.key_prefix}-{i}-{k}"} for k in range(self.size)]
        async with self.client.post(self.url, data=orjson.dumps({"messages": items}),
                                    headers=self.headers) as r:
            raw = await r.read()
            if r.status != 200:
                return Answer.failed(str(r.status), self.size)
        return batch_answer(orjson.loads(raw), self.size)


def batch_answer(doc: dict[str, Any], size: int) -> Answer:
    """A ``200`` batch answer: items answered ``202`` are accepted, the others counted by
    their code (items missing from the answer as ``missing``)."""
    codes = Counter(str(r.get("code")) for r in doc.get("results") or [])
    accepted = codes.pop("202", 0)
    if sum(codes.values()) + accepted < size:
        codes["missing"] += size - accepted - sum(codes.values())
    return Answer("200", accepted, dict(codes))
