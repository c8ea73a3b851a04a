"""The load a benchmark offers the platform: bulk records produced straight to the ingest
topics (:class:`CampaignProducer`, the stand-in for upstream services) and P0 OTPs through
the API at a steady rate (:func:`send_otps`, :class:`OtpStream`).

Both run on threads of their own and record when each message was accepted (by Kafka, or
by the API's ``accepted_at``), the start of every latency a benchmark reports.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

import aiohttp
import orjson
from confluent_kafka import Producer

from notiflow.adapters.kafka_io import producer_config
from notiflow.bench.workload import TEMPLATE_IDS, TENANT_BY_TIER, Generated, PhoneFactory
from notiflow.ingest_binding import Signer, tenant_signer
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings


class ApiTarget(Protocol):
    """What the OTP sender needs of a :class:`~notiflow.bench.harness.Phase`: the base URL
    of its (priority-lane) API and a tenant's authorization header."""

    api: str

    def auth(self, tenant: str) -> dict[str, str]: ...


class CampaignProducer:
    """Produces generated records to their ingest topics as fast as Kafka takes them (the
    producer settings every notiflow producer uses: acks=all, idempotent), in a thread.

    ``nice``: the CPU niceness of the producing thread and of librdkafka's threads (created
    by it): the stand-in for upstream services, which run on machines of their own, should
    not take the platform's two cores from it."""

    def __init__(self, settings: Settings, nice: int = 0) -> None:
        self.settings = settings
        self.nice = nice
        self.producer: Producer | None = None
        self.accepted_at: dict[str, float] = {}
        self.failed = 0
        self.started = self.finished = 0.0
        self._signers: dict[str, Signer] = {}

    def produce(self, items: Iterable[Generated], tier: Tier, rate: float | None = None
                ) -> None:
        """Produce every item (``rate``: at most that many per second, for steady loads)."""
        def failed(err: Any, _msg: Any) -> None:
            if err is not None:
                self.failed += 1

        if self.nice:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        self.producer = Producer(producer_config(self.settings, **{"linger.ms": 20,
                                                                   "batch.size": 1_000_000}))
        self.started = time.time()
        for i, g in enumerate(items):
            while rate and (ahead := self.started + i / rate - time.time()) > 0:
                self.producer.poll(ahead)
            topic = self.settings.ingest_topic(g.channel, tier)
            headers: list[tuple[str, str | bytes | None]] = [
                self._signer(g.value).header(g.channel.value, tier.value, g.value)]
            while True:
                try:
                    self.producer.produce(topic, g.value, key=g.message_id.encode(),
                                          headers=headers, on_delivery=failed)
                    break
                except BufferError:
                    self.producer.poll(0.05)
            self.accepted_at[g.message_id] = time.time()
            self.producer.poll(0)
        left = self.producer.flush(120)
        if left or self.failed:
            raise RuntimeError(f"campaign producer: {left} undelivered, {self.failed} failed")
        self.finished = time.time()

    def _signer(self, value: bytes) -> Signer:
        """The key of the record's tenant (a direct producer holds its own tenant's key)."""
        tenant = str(orjson.loads(value).get("tenant_id", ""))
        if tenant not in self._signers:
            found = tenant_signer(self.settings, tenant)
            if found is None:
                raise RuntimeError(f"campaign producer: tenant {tenant!r} has no ingest_keys")
            self._signers[tenant] = found
        return self._signers[tenant]


OTP_CONNECTIONS = 64
"""The OTP sender's connection pool. The sender is aiohttp's: httpx's pool scans every pending
request against every connection on each request and release, which took the benchmark
process to 0.3 of a core at 20 OTP/s once the API slowed (py-spy) — CPU the platform it
measures did not get."""


async def send_otps(phase: ApiTarget, versions: dict[tuple[str, Channel], int], rate: float,
                    stop: threading.Event, phones: PhoneFactory, key_prefix: str, *,
                    max_count: int | None = None) -> tuple[dict[str, float], int]:
    """P0 OTPs through the API at a steady ``rate`` until ``stop`` is set: message_id →
    accepted_at (the API's), and the number refused (not 202, or no answer in three tries)."""
    tenant = TENANT_BY_TIER[Tier.P0]
    accepted: dict[str, float] = {}
    refused = 0
    interval = 1.0 / rate
    async with aiohttp.ClientSession(
            base_url=phase.api, headers=phase.auth(tenant),
            timeout=aiohttp.ClientTimeout(total=30),
            connector=aiohttp.TCPConnector(limit=OTP_CONNECTIONS)) as client:
        tasks: set[asyncio.Task[None]] = set()

        async def one(i: int) -> None:
            nonlocal refused
            body = {"channel": "SMS", "tier": "P0", "category": "otp",
                    "recipient": phones.take(), "template_id": TEMPLATE_IDS[Channel.SMS],
                    "template_version": versions[(tenant, Channel.SMS)],
                    "variables": {"brand": "Notiflow", "headline": "code",
                                  "code": f"{i % 1_000_000:06d}"}}
            for _ in range(3):  # a dropped connection: retry with the same key (idempotent)
                try:
                    async with client.post("/v1/messages", json=body,
                                           headers={"Idempotency-Key": f"{key_prefix}-{i}"}
                                           ) as r:
                        status = r.status
                        doc = await r.json() if status == 202 else None
                    break
                except (TimeoutError, aiohttp.ClientConnectionError):
                    await asyncio.sleep(0.1)
            else:
                refused += 1
                return
            if doc is not None:
                accepted[doc["message_id"]] = _ts(doc["accepted_at"])
            else:
                refused += 1

        t0 = time.monotonic()
        i = 0
        while not stop.is_set() and (max_count is None or i < max_count):
            task = asyncio.create_task(one(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
            await asyncio.sleep(max(0.0, t0 + i * interval - time.monotonic()))
        if tasks:
            await asyncio.gather(*tasks)
    return accepted, refused


class OtpStream:
    """:func:`send_otps` on a thread of its own, from :meth:`start` until :meth:`stop`."""

    def __init__(self, phase: ApiTarget, versions: dict[tuple[str, Channel], int], rate: float,
                 phones: PhoneFactory, key_prefix: str) -> None:
        self._stop = threading.Event()
        self._result: tuple[dict[str, float], int] = ({}, 0)

        def run() -> None:
            self._result = asyncio.run(send_otps(phase, versions, rate, self._stop, phones,
                                                 key_prefix))

        self._thread = threading.Thread(target=run, name="bench-otps")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> tuple[dict[str, float], int]:
        """Stop sending, wait for the answers in flight: (message_id → accepted_at,
        refused)."""
        self._stop.set()
        self._thread.join()
        return self._result


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()
