"""Amazon SES v2 ``SendEmail`` adapter, on SES's real wire format.

``POST {endpoint_url}/v2/email/outbound-emails`` with a JSON body (``FromEmailAddress``, one
``Destination.ToAddresses`` entry, ``Content.Simple`` with a UTF-8 subject and text body,
``EmailTags`` carrying ``message_id``, ``attempt`` and the trace, and the account's
``ConfigurationSetName`` when set), signed with AWS Signature Version 4 for the service
``ses`` by botocore's own signer (never by hand). SES answers ``200 {"MessageId": ...}``:
that is the provider's acceptance. Errors carry their type in ``x-amzn-ErrorType``
(:mod:`~notiflow.providers.ses.classify`). SES has no idempotency key: a timeout
after the request was sent is AMBIGUOUS. The ``EmailTags`` come back in every SES event
(``mail.tags``), which is how a delivery notification finds its message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

import aiohttp
import orjson
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, SendResult
from notiflow.adapters.providers.common import HttpAnswer, HttpProvider, utcnow
from notiflow.providers.ses.classify import (
    STATUS_CLASSES,
    classify_response,
    error_message,
    error_type,
)
from notiflow.providers.ses.config import SesSettings
from notiflow.schemas.enums import Channel
from notiflow.telemetry import current_traceparent

log = logging.getLogger(__name__)

SEND_EMAIL_PATH: Final = "/v2/email/outbound-emails"
SERVICE: Final = "ses"
ERROR_TYPE_HEADER: Final = "x-amzn-ErrorType"


def credentials(config: SesSettings) -> Credentials:
    """The account's key pair (and session token); ``ValueError`` when not configured."""
    if not config.access_key_id or config.secret_access_key is None:
        raise ValueError("ses.access_key_id and ses.secret_access_key are not configured")
    token = config.session_token.get_secret_value() if config.session_token else None
    return Credentials(config.access_key_id, config.secret_access_key.get_secret_value(),
                       token)


def signed_headers(creds: Credentials, region: str, url: str, body: bytes) -> dict[str, str]:
    """The headers of a SigV4-signed JSON ``POST`` of ``body`` to ``url`` (botocore's
    signer: ``Authorization``, ``X-Amz-Date``, ``X-Amz-Security-Token`` with a session
    token)."""
    request = AWSRequest(method="POST", url=url, data=body,
                         headers={"Content-Type": "application/json"})
    SigV4Auth(creds, SERVICE, region).add_auth(request)
    return {k: v for k, v in request.headers.items() if k.lower() != "host"}


def send_email_body(config: SesSettings, message: OutboundMessage,
                    trace: str | None = None) -> dict[str, Any]:
    """The ``SendEmail`` body of ``message`` (``Subject`` omitted when the message has none:
    SES then refuses it as a bad request); the message's own sender, else the account's;
    its extra headers as ``Content.Simple.Headers``."""
    simple: dict[str, Any] = {"Body": {"Text": {"Data": message.body, "Charset": "UTF-8"}}}
    if message.subject is not None:
        simple["Subject"] = {"Data": message.subject, "Charset": "UTF-8"}
    if message.headers:
        simple["Headers"] = [{"Name": name, "Value": value} for name, value in message.headers]
    tags = [{"Name": "message_id", "Value": message.message_id},
            {"Name": "attempt", "Value": str(message.attempt)}]
    if trace:
        tags.append({"Name": "traceparent", "Value": trace})
    body: dict[str, Any] = {
        "FromEmailAddress": message.sender or config.from_email,
        "Destination": {"ToAddresses": [str(message.recipient)]},
        "Content": {"Simple": simple},
        "EmailTags": tags,
    }
    if config.configuration_set:
        body["ConfigurationSetName"] = config.configuration_set
    return body


class SesEmail(HttpProvider[SesSettings]):
    """One SES account as a :class:`~notiflow.adapters.providers.base.ProviderClient`
    (opened and bounded as :class:`~notiflow.adapters.providers.common.HttpProvider` says)."""

    channel = Channel.EMAIL
    name = "ses"
    log = log
    answer_headers = (ERROR_TYPE_HEADER, "x-amzn-RequestId", "Retry-After")

    def __init__(self, config: SesSettings, session: aiohttp.ClientSession, *,
                 timeout: float, connect_timeout: float | None = None,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self._credentials = credentials(config)
        super().__init__(config, session, timeout=timeout, connect_timeout=connect_timeout,
                         clock=clock)
        self._url = URL(config.endpoint_url.rstrip("/") + SEND_EMAIL_PATH)

    @classmethod
    def _headers(cls, config: SesSettings) -> dict[str, str]:
        credentials(config)
        return {"Accept": "application/json", "User-Agent": "notiflow-ses/1"}

    def payload(self, message: OutboundMessage) -> dict[str, Any]:
        """The ``SendEmail`` body SES receives for ``message`` (:func:`send_email_body`)."""
        return send_email_body(self._config, message, current_traceparent())

    def _encode(self, message: OutboundMessage) -> bytes:
        return orjson.dumps(self.payload(message))

    def _request_headers(self, body: bytes) -> dict[str, str]:
        """The SigV4 signature of this request, for this moment."""
        return signed_headers(self._credentials, self._config.region, str(self._url), body)

    def _classify(self, answer: HttpAnswer, message: OutboundMessage,
                  started: datetime) -> SendResult:
        """``200`` with a ``MessageId`` is accepted; anything else goes through the tables."""
        payload = answer.json()
        if answer.status == 200:
            sid = payload.get("MessageId") if isinstance(payload, dict) else None
            if isinstance(sid, str) and sid:
                return self._accepted(started, sid)
            return self._result(STATUS_CLASSES[2], message, started, error_code="http_200")
        kind = error_type(answer.headers.get(ERROR_TYPE_HEADER), payload)
        rule = classify_response(answer.status, kind, error_message(payload))
        code = f"http_{answer.status}:{kind}" if kind else f"http_{answer.status}"
        return self._result(rule, message, started, error_code=code)
