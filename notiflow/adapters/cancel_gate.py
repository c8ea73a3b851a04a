"""The per-message cancel gate in Redis: where a cancel and a send are ordered.

Key ``{namespace}gate:{message_id}``, value ``cancelled`` or ``sending``:

- the API's cancel (:meth:`CancelGate.cancel`, :data:`CANCEL`): absent or ``cancelled`` →
  ``cancelled`` (idempotent), kept until the message's expiry plus a day; ``sending`` → refused;
- the send flow's confirm (``redis_dedup.DedupStore.confirm``, :data:`CONFIRM`), just before
  the provider call, in one script with the attempt's lease: lease lost → :attr:`Confirm.LOST`;
  ``cancelled`` → :attr:`Confirm.CANCELLED` (the attempt ends CANCELLED, nothing is sent);
  else the gate becomes ``sending`` for the lease's TTL → :attr:`Confirm.OURS`;
- a campaign's cancel (:meth:`CancelGate.cancel_campaign`) sets the campaign's gate
  ``{namespace}campaign-gate:{campaign_id}`` to ``cancelled``: the confirm of every message
  of the campaign (:func:`notiflow.schemas.campaigns.parse_row_message_id`: a row id whose
  tag the correlation keys made, never one merely shaped like it) reads it too, so one key
  cancels millions of messages not yet sent;
- an attempt that ends RETRY_PENDING clears ``sending`` (:data:`CLEAR`), so the message can be
  cancelled while it waits; any other ending keeps it (a cancel is refused from then on).

Redis runs each script alone, so a cancel and a confirm of one message never interleave:
either the cancel lands first and the message is never sent, or the confirm does and the
cancel is refused. :class:`GateModel` is the reference model of the three scripts.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import redis.asyncio as aioredis

from notiflow.adapters.ports import Confirm
from notiflow.correlation import CorrelationKeys
from notiflow.schemas.campaigns import parse_row_message_id

CANCELLED = "cancelled"
SENDING = "sending"
HOLD_AFTER_EXPIRY = timedelta(days=1)
MIN_HOLD = timedelta(minutes=1)

CANCEL = """
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
"""KEYS: gate. ARGV: ``cancelled``, hold (ms). 1: cancelled; 0: refused."""

CONFIRM = """
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) ~= ARGV[1] then
  return 0
end
if redis.call('GET', KEYS[2]) == ARGV[4] then
  return 2
end
if KEYS[3] and redis.call('GET', KEYS[3]) == ARGV[4] then
  return 2
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[3])
return 1
"""
"""KEYS: lease, gate, and the campaign's gate for a campaign's message. ARGV: our pending
prefix, our new pending value, lease TTL (ms), ``cancelled``, ``sending``. Returns a
:class:`Confirm` value. A lease that is gone (Redis restarted without it, or it expired and
nobody took it) is taken again: nobody else is sending, and refusing would leave the message
unsent forever (found by ``notiflow chaos redis-kill``); a lease another sender holds, or
one marked done, is lost."""

CLEAR = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
"""KEYS: gate. ARGV: ``sending``. Deletes the gate only while it says ``sending``."""


def gate_key(namespace: str, message_id: str) -> str:
    return f"{namespace}gate:{message_id}"


def campaign_gate_key(namespace: str, message_id: str, keys: CorrelationKeys) -> str | None:
    """The campaign gate a message's confirm also reads; None for a message of no
    campaign (or shaped like one's without a tag ``keys`` made)."""
    found = parse_row_message_id(keys, message_id)
    return f"{namespace}campaign-gate:{found[0]}" if found else None


def hold_for(expires_at: datetime | None, now: datetime) -> timedelta:
    """How long a cancel is kept: until the message's expiry plus a day, at least
    :data:`MIN_HOLD` (no expiry known: a day)."""
    end = (expires_at or now) + HOLD_AFTER_EXPIRY
    return max(end - now, MIN_HOLD)


def _ms(d: timedelta) -> int:
    return max(1, int(d.total_seconds() * 1000))


class CancelGate:
    """The API's side of the gate, on a client it is given (the API's Redis client)."""

    def __init__(self, client: aioredis.Redis, namespace: str) -> None:
        self.r = client
        self.ns = namespace

    async def cancel_campaign(self, campaign_id: str, hold: timedelta) -> None:
        """Cancel every message of a campaign that no provider took yet (kept for
        ``hold``). Raises one of ``outages.REDIS_DOWN`` without Redis."""
        await self.r.set(f"{self.ns}campaign-gate:{campaign_id}", CANCELLED, px=_ms(hold))

    async def cancel(self, message_id: str, hold: timedelta) -> bool:
        """True when the message is cancelled (now or earlier; kept for ``hold``); False
        when a sender holds the gate. Raises one of ``outages.REDIS_DOWN`` without Redis."""
        done = await self.r.eval(CANCEL, 1, gate_key(self.ns, message_id), CANCELLED,
                                 _ms(hold))
        return bool(done)


class GateModel:
    """Reference model of :data:`CANCEL`, :data:`CONFIRM` and :data:`CLEAR` over a plain
    mapping of keys to values (expiry left out); the scripts mirror it step for step."""

    def __init__(self) -> None:
        self.kv: dict[str, str] = {}

    def cancel(self, gate: str) -> bool:
        v = self.kv.get(gate)
        if v is not None and v != CANCELLED:
            return False
        self.kv[gate] = CANCELLED
        return True

    def confirm(self, lease: str, gate: str, prefix: str, value: str,
                campaign: str | None = None) -> Confirm:
        v = self.kv.get(lease)
        if v is not None and not v.startswith(prefix):
            return Confirm.LOST
        if self.kv.get(gate) == CANCELLED:
            return Confirm.CANCELLED
        if campaign is not None and self.kv.get(campaign) == CANCELLED:
            return Confirm.CANCELLED
        self.kv[lease] = value
        self.kv[gate] = SENDING
        return Confirm.OURS

    def clear(self, gate: str) -> bool:
        if self.kv.get(gate) == SENDING:
            del self.kv[gate]
            return True
        return False
