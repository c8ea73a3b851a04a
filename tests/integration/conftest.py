"""Fixtures for tests against the real stack: dataflow processes, CQL, templates, Redis."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from cassandra.cluster import Session

from notiflow.adapters.cassandra.session import connect
from notiflow.devenv import free_port
from notiflow.ops.procs import ManagedProcess, ProcessGroup
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from tests.helpers import SMS_PROVIDERS, create_template, wait_for

pytestmark = pytest.mark.integration

OTP_TEMPLATE = "Your code is {{ code }}"


@pytest.fixture(scope="session")
def cql(stack: Settings) -> Iterator[Session]:
    cluster, session = connect(stack)
    yield session
    cluster.shutdown()


@pytest.fixture(scope="session")
def recovery_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("recovery")


FlowStarter = Callable[..., ManagedProcess]


def ready(proc: ManagedProcess) -> bool:
    """A flow process is ready when it runs and its sender has opened its clients."""
    log = proc.log_path.read_text(errors="replace") if proc.log_path.exists() else ""
    return "starting" in log and ("dispatcher ready" in log or "reconcile" in proc.name)


@pytest.fixture(scope="session")
def start_flow(stack: Settings, fakes: str, processes: ProcessGroup, log_dir: Path,
               recovery_root: Path) -> FlowStarter:
    """Start a dataflow process: ``start_flow("send", tier=Tier.P1, name=..., recovery=...)``."""

    def start(kind: str, *, tier: Tier | None = None, name: str | None = None,
              recovery: Path | None = None) -> ManagedProcess:
        label = name or (f"send-{tier.value.lower()}" if tier else kind)
        args = ["flow", kind]
        if tier is not None:
            args += ["--tier", tier.value]
        args += ["--recovery-dir", str(recovery or recovery_root / label)]
        proc = processes.add(ManagedProcess(label, args, log_dir)).start()
        return proc.wait_until(lambda: ready(proc), timeout=60)

    return start


@pytest.fixture(scope="session")
def reconciler(start_flow: FlowStarter) -> ManagedProcess:
    return start_flow("reconcile")


@pytest.fixture(scope="session")
def send_p0(start_flow: FlowStarter, reconciler: ManagedProcess) -> ManagedProcess:
    return start_flow("send", tier=Tier.P0)


@pytest.fixture(scope="session")
def send_p1(start_flow: FlowStarter, reconciler: ManagedProcess) -> ManagedProcess:
    return start_flow("send", tier=Tier.P1)


@pytest.fixture(scope="session")
def send_p3(start_flow: FlowStarter, reconciler: ManagedProcess) -> ManagedProcess:
    return start_flow("send", tier=Tier.P3)


@dataclass
class Isolated:
    """A namespace of its own (topic prefix, Redis keys) on the shared stack, for tests that
    change rates or stop infrastructure; its processes get ``env``."""

    settings: Settings
    env: dict[str, str]
    log_dir: Path
    recovery: Path
    processes: ProcessGroup

    def start(self, name: str, args: list[str], **extra: str) -> ManagedProcess:
        proc = ManagedProcess(name, args, self.log_dir, env={**self.env, **extra})
        return self.processes.add(proc).start()

    def flow(self, tier: Tier, **extra: str) -> ManagedProcess:
        name = f"send-{tier.value.lower()}"
        proc = self.start(name, ["flow", "send", "--tier", tier.value, "--recovery-dir",
                                 str(self.recovery / name)], **extra)
        return proc.wait_until(lambda: ready(proc), timeout=60)

    def api(self) -> str:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        self.start("api", ["api"], NOTIFLOW_API_PORT=str(port)).wait_http(f"{base}/healthz")
        return base


@pytest.fixture
def isolated(stack: Settings, fakes: str, log_dir: Path,
             tmp_path: Path) -> Iterator[Callable[..., Isolated]]:
    """``isolated(name, NOTIFLOW_X=...)`` → an :class:`Isolated` namespace; its processes
    are stopped at the end of the test."""
    import os

    from notiflow.ops.topics import ensure_topics

    groups: list[ProcessGroup] = []

    def make(name: str, **overrides: str) -> Isolated:
        env = {**os.environ, "NOTIFLOW_TOPIC_PREFIX": f"{stack.topic_prefix}{name}.",
               **overrides}
        settings = stack.model_copy(update={"topic_prefix": env["NOTIFLOW_TOPIC_PREFIX"]})
        ensure_topics(settings)
        group = ProcessGroup()
        groups.append(group)
        return Isolated(settings, env, log_dir / name, tmp_path / name, group)

    yield make
    for g in groups:
        g.stop_all()


@pytest.fixture(scope="session")
def otp_template(api: str, tokens: dict[str, str]) -> dict[str, int]:
    """tenant id → version of template ``otp`` (SMS, one variable ``code``)."""
    return {tenant: create_template(api, token, template_id="otp", channel="SMS",
                                    body=OTP_TEMPLATE)
            for tenant, token in tokens.items()}


class RedisServer:
    """A private, memory-only ``redis-server`` on a free loopback port; stopping and starting it
    again simulates a Redis outage."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no"]
        if self.workdir is not None:
            cmd += ["--dir", str(self.workdir)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_for(answers, timeout=10, interval=0.02, what="redis-server answering")
        client.close()

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (``kill``: SIGKILL instead of SIGTERM)."""
        if self.proc is not None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """The shared local Redis when it answers (``NOTIFLOW_REDIS_URL`` or the default), else a
    private ``redis-server`` for this module."""
    url = Settings().redis_url
    try:
        redis.Redis.from_url(url, socket_connect_timeout=0.3).ping()
    except redis.ConnectionError:
        server = RedisServer()
        server.start()
        yield server.url
        server.stop()
    else:
        yield url


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """An asyncio client of :func:`redis_url` (decoded responses)."""
    c = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    await c.aclose()


@pytest.fixture
def slow_provider(fakes: str, request: pytest.FixtureRequest) -> Iterator[None]:
    """The SMS emulators answer after 250 ms (or the test's indirect parameter, in ms) for
    this test (a stream still in flight when a flow is killed)."""
    latency = getattr(request, "param", 250)
    for provider in SMS_PROVIDERS:
        httpx.post(f"{fakes}/_admin/{provider}/config",
                   json={"latency_ms": latency}).raise_for_status()
    yield
    for provider in SMS_PROVIDERS:
        httpx.post(f"{fakes}/_admin/{provider}/config",
                   json={"latency_ms": 0}).raise_for_status()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A running private ``redis-server`` of this test (the test may stop and restart it)."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
