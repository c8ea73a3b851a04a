"""Amazon SES v2 ``SendEmail`` emulator (``notiflow fakes``; dev, tests, benchmarks).

Serves ``POST /ses/v2/email/outbound-emails`` on SES's wire format: every request must carry
an AWS Signature Version 4 ``Authorization`` for the service ``ses`` by a known access key
(``ses``'s configured key pair, or ``fakes_ses_*``), which is recomputed with botocore's
signer over the received method, path, signed headers and body; ``X-Amz-Date`` within 5
minutes. Answers: ``200 {"MessageId"}``, or SES's error shape (``x-amzn-ErrorType`` header,
``{"message"}`` body): ``403`` for a missing, unknown or wrong signature, ``400
BadRequestException`` for a body ``SendEmail`` does not take, ``429
TooManyRequestsException`` (no ``Retry-After``: SES sends none), ``500 InternalFailure`` /
``503 ServiceUnavailable``. Latency, error mix, outages and accepted-then-hang are the common
knobs over ``/_admin/ses/config``; every request is recorded (the newest ``max_records``),
recipient included: test infrastructure only.

Magic addresses (emulator only): a recipient without ``@domain`` is ``BadRequestException``;
one at ``reject.example.com`` is ``MessageRejected``; a sender at ``unverified.example.com``
is ``MessageRejected`` "Email address is not verified".
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import orjson
from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from notiflow.adapters.providers.ses.client import (
    ERROR_TYPE_HEADER,
    SEND_EMAIL_PATH,
    SERVICE,
)
from notiflow.fakes.common import ACCEPTED, CommonKnobs, Emulator, MessageRecord, json_response
from notiflow.settings import Settings

log = logging.getLogger(__name__)

PREFIX: Final = "/ses"
REJECT_DOMAINS: Final = frozenset({"reject.example.com"})
UNVERIFIED_DOMAINS: Final = frozenset({"unverified.example.com"})
MAX_SKEW: Final = timedelta(minutes=5)
_AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request,"
                   r"\s*SignedHeaders=([a-z0-9;-]+),\s*Signature=([0-9a-f]{64})$")


class SesKnobs(CommonKnobs):
    """Runtime behaviour of the SES emulator (the common knobs)."""


@dataclass(slots=True)
class SesRecord(MessageRecord):
    """One ``SendEmail`` request; ``sid`` is the ``MessageId``."""

    subject: str | None = None
    error: str | None = None
    """The error type of a refused request."""
    tags: dict[str, str] | None = None

    def as_json(self) -> dict[str, Any]:
        return {**MessageRecord.as_json(self), "subject": self.subject, "error": self.error,
                "tags": self.tags}


class Refused(Exception):
    """An SES error answer: HTTP status, error type, message."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message

    def response(self) -> web.Response:
        return json_response(orjson.dumps({"message": self.message}), self.status,
                             {ERROR_TYPE_HEADER: f"{self.kind}:http://internal.amazon.com/"
                                                 "coral/com.amazonaws.sesv2/"})


def verify_signature(request_headers: dict[str, str], method: str, path: str, body: bytes,
                     keys: dict[str, str], now: datetime) -> str:
    """The access key id of a valid SigV4 signature of this request; :class:`Refused`
    otherwise. The signature is recomputed by botocore over the signed headers only."""
    auth = request_headers.get("authorization", "")
    m = _AUTH.match(auth.strip())
    if m is None:
        raise Refused(403, "IncompleteSignature", "Authorization header requires "
                      "'Credential', 'SignedHeaders' and 'Signature'")
    key_id, day, region, service, signed, signature = m.groups()
    if service != SERVICE:
        raise Refused(403, "InvalidSignatureException", f"credential should be scoped to "
                      f"correct service: '{SERVICE}'")
    secret = keys.get(key_id)
    if secret is None:
        raise Refused(403, "UnrecognizedClientException",
                      "The security token included in the request is invalid.")
    stamp = request_headers.get("x-amz-date", "")
    try:
        at = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise Refused(403, "IncompleteSignature", "X-Amz-Date is missing or malformed") from None
    if abs(now - at) > MAX_SKEW or not stamp.startswith(day):
        raise Refused(403, "InvalidSignatureException", "Signature expired or not yet valid")
    names = signed.split(";")
    if "host" not in names:
        raise Refused(403, "InvalidSignatureException", "host must be a signed header")
    headers = {n: request_headers.get(n, "") for n in names}
    aws = AWSRequest(method=method, url=f"http://{headers['host']}{path}", data=body,
                     headers=headers)
    aws.context["timestamp"] = stamp
    signer = SigV4Auth(Credentials(key_id, secret), SERVICE, region)
    expected = signer.signature(signer.string_to_sign(aws, signer.canonical_request(aws)), aws)
    if not hmac.compare_digest(expected, signature):
        raise Refused(403, "SignatureDoesNotMatch", "The request signature we calculated does "
                      "not match the signature you provided.")
    return key_id


