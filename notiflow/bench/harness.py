"""What every benchmark needs: an isolated namespace on the running local stack, the platform's
processes, the emulators' timestamps, and CPU/RSS samples of each process.

A :class:`Phase` is one measured configuration: its own topic prefix (fresh topics, so no
backlog of an earlier phase leaks in), Redis namespace (the prefix), recovery directories and
processes (emulators, API, flows); the Cassandra keyspace ``notiflow_bench`` is shared by all
runs (message ids are unique per run). Processes log to ``<out>/logs/<run>-<phase>/``.

The samples come from :mod:`notiflow.bench.sampler` (:class:`Sampler`), the load from
:mod:`notiflow.bench.traffic` (:class:`CampaignProducer`, :func:`send_otps`,
:class:`OtpStream`); this module re-exports both, so a benchmark imports from here alone.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx

from notiflow.adapters.kafka_io import kafka_config
from notiflow.adapters.providers import provider_specs
from notiflow.bench.sampler import ProcessFigures, ProcSample, Sampler
from notiflow.bench.traffic import (
    OTP_CONNECTIONS,
    ApiTarget,
    CampaignProducer,
    OtpStream,
    send_otps,
)
from notiflow.bench.workload import TEMPLATE_IDS, TEMPLATES
from notiflow.devenv import dev_environment, free_port
from notiflow.ops.procs import ManagedProcess, ProcessGroup
from notiflow.ops.stack import Stack
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings

__all__ = [
    "EMULATOR_REALTIME", "KEYSPACE", "OTP_CONNECTIONS", "PROVIDERS", "UNBOUND_RATES",
    "ApiTarget", "CampaignProducer", "OtpStream", "Phase", "ProcSample", "ProcessFigures",
    "Sampler", "drop_keys", "send_otps", "wait_until",
]

PROVIDERS = tuple(name for name, spec in provider_specs(Settings).items()
                  if spec.emulator is not None)
"""The registered providers ``notiflow fakes`` emulates (its ``/_admin/{provider}/...``)."""
KEYSPACE = "notiflow_bench"
EMULATOR_REALTIME = 1
"""The emulators' real-time priority in benchmarks. A provider runs on someone else's
machine; on this one the emulators share two cores with the flood they serve, and at the
normal priority P0's ``provider`` stage measured the machine's load (p99 466 ms once every
other P0 stage was under 150 ms), not the platform."""
UNBOUND_RATES = {p: 1_000_000.0 for p in PROVIDERS}
"""Provider rates for throughput runs: the limiter still runs (one Redis call per lease) but
never binds, so the figure is the platform's, not a contract's."""


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
        """Start ``name`` and return once it answers ``http`` or logged ``ready``."""
        return self.await_ready(self.launch(name, args), ready=ready, http=http,
                                timeout=timeout)

    def launch(self, name: str, args: list[str]) -> ManagedProcess:
        """Start ``name`` without waiting for it (:meth:`await_ready`)."""
        return self.group.add(ManagedProcess(name, args, self.log_dir, self.env)).start()

    def await_ready(self, proc: ManagedProcess, *, ready: str | None = None,
                    http: str | None = None, timeout: float = 120.0) -> ManagedProcess:
        if http:
            proc.wait_http(http, timeout=timeout)
        if ready:
            proc.wait_until(lambda: ready in _read(proc.log_path), timeout=timeout)
        assert proc.proc is not None
        self.sampler.watch(proc.name, proc.proc.pid)
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
        reconciler and a scheduler (long retry waits and scheduled messages), started
        together."""
        self.watch_stack()
        waits: list[tuple[ManagedProcess, str | None, str | None]] = [
            (self.launch("fakes", ["fakes", "--realtime", str(EMULATOR_REALTIME)]), None,
             f"{self.fakes}/_admin/health")]
        if api and self.lanes:
            waits += [(self.launch("api", ["api", "--lane", "priority"]), None,
                       f"{self.api}/healthz"),
                      (self.launch("api-bulk", ["api", "--lane", "bulk", "--port",
                                                str(self.bulk_port)]), None,
                       f"{self.bulk_api}/healthz")]
        elif api:
            waits.append((self.launch("api", ["api"]), None, f"{self.api}/healthz"))
        if reconcile:
            waits += [(self.launch("reconcile", ["flow", "reconcile", "--recovery-dir",
                                                 str(self.recovery / "reconcile")]),
                       "starting", None),
                      (self.launch("scheduler", ["flow", "scheduler"]), "starting scheduler",
                       None)]
        for proc, ready, http in waits:
            self.await_ready(proc, ready=ready, http=http)

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
