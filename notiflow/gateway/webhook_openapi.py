"""What every provider webhook receiver has in the OpenAPI document: its errors (a plug-in's
``routes.py`` describes how it authenticates, what it receives and answers), and the schema
pieces form-encoded receipts share."""

from __future__ import annotations

from typing import Any, Final

from notiflow.gateway.openapi import Responses, errors

FORM: Final = "application/x-www-form-urlencoded"
FLAT_OBJECT: Final[dict[str, Any]] = {"type": "object",
                                      "additionalProperties": {"type": "string"}}
"""An object of string fields (a form, or JSON of strings)."""

_REFUSED: Final = ("`invalid_signature`, `missing_signature`, `stale_timestamp`, "
                   "`signature_not_configured`, `wrong_account`, `invalid_token`, "
                   "`webhook_not_configured`, `untrusted_url`: nothing was written.")
_PUBLISH: Final = "`kafka_unavailable`: the provider retries the whole post."


def webhook_errors(*codes: int, **reasons: str) -> Responses:
    """The errors of a webhook receiver: 403 for an unsigned or forged post, 503 when
    Kafka does not confirm the receipts, and ``codes``."""
    return errors(*sorted({*codes, 403, 503}), **{"r403": _REFUSED, "r503": _PUBLISH, **reasons})
