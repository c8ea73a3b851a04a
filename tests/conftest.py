"""Shared fixtures.

Unit tests need nothing. Flow and integration tests share one real stack (Kafka, Cassandra,
Redis; started once per session by ``notiflow stack up`` or by the ``stack`` fixture) and get
their own topic prefix and keyspace per session, so runs never see each other's data.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from notiflow.devenv import dev_environment, free_port
from notiflow.ops.procs import ManagedProcess, ProcessGroup
from notiflow.settings import Settings
from tests.file_order import Tally, load_costs, order

ROOT = Path(__file__).resolve().parent.parent
RUN_ID = uuid.uuid4().hex[:8]

hypothesis_settings.register_profile("notiflow", deadline=None)
hypothesis_settings.load_profile("notiflow")
"""No per-example deadline: properties are checked here, speed by the benchmarks (``bench/``);
on a loaded two-core machine a deadline only adds flakes."""


@pytest.fixture(scope="session")
def test_env() -> dict[str, str]:
    """NOTIFLOW_* variables of this test session (also exported to ``os.environ``)."""
    env, tokens = dev_environment(
        api_port=free_port(),
        fakes_port=free_port(),
        time_scale=0.1,
        extra={
            "NOTIFLOW_TOPIC_PREFIX": f"t{RUN_ID}.",
            "NOTIFLOW_CASSANDRA_KEYSPACE": f"nf_test_{RUN_ID}",
            "NOTIFLOW_STACK_DIR": os.environ.get("NOTIFLOW_STACK_DIR", str(ROOT / ".stack")),
            "NOTIFLOW_FLOW_EPOCH_SECONDS": "1",
            "NOTIFLOW_INBOX__PORT": str(free_port()),
            "NOTIFLOW_DEFAULT_QUIET_HOURS": '{"start": "00:00", "end": "00:00"}',
        },
    )
    os.environ.update(env)
    env.update({f"TOKEN_{tid.upper()}": tok for tid, tok in tokens.items()})
    return env


@pytest.fixture(scope="session")
def tokens(test_env: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix("TOKEN_").lower(): v for k, v in test_env.items()
            if k.startswith("TOKEN_")}


@pytest.fixture(scope="session")
def settings(test_env: dict[str, str]) -> Settings:
    return Settings()


@pytest.fixture(scope="session")
def log_dir(settings: Settings) -> Path:
    d = settings.stack_dir.resolve() / "logs" / f"test-{RUN_ID}"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def stack(settings: Settings) -> Iterator[Settings]:
    """The real local stack, with this session's topics and keyspace (dropped at the end,
    unless NOTIFLOW_KEEP_TEST_DATA is set, so repeated runs do not pile up schema)."""
    from notiflow.ops.stack import Stack

    Stack(settings, log=lambda _m: None).up()
    yield settings
    if not os.environ.get("NOTIFLOW_KEEP_TEST_DATA"):
        _drop_session_data(settings)


def _drop_session_data(settings: Settings) -> None:
    from notiflow.adapters.cassandra.session import connect
    from notiflow.ops.topics import delete_topics

    delete_topics(settings)
    cluster, session = connect(settings, keyspace=None)
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.cassandra_keyspace}", timeout=120)
    finally:
        cluster.shutdown()


@pytest.fixture(scope="session")
def processes() -> Iterator[ProcessGroup]:
    group = ProcessGroup()
    yield group
    group.stop_all()


@pytest.fixture(scope="session")
def fakes(stack: Settings, processes: ProcessGroup, log_dir: Path) -> str:
    """``notiflow fakes`` on loopback; returns its base URL."""
    base = f"http://127.0.0.1:{stack.fakes_port}"
    processes.add(ManagedProcess("fakes", ["fakes"], log_dir)).start().wait_http(
        f"{base}/_admin/health")
    return base


@pytest.fixture(scope="session")
def inbox(stack: Settings, processes: ProcessGroup, log_dir: Path) -> str:
    """``notiflow inbox``; returns its base URL."""
    base = f"http://127.0.0.1:{stack.inbox.port}"
    processes.add(ManagedProcess("inbox", ["inbox"], log_dir)).start().wait_http(
        f"{base}/healthz")
    return base


@pytest.fixture(scope="session")
def api(stack: Settings, fakes: str, processes: ProcessGroup, log_dir: Path) -> str:
    """``notiflow api``; returns its base URL."""
    base = f"http://127.0.0.1:{stack.api_port}"
    processes.add(ManagedProcess("api", ["api"], log_dir)).start().wait_http(f"{base}/healthz")
    return base


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Costliest files first, disruptive tests last (``tests/file_order.py``)."""
    order(items, load_costs())


TALLY = Tally()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    TALLY.add(report)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The session's seconds per test file, for refreshing ``tests/file_costs.json``
    (written by a plain session or xdist's controller, not by its workers)."""
    if TALLY.seconds and not hasattr(session.config, "workerinput"):
        stack_dir = Path(os.environ.get("NOTIFLOW_STACK_DIR", str(ROOT / ".stack")))
        TALLY.write(stack_dir / "logs" / f"test-costs-{RUN_ID}.json")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Shut down the Cassandra clusters still open (flows and stores built inside tests keep
    theirs for the process's life) while their threads can still run: left to the driver's
    own exit hook, which runs after ``concurrent.futures`` refuses new work, their scheduler
    threads printed about 29 "cannot schedule new futures after shutdown" tracebacks at the
    end of every full run."""
    import sys

    cluster = sys.modules.get("cassandra.cluster")
    if cluster is not None:
        cluster._shutdown_clusters()
