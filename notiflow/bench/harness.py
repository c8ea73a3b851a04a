"""What every benchmark needs: an isolated namespace on the running local stack, the platform's
processes, the emulators' timestamps, and CPU/RSS samples of each process.

A :class:`Phase` is one measured configuration: its own topic prefix (fresh topics, so no
backlog of an earlier phase leaks in), Redis namespace (the prefix), recovery directories and
processes (emulators, API, flows); the Cassandra keyspace ``notiflow_bench`` is shared by all
runs (message ids are unique per run). Processes log to ``<out>/logs/<run>-<phase>/``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import aiohttp
import httpx
import orjson
import psutil
from confluent_kafka import Producer

from notiflow.adapters.kafka_io import kafka_config, producer_config
from notiflow.bench import host
from notiflow.bench.jvm import compiler_cpu_s
from notiflow.bench.proc_cpu import tree_cpu_s
from notiflow.bench.workload import (
    TEMPLATE_IDS,
    TEMPLATES,
    TENANT_BY_TIER,
    Generated,
    PhoneFactory,
)
from notiflow.devenv import dev_environment, free_port
from notiflow.ingest_binding import Signer, tenant_signer
from notiflow.ops.procs import ManagedProcess, ProcessGroup
from notiflow.ops.stack import Stack
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings

PROVIDERS = ("twilio", "vonage", "sendgrid", "ses", "smtp", "fcm", "apns")
KEYSPACE = "notiflow_bench"
EMULATOR_REALTIME = 1
"""The emulators' real-time priority in benchmarks. A provider runs on someone else's
machine; on this one the emulators share two cores with the flood they serve, and at the
normal priority P0's ``provider`` stage measured the machine's load (p99 466 ms once every
other P0 stage was under 150 ms), not the platform."""
UNBOUND_RATES = {p: 1_000_000.0 for p in PROVIDERS}
"""Provider rates for throughput runs: the limiter still runs (one Redis call per lease) but
never binds, so the figure is the platform's, not a contract's."""


class ProcessFigures(TypedDict):
    """One process's row of :meth:`Sampler.table` (CPU seconds, RSS MiB)."""

    cpu_s: float
    rss_start_mb: float
    rss_mid_mb: float
    rss_end_mb: float
    rss_max_mb: float
    rss_tenths_mb: list[float]


@dataclass
class ProcSample:
    at: float
    cpu_s: float
    rss_mb: float
    jit_s: float
    """CPU seconds of a JVM's JIT compiler threads (part of ``cpu_s``; 0 for other
    processes)."""


