"""One-click unsubscribe (RFC 8058): ``POST /unsubscribe/{token}``, what a mailbox provider
sends when its user clicks "unsubscribe", and ``GET /unsubscribe/{token}``, the page a
person who follows the link sees (a form that POSTs; a GET never unsubscribes, so link
scanners change nothing).

The token (``notiflow/unsubscribe.py``) is the only credential: the POST opts the
recipient it names out of its category on email, idempotently, and answers after the
change is in Cassandra and on ``notify.preferences``, so the next message the send flow
takes sees it. An unknown, forged or expired link is ``404``, as an unknown id is. See
``docs/users.md``.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import Annotated, Final

from fastapi import APIRouter, Path, Request, Response

from notiflow.correlation import CorrelationKeyMissing, CorrelationKeys
from notiflow.gateway.auth import RuntimeDep
from notiflow.gateway.bodies import read_limited
from notiflow.gateway.errors import not_found, unavailable
from notiflow.gateway.openapi import errors, raw_body
from notiflow.gateway.runtime import Runtime
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings
from notiflow.unsubscribe import ONE_CLICK, InvalidToken, UnsubscribeKeys, Unsubscription

router = APIRouter()

MAX_BODY: Final = 4096
TOKEN_PATTERN: Final = r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$"
Token = Annotated[str, Path(description="The link's token (a signed JWT).",
                            json_schema_extra={"pattern": TOKEN_PATTERN, "maxLength": 2048})]
HTML: Final = "text/html; charset=utf-8"
PAGE: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body><main><h1>{title}</h1>{content}</main></body></html>
"""


def unsubscription(settings: Settings, token: str) -> Unsubscription:
    """What ``token`` unsubscribes; ``404`` for a token this platform did not issue or one
    past ``unsubscribe.max_age``."""
    try:
        keys = UnsubscribeKeys.of(CorrelationKeys.from_settings(settings))
    except CorrelationKeyMissing:
        raise unavailable("unsubscribe_unavailable", "unsubscribe links need "
                          "NOTIFLOW_CORRELATION_KEY or NOTIFLOW_DLQ_KEY") from None
    try:
        return keys.verify(token, datetime.now(UTC), settings.unsubscribe.max_age)
    except InvalidToken:
        raise not_found() from None


async def opt_out(rt: Runtime, u: Unsubscription) -> None:
    """Opt ``u``'s recipient out of its category on email; returns once stored and
    published."""
    await rt.preferences().opt_out(u.tenant_id, u.recipient_hash, Channel.EMAIL, u.category)


@router.get("/unsubscribe/{token}", response_class=Response,
            responses={200: {"description": "A page with one button that unsubscribes.",
                             "content": {"text/html": {"schema": {"type": "string"}}}},
                       **errors(404, 503)})
async def unsubscribe_page(token: Token, rt: RuntimeDep) -> Response:
    """The page behind the link: says what the button does; changes nothing itself."""
    u = unsubscription(rt.settings, token)
    what = html.escape(u.category.value)
    form = (f'<p>Stop {what} email to this address?</p>'
            f'<form method="post"><input type="hidden" name="List-Unsubscribe" '
            f'value="One-Click"><button type="submit">Unsubscribe</button></form>')
    return Response(PAGE.format(title="Unsubscribe", content=form), media_type=HTML)


@router.post("/unsubscribe/{token}", response_class=Response,
             responses={200: {"description": "Unsubscribed (also when it already was).",
                              "content": {"text/html": {"schema": {"type": "string"}}}},
                        **errors(404, 413, 503)},
             openapi_extra=raw_body(
                 f"`{ONE_CLICK}` as a form, as a mailbox provider sends it (RFC 8058); "
                 "the body is not required: the token is the request.",
                 {"application/x-www-form-urlencoded": {"schema": {
                     "type": "object",
                     "properties": {"List-Unsubscribe": {"type": "string"}}}}}))
async def unsubscribe(token: Token, request: Request, rt: RuntimeDep) -> Response:
    """Opt the link's recipient out of its category on email; ``200`` once stored and
    published."""
    await read_limited(request, MAX_BODY)
    u = unsubscription(rt.settings, token)
    await opt_out(rt, u)
    done = f"<p>You will get no more {html.escape(u.category.value)} email.</p>"
    return Response(PAGE.format(title="Unsubscribed", content=done), media_type=HTML)
