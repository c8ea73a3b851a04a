"""The send step, stage by stage (``flows/send/flow.py`` lists them in order).

A batch of due messages is prepared by stages that each decide some messages and pass the
rest on (:mod:`.send_batch`): admit (:mod:`.admit`), gates (:mod:`.gates`), render
(:mod:`.render`), route (:mod:`.route`). Then each prepared message goes on by itself
through the per-message stages, each of which ends it (its outputs) or passes it on
(:class:`~.send_batch.MessageStage`): quota (:mod:`.route`), before the channel's in-flight
slot; then, inside it, confirm (:mod:`.confirm`), call (:mod:`.call`), last resort
(:mod:`.route`) and classify (:mod:`.classifying`). Every end is recorded by emit
(:mod:`.emit`). The dispatcher (``flows/send/dispatch.py``) runs the stages on its event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from notiflow.flows.send.stages.send_batch import MessageStage, Stage


@dataclass(frozen=True)
class SendStages:
    """``prepare`` runs over each batch in order; ``route`` over each prepared message
    before its channel's in-flight slot is taken, ``send`` inside that slot. A message's
    stages stop at the first that ends it."""

    prepare: tuple[Stage, ...]
    route: tuple[MessageStage, ...]
    send: tuple[MessageStage, ...]