@dataclass
class Sampler:
    """Samples CPU time and RSS of named processes, and the machine's pressure counters
    (:mod:`notiflow.bench.host`), every ``interval`` seconds (a thread); every
    ``io_interval`` seconds in which the machine's I/O pressure grew, the watched processes'
    threads waiting in uninterruptible sleep (a second thread)."""

    interval: float = 1.0
    io_interval: float = 0.1
    samples: dict[str, list[ProcSample]] = field(default_factory=dict)
    host_samples: list[host.HostSample] = field(default_factory=list)
    blocked: list[host.Blocked] = field(default_factory=list)
    _procs: dict[str, psutil.Process] = field(default_factory=dict)
    _jvms: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _io_thread: threading.Thread | None = None

    def watch(self, name: str, pid: int, *, jvm: bool = False) -> None:
        """Sample process ``pid`` as ``name``; ``jvm``: its JIT compiler's CPU too."""
        self._procs[name] = psutil.Process(pid)
        self.samples.setdefault(name, [])
        if jvm:
            self._jvms.add(name)

    def start(self) -> Sampler:
        """Take a first sample now (a phase shorter than ``interval`` still has two), then
        sample every ``interval`` seconds until :meth:`stop`."""
        self.sample()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()
        self._io_thread = threading.Thread(target=self._watch_io, name="bench-io-sampler",
                                           daemon=True)
        self._io_thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in (self._thread, self._io_thread):
            if thread is not None:
                thread.join(timeout=5)
        self.sample()

    def sample(self) -> None:
        """CPU of each watched process with its unwatched descendants (``tree_cpu_s``: an
        API of several worker processes); memory of the process alone."""
        now = time.time()
        procs = list(self._procs.items())
        skip = {proc.pid for _name, proc in procs}
        for name, proc in procs:
            try:
                with proc.oneshot():
                    cpu = tree_cpu_s(proc, skip)
                    rss = proc.memory_info().rss
            except psutil.Error:
                continue
            jit = compiler_cpu_s(proc.pid) if name in self._jvms else None
            self.samples[name].append(ProcSample(now, cpu, rss / 2**20,
                                                 jit or 0.0))
        machine = host.read(time.time())
        if machine is not None:
            self.host_samples.append(machine)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def _watch_io(self) -> None:
        watch = host.IoWatch()
        while not self._stop.wait(self.io_interval):
            if watch.pressed():
                pids = {name: p.pid for name, p in list(self._procs.items())}
                self.blocked.extend(host.blocked_threads(pids, time.time()))

    def _nearest(self, name: str, t0: float, t1: float) -> tuple[ProcSample, ProcSample] | None:
        """``name``'s samples nearest to two instants (None when it has none)."""
        return _nearest(self.samples.get(name, []), t0, t1)

    def cpu_between(self, name: str, t0: float, t1: float) -> float:
        """CPU seconds ``name`` used between two instants (nearest samples)."""
        ends = self._nearest(name, t0, t1)
        return max(0.0, ends[1].cpu_s - ends[0].cpu_s) if ends else 0.0

    def jit_between(self, name: str, t0: float, t1: float) -> float:
        """CPU seconds ``name``'s JIT compiler used between two instants (nearest samples;
        0 for a process not watched as a JVM)."""
        ends = self._nearest(name, t0, t1)
        return max(0.0, ends[1].jit_s - ends[0].jit_s) if ends else 0.0

    def machine_between(self, t0: float, t1: float) -> tuple[float, float] | None:
        """(busy, idle) CPU seconds of the whole machine between two instants: the nearest
        host samples, or for a window shorter than the sampling interval the samples around
        it; None without two samples that count CPU, or for an empty window."""
        s = [x for x in self.host_samples if x.cpu_busy_s or x.cpu_idle_s]
        ends = _nearest(s, t0, t1) if len(s) >= 2 and t1 > t0 else None
        if ends is None:
            return None
        a, b = ends
        if b.at <= a.at:
            a = max((x for x in s if x.at <= t0), key=lambda x: x.at, default=s[0])
            b = min((x for x in s if x.at >= t1), key=lambda x: x.at, default=s[-1])
        if b.at <= a.at:
            return None
        return b.cpu_busy_s - a.cpu_busy_s, b.cpu_idle_s - a.cpu_idle_s

    def jvms(self) -> list[str]:
        """The names watched as JVMs."""
        return sorted(self._jvms)

    def rss_at(self, name: str, t: float) -> float:
        """RSS in MiB of the sample nearest to ``t``."""
        s = self.samples.get(name, [])
        return min(s, key=lambda x: abs(x.at - t)).rss_mb if s else 0.0

    def table(self, t0: float, t1: float) -> dict[str, ProcessFigures]:
        """Per process: CPU seconds between ``t0`` and ``t1``, RSS (MiB) at both instants, at
        the middle and at every tenth of the interval, and the highest RSS sampled."""
        out: dict[str, ProcessFigures] = {}
        for name in self.samples:
            out[name] = {"cpu_s": round(self.cpu_between(name, t0, t1), 2),
                         "rss_start_mb": round(self.rss_at(name, t0), 1),
                         "rss_mid_mb": round(self.rss_at(name, (t0 + t1) / 2), 1),
                         "rss_end_mb": round(self.rss_at(name, t1), 1),
                         "rss_max_mb": round(self.rss(name)[2], 1),
                         "rss_tenths_mb": [round(self.rss_at(name, t0 + (t1 - t0) * i / 10), 1)
                                           for i in range(11)]}
        return out

    def cpu_timeline(self, t0: float, t1: float) -> dict[str, list[tuple[float, float]]]:
        """Per process: (seconds after ``t0``, share of one core used since the previous
        sample) of every sample between ``t0`` and ``t1``: what ran when a stage stalled."""
        out: dict[str, list[tuple[float, float]]] = {}
        for name, s in self.samples.items():
            pts = [(round(b.at - t0, 1), round((b.cpu_s - a.cpu_s) / (b.at - a.at), 2))
                   for a, b in itertools.pairwise(s) if t0 <= b.at <= t1 and b.at > a.at]
            out[name] = pts
        return out

    def rss(self, name: str) -> tuple[float, float, float]:
        """(first, last, max) RSS in MiB."""
        s = self.samples.get(name, [])
        if not s:
            return (0.0, 0.0, 0.0)
        return (s[0].rss_mb, s[-1].rss_mb, max(x.rss_mb for x in s))


