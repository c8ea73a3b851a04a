"""A batch on its way through the send step: the messages still going, and what was decided
for the others. Every preparing stage takes the batch, decides some of its messages (their
outputs are final) and leaves the rest for the next stage. Each prepared message then goes
through the per-message stages (:class:`MessageStage`) as a :class:`Prepared`, which carries
what they found."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from notiflow.adapters.providers.base import OutboundMessage, ProviderClient, SendResult
from notiflow.flows.common.items import Out, Work
from notiflow.flows.send.routing import Choice

if TYPE_CHECKING:
    from notiflow.flows.send.stages.context import SendContext


def attempt_key(w: Work) -> str:
    """``message_id:attempt``: one attempt of one message (unique within a batch)."""
    return f"{w.message_id}:{w.record.attempt}"


@dataclass(slots=True)
class Batch:
    """``live``: still going, in arrival order; ``decided``: outputs by :func:`attempt_key`;
    ``content_keys``/``rendered``: what the content and render stages found for the live."""

    live: list[Work]
    now: datetime
    decided: dict[str, list[Out]] = field(default_factory=dict)
    content_keys: dict[str, str] = field(default_factory=dict)
    rendered: dict[str, OutboundMessage] = field(default_factory=dict)

    def decide(self, w: Work, outs: list[Out]) -> None:
        """``w`` ends here with ``outs`` (possibly none)."""
        self.decided[attempt_key(w)] = outs

    def settle(self) -> None:
        """Drop the decided from ``live``."""
        self.live = [w for w in self.live if attempt_key(w) not in self.decided]

    def prepared(self) -> list[Prepared]:
        """The live messages with their rendered message (after the render stage)."""
        return [Prepared(w, self.rendered[attempt_key(w)], self.content_keys.get(attempt_key(w)))
                for w in self.live]


@dataclass(slots=True)
class Prepared:
    """A message ready for its provider call, and what its per-message stages found: the
    account it goes to (``choice``, ``provider``), when it was routed (``routed``,
    ``time.monotonic``) and the provider's answer (``result``)."""

    work: Work
    message: OutboundMessage
    content_key: str | None
    choice: Choice | None = None
    provider: ProviderClient | None = None
    routed: float = 0.0
    result: SendResult | None = None


class Stage(Protocol):
    """One preparing stage of the send step."""

    async def __call__(self, batch: Batch, ctx: SendContext) -> None: ...


class MessageStage(Protocol):
    """One per-message stage of the send step. It answers None, at once or once awaited,
    when the message goes on to the next stage, or the outputs that end the message there
    (an answer of None at once costs the message no await)."""

    def __call__(self, item: Prepared,
                 ctx: SendContext) -> Awaitable[list[Out] | None] | None: ...
