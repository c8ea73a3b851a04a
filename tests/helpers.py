"""Small test utilities over the real stack (Kafka, Cassandra, emulator)."""

from __future__ import annotations

import asyncio
import inspect
import random
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import httpx
import orjson
import pytest
from cassandra.cluster import Session
from confluent_kafka import Consumer, TopicPartition

from notiflow.adapters.breaker import StateChange
from notiflow.adapters.breaker.facade import CircuitBreakers
from notiflow.adapters.kafka_io import OutRecord, SyncProducer, producer_config
from notiflow.adapters.providers import provider_specs
from notiflow.adapters.ratelimit import CapacityLimiter
from notiflow.devenv import dev_environment
from notiflow.ingest_binding import HEADER, binder, claimed_target, tenant_signer
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings
from tests.fakes import ManualClock

T = TypeVar("T")
SUCCESS = frozenset({"PROVIDER_ACCEPTED", "SENT", "DELIVERED"})
"""Statuses that mean the provider took the message (receipts move it past acceptance)."""


def fresh_phone() -> str:
    """A valid US number no other test uses: a test that opts an address out must own it,
    because the stack, its tenants and their preferences are shared by the whole session."""
    return f"+1415{random.randint(2, 9)}{random.randint(0, 999_999):06d}"


def fresh_email() -> str:
    """An address no other test uses (see :func:`fresh_phone`)."""
    return f"user.{uuid.uuid4().hex[:12]}@example.com"


def fresh_ios_token() -> str:
    """An APNs device token no other test uses."""
    return secrets.token_hex(32)


def wait_for(fn: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.25,
             what: str = "condition") -> T:
    """Poll ``fn`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


async def wait_until(fn: Callable[[], Any], timeout: float = 10.0, interval: float = 0.005,
                     what: str = "condition") -> Any:
    """:func:`wait_for` inside an event loop: await ``fn`` (sync or async) until it returns
    something truthy, letting the loop run between checks."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


async def loop_turns(n: int = 1) -> None:
    """Let tasks already scheduled run to their next ``await``: ``n`` turns of the event
    loop, no real time."""
    for _ in range(n):
        await asyncio.sleep(0)


def first_changes(breakers: CircuitBreakers, n: int) -> asyncio.Task[list[StateChange]]:
    """A task that follows ``breakers.changes()`` from now and ends with its first ``n``
    state changes."""
    async def take() -> list[StateChange]:
        got: list[StateChange] = []
        async for change in breakers.changes():
            got.append(change)
            if len(got) == n:
                break
        return got

    return asyncio.ensure_future(take())


async def granted_over(limiter: CapacityLimiter, provider_id: str, tier: Tier,
                       clock: ManualClock[float], ms: int) -> int:
    """How many of ``ms`` calls of ``limiter.acquire``, one per millisecond of ``clock``
    (which it moves on), took a token."""
    granted = 0
    for _ in range(ms):
        if await limiter.acquire(provider_id, tier) is None:
            granted += 1
        clock.now += 0.001
    return granted


def hold(seconds: float) -> None:
    """Let ``seconds`` of real time pass on purpose: here the passing time is the scenario
    (an outage kept up, a quiet period that must stay quiet, load spread over time), not a
    wait for an event. Call sites name the duration (``hold(OUTAGE_S)``)."""
    time.sleep(max(0.0, seconds))


async def hold_async(seconds: float) -> None:
    """:func:`hold` inside an event loop (also a fake's injected latency)."""
    await asyncio.sleep(max(0.0, seconds))


def max_window(points: Iterable[tuple[int, int]], width: int) -> int:
    """The largest sum of ``k`` over the ``(at - width, at]`` windows ending at a point of
    ``(at, k)`` points (any order; every ``k`` >= 0)."""
    ordered = sorted(points)
    best, total, lo = 0, 0, 0
    for at, k in ordered:
        total += k
        while ordered[lo][0] <= at - width:
            total -= ordered[lo][1]
            lo += 1
        best = max(best, total)
    return best