S = TypeVar("S", ProcSample, host.HostSample)


def _nearest(samples: Sequence[S], t0: float, t1: float) -> tuple[S, S] | None:
    """The samples nearest to two instants (None when there are none)."""
    if not samples:
        return None
    return (min(samples, key=lambda x: abs(x.at - t0)),
            min(samples, key=lambda x: abs(x.at - t1)))


def drop_keys(settings: Settings, batch: int = 1000) -> int:
    """Delete every Redis key of ``settings``' namespace (its topic prefix); returns how many.
    A phase leaves a lease and a content fingerprint per message, kept for hours by their
    TTLs: left behind, a day of benchmark runs grew the stack's append-only file to 490 MB,
    whose rewrites (a fork writing every key) and key expiries then fell into later
    phases."""
    if not settings.topic_prefix:
        raise ValueError("no namespace: would delete every key")
    return asyncio.run(_drop_keys(settings, batch))


async def _drop_keys(settings: Settings, batch: int) -> int:
    from notiflow.adapters.redis_pool import redis_client

    client = redis_client(settings, timeout=30)
    dropped = 0
    try:
        keys: list[str] = []
        async for key in client.scan_iter(match=f"{settings.topic_prefix}*", count=batch):
            keys.append(key)
            if len(keys) >= batch:
                dropped += int(await client.unlink(*keys))
                keys = []
        if keys:
            dropped += int(await client.unlink(*keys))
    finally:
        await client.aclose()
    return dropped


