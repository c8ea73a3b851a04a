"""docker-compose.yml runs the whole platform, checked without Docker: every notiflow service
runs a real command of the image, starts after the init job, which starts after healthy
infrastructure; the settings file loads; Cassandra gets the local stack's tuning."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from dotenv import dotenv_values
from typer.testing import CliRunner

from notiflow.cli import app
from notiflow.ops.stack.cassandra import cassandra_tuning, cassandra_tuning_flags
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
INFRA = ("kafka", "cassandra", "redis", "s3")
ENV_FILE = "deploy/compose/notiflow.env"


@pytest.fixture(scope="module")
def services() -> dict[str, dict]:
    doc: dict[str, dict[str, dict]] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return doc["services"]


def notiflow_services(services: dict[str, dict]) -> dict[str, dict]:
    return {n: s for n, s in services.items() if s.get("image", "").startswith("notiflow:")}


def test_every_process_kind_of_the_platform_runs(services: dict[str, dict]) -> None:
    commands = {tuple(s["command"]) for s in notiflow_services(services).values()}
    expected = {("stack", "init"), ("api",), ("fakes",), ("flow", "reconcile"),
                ("flow", "webhooks"), *(("flow", "send", "--tier", t.value) for t in Tier)}
    assert expected <= commands
    assert {c[:2] for c in commands} >= {("flow", "scheduler"), ("flow", "expander")}


def test_each_command_is_one_the_image_understands(services: dict[str, dict]) -> None:
    runner = CliRunner()
    for name, service in notiflow_services(services).items():
        result = runner.invoke(app, [*service["command"], "--help"], prog_name="notiflow")
        assert result.exit_code == 0, (name, result.output)


def test_services_start_in_order_and_only_on_healthy_dependencies(
        services: dict[str, dict]) -> None:
    for name in INFRA:
        assert "healthcheck" in services[name], f"{name} has no healthcheck"
    init = services["init"]
    assert init["restart"] == "no"
    assert {d: c["condition"] for d, c in init["depends_on"].items()} == {
        "kafka": "service_healthy", "cassandra": "service_healthy", "redis": "service_healthy",
        "s3-bucket": "service_completed_successfully"}
    for name, service in notiflow_services(services).items():
        if name in ("init", "fakes"):
            continue
        assert service["depends_on"]["init"] == {"condition": "service_completed_successfully"}
    for name in ("api", "fakes"):
        assert "healthcheck" in services[name], f"{name} has no healthcheck"
    for name, service in services.items():
        deps = service.get("depends_on") or {}
        for dep, how in (deps.items() if isinstance(deps, dict) else ()):
            assert dep in services, (name, dep)
            if how["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits on {dep}'s missing check"


def test_images_are_pinned_and_ports_loopback_only(services: dict[str, dict]) -> None:
    for name, service in services.items():
        image = service["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", (name, image)
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_flows_keep_their_recovery_state_on_volumes(services: dict[str, dict]) -> None:
    for name in (*(f"send-{t.value.lower()}" for t in Tier), "reconcile", "webhooks"):
        assert any(v.endswith(":/var/lib/notiflow") for v in services[name]["volumes"]), name
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "NOTIFLOW_STACK_DIR=/var/lib/notiflow" in dockerfile
    assert re.search(r'ENTRYPOINT \["notiflow"\]', dockerfile)
    assert "-c constraints.txt" in dockerfile


def test_the_settings_file_loads_and_names_the_compose_services(
        services: dict[str, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in dotenv_values(ROOT / ENV_FILE).items() if v is not None}
    env |= {k: v for k, v in dotenv_values(
        ROOT / "deploy/compose/secrets.env.example").items() if v}
    for key in list(os.environ):
        if key.startswith("NOTIFLOW_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    host, _, port = settings.kafka_bootstrap.partition(":")
    kafka = services["kafka"]["environment"]
    assert f"INTERNAL://{host}:{port}" in kafka["KAFKA_ADVERTISED_LISTENERS"]
    assert settings.cassandra_hosts == ("cassandra",) and settings.cassandra_port == 9042
    assert settings.redis_url.startswith("redis://redis:6379/")
    assert settings.object_store.endpoint == "http://s3:8333"
    assert settings.api_host == "0.0.0.0" and settings.tenants
    assert "deploy/compose/secrets.env" in (ROOT / ".gitignore").read_text().split()


def test_cassandra_gets_the_local_stacks_tuning_from_one_source(
        services: dict[str, dict]) -> None:
    extra = services["cassandra"]["environment"]["JVM_EXTRA_OPTS"].split()
    assert extra == cassandra_tuning_flags()
    assert "-Dcassandra.config.allow_system_properties=true" in extra
    assert {"paxos_variant", "commitlog_sync", "cas_contention_timeout"} <= set(
        cassandra_tuning())
