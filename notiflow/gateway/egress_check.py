"""Tenant-supplied URLs checked at acceptance: ``422 webhook_url_not_allowed`` for a URL the
egress rules refuse or whose host does not resolve (``adapters/egress.py``). The senders
check again before each connection: a name's addresses may change after acceptance."""

from __future__ import annotations

from notiflow.adapters.egress import Denied
from notiflow.gateway.errors import unprocessable
from notiflow.gateway.runtime import Runtime

REASON = "webhook_url_not_allowed"


async def check_webhook_url(rt: Runtime, url: object | None, field: str) -> None:
    """Nothing when ``url`` is None or may be called now; else :data:`REASON` (422) naming
    ``field``. The message never names the addresses a host resolved to."""
    if url is None:
        return
    verdict = await rt.egress.vet(str(url))
    if isinstance(verdict, Denied):
        raise unprocessable(REASON, f"{field}: {verdict.detail}", field=field)
