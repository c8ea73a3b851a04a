"""Recipient and tenant caps in Redis: one Lua script per message, pipelined per batch.

Per recipient and category, a sorted set ``rcap:{tenant}:{recipient_hash}:{category}`` of the
message ids let through, scored by the time they were (ms); it expires with its window, so
a recipient seen once costs nothing after it. Per tenant and UTC day, a counter
``tcap:{tenant}:{day}`` of the marketing messages let through. The script is atomic: it
drops the entries that left the window, lets a message already counted through again, and
otherwise counts it only if the recipient and the tenant caps both have room
(``LocalCaps`` in ``adapters/memory/caps.py`` is the same rule, in memory).

Both keys of one message are touched by one script, so on Redis Cluster they would need one
hash slot (``{tenant}`` braces); notiflow runs a single Redis (or a primary with replicas).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import redis.asyncio as aioredis

from notiflow.adapters.ports import CapCheck, Verdict

TENANT_DAY_TTL = timedelta(days=2)
"""How long a tenant's daily marketing counter outlives its day."""

_ADMIT = """
local now, window, limit, member = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZSCORE', KEYS[1], member) then
  return 1
end
if limit >= 0 and redis.call('ZCARD', KEYS[1]) >= limit then
  return 0
end
if #KEYS > 1 then
  local used = tonumber(redis.call('GET', KEYS[2]) or '0')
  if used >= tonumber(ARGV[5]) then
    return -1
  end
  redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
end
redis.call('ZADD', KEYS[1], now, member)
redis.call('PEXPIRE', KEYS[1], window)
return 1
"""

_VERDICTS = {1: Verdict.OK, 0: Verdict.RECIPIENT, -1: Verdict.TENANT}


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class CapStore:
    """Answers :class:`CapCheck` s against Redis; shares the dispatcher's client."""

    def __init__(self, client: aioredis.Redis, namespace: str = "") -> None:
        self.r = client
        self.ns = namespace

    def recipient_key(self, check: CapCheck) -> str:
        return f"{self.ns}rcap:{check.recipient_key}"

    def tenant_key(self, check: CapCheck) -> str | None:
        return f"{self.ns}tcap:{check.tenant_key}" if check.tenant_key else None

    async def admit(self, checks: Sequence[CapCheck], now: datetime) -> list[Verdict]:
        """Count each message that fits under its caps, in one round trip."""
        if not checks:
            return []
        now_ms = round(now.timestamp() * 1000)
        day_ms = _ms(TENANT_DAY_TTL.total_seconds())
        pipe = self.r.pipeline(transaction=False)
        for c in checks:
            keys = [self.recipient_key(c)]
            if (tenant := self.tenant_key(c)) is not None:
                keys.append(tenant)
            args: list[int | str] = [now_ms, _ms(c.window.total_seconds()),
                    -1 if c.limit is None else c.limit, c.member,
                    c.tenant_cap if c.tenant_cap is not None else -1, day_ms]
            pipe.eval(_ADMIT, len(keys), *keys, *args)
        return [_VERDICTS[int(v)] for v in await pipe.execute()]
