"""Confirm: just before the provider call, inside the channel's slot, the attempt's lease is
confirmed together with the message's cancel gate (``adapters/cancel_gate.py``), in one
call. Lost (another sender took the lease over or finished the message) → nothing, that
sender sends; cancelled → CANCELLED, nothing is sent; ours → the call goes ahead (the gate
says ``sending`` for the lease's TTL). Redis down on a tier that sends without it: ours."""

from __future__ import annotations

import logging
import time

from notiflow import stages
from notiflow.adapters.ports import Confirm as Gate
from notiflow.flows.common.items import Out
from notiflow.flows.send.stages.context import SendContext
from notiflow.flows.send.stages.emit import cancelled
from notiflow.flows.send.stages.send_batch import Prepared
from notiflow.names import Stage

log = logging.getLogger("notiflow.flows.dispatch")


class Confirm:
    """Per message: None when this sender may call the provider (the wait for the slot and
    the confirmation recorded as ``dispatch.slot``), else the attempt's outputs."""

    async def __call__(self, item: Prepared, ctx: SendContext) -> list[Out] | None:
        w = item.work
        leases = ctx.ports.leases
        key, gate = ctx.lease_key(w), ctx.gate_key(w)
        campaign = leases.campaign_gate_key(w.message_id)
        confirmed = await ctx.redis(
            lambda: leases.confirm(key, gate, ctx.lease_ttl(w), campaign), Gate.OURS)
        if confirmed is Gate.LOST:
            log.warning("message %s attempt %s: lease taken over by another sender; "
                        "not sending", w.message_id, w.record.attempt)
            return []
        if confirmed is Gate.CANCELLED:
            return await cancelled(ctx, w, item.content_key)
        stages.record(w.record.tier.value, Stage.DISPATCH_SLOT, time.monotonic() - item.routed)
        return None
