"""Microsoft Teams incoming-webhook answers → :class:`~notiflow.adapters.providers.common.Rule`.

Two kinds of webhook answer differently:

- **Workflows** (Power Automate, Logic Apps URLs) answer ``202`` to a post they took, and
  otherwise a status with ``{"error": {"code", "message"}}``.
- **Office 365 connectors** (``webhook.office.com``, retired by Microsoft) answer ``200`` ``1``.
  They also answer ``200`` when Teams refused the post, with the refusal's status in the text
  (``Microsoft Teams endpoint returned HTTP error 429 ...``): that status is classified.

The URL is the credential: ``401``/``403``, a workflow or connector that no longer exists
(``404``, ``410``) make the webhook dead (the recipient is deactivated). A disabled workflow
refuses for good but is kept (it can be turned on again).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from notiflow.adapters.providers.base import Outcome
from notiflow.adapters.providers.common import HTTP_DEFAULTS, Rule, coded_rule, status_rule

_T, _P, _A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS
DEAD: Final = Rule(_P, "invalid_recipient", deactivate=True)
INVALID_CONTENT: Final = Rule(_P, "invalid_content")

CODES: Final[Mapping[str, Rule]] = {
    "WorkflowNotFound": DEAD,
    "DirectApiAuthorizationRequired": DEAD,
    "WorkflowTriggerIsNotEnabled": Rule(_P, "recipient_disabled"),
    "InvalidRequestContent": INVALID_CONTENT,
    "TriggerInputSchemaMismatch": INVALID_CONTENT,
}
"""A workflow's ``error.code``."""

STATUSES: Final[Mapping[int, Rule]] = {
    **HTTP_DEFAULTS,
    400: INVALID_CONTENT,
    401: DEAD,
    403: DEAD,
    404: DEAD,
    410: DEAD,
}
"""Statuses without a known code (defaults: ``common.HTTP_DEFAULTS``)."""

_EMBEDDED: Final = re.compile(rb"returned HTTP error (\d{3})")


def error_code_of(payload: Any) -> str | None:
    """``error.code`` of a workflow's JSON error body."""
    error = payload.get("error") if isinstance(payload, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def embedded_status(body: bytes) -> int | None:
    """The status a connector's ``200`` text reports Teams refused the post with."""
    found = _EMBEDDED.search(body[:2048])
    return int(found.group(1)) if found else None


def classify_response(status: int, code: str | None) -> Rule:
    """The rule of a refused post: its workflow error code's row, else its status's."""
    return coded_rule(code, CODES, status, STATUSES)


def embedded_rule(status: int) -> Rule:
    """The rule of a connector's ``200`` that reports ``status``."""
    return status_rule(status, STATUSES)
