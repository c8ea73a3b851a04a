"""What each way of setting up and starting the local stack installs and starts: `make demo`
(``ops/bootstrap.sh --demo``, a stack without the object store) against `make test` and
`make stack-up` (everything). Nothing is installed, built or started."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from notiflow.ops import toxiproxy
from notiflow.ops.stack import Stack, s3
from notiflow.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = ROOT / "ops" / "bootstrap.sh"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(stack_dir=tmp_path / "stack", cache_dir=tmp_path / "cache")


def jars_fetched(settings: Settings) -> None:
    """Mark the Kafka and Cassandra jars as fetched, so that no test runs Maven."""
    for name, version in (("kafka", settings.kafka_version),
                          ("cassandra", settings.cassandra_version)):
        libs = Stack(settings).p.libs(name, version)
        libs.mkdir(parents=True)
        (libs / ".complete").write_text(version)


def test_a_stack_without_the_object_store_has_no_s3(settings: Settings) -> None:
    assert [c.name for c in Stack(settings, object_store=False).components()] == [
        "redis", "kafka", "cassandra"]
    assert [c.name for c in Stack(settings, nodes=3, object_store=False).components()] == [
        "redis", "kafka-1", "kafka-2", "kafka-3", "cassandra-1", "cassandra-2", "cassandra-3"]
    assert [row[0] for row in Stack(settings, object_store=False).status()] == [
        "redis", "kafka", "cassandra"]


def test_the_default_stack_keeps_the_object_store(settings: Settings) -> None:
    assert Stack(settings).object_store
    assert [c.name for c in Stack(settings).components()][-1] == "s3"


def test_what_up_and_fetch_build(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """``up`` fetches what it starts (``weed`` only with the object store); ``stack fetch``
    (the full bootstrap) builds toxiproxy as well."""
    jars_fetched(settings)
    built: list[str] = []
    monkeypatch.setattr(s3, "build_weed", lambda s, p, log: built.append("weed"))
    monkeypatch.setattr(toxiproxy, "build",
                        lambda cache, log=print: built.append("toxiproxy"))

    Stack(settings, object_store=False).fetch_runtime()
    assert built == []
    Stack(settings).fetch_runtime()
    assert built == ["weed"]
    built.clear()
    Stack(settings).fetch()
    assert built == ["weed", "toxiproxy"]


def test_up_fetches_only_what_it_starts(settings: Settings,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    class Fetched(Exception):
        pass

    def fetch_runtime(self: Stack) -> None:
        raise Fetched

    def fetch(self: Stack) -> None:
        pytest.fail("up must not build toxiproxy, helm or kubeconform")

    monkeypatch.setattr(Stack, "fetch_runtime", fetch_runtime)
    monkeypatch.setattr(Stack, "fetch", fetch)
    with pytest.raises(Fetched):
        Stack(settings, object_store=False).up()


def test_the_demo_starts_a_stack_without_the_object_store(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing ``notiflow demo`` starts reads or writes the object store."""
    from rich.console import Console

    from notiflow.ops import demo

    made: list[dict[str, object]] = []

    class Made(Exception):
        pass

    def fake_stack(settings: Settings, **kwargs: object) -> Stack:
        made.append(kwargs)
        raise Made

    monkeypatch.setattr(demo, "dev_environment", lambda **_kw: ({}, {}))
    monkeypatch.setattr(demo, "Stack", fake_stack)
    monkeypatch.setenv("NOTIFLOW_STACK_DIR", str(tmp_path / "stack"))
    with pytest.raises(Made):
        demo.run_demo(messages=1, keep_running=False, console=Console(file=None))
    assert made and made[0]["object_store"] is False


def bootstrap(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(BOOTSTRAP), *args], capture_output=True, text=True,
                          timeout=30)


def test_the_full_profile_installs_everything() -> None:
    done = bootstrap("--plan")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["system-packages", "promtool", "browser", "venv-full",
                                   "stack-fetch", "kube-tools"]


def test_the_demo_profile_builds_nothing_with_go() -> None:
    done = bootstrap("--demo", "--plan")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["system-packages", "venv"]


def test_an_unknown_option_is_refused() -> None:
    done = bootstrap("--fast")
    assert done.returncode == 2
    assert "unknown option --fast" in done.stderr
    assert "usage: ops/bootstrap.sh" in done.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_demo_bootstraps_the_demo_profile_and_make_test_everything() -> None:
    def dry(target: str) -> list[str]:
        done = subprocess.run(["make", "-n", "-C", str(ROOT), target], capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return [line for line in done.stdout.splitlines() if "bootstrap.sh" in line]

    assert dry("demo") == ["ops/bootstrap.sh --demo"]
    assert dry("test") == ["ops/bootstrap.sh"]
    assert dry("stack-up") == ["ops/bootstrap.sh"]
