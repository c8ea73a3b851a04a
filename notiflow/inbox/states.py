"""An inbox item's state: ``new`` → ``seen`` → ``read`` → ``archived``, never back.

Each state past ``new`` is a time column (``seen_at``, ``read_at``, ``archived_at``) written
once; the state is the furthest one set. Marking an item sets the target's column and every
earlier one still unset (reading an item also sees it). So concurrent marks from two devices
only ever move an item forward, with no read-modify-write to lose: the same monotonic rule as
a message's status (``schemas/status.py``), by construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Final


class InboxState(StrEnum):
    NEW = "new"
    SEEN = "seen"
    READ = "read"
    ARCHIVED = "archived"


ORDER: Final = (InboxState.NEW, InboxState.SEEN, InboxState.READ, InboxState.ARCHIVED)
COLUMNS: Final[Mapping[InboxState, str]] = {
    InboxState.SEEN: "seen_at", InboxState.READ: "read_at", InboxState.ARCHIVED: "archived_at"}
"""The time column of each state past ``new``."""


def state_of(times: Mapping[str, datetime | None]) -> InboxState:
    """The furthest state whose column is set in ``times``."""
    for state in reversed(ORDER[1:]):
        if times.get(COLUMNS[state]) is not None:
            return state
    return InboxState.NEW


def marks(target: InboxState, times: Mapping[str, datetime | None],
          now: datetime) -> dict[str, datetime]:
    """The columns to set (to ``now``) to bring an item with ``times`` to ``target``: the
    target's and every earlier one still unset; none when it is there already or beyond."""
    if ORDER.index(target) <= ORDER.index(state_of(times)):
        return {}
    return {COLUMNS[s]: now for s in ORDER[1:ORDER.index(target) + 1]
            if times.get(COLUMNS[s]) is None}
