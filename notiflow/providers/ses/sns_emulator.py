"""An SNS topic with one HTTP(S) subscription, as the SES emulator publishes to it.

It signs like SNS (``providers/ses/sns.py``: RSA over the canonical fields,
``SignatureVersion`` 1 or 2) with a throw-away key whose self-signed certificate it serves at
``<base>/sns/SimpleNotificationService-<fingerprint>.pem``, and posts with SNS's headers
(``x-amz-sns-message-type``, ``-message-id``, ``-topic-arn``, ``text/plain``).

Subscription: the first message for an endpoint not confirmed yet sends a
``SubscriptionConfirmation`` (again after ``CONFIRM_EVERY_S`` while unconfirmed) whose
``SubscribeURL`` (``<base>/sns/?Action=ConfirmSubscription&TopicArn=…&Token=…``) confirms it.
Messages for an unconfirmed endpoint are held and sent once it confirms: SNS would drop them,
the emulator keeps them so a test's first message does not depend on start-up order.
The newest ``MAX_KEPT`` posts are kept for inspection (``/_admin/ses/sns``).
"""

from __future__ import annotations

import hashlib
import secrets
import time
import uuid
from collections import deque
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from urllib.parse import quote

import aiohttp
import orjson
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from notiflow.fakes.common import WebhookDispatcher, json_response
from notiflow.providers.ses import sns

CONFIRM_EVERY_S: Final = 2.0
MAX_KEPT: Final = 1000
MAX_HELD: Final = 100_000
Post = tuple[str, dict[str, str]]
"""(message type, the signed SNS message)."""


def iso(at: datetime) -> str:
    """SNS's and SES's timestamps: ``2026-12-06T07:30:00.123Z``."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def self_signed(key: rsa.RSAPrivateKey) -> bytes:
    """A PEM certificate of ``key`` (SNS's are CA-issued; receivers trust them for the host
    they are fetched from, not for their chain)."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.amazonaws.com")])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=365))
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


async def _post(session: aiohttp.ClientSession, url: str, item: Post) -> int:
    kind, fields = item
    headers = {sns.TYPE_HEADER: kind, "x-amz-sns-message-id": fields["MessageId"],
               "x-amz-sns-topic-arn": fields["TopicArn"],
               "Content-Type": "text/plain; charset=UTF-8"}
    async with session.post(url, data=orjson.dumps(fields), headers=headers) as resp:
        await resp.read()
        return resp.status


