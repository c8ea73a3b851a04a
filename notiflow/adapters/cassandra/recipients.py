"""Recipient state (``recipient_preferences``) and device tokens.

State changes are compare-and-set on ``version``: every write to ``recipient_preferences``
is a lightweight transaction, so a read at ``LOCAL_QUORUM`` after it returns sees it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, time
from typing import Any

from cassandra import ConsistencyLevel, WriteTimeout
from cassandra.policies import WriteType

from notiflow.adapters.cassandra.session import Row, Statements
from notiflow.adapters.cassandra.values import from_row, to_ms, utc
from notiflow.schemas.preferences import OptOut, PreferenceState, QuietWindow, Suppression

MAX_STATE_RACES = 16
"""Compare-and-set attempts on one recipient's state before :class:`StateContention`."""
STATE_READ_CONCURRENCY = 256

StateChange = Callable[[PreferenceState], PreferenceState | None]
"""Given the current state (version 0 when none is stored), the wanted state (its
``version`` and ``updated_at`` are set by the store), or None when nothing changes."""


class StateContention(RuntimeError):
    """Too many concurrent writers on one recipient's state; the caller may retry."""


@dataclass(frozen=True, slots=True)
class DeviceRow:
    """A device token of a recipient: ``active`` False once deactivated, with the reason;
    ``updated_at`` in UTC."""

    tenant_id: str
    recipient_id: str
    device_token: str
    platform: str | None = None
    active: bool | None = None
    deactivated_reason: str | None = None
    updated_at: datetime | None = None

    @classmethod
    def of(cls, row: Row) -> DeviceRow:
        return from_row(cls, row, updated_at=utc)


def _paxos_timeout(exc: WriteTimeout) -> None:
    """Re-raise ``exc`` unless it is a Paxos round that timed out (``write_type`` CAS: the
    outcome is unknown, and a later serial read settles it)."""
    if exc.write_type != WriteType.CAS:
        raise exc


def blank_state(tenant_id: str, recipient_hash: str, now: datetime) -> PreferenceState:
    """Version 0: what a recipient without a stored state is treated as."""
    return PreferenceState(tenant_id=tenant_id, recipient_hash=recipient_hash, version=0,
                           updated_at=to_ms(now))


def opt_out_text(o: OptOut) -> str:
    """``{channel}/{category}`` as stored in ``recipient_preferences.opt_outs``."""
    return f"{o.channel}/{o.category}"


def state_from_row(row: Row) -> PreferenceState:
    """A ``recipient_preferences`` row as the wire state."""
    start, end = row.get("quiet_start"), row.get("quiet_end")
    quiet = (QuietWindow(start=time.fromisoformat(start), end=time.fromisoformat(end))
             if start and end else None)
    opt_outs = []
    for text in row.get("opt_outs") or ():
        channel, _, category = text.partition("/")
        opt_outs.append(OptOut.model_validate({"channel": channel, "category": category}))
    updated_at = utc(row.get("updated_at")) or datetime.fromtimestamp(0, UTC)
    return PreferenceState(
        tenant_id=row["tenant_id"], recipient_hash=row["recipient_hash"],
        version=int(row.get("version") or 0), updated_at=updated_at,
        timezone=row.get("timezone"), quiet_hours=quiet, opt_outs=tuple(opt_outs),
        suppressed=row.get("suppressed"),
        muted_topics=tuple(sorted(row.get("muted_topics") or ())),
    )


def state_columns(state: PreferenceState) -> tuple[Any, ...]:
    """``(version, timezone, quiet_start, quiet_end, opt_outs, suppressed, updated_at,
    muted_topics)``."""
    q = state.quiet_hours
    return (
        state.version, state.timezone,
        q.start.isoformat() if q else None, q.end.isoformat() if q else None,
        [opt_out_text(o) for o in state.opt_outs] or None, state.suppressed,
        state.updated_at, set(state.muted_topics) or None,
    )


