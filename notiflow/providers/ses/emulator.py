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

Events: with an SNS endpoint (knob ``sns_endpoint_url``, default
``fakes_ses_sns_endpoint_url``), every accepted message publishes SES's event-publishing
events through an SNS topic (``sns_emulator.py``, the first of ``ses.sns_topic_arns``): ``Send``,
then after ``event_delay_ms`` ``Delivery``, or a ``Bounce`` (``Permanent`` 5.1.1 for
``bounce.example.com`` and a ``bounce_rate`` share, ``Transient`` 4.2.2 for
``transient.example.com``); ``complaint.example.com`` gets a ``Complaint`` after its
``Delivery``. The message's ``EmailTags`` come back as ``mail.tags``.
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
from typing import Any, Final, Literal

import orjson
from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from pydantic import Field

from notiflow.fakes.common import ACCEPTED, CommonKnobs, Emulator, MessageRecord, json_response
from notiflow.providers.ses.client import (
    ERROR_TYPE_HEADER,
    SEND_EMAIL_PATH,
    SERVICE,
)
from notiflow.providers.ses.sns_emulator import SnsTopic, iso
from notiflow.settings import Settings

log = logging.getLogger(__name__)

PREFIX: Final = "/ses"
REJECT_DOMAINS: Final = frozenset({"reject.example.com"})
UNVERIFIED_DOMAINS: Final = frozenset({"unverified.example.com"})
BOUNCE_DOMAINS: Final = frozenset({"bounce.example.com"})
TRANSIENT_DOMAINS: Final = frozenset({"transient.example.com"})
COMPLAINT_DOMAINS: Final = frozenset({"complaint.example.com"})
DEFAULT_TOPIC: Final = "arn:aws:sns:{region}:000000000000:notiflow-ses-events"
ACCOUNT: Final = "000000000000"
MAX_SKEW: Final = timedelta(minutes=5)
_AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request,"
                   r"\s*SignedHeaders=([a-z0-9;-]+),\s*Signature=([0-9a-f]{64})$")


class SesKnobs(CommonKnobs):
    """Runtime behaviour of the SES emulator."""

    sns_endpoint_url: str | None = None
    """Where SES events go (an SNS HTTP subscription); None = the configured one."""
    event_delay_ms: float = Field(50.0, ge=0)
    """Delay of the final event (``Delivery`` / ``Bounce``) after the send."""
    bounce_rate: float = Field(0.0, ge=0, le=1)
    """Share of accepted messages whose final event is a permanent bounce."""
    signature_version: Literal["1", "2"] = "1"
    """How the SNS topic signs (SHA-1 or SHA-256)."""


@dataclass(slots=True)
class SesRecord(MessageRecord):
    """One ``SendEmail`` request; ``sid`` is the ``MessageId``."""

    subject: str | None = None
    error: str | None = None
    """The error type of a refused request."""
    tags: dict[str, str] | None = None


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


def _valid_headers(headers: Any) -> bool:
    """SES's rule for ``Content.Simple.Headers`` (``MessageHeader`` list)."""
    return isinstance(headers, list) and len(headers) <= 15 and all(
        isinstance(h, dict) and isinstance(h.get("Name"), str)
        and isinstance(h.get("Value"), str) and 1 <= len(h["Name"]) <= 126
        and 1 <= len(h["Value"]) <= 870 for h in headers)


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
    headers = ((payload.get("Content") or {}).get("Simple") or {}).get("Headers")
    if headers is not None and not _valid_headers(headers):
        raise Refused(400, "BadRequestException", "Headers must be at most 15 objects of a "
                      "Name (1-126 characters) and a Value (1-870 characters)")
    if from_.rpartition("@")[2].lower() in UNVERIFIED_DOMAINS:
        raise Refused(400, "MessageRejected", "Email address is not verified. The following "
                      f"identities failed the check in region US-EAST-1: {from_}")
    if to.rpartition("@")[2].lower() in REJECT_DOMAINS:
        raise Refused(400, "MessageRejected", "Message rejected")


