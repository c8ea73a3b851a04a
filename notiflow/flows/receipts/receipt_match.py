"""Which attempt a receipt may change (pure): only one whose provider and provider message id
were recorded for it.

A receipt names its attempt two ways: the provider message index row its
``(provider_id, provider_message_id)`` finds (written with the attempt, so authoritative), or
the ``message_id`` / ``attempt`` hint it carries. A hint is checked against the attempt row
it names: the same provider, and a provider message id that names that attempt. A receipt
whose hint disagrees with the index, or whose named attempt was sent through another provider
or under another id, is :class:`Forged`; one whose attempt is not recorded yet is
:class:`Unmatched` (parked, the send event may still be on its way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from notiflow.adapters.cassandra.attempts import ProviderIndexRow
from notiflow.adapters.rows import AttemptRow
from notiflow.providers.smtp.message import message_id_header
from notiflow.schemas.messages import Receipt


@dataclass(frozen=True, slots=True)
class Target:
    """The attempt a receipt applies to; ``provider_message_id`` as recorded (or the
    receipt's, for an attempt recorded without one)."""

    message_id: str
    attempt: int
    provider_message_id: str


@dataclass(frozen=True, slots=True)
class Forged:
    """A receipt that names an attempt it does not belong to (``reason``: what differs)."""

    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class Unmatched:
    """A receipt whose attempt is not recorded (yet)."""

    why: str


Verdict = Target | Forged | Unmatched


def names_attempt(recorded: str, reported: str, message_id: str, attempt: int) -> bool:
    """True when a receipt's provider message id ``reported`` names the attempt recorded
    with ``recorded``: the same id; a member ``<reported>#<k>`` of a batch request (SendGrid
    events name the request's ``X-Message-Id``); or the attempt's own ``Message-ID`` (the
    SMTP bounce receiver's id for a bounce its keyed address tied to this attempt)."""
    return (recorded == reported or recorded.startswith(reported + "#")
            or reported == message_id_header(message_id, attempt)[1:-1])


def by_index(r: Receipt, row: ProviderIndexRow) -> Target | Forged:
    """The attempt the provider message index ``row`` records for the receipt; forged when
    the receipt's hint names another message or attempt."""
    message_id, attempt = row.message_id, row.attempt_no or 0
    if r.message_id is not None and r.message_id != message_id:
        return Forged("message_id", f"{r.provider_id} {r.provider_message_id} was sent for "
                                    f"another message than {r.message_id}")
    if r.message_id is not None and r.attempt is not None and attempt and r.attempt != attempt:
        return Forged("attempt", f"{r.provider_id} {r.provider_message_id} was sent as attempt "
                                 f"{attempt} of {message_id}, not {r.attempt}")
    return Target(message_id, attempt, r.provider_message_id)


def by_attempts(r: Receipt, rows: Sequence[AttemptRow]) -> Verdict:
    """The attempt the receipt's hint names, checked against its recorded row (``rows``:
    the hinted message's attempt rows)."""
    if r.message_id is None or r.attempt is None:
        return Unmatched("unknown provider message id")
    row = next((a for a in rows if a.attempt_no == r.attempt), None)
    if row is None:
        return Unmatched(f"attempt {r.attempt} of {r.message_id} not recorded")
    if row.provider_id != r.provider_id:
        return Forged("provider", f"attempt {r.attempt} of {r.message_id} was sent through "
                                  f"{row.provider_id}, not {r.provider_id}")
    recorded = row.provider_message_id
    if not recorded:
        return Target(r.message_id, r.attempt, r.provider_message_id)
    if not names_attempt(recorded, r.provider_message_id, r.message_id, r.attempt):
        return Forged("provider_message_id", f"attempt {r.attempt} of {r.message_id} has "
                                             f"another {r.provider_id} message id")
    return Target(r.message_id, r.attempt, recorded)
