"""Helpers of the Messaging API tests: request bodies, keys, reading a record back from Kafka,
and API processes of their own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from notiflow.adapters.kafka_io import header
from notiflow.devenv import free_port
from notiflow.ops.procs import ManagedProcess
from notiflow.settings import Settings

PHONE = "+14155550123"
TEMPLATE = "otp"
TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-01$")


def sms(tier: str = "P1", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"channel": "SMS", "tier": tier, "recipient": PHONE,
                            "template_id": TEMPLATE, "template_version": 1,
                            "variables": {"code": "123456"}}
    body.update(overrides)
    return body


def key() -> str:
    return f"test-{uuid.uuid4().hex}"


def find_record(settings: Settings, topic: str, message_id: str,
                timeout: float = 30.0) -> Message:
    """The first record of ``topic`` whose ``message_id`` header matches (from offset 0)."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap,
                         "group.id": f"test-api-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            if header(msg.headers(), "message_id") == message_id:
                return msg
        raise AssertionError(f"{message_id} not found on {topic} within {timeout}s")
    finally:
        consumer.close()


def start_api(name: str, log_dir: Path, **env: str) -> tuple[ManagedProcess, str]:
    port = free_port()
    proc = ManagedProcess(name, ["api"], log_dir,
                          env=os.environ | {"NOTIFLOW_API_PORT": str(port), **env})
    base = f"http://127.0.0.1:{port}"
    proc.start().wait_http(f"{base}/healthz")
    return proc, base


@contextlib.asynccontextmanager
async def kafka_less_api(name: str, log_dir: Path,
                         window: int) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an API process of its own whose Kafka bootstrap is a port nothing listens
    on, with an outage window of ``window`` messages (stopped on exit)."""
    proc, base = await asyncio.to_thread(
        start_api, name, log_dir, NOTIFLOW_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}",
        NOTIFLOW_KAFKA_WINDOW__MAX_MESSAGES=str(window))
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30.0) as bad:
            yield bad
    finally:
        await asyncio.to_thread(proc.stop)


def ms(d: datetime) -> datetime:
    """``d`` to the millisecond (Cassandra's timestamps)."""
    return d.replace(microsecond=d.microsecond // 1000 * 1000)
