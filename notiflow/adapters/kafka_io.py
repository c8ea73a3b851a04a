"""Kafka producing with confirmed delivery (acks=all, idempotent producer, delivery callbacks).

Bytewax's stock ``KafkaSink`` drops failed deliveries; everything notiflow produces goes
through :class:`AsyncProducer` (API and adapters) or :class:`SyncProducer` (the dataflows'
``ConfirmingSink``, ``adapters/bytewax_kafka.py``), both of which surface a failed delivery as
an error instead of losing it.

Every Kafka client of notiflow (producers, consumers, admin clients, the Bytewax sources)
starts from :func:`kafka_config`, which carries the transport security of the settings.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from pydantic import SecretStr

from notiflow.settings import KafkaSecurity, Settings

log = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]


class DeliveryFailed(RuntimeError):
    """The broker did not acknowledge a record."""


def security_config(security: KafkaSecurity) -> dict[str, str]:
    """librdkafka's transport-security properties of ``security``: ``security.protocol``;
    for TLS the CA, the client certificate and key, and the hostname check; for SASL the
    mechanism and its credentials (``OAUTHBEARER``: librdkafka's own OIDC client-credentials
    flow)."""
    cfg: dict[str, str] = {"security.protocol": security.protocol}
    if security.tls:
        cfg["ssl.endpoint.identification.algorithm"] = (
            "https" if security.check_hostname else "none")
        cfg.update(_present({"ssl.ca.location": security.ca_file,
                             "ssl.certificate.location": security.cert_file,
                             "ssl.key.location": security.key_file,
                             "ssl.key.password": security.key_password}))
    if security.sasl and security.sasl_mechanism is not None:
        cfg["sasl.mechanism"] = security.sasl_mechanism
        if security.sasl_mechanism == "OAUTHBEARER":
            cfg["sasl.oauthbearer.method"] = "oidc"
            cfg.update(_present({
                "sasl.oauthbearer.token.endpoint.url": security.oauth_token_url,
                "sasl.oauthbearer.client.id": security.oauth_client_id,
                "sasl.oauthbearer.client.secret": security.oauth_client_secret,
                "sasl.oauthbearer.scope": security.oauth_scope}))
        else:
            cfg.update(_present({"sasl.username": security.sasl_username,
                                 "sasl.password": security.sasl_password}))
    return cfg


def _present(values: Mapping[str, object]) -> dict[str, str]:
    return {k: v.get_secret_value() if isinstance(v, SecretStr) else str(v)
            for k, v in values.items() if v is not None}


def kafka_config(settings: Settings, options: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
    """The configuration every Kafka client of notiflow starts from: ``bootstrap.servers``
    and :func:`security_config`, then ``options`` (the client's own properties)."""
    return {"bootstrap.servers": settings.kafka_bootstrap,
            **security_config(settings.kafka_security), **(options or {})}


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """:func:`kafka_config` of an acks=all idempotent producer, then ``overrides``."""
    quiet = logging.getLogger("notiflow.kafka.producer")
    cfg = kafka_config(settings, {
        "acks": "all",
        "enable.idempotence": True,
        "max.in.flight.requests.per.connection": 5,
        "linger.ms": 2,
        "compression.type": "lz4",
        "partitioner": "murmur2_random",
        "delivery.timeout.ms": 30_000,
        "logger": quiet,
    })
    cfg.update(overrides)
    return cfg


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One record to produce."""

    topic: str
    key: bytes | None
    value: bytes | None
    """None: a tombstone (a compacted topic drops the key's earlier records)."""
    headers: Headers = field(default_factory=list)


def make_headers(message_id: str, tenant_id: str | None, tier: str | None,
                 traceparent: str | None = None, schema_version: int = 1) -> Headers:
    """The header contract (docs/design.md, "Topics and keys"): message_id, tenant_id, tier,
    schema_version, traceparent."""
    h: Headers = [("message_id", message_id.encode()),
                  ("schema_version", str(schema_version).encode())]
    if tenant_id:
        h.append(("tenant_id", tenant_id.encode()))
    if tier:
        h.append(("tier", tier.encode()))
    if traceparent:
        h.append(("traceparent", traceparent.encode()))
    return h


def header(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> str | None:
    for k, v in headers or ():
        if k == name and v is not None:
            return v.decode(errors="replace")
    return None


def _headers(record: OutRecord) -> list[tuple[str, str | bytes | None]]:
    return list(record.headers)


class AsyncProducer:
    """asyncio face of a confluent-kafka producer: ``await produce(...)`` returns once the
    broker acknowledged the record (acks=all) and raises :class:`DeliveryFailed` otherwise."""

    def __init__(self, settings: Settings, **overrides: Any) -> None:
        self._producer = Producer(producer_config(settings, **overrides))
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="kafka-poll", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    async def produce(self, record: OutRecord) -> Message:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Message] = loop.create_future()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                loop.call_soon_threadsafe(_fail, fut, DeliveryFailed(str(err)))
            else:
                loop.call_soon_threadsafe(_ok, fut, msg)

        try:
            self._producer.produce(record.topic, record.value, record.key,
                                   headers=_headers(record), on_delivery=on_delivery)
        except (BufferError, KafkaException) as exc:
            raise DeliveryFailed(str(exc)) from exc
        return await fut

    async def produce_all(self, records: Iterable[OutRecord]) -> None:
        """:meth:`produce` of every record at once; returns once all are acknowledged, and
        raises the first failure otherwise."""
        await asyncio.gather(*(self.produce(r) for r in records))

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._poller.join(timeout=2)
        self._producer.flush(timeout)


def _ok(fut: asyncio.Future[Message], msg: Message) -> None:
    if not fut.done():
        fut.set_result(msg)


def _fail(fut: asyncio.Future[Message], exc: Exception) -> None:
    if not fut.done():
        fut.set_exception(exc)


class SyncProducer:
    """Blocking producer for batches: :meth:`send_all` returns only when every record is
    acknowledged and raises :class:`DeliveryFailed` if any was not."""

    def __init__(self, settings: Settings, **overrides: Any) -> None:
        self._producer = Producer(producer_config(settings, **overrides))
        self._errors: list[str] = []

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err}")

    def send_all(self, records: Iterable[OutRecord], timeout: float = 60.0) -> int:
        n = 0
        for r in records:
            while True:
                try:
                    self._producer.produce(r.topic, r.value, r.key, headers=_headers(r),
                                           on_delivery=self._on_delivery)
                    break
                except BufferError:
                    self._producer.poll(0.1)
            n += 1
        remaining = self._producer.flush(timeout)
        if remaining:
            raise DeliveryFailed(f"{remaining} records not acknowledged within {timeout}s")
        if self._errors:
            errors, self._errors = self._errors, []
            raise DeliveryFailed(f"{len(errors)} records failed, first: {errors[0]}")
        return n

    def close(self) -> None:
        self._producer.flush(30)