class RecipientStore:
    """Recipient preference state and the device tokens of recipients."""

    def __init__(self, cql: Statements) -> None:
        self.cql = cql
        cql.prepare(STATEMENTS)
        cql.prepare({"pref_get_serial": STATEMENTS["pref_get"]},
                    consistency=ConsistencyLevel.LOCAL_SERIAL)

    async def get_state(self, tenant_id: str, recipient_hash: str, *,
                        serial: bool = False) -> PreferenceState | None:
        """The stored state (``LOCAL_QUORUM``; ``serial`` also completes an in-flight
        transaction first), or None."""
        row = await self.cql.first("pref_get_serial" if serial else "pref_get",
                                   (tenant_id, recipient_hash))
        return state_from_row(row) if row else None

    async def get_states(
        self, keys: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], PreferenceState]:
        """States of many ``(tenant_id, recipient_hash)`` at once (concurrent single-partition
        reads); recipients without a stored state are absent from the result."""
        wanted = list(dict.fromkeys(keys))
        limit = asyncio.Semaphore(STATE_READ_CONCURRENCY)

        async def one(key: tuple[str, str]) -> PreferenceState | None:
            async with limit:
                return await self.get_state(*key)

        found = await asyncio.gather(*(one(k) for k in wanted))
        return {k: st for k, st in zip(wanted, found, strict=True) if st is not None}

    async def change_state(self, tenant_id: str, recipient_hash: str, change: StateChange,
                           now: datetime | None = None) -> tuple[PreferenceState | None, bool]:
        """Read-modify-write of one recipient's state: ``version + 1`` written with a
        lightweight transaction on the version read, re-read and retried on contention.
        Returns (the state now stored, whether this call wrote it); raises
        :class:`StateContention` after :data:`MAX_STATE_RACES` lost races. A transaction
        that timed out in Paxos (contention on a replicated partition; the outcome is
        unknown) counts as a race, and so does a serial read that timed out: the next serial
        read tells whether it was written. When it was, and another write came before that
        read, the change is written once more (as a client's retry of a 503 would)."""
        stamp = to_ms(now or datetime.now(UTC))
        current = await self.get_state(tenant_id, recipient_hash)
        for _ in range(MAX_STATE_RACES):
            base = current or blank_state(tenant_id, recipient_hash, stamp)
            wanted = change(base)
            if wanted is None:
                return current, False
            new = PreferenceState.model_validate({
                **wanted.model_dump(), "tenant_id": tenant_id, "recipient_hash": recipient_hash,
                "version": base.version + 1, "updated_at": max(stamp, base.updated_at),
            })
            try:
                if current is None:
                    rows = await self.cql.run("pref_insert",
                                              (tenant_id, recipient_hash, *state_columns(new)))
                else:
                    rows = await self.cql.run("pref_update", (
                        *state_columns(new), tenant_id, recipient_hash, current.version))
            except WriteTimeout as exc:
                _paxos_timeout(exc)
                rows = []
            if rows and rows[0].get("[applied]"):
                return new, True
            try:
                current = await self.get_state(tenant_id, recipient_hash, serial=True)
            except WriteTimeout as exc:
                _paxos_timeout(exc)
                continue
            if current is not None and current == new:
                return new, True
        raise StateContention(f"state of {tenant_id}/{recipient_hash} keeps changing")

    async def suppress(self, tenant_id: str, recipient_hash: str, reason: Suppression,
                       now: datetime | None = None) -> PreferenceState:
        """Mark an address or device token dead (``suppressed = reason``, version bumped);
        a no-op returning the stored state when it already carries that reason."""
        def change(st: PreferenceState) -> PreferenceState | None:
            return None if st.suppressed == reason else st.model_copy(
                update={"suppressed": reason})

        state, _ = await self.change_state(tenant_id, recipient_hash, change, now)
        if state is None:
            raise RuntimeError("suppression produced no state")
        return state

    async def unsuppress(self, tenant_id: str, recipient_hash: str,
                         now: datetime | None = None, *,
                         only: Suppression | None = None) -> PreferenceState | None:
        """Clear a suppression (a device token registered again), or only one for reason
        ``only`` (START clears ``unsubscribed``, never a dead number); the stored state,
        None when there is none."""
        def change(st: PreferenceState) -> PreferenceState | None:
            if st.suppressed is None or only not in (None, st.suppressed):
                return None
            return st.model_copy(update={"suppressed": None})

        state, _ = await self.change_state(tenant_id, recipient_hash, change, now)
        return state

    async def get_device(self, tenant_id: str, owner_hash: str,
                         device_token: str) -> DeviceRow | None:
        row = await self.cql.first("device_get", (tenant_id, owner_hash, device_token))
        return DeviceRow.of(row) if row else None

    async def activate_device(self, tenant_id: str, owner_hash: str, device_token: str,
                              platform: str, now: datetime, token_hash: str) -> None:
        """Register or reactivate a device token of a recipient (``active = true``) and
        record the recipient as an owner of ``token_hash`` (the token's recipient hash)."""
        await self.cql.write_all([
            ("device_activate", (platform, now, tenant_id, owner_hash, device_token)),
            ("device_owner_put", (tenant_id, token_hash, owner_hash, device_token, platform,
                                  now)),
        ])

    async def deactivate_token(self, tenant_id: str, token_hash: str, reason: str,
                               now: datetime) -> int:
        """``active = false`` with ``reason`` on every owner's row of the token whose
        recipient hash is ``token_hash``; returns how many rows (owners registered before
        migration 0012 are not known)."""
        owners = await self.cql.run("device_owners_get", (tenant_id, token_hash))
        await self.cql.write_all([
            ("device_deactivate", (reason, now, tenant_id, row["recipient_id"],
                                   row["device_token"]))
            for row in owners])
        return len(owners)

    async def forget_devices(self, tenant_id: str, owner_hash: str,
                             hashing: Callable[[str, str], tuple[str, ...]]) -> int:
        """Delete the device tokens registered under ``owner_hash`` and their owner rows
        (under each of ``hashing(tenant_id, "<platform>:<token>")``); returns how many
        tokens (an erasure)."""
        rows = await self.cql.run("devices_of_owner", (tenant_id, owner_hash))
        writes = [("device_owner_delete", (tenant_id, token_hash, owner_hash))
                  for r in rows if r.get("platform")
                  for token_hash in hashing(tenant_id, f"{r['platform']}:{r['device_token']}")]
        if writes:
            await self.cql.write_all(writes)
        await self.cql.run("devices_delete", (tenant_id, owner_hash))
        return len(rows)

    async def deactivate_device(self, tenant_id: str, owner_hash: str, device_token: str,
                                reason: str, now: datetime) -> None:
        """``active = false`` with the reason (the row must exist: this is an upsert)."""
        await self.cql.run("device_deactivate",
                           (reason, now, tenant_id, owner_hash, device_token))