def create_template(api: str, token: str, **template: Any) -> int:
    """The version ``POST /v1/templates`` answers for ``template`` (created, or identical to
    one there), as the tenant of ``token``."""
    r = httpx.post(f"{api}/v1/templates", headers={"Authorization": f"Bearer {token}"},
                   json=template)
    assert r.status_code in (200, 201), r.text
    return int(r.json()["version"])


def signed(settings: Settings, record: OutRecord) -> OutRecord:
    """``record`` as a direct producer writes it: a record for an ingest topic (or
    ``notify.delayed``) without an ``nf-binding`` header gets one, by the key of the tenant
    it names (the platform key when that tenant has none); any other record as it is."""
    targets = {settings.ingest_topic(c, t): (c.value, t.value) for c in Channel for t in Tier}
    if (record.topic not in targets and record.topic != settings.delayed_topic) or any(
            k == HEADER for k, _ in record.headers):
        return record
    try:
        doc = orjson.loads(record.value)
    except orjson.JSONDecodeError:
        doc = None
    doc = doc if isinstance(doc, dict) else {}
    channel, tier = targets.get(record.topic) or claimed_target(doc)
    if settings.mode == "shared":
        channel, tier = claimed_target(doc)
    tenant = doc.get("tenant_id")
    signer = tenant_signer(settings, tenant) if isinstance(tenant, str) else None
    headers = (signer.headers(record.headers, channel, tier, record.value) if signer
               else binder(settings).sign(record.headers, channel, tier, record.value))
    return OutRecord(record.topic, record.key, record.value, headers)


class Placer:
    """A reusable confirming producer that tells where each record landed; ingest records
    go :func:`signed`."""

    def __init__(self, settings: Settings) -> None:
        from confluent_kafka import Producer

        from notiflow.adapters.kafka_io import producer_config

        self.producer = Producer(producer_config(settings))
        self.settings = settings

    def send(self, records: list[OutRecord],
             settings: Settings | None = None) -> list[tuple[int, int]]:
        """Produce and confirm; (partition, offset) of each record in order. Ingest records
        are signed with ``settings``' keys (default: the producer's own settings)."""
        placed: list[tuple[int, int] | None] = [None] * len(records)

        def cb(i: int) -> Callable[[Any, Any], None]:
            def done(err: Any, msg: Any) -> None:
                assert err is None, err
                placed[i] = (msg.partition(), msg.offset())
            return done

        for i, r in enumerate(records):
            r = signed(settings or self.settings, r)
            self.producer.produce(r.topic, r.value, r.key, headers=r.headers,
                                  on_delivery=cb(i))
        assert self.producer.flush(30) == 0
        return [x for x in placed if x is not None]


_PLACERS: dict[str, Placer] = {}


def produce(settings: Settings, records: list[OutRecord]) -> list[tuple[int, int]]:
    """Produce and confirm; returns (partition, offset) of each record in order. One producer
    per configuration serves every call (a new one costs about half a second to connect)."""
    key = repr(sorted(producer_config(settings).items()))
    if key not in _PLACERS:
        _PLACERS[key] = Placer(settings)
    return _PLACERS[key].send(records, settings)


def produce_quick(settings: Settings, records: list[OutRecord]) -> None:
    SyncProducer(settings).send_all([signed(settings, r) for r in records])


def read_topic(settings: Settings, topic: str, timeout: float = 5.0) -> Iterator[Any]:
    """Every record currently in ``topic`` (all partitions, from the beginning)."""
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "tests",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        md = c.list_topics(topic, timeout=timeout)
        parts = list(md.topics[topic].partitions)
        ends = {}
        for p in parts:
            _, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            ends[p] = hi
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        remaining = {p for p in parts if ends[p] > 0}
        deadline = time.monotonic() + timeout
        while remaining and time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                remaining.discard(msg.partition())
                continue
            yield msg
            if msg.offset() + 1 >= ends[msg.partition()]:
                remaining.discard(msg.partition())
    finally:
        c.close()


