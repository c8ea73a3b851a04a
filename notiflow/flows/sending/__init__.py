"""The send step, stage by stage (``flows/send.py`` lists them in order).

A batch of due messages is prepared by stages that each decide some messages and pass the
rest on (:mod:`.batch`): admit (:mod:`.admit`), gates (:mod:`.gates`), render
(:mod:`.render`), route (:mod:`.route`). Then each prepared message goes on by itself: quota
(:mod:`.route`), send (:mod:`.call`), classify (:mod:`.classify`); every end is recorded by
emit (:mod:`.emit`). The dispatcher (``flows/dispatch.py``) runs them on its event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from notiflow.flows.sending.batch import Stage
from notiflow.flows.sending.call import Call
from notiflow.flows.sending.classify import Classify
from notiflow.flows.sending.route import Quota


@dataclass(frozen=True)
class SendStages:
    """``prepare`` runs over each batch in order; ``quota``, ``call`` and ``classify`` over
    each prepared message."""

    prepare: tuple[Stage, ...]
    quota: Quota
    call: Call
    classify: Classify
