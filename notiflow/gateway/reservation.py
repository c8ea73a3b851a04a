"""Reserving a tenant's ``Idempotency-Key`` for a fresh acceptance.

A key the API minted (``auto:{message_id}``, no client key) is nobody else's: its
reservation row is written plainly with the message row. A client's key takes its fence in
Redis (``adapters/idempotency_fence.py``) while the key's row is read from Cassandra:

- the row exists: the key was used before; the caller answers from it (replay or 409);
- the fence was free: the key is this request's; its row is written plainly with the
  message row (no Paxos round);
- another request holds the fence and its row is not written yet: 409 when that request's
  body differs, else the row is awaited briefly and answered from (503
  ``acceptance_in_progress`` if it does not appear).

Without Redis (fences off, down, or failed within the last second) the key is reserved
with a lightweight transaction (``INSERT ... IF NOT EXISTS``, ``LOCAL_SERIAL``). What
fences give up against that transaction: two requests with one key in the same few
milliseconds, one of them in a process that reserved by transaction because Redis failed it,
or either side of a Redis failover that lost the fence, can both be accepted (docs/api.md,
"Idempotency").
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from notiflow.adapters.cassandra.idempotency import IdempotencyStore, ReservationRow
from notiflow.adapters.cassandra.session import Write
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.idempotency_fence import Fence, FenceUnavailable, Holder
from notiflow.gateway.errors import idempotency_conflict, unavailable

log = logging.getLogger("notiflow.gateway.reservation")

ROW_WAITS_S: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32)
"""Pauses between reads of a key's row while another request holds its fence (0.63 s in
all: that request writes the row right after taking the fence)."""


@dataclass(frozen=True, slots=True)
class Reserved:
    """The key is this request's. ``writes`` go out with the message row (empty when a
    lightweight transaction wrote the reservation); ``fence`` is the fence taken, if any."""

    writes: tuple[Write, ...]
    fence: Holder | None = None


@dataclass(frozen=True, slots=True)
class Taken:
    """The key was reserved before; ``row`` is its reservation."""

    row: ReservationRow


@dataclass(frozen=True, slots=True)
class Claim:
    """The key, the request's hash and what its reservation row holds; ``also``: the other
    hashes the same request may have been recorded under (rotated keys, the unkeyed hash of
    earlier releases)."""

    tenant_id: str
    key: str
    request_hash: str
    message_id: str
    topic: str
    payload: str
    created_at: datetime
    also: tuple[str, ...] = ()

    @property
    def same_request(self) -> tuple[str, ...]:
        """Every hash a reservation of this request may hold, :attr:`request_hash` first."""
        return tuple(dict.fromkeys((self.request_hash, *self.also)))

    def write(self) -> Write:
        return IdempotencyStore.reservation_write(
            self.tenant_id, self.key, self.request_hash, self.message_id, self.topic,
            self.payload, self.created_at)


class _Down:
    """The fence could not be asked."""


DOWN: Final = _Down()


async def _claim(fence: Fence, c: Claim, holder: Holder) -> Holder | _Down | None:
    try:
        return await fence.claim(c.tenant_id, c.key, holder)
    except FenceUnavailable:
        return DOWN


async def release(fence: Fence | None, tenant_id: str, key: str, holder: Holder | None) -> None:
    """Drop a fence this request took (best effort: a fence left behind expires)."""
    if fence is None or holder is None:
        return
    try:
        await fence.release(tenant_id, key, holder)
    except FenceUnavailable as exc:
        log.info("fence not released (%s); it expires", exc)


async def reserve(store: CassandraStore, fence: Fence | None, c: Claim, *,
                  client_key: bool) -> Reserved | Taken:
    """Reserve ``c.key`` (module docstring); raises the store's errors, and the 409 / 503
    :class:`~notiflow.gateway.errors.ApiError` of a key another request is accepting."""
    if not client_key:
        return Reserved((c.write(),))
    if fence is None:
        return await reserve_by_transaction(store, c)
    holder = Holder(c.request_hash, c.message_id)
    claiming = asyncio.ensure_future(_claim(fence, c, holder))
    try:
        row = await store.idempotency.get_reservation(c.tenant_id, c.key)
    except BaseException:
        if await claiming is None:
            await release(fence, c.tenant_id, c.key, holder)
        raise
    claimed = await claiming
    if isinstance(claimed, _Down):
        return await reserve_by_transaction(store, c)
    if row is not None:
        if claimed is None:
            await release(fence, c.tenant_id, c.key, holder)
        return Taken(row)
    if claimed is None:
        return Reserved((c.write(),), holder)
    if claimed.request_hash not in c.same_request:
        raise idempotency_conflict()
    for pause in ROW_WAITS_S:
        await asyncio.sleep(pause)
        row = await store.idempotency.get_reservation(c.tenant_id, c.key)
        if row is not None:
            return Taken(row)
    raise unavailable("acceptance_in_progress", "an earlier request with this key is still "
                      "being accepted")


async def reserve_by_transaction(store: CassandraStore, c: Claim) -> Reserved | Taken:
    """``INSERT ... IF NOT EXISTS`` of the reservation row."""
    reservation = await store.idempotency.reserve(c.tenant_id, c.key, c.request_hash, c.message_id,
                                                  c.topic, c.payload, c.created_at)
    if reservation.applied:
        return Reserved(())
    existing = reservation.existing or await store.idempotency.get_reservation(c.tenant_id, c.key)
    if not existing:
        raise unavailable("acceptance_in_progress", "retry the request")
    return Taken(existing)