def message_row(session: Session, message_id: str) -> dict[str, Any] | None:
    return session.execute("SELECT * FROM messages WHERE message_id = %s", (message_id,)).one()


def statuses(session: Session, ids: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for mid in ids:
        row = message_row(session, mid)
        out[mid] = row["status"] if row else None
    return out


SMS_PROVIDERS = tuple(name for name, spec in provider_specs(Settings).items()
                      if spec.channel is Channel.SMS)
"""The registered SMS plug-ins (their emulators are where the tests' SMS messages land)."""


def emulator_records(fakes: str, message_id: str | None = None,
                     providers: tuple[str, ...] = SMS_PROVIDERS) -> list[dict[str, Any]]:
    """Requests the emulators of ``providers`` received (each record tagged with its
    ``provider``), oldest first per provider."""
    params = {"message_id": message_id} if message_id else None
    out: list[dict[str, Any]] = []
    for provider in providers:
        r = httpx.get(f"{fakes}/_admin/{provider}/messages", params=params, timeout=60)
        r.raise_for_status()
        out.extend({**rec, "provider": provider} for rec in r.json())
    return out


def received_at(fakes: str, providers: tuple[str, ...] = SMS_PROVIDERS,
                ids: set[str] | None = None) -> dict[str, float]:
    """message_id → when a provider emulator first accepted it (epoch seconds); with
    ``ids``, only those are asked for (one small query each, cheap on a busy emulator)."""
    first: dict[str, float] = {}
    records = (emulator_records(fakes, providers=providers) if ids is None else
               [r for mid in ids for r in emulator_records(fakes, mid, providers)])
    for rec in records:
        mid = rec.get("message_id")
        if mid and rec.get("outcome") == "accepted":
            first[mid] = min(first.get(mid, rec["received_at"]), rec["received_at"])
    return first


def accepted_counts(fakes: str, providers: tuple[str, ...] = SMS_PROVIDERS) -> dict[str, int]:
    """message_id → number of provider-accepted requests the emulators saw (all SMS vendors:
    a duplicate across vendors after a failover counts too)."""
    counts: dict[str, int] = {}
    for rec in emulator_records(fakes, providers=providers):
        if rec.get("outcome") == "accepted" and rec.get("message_id"):
            counts[rec["message_id"]] = counts.get(rec["message_id"], 0) + 1
    return counts


def report(capsys: Any, text: str) -> None:
    """Print measured figures straight to the terminal (and so into CI's log), past pytest's
    output capture."""
    with capsys.disabled():
        print(f"\n[figures] {text}", flush=True)


def partial_ports(**given: Any) -> Any:
    """A :class:`~notiflow.adapters.ports.SendPorts` with only the ports a test gives (the
    others None), for tests that drive one stage of a dispatcher."""
    from notiflow.adapters.ports import SendPorts

    async def close() -> None:
        return None

    fields = dict.fromkeys(("leases", "caps", "messages", "preferences", "breakers", "quota",
                            "boards"))
    return SendPorts(**{**fields, "providers": {}, "close": close, **given})


async def no_ports() -> Any:
    """An ``open_ports`` for a dispatcher whose ports a test sets itself."""
    raise AssertionError("this test sets the dispatcher's ports")


@contextmanager
def dev_environ() -> Iterator[dict[str, str]]:
    """A fresh development environment (``dev_environment`` on ports 1 and 2, never dialled)
    in ``os.environ`` for the block, restored after it; yields its bearer tokens by tenant."""
    env, tokens = dev_environment(api_port=1, fakes_port=2)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        yield tokens


def memory_settings(**update: Any) -> Any:
    """The settings of a development environment (tenant acme, every emulated provider
    account enabled, time scale 0.1), read with no server up, with ``update`` applied."""
    from notiflow.settings import Settings

    with dev_environ():
        s = Settings(time_scale=0.1)
    return s.model_copy(update=update) if update else s