class Phase:
    """One isolated configuration of the platform on the running stack."""

    def __init__(self, name: str, out: Path, run_id: str, *, mode: str = "tiered",
                 extra_env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.log_dir = out / "logs" / f"{run_id}-{name}"
        self.recovery = out / "recovery" / f"{run_id}-{name}"
        self.api_port, self.fakes_port = free_port(), free_port()
        self.lanes = mode != "shared"
        self.bulk_port = free_port() if self.lanes else self.api_port
        env, self.tokens = dev_environment(
            api_port=self.api_port, fakes_port=self.fakes_port, webhook_port=self.bulk_port,
            extra={"NOTIFLOW_TOPIC_PREFIX": f"bench-{run_id}-{name}-",
                   "NOTIFLOW_CASSANDRA_KEYSPACE": KEYSPACE, "NOTIFLOW_MODE": mode,
                   "NOTIFLOW_LOG_FORMAT": "text", **(extra_env or {})})
        self.env = {**os.environ, **env}
        self.settings = _settings(env)
        self.group = ProcessGroup()
        self.sampler = Sampler()
        self.sampler.watch("bench", os.getpid())
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.bulk_api = f"http://127.0.0.1:{self.bulk_port}"
        self.fakes = f"http://127.0.0.1:{self.fakes_port}"

    @functools.cached_property
    def admin(self) -> httpx.Client:
        """The one client of the emulators' admin calls, made on first use: ``httpx.get``
        builds a client and an SSL context per call (30 ms of CPU each here), and the progress
        poll's six calls a second took 0.39 ms of the bench's CPU per message from the
        pipeline it measured."""
        return httpx.Client(timeout=30)

    def prepare(self, timeout: float = 60.0) -> None:
        """Topics of this prefix and the bench keyspace's migrations (the stack is up); returns
        once the broker's metadata lists every topic (a broker started moments ago answered
        "created" before its metadata showed them, and the flows refused to start)."""
        from confluent_kafka.admin import AdminClient

        from notiflow.ops.topics import topic_specs

        Stack(self.settings, log=lambda _m: None).init()
        wanted = {t.name for t in topic_specs(self.settings)}
        admin = AdminClient(kafka_config(self.settings))
        deadline = time.monotonic() + timeout
        while not wanted <= set(admin.list_topics(timeout=10).topics):
            if time.monotonic() > deadline:
                raise RuntimeError(f"topics of phase {self.name} never appeared")
            time.sleep(0.5)

    def start(self, name: str, args: list[str], *, ready: str | None = None,
              http: str | None = None, timeout: float = 120.0) -> ManagedProcess:
        proc = self.group.add(ManagedProcess(name, args, self.log_dir, self.env)).start()
        if http:
            proc.wait_http(http, timeout=timeout)
        if ready:
            proc.wait_until(lambda: ready in _read(proc.log_path), timeout=timeout)
        assert proc.proc is not None
        self.sampler.watch(name, proc.proc.pid)
        return proc

    def watch_stack(self) -> None:
        """Sample the stack's own processes too (Kafka, Cassandra, Redis): on one machine
        their CPU is part of every message's cost."""
        stack = Stack(self.settings, log=lambda _m: None)
        jvms = {c.name for c in stack.components() if c.jvm}
        for name, pid, _port, healthy in stack.status():
            if pid and healthy:
                self.sampler.watch(name, pid, jvm=name in jvms)

    def start_platform(self, *, api: bool = True, reconcile: bool = True) -> None:
        """Emulators, the API (tier-isolated: a priority-lane process for P0/P1 and a bulk-lane
        one for P2/P3 and the providers' webhooks; shared mode: one for everything), the
        reconciler and a scheduler (long retry waits and scheduled messages)."""
        self.watch_stack()
        self.start("fakes", ["fakes", "--realtime", str(EMULATOR_REALTIME)],
                   http=f"{self.fakes}/_admin/health")
        if api and self.lanes:
            self.start("api", ["api", "--lane", "priority"], http=f"{self.api}/healthz")
            self.start("api-bulk", ["api", "--lane", "bulk", "--port", str(self.bulk_port)],
                       http=f"{self.bulk_api}/healthz")
        elif api:
            self.start("api", ["api"], http=f"{self.api}/healthz")
        if reconcile:
            self.start("reconcile", ["flow", "reconcile", "--recovery-dir",
                                     str(self.recovery / "reconcile")], ready="starting")
            self.start("scheduler", ["flow", "scheduler"], ready="starting scheduler")

    def start_send(self, tier: Tier | None, *, processes: int = 1) -> list[ManagedProcess]:
        """The send flow of ``tier`` (None: the shared baseline) as a Bytewax cluster of
        ``processes`` processes."""
        base = "send-shared" if tier is None else f"send-{tier.value.lower()}"
        args = ["flow", "send", *(["--mode", "shared"] if tier is None
                                  else ["--tier", tier.value])]
        args += ["--recovery-dir", str(self.recovery / base)]
        if processes > 1:
            addrs = ";".join(f"127.0.0.1:{free_port()}" for _ in range(processes))
            args += ["-a", addrs]
        procs = []
        for i in range(processes):
            extra = ["-i", str(i)] if processes > 1 else []
            name = base if processes == 1 else f"{base}-{i}"
            procs.append(self.group.add(ManagedProcess(name, [*args, *extra], self.log_dir,
                                                       self.env)).start())
        for p in procs:
            p.wait_until(_logged(p.log_path, "dispatcher ready"), timeout=180)
            assert p.proc is not None
            self.sampler.watch(p.name, p.proc.pid)
        return procs

    def check_alive(self) -> None:
        dead = [p for p in self.group.procs if not p.alive]
        if dead:
            raise RuntimeError("; ".join(f"{p.name} exited:\n{p.tail(20)}" for p in dead))

    def stop(self) -> None:
        """Stop the phase's processes and delete its topics (a local broker holding every
        phase's topics of earlier runs ran out of heap when it started) and its Redis keys
        (:func:`drop_keys`)."""
        from notiflow.ops.topics import delete_topics

        self.sampler.stop()
        self.group.stop_all()
        if "admin" in self.__dict__:
            self.admin.close()
        try:
            delete_topics(self.settings)
        except Exception as exc:
            print(f"{self.name}: topics not deleted ({exc!r})", file=sys.stderr)
        try:
            drop_keys(self.settings)
        except Exception as exc:
            print(f"{self.name}: Redis keys not deleted ({exc!r})", file=sys.stderr)

    def templates(self, tenants: Iterable[str]) -> dict[tuple[str, Channel], int]:
        """Create the bench templates of every channel for ``tenants``."""
        versions: dict[tuple[str, Channel], int] = {}
        with httpx.Client(base_url=self.api, timeout=30) as client:
            for tenant in tenants:
                for channel, parts in TEMPLATES.items():
                    r = client.post("/v1/templates", headers=self.auth(tenant), json={
                        "template_id": TEMPLATE_IDS[channel], "channel": channel.value,
                        **parts})
                    r.raise_for_status()
                    versions[(tenant, channel)] = int(r.json()["version"])
        return versions

    def auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[tenant]}"}

    def accepted_count(self, prefix: str | None = None) -> int:
        """Requests the emulators accepted so far (every provider); with ``prefix``, distinct
        message ids with that prefix that were accepted."""
        total = 0
        for p in PROVIDERS:
            r = self.admin.get(f"{self.fakes}/_admin/{p}/stats",
                               params={"prefix": prefix} if prefix else None, timeout=30)
            if r.status_code == 200:
                doc = r.json()
                total += int(doc.get("accepted_with_prefix", 0) if prefix
                             else doc.get("accepted", 0))
        return total

    def first_accepts(self) -> dict[str, float]:
        """message_id → the emulator's receipt time of its first accepted request."""
        return {mid: min(times) for mid, times in self.accepted_sends().items()}

    def accepted_sends(self) -> dict[str, list[float]]:
        """message_id → the emulators' receipt times of every accepted request for it (more
        than one: a duplicate send)."""
        sends: dict[str, list[float]] = {}
        for p in PROVIDERS:
            r = self.admin.get(f"{self.fakes}/_admin/{p}/messages",
                               params={"fields": "received_at,message_id,outcome"}, timeout=120)
            if r.status_code != 200:
                continue
            for rec in r.json():
                mid = rec.get("message_id")
                if mid and rec.get("outcome") == "accepted":
                    sends.setdefault(mid, []).append(float(rec["received_at"]))
        return sends


def _logged(path: Path, text: str) -> Callable[[], bool]:
    """Whether ``text`` is in the log at ``path`` yet."""
    return lambda: text in _read(path)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _settings(env: Mapping[str, str]) -> Settings:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return Settings()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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


async def send_otps(phase: Phase, versions: dict[tuple[str, Channel], int], rate: float,
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

    def __init__(self, phase: Phase, versions: dict[tuple[str, Channel], int], rate: float,
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


def wait_until(check: Any, timeout: float, interval: float = 1.0, phase: Phase | None = None
               ) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if phase is not None:
            phase.check_alive()
        if check():
            return True
        time.sleep(interval)
    return False