class SesEmulator(Emulator[SesKnobs]):
    """State and handlers of the SES emulator."""

    def __init__(self, settings: Settings) -> None:
        config = settings.ses
        topic = (config.sns_topic_arns[0] if config.sns_topic_arns
                 else DEFAULT_TOPIC.format(region=config.region))
        self.topic = SnsTopic(topic, config.endpoint_url, PREFIX)
        super().__init__("ses", SesKnobs, callbacks=self.topic.dispatcher)
        self._default_endpoint = settings.fakes_ses_sns_endpoint_url
        self._configuration_set = config.configuration_set
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
        return [web.post(PREFIX + SEND_EMAIL_PATH, self.send_email), *self.topic.routes(),
                web.get("/_admin/ses/sns", self.topic.list_posts), *self.admin_routes()]

    def reset(self) -> None:
        super().reset()
        self.topic.reset()
        self.knobs_changed()

    def knobs_changed(self) -> None:
        self.topic.signature_version = self.knobs.signature_version

    def extra_stats(self) -> dict[str, Any]:
        return {"sns": self.topic.stats()}

    def _publish_events(self, knobs: SesKnobs, url: str, message_id: str, from_: str,
                        to: str, tags: dict[str, str]) -> None:
        """SES's events of one accepted message, through the SNS topic."""
        sent_at = datetime.now(UTC)
        mail = {"timestamp": iso(sent_at), "source": from_, "sendingAccountId": ACCOUNT,
                "messageId": message_id, "destination": [to], "headersTruncated": False,
                "tags": {**{k: [v] for k, v in tags.items()},
                         **({"ses:configuration-set": [self._configuration_set]}
                            if self._configuration_set else {})}}
        delay = knobs.event_delay_ms / 1000
        final_at = sent_at + timedelta(seconds=delay)
        domain = to.rpartition("@")[2].lower()
        now = time.monotonic()
        events: list[tuple[float, dict[str, Any]]] = [
            (now, {"eventType": "Send", "mail": mail, "send": {}})]
        if domain in BOUNCE_DOMAINS or domain in TRANSIENT_DOMAINS or self.draw(
                knobs.bounce_rate):
            permanent = domain not in TRANSIENT_DOMAINS
            events.append((now + delay, {"eventType": "Bounce", "mail": mail, "bounce": {
                "bounceType": "Permanent" if permanent else "Transient",
                "bounceSubType": "General" if permanent else "MailboxFull",
                "bouncedRecipients": [{
                    "emailAddress": to, "action": "failed",
                    "status": "5.1.1" if permanent else "4.2.2",
                    "diagnosticCode": "smtp; 550 5.1.1 user unknown" if permanent
                    else "smtp; 452 4.2.2 mailbox full"}],
                "timestamp": iso(final_at), "feedbackId": f"{secrets.token_hex(16)}-000000",
                "reportingMTA": "dsn; a1-2.smtp-out.amazonses.com"}}))
        else:
            events.append((now + delay, {"eventType": "Delivery", "mail": mail, "delivery": {
                "timestamp": iso(final_at), "processingTimeMillis": int(delay * 1000),
                "recipients": [to], "smtpResponse": "250 2.6.0 Message received",
                "reportingMTA": "a1-2.smtp-out.amazonses.com"}}))
            if domain in COMPLAINT_DOMAINS:
                events.append((now + 2 * delay, {"eventType": "Complaint", "mail": mail,
                                                 "complaint": {
                    "complainedRecipients": [{"emailAddress": to}],
                    "timestamp": iso(final_at + timedelta(seconds=delay)),
                    "feedbackId": f"{secrets.token_hex(16)}-000000",
                    "complaintFeedbackType": "abuse"}}))
        for due, event in events:
            self.topic.publish(due, url, orjson.dumps(event).decode())

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
        url = knobs.sns_endpoint_url or self._default_endpoint
        if url and from_ and to:
            self._publish_events(knobs, url, message_id, from_, to, tags)
        if hang:
            await asyncio.sleep(knobs.hang_s)
        return json_response(orjson.dumps({"MessageId": message_id}), 200)