def _address(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _parse(payload: Any) -> tuple[str | None, str | None, str | None, str | None,
                                  dict[str, str]]:
    """``(from, to, subject, body, tags)`` of a ``SendEmail`` body, as far as present."""
    if not isinstance(payload, dict):
        return None, None, None, None, {}
    to = (payload.get("Destination") or {}).get("ToAddresses") or [None]
    simple = (payload.get("Content") or {}).get("Simple") or {}
    subject = (simple.get("Subject") or {}).get("Data")
    body = ((simple.get("Body") or {}).get("Text") or {}).get("Data")
    tags = {t.get("Name"): t.get("Value") for t in payload.get("EmailTags") or []
            if isinstance(t, dict)}
    return (_address(payload.get("FromEmailAddress")), _address(to[0]),
            subject if isinstance(subject, str) else None,
            body if isinstance(body, str) else None,
            {k: v for k, v in tags.items() if isinstance(k, str) and isinstance(v, str)})


def _check(payload: Any, from_: str | None, to: str | None, subject: str | None,
           body: str | None) -> None:
    """Raise :class:`Refused` for a body SES would refuse."""
    if not isinstance(payload, dict):
        raise Refused(400, "BadRequestException", "Request body is not valid JSON")
    if from_ is None:
        raise Refused(400, "BadRequestException", "FromEmailAddress is required")
    if to is None or "@" not in to or not to.rpartition("@")[2]:
        raise Refused(400, "BadRequestException", "Missing final '@domain'")
    if subject is None or body is None:
        raise Refused(400, "BadRequestException", "Simple content needs a Subject and a Body")
    if from_.rpartition("@")[2].lower() in UNVERIFIED_DOMAINS:
        raise Refused(400, "MessageRejected", "Email address is not verified. The following "
                      f"identities failed the check in region US-EAST-1: {from_}")
    if to.rpartition("@")[2].lower() in REJECT_DOMAINS:
        raise Refused(400, "MessageRejected", "Message rejected")


class SesEmulator(Emulator[SesKnobs]):
    """State and handlers of the SES emulator."""

    def __init__(self, settings: Settings) -> None:
        super().__init__("ses", SesKnobs)
        self._keys: dict[str, str] = {}
        for key_id, secret in ((settings.ses.access_key_id, settings.ses.secret_access_key),
                               (settings.fakes_ses_access_key_id,
                                settings.fakes_ses_secret_access_key)):
            if key_id and secret is not None:
                self._keys[key_id] = secret.get_secret_value()
        if not self._keys:
            log.warning("ses emulator: no key pair configured (NOTIFLOW_FAKES_SES_*); every "
                        "request will get 403")

    def routes(self) -> list[web.RouteDef]:
        return [web.post(PREFIX + SEND_EMAIL_PATH, self.send_email), *self.admin_routes()]

    async def send_email(self, request: web.Request) -> web.Response:
        received_at = time.time()
        knobs = self.knobs
        raw = await request.read()
        try:
            payload = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            payload = None
        from_, to, subject, body, tags = _parse(payload)
        attempt = tags.get("attempt")

        def record(outcome: str, status: int, *, sid: str | None = None, hang: bool = False,
                   error: str | None = None) -> None:
            self.messages.add(SesRecord(
                received_at, outcome, status, None, sid, tags.get("message_id"),
                int(attempt) if attempt and attempt.isdigit() else None, to, from_, body,
                hang, subject=subject, error=error, tags=tags))

        await self.added_latency(knobs)
        try:
            if knobs.outage:
                raise Refused(503, "ServiceUnavailable", "Service unavailable")
            verify_signature({k.lower(): v for k, v in request.headers.items()},
                             request.method, request.path, raw, self._keys,
                             datetime.now(UTC))
            if self.draw(knobs.error_rate_429):
                raise Refused(429, "TooManyRequestsException", "Maximum sending rate exceeded.")
            if self.draw(knobs.error_rate_5xx):
                status = self.rng.choice(knobs.statuses_5xx)
                raise Refused(status, "InternalFailure" if status == 500 else
                              "ServiceUnavailable", "Internal failure")
            _check(payload, from_, to, subject, body)
        except Refused as refused:
            if refused.status >= 500:
                outcome = "outage" if knobs.outage else "server_error"
            else:
                outcome = {403: "unauthorized", 429: "rate_limited"}.get(refused.status,
                                                                         "invalid")
            record(outcome, refused.status, error=refused.kind)
            return refused.response()
        message_id = f"0100{secrets.token_hex(12)}-{secrets.token_hex(4)}-000000"
        hang = self.draw(knobs.timeout_rate)
        record(ACCEPTED, 200, sid=message_id, hang=hang)
        if hang:
            await asyncio.sleep(knobs.hang_s)
        return json_response(orjson.dumps({"MessageId": message_id}), 200)