class SnsTopic:
    """One topic (``topic_arn``) signing with a fresh key, served under ``base_url``."""

    def __init__(self, topic_arn: str, base_url: str, route_prefix: str) -> None:
        self.topic_arn, self.base_url, self._prefix = topic_arn, base_url.rstrip("/"), route_prefix
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.certificate = self_signed(self._key)
        fingerprint = hashlib.sha256(self.certificate).hexdigest()[:32]
        self._cert_name = f"SimpleNotificationService-{fingerprint}.pem"
        self.dispatcher: WebhookDispatcher[Post] = WebhookDispatcher(
            "sns", _post, user_agent="Amazon Simple Notification Service Agent", concurrency=16)
        self.signature_version = "1"
        self.confirmed: set[str] = set()
        self._tokens: dict[str, str] = {}
        self._asked: dict[str, float] = {}
        self._held: dict[str, list[tuple[float, Post]]] = {}
        self.kept: deque[dict[str, str]] = deque(maxlen=MAX_KEPT)

    @property
    def cert_url(self) -> str:
        return f"{self.base_url}/sns/{self._cert_name}"

    def routes(self) -> list[web.RouteDef]:
        return [web.get(f"{self._prefix}/sns/{self._cert_name}", self.serve_certificate),
                web.get(f"{self._prefix}/sns/", self.subscription_action)]

    def reset(self) -> None:
        self.dispatcher.clear()
        self.confirmed.clear()
        self._tokens.clear()
        self._asked.clear()
        self._held.clear()
        self.kept.clear()

    def stats(self) -> dict[str, Any]:
        return {**self.dispatcher.stats(), "confirmed": sorted(self.confirmed),
                "held": sum(len(v) for v in self._held.values())}

    def _signed(self, kind: str, fields: dict[str, str]) -> dict[str, str]:
        doc = {"Type": kind, "MessageId": str(uuid.uuid4()), "TopicArn": self.topic_arn,
               "Timestamp": iso(datetime.now(UTC)), **fields}
        version = self.signature_version
        doc.update(SignatureVersion=version, Signature=sns.sign(doc, self._key, version),
                   SigningCertURL=self.cert_url)
        self.kept.append(doc)
        return doc

    def publish(self, due: float, url: str, message: str) -> None:
        """Deliver ``message`` (an SES event's JSON) to ``url`` at ``due`` (monotonic), once
        the endpoint has confirmed its subscription."""
        post = (sns.NOTIFICATION, self._signed(sns.NOTIFICATION, {
            "Message": message,
            "UnsubscribeURL": f"{self.base_url}/sns/?Action=Unsubscribe&SubscriptionArn="
                              f"{quote(self.topic_arn, safe='')}:{uuid.uuid4()}"}))
        if url in self.confirmed:
            self.dispatcher.schedule(due, url, post)
            return
        held = self._held.setdefault(url, [])
        if len(held) < MAX_HELD:
            held.append((due, post))
        now = time.monotonic()
        if now - self._asked.get(url, float("-inf")) >= CONFIRM_EVERY_S:
            self._asked[url] = now
            self._ask_to_confirm(url)

    def _ask_to_confirm(self, url: str) -> None:
        token = secrets.token_hex(64)
        self._tokens[token] = url
        subscribe = (f"{self.base_url}/sns/?Action=ConfirmSubscription&TopicArn="
                     f"{quote(self.topic_arn, safe='')}&Token={token}")
        doc = self._signed(sns.SUBSCRIPTION_CONFIRMATION, {
            "Message": f"You have chosen to subscribe to the topic {self.topic_arn}.\n"
                       "To confirm the subscription, visit the SubscribeURL included in this "
                       "message.",
            "SubscribeURL": subscribe, "Token": token})
        self.dispatcher.schedule(time.monotonic(), url, (sns.SUBSCRIPTION_CONFIRMATION, doc))

    async def serve_certificate(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.certificate, content_type="application/x-pem-file")

    async def subscription_action(self, request: web.Request) -> web.Response:
        """``ConfirmSubscription`` with a token this topic sent: the endpoint is confirmed and
        its held messages go out."""
        query = request.query
        if query.get("Action") != "ConfirmSubscription":
            return _sns_error(400, "InvalidAction", "only ConfirmSubscription is served")
        url = self._tokens.get(query.get("Token", ""))
        if url is None or query.get("TopicArn") != self.topic_arn:
            return _sns_error(400, "InvalidParameter", "Invalid token")
        self.confirmed.add(url)
        for due, post in self._held.pop(url, []):
            self.dispatcher.schedule(due, url, post)
        arn = f"{self.topic_arn}:{uuid.uuid4()}"
        return web.Response(
            text=f"<ConfirmSubscriptionResponse><ConfirmSubscriptionResult><SubscriptionArn>"
                 f"{arn}</SubscriptionArn></ConfirmSubscriptionResult>"
                 "</ConfirmSubscriptionResponse>", content_type="text/xml")

    async def list_posts(self, _request: web.Request) -> web.Response:
        return json_response(orjson.dumps({"posts": list(self.kept), **self.stats()}), 200)


def _sns_error(status: int, code: str, message: str) -> web.Response:
    return web.Response(status=status, content_type="text/xml", text=(
        f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}"
        "</Message></Error></ErrorResponse>"))
