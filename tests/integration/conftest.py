"""Fixtures for tests against the real stack: dataflow processes, CQL, templates."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cassandra.cluster import Session

from notiflow.adapters.cassandra_store import connect
from notiflow.ops.procs import ManagedProcess, ProcessGroup
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings

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
        from notiflow.devenv import free_port

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
    versions = {}
    for tenant, token in tokens.items():
        r = httpx.post(f"{api}/v1/templates", headers={"Authorization": f"Bearer {token}"},
                       json={"template_id": "otp", "channel": "SMS", "body": OTP_TEMPLATE})
        assert r.status_code in (200, 201), r.text
        versions[tenant] = r.json()["version"]
    return versions