STATEMENTS: dict[str, str] = {
    "pref_get": "SELECT * FROM recipient_preferences WHERE tenant_id = ? AND recipient_hash = ?",
    "pref_insert": "INSERT INTO recipient_preferences (tenant_id, recipient_hash, version, "
    "timezone, quiet_start, quiet_end, opt_outs, suppressed, updated_at, muted_topics) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    "pref_update": "UPDATE recipient_preferences SET version = ?, timezone = ?, quiet_start = ?, "
    "quiet_end = ?, opt_outs = ?, suppressed = ?, updated_at = ?, muted_topics = ? "
    "WHERE tenant_id = ? AND recipient_hash = ? IF version = ?",
    "device_get": "SELECT * FROM device_tokens WHERE tenant_id = ? AND recipient_id = ? "
    "AND device_token = ?",
    "device_activate": "UPDATE device_tokens SET platform = ?, active = true, "
    "deactivated_reason = null, updated_at = ? WHERE tenant_id = ? AND recipient_id = ? "
    "AND device_token = ?",
    "device_deactivate": "UPDATE device_tokens SET active = false, deactivated_reason = ?, "
    "updated_at = ? WHERE tenant_id = ? AND recipient_id = ? AND device_token = ?",
    "device_owner_put": "INSERT INTO device_owners (tenant_id, token_hash, recipient_id, "
    "device_token, platform, registered_at) VALUES (?, ?, ?, ?, ?, ?)",
    "device_owners_get": "SELECT recipient_id, device_token FROM device_owners "
    "WHERE tenant_id = ? AND token_hash = ?",
    "devices_of_owner": "SELECT device_token, platform FROM device_tokens "
    "WHERE tenant_id = ? AND recipient_id = ?",
    "devices_delete": "DELETE FROM device_tokens WHERE tenant_id = ? AND recipient_id = ?",
    "device_owner_delete": "DELETE FROM device_owners WHERE tenant_id = ? AND token_hash = ? "
    "AND recipient_id = ?",
}
