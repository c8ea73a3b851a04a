"""The backlog signal: each send-flow worker reports the acceptance time of its oldest unsent
message; the API sheds a tier (429) when that age passes the tier's bound.

Redis hash ``{prefix}backlog:{tier}``: field = reporter id, value = JSON
``{"oldest_accepted_at": epoch seconds | null, "reported_at": epoch seconds}``. Reports older
than :data:`STALE_AFTER_S` are ignored (a stopped worker does not pin the signal).
"""

from __future__ import annotations

import time

import orjson
import redis.asyncio as aioredis

from notiflow.schemas.enums import Tier

STALE_AFTER_S = 10.0


def backlog_key(prefix: str, tier: Tier) -> str:
    return f"{prefix}backlog:{Tier(tier).value}"


async def report(client: aioredis.Redis, prefix: str, tier: Tier, reporter: str,
                 oldest_accepted_at: float | None, now: float | None = None) -> None:
    """Publish this reporter's oldest unsent acceptance time (None = nothing waiting)."""
    value = orjson.dumps({"oldest_accepted_at": oldest_accepted_at,
                          "reported_at": time.time() if now is None else now})
    key = backlog_key(prefix, tier)
    pipe = client.pipeline(transaction=False)
    pipe.hset(key, reporter, value)
    pipe.expire(key, int(STALE_AFTER_S * 6))
    await pipe.execute()


async def oldest_age(client: aioredis.Redis, prefix: str, tier: Tier,
                     now: float | None = None) -> float | None:
    """Seconds since the oldest unsent message of ``tier`` was accepted, over fresh reports;
    None when no fresh report has anything waiting."""
    now = time.time() if now is None else now
    raw = await client.hgetall(backlog_key(prefix, tier))
    oldest: float | None = None
    for value in raw.values():
        doc = orjson.loads(value)
        if now - float(doc["reported_at"]) > STALE_AFTER_S:
            continue
        at = doc.get("oldest_accepted_at")
        if at is not None and (oldest is None or at < oldest):
            oldest = float(at)
    return None if oldest is None else max(0.0, now - oldest)
