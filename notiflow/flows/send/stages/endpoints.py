"""Which circuit breakers an attempt asks and tells. Every provider account has its breaker
(``adapters/breaker/``); a chat message also goes to an endpoint its tenant owns (the
webhook URL), whose breaker is the tenant's alone (``chat:<tenant>:<hash>``,
:func:`~notiflow.adapters.providers.chat.endpoint_breaker`). The endpoint's breaker counts
every outcome of a post; the provider's counts only what shows the provider itself
answering or failing (:func:`~notiflow.adapters.providers.chat.provider_evidence`), so no
tenant's endpoint can open a breaker another tenant's messages depend on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from notiflow.adapters.providers.base import Outcome, SendResult
from notiflow.adapters.providers.chat import endpoint_breaker, provider_evidence
from notiflow.flows.common.items import Work
from notiflow.flows.send.routing import Choice
from notiflow.schemas.enums import Channel


@dataclass(frozen=True, slots=True)
class Report:
    """One outcome for one breaker (the arguments of ``Breakers.record``)."""

    breaker_id: str
    outcome: Outcome
    reason: str | None
    latency_s: float
    probe: bool
    episode: int | None


def endpoint_of(w: Work) -> str | None:
    """The breaker id of the tenant endpoint ``w`` posts to; None for a message that goes to
    a provider's own API (every channel but chat)."""
    r = w.record
    if r.channel is not Channel.CHAT or not isinstance(r.recipient, str):
        return None
    return endpoint_breaker(r.tenant_id, r.recipient)


def _probe(admission: Any) -> tuple[bool, int | None]:
    return bool(getattr(admission, "probe", False)), getattr(admission, "episode", None)


def reports(w: Work, choice: Choice, result: SendResult, latency_s: float,
            prefixes: Mapping[str, tuple[str, ...]]) -> list[Report]:
    """What the breakers are told of ``result``: nothing for our own exception
    (``internal_error``); the provider's breaker the whole outcome, unless the send was a
    last resort (its breaker had refused it) or the message is chat, where it gets only the
    provider's evidence; and a chat endpoint's breaker the whole outcome, with the
    endpoint's admission (``choice.endpoint``)."""
    if (result.reason or "").startswith("internal_error"):
        return []
    probe, episode = _probe(choice.admission)
    whole = Report(result.provider_id, result.outcome, result.reason, latency_s, probe,
                   episode)
    endpoint = endpoint_of(w)
    if endpoint is None:
        return [] if choice.last_resort else [whole]
    out: list[Report] = []
    url = w.record.recipient
    assert isinstance(url, str)
    evidence = provider_evidence(result, url, prefixes.get(result.provider_id, ()))
    if evidence is not None and not choice.last_resort:
        out.append(Report(result.provider_id, *evidence, probe, episode))
    out.append(Report(endpoint, result.outcome, result.reason, latency_s,
                      *_probe(choice.endpoint)))
    return out
