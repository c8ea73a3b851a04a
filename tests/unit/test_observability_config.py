"""The Docker observability stack, checked without Docker: docker-compose.yml services and their
mounted files, the Collector pipelines, Prometheus scrape targets, Grafana provisioning and the
dashboard's queries (every metric declared in notiflow/names.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from notiflow import names
from tests.promql import metric_names

ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY = ("otel-collector", "prometheus", "grafana", "jaeger")


def _yaml(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text())


@pytest.fixture(scope="module")
def compose() -> dict:
    return _yaml("docker-compose.yml")


def _mounts(service: dict) -> dict[str, Path]:
    """container path → repository path of each bind mount (``./…:/…``)."""
    out = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            out[target] = ROOT / source
    return out


def _mounted(compose: dict, service: str, container_path: str) -> Path:
    mounts = _mounts(compose["services"][service])
    assert container_path in mounts, f"{service} does not mount {container_path}"
    return mounts[container_path]


def test_observability_services_are_pinned_and_loopback_only(compose: dict) -> None:
    services = compose["services"]
    for name in OBSERVABILITY:
        assert name in services, f"docker-compose.yml lacks {name}"
        image = services[name]["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and re.search(r"\d", tag), image
        for port in services[name].get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for dependency in services[name].get("depends_on", []):
            assert dependency in services


def test_every_mounted_file_exists_in_the_repository(compose: dict) -> None:
    for name, service in compose["services"].items():
        for target, source in _mounts(service).items():
            assert source.exists(), f"{name} mounts missing {source.relative_to(ROOT)}"
            assert source.resolve().is_relative_to(ROOT), target
    for name in ("prometheus", "grafana"):
        for volume in compose["services"][name]["volumes"]:
            source = volume.split(":")[0]
            if not source.startswith("./"):
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"


def test_collector_pipelines_and_endpoints(compose: dict) -> None:
    config = yaml.safe_load(_mounted(compose, "otel-collector",
                                     "/etc/otelcol-contrib/config.yaml").read_text())
    service = config["service"]
    for pipeline in service["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"{component} is not defined under {kind}"
    assert service["pipelines"]["metrics"]["exporters"] == ["prometheus"]
    prometheus = config["exporters"]["prometheus"]
    assert "namespace" not in prometheus, "a namespace would rename every Prometheus series"
    assert "translation_strategy" not in prometheus and "add_metric_suffixes" not in prometheus
    # traces go on to Jaeger, over OTLP, on the compose network
    (trace_exporter,) = service["pipelines"]["traces"]["exporters"]
    assert trace_exporter.split("/")[0] in {"otlp", "otlp_grpc"}
    host, port = config["exporters"][trace_exporter]["endpoint"].rsplit(":", 1)
    assert host == "jaeger" and port == "4317"
    # OTLP in on the standard ports, published to the host's notiflow processes
    published = {p.split(":")[-1] for p in compose["services"]["otel-collector"]["ports"]}
    for protocol in config["receivers"]["otlp"]["protocols"].values():
        assert protocol["endpoint"].rsplit(":", 1)[1] in published
    # Prometheus scrapes the exporter's port
    scrape = _yaml("ops/prometheus/prometheus.yml")
    targets = {t for job in scrape["scrape_configs"] for sc in job["static_configs"]
               for t in sc["targets"]}
    assert f"otel-collector:{prometheus['endpoint'].rsplit(':', 1)[1]}" in targets


def test_prometheus_loads_the_rules_it_mounts(compose: dict) -> None:
    config_path = _mounted(compose, "prometheus", "/etc/prometheus/prometheus.yml")
    config = yaml.safe_load(config_path.read_text())
    for rule_file in config["rule_files"]:
        local = config_path.parent / rule_file
        assert local.exists()
        assert _mounted(compose, "prometheus", f"/etc/prometheus/{rule_file}") == local


def test_grafana_provisioning(compose: dict) -> None:
    datasources = yaml.safe_load(_mounted(
        compose, "grafana", "/etc/grafana/provisioning/datasources").joinpath(
            "notiflow.yml").read_text())["datasources"]
    by_uid = {d["uid"]: d for d in datasources}
    assert by_uid["prometheus"]["type"] == "prometheus"
    assert by_uid["jaeger"]["type"] == "jaeger"
    for source in datasources:
        host = re.match(r"https?://([^:/]+)", source["url"]).group(1)
        assert host in compose["services"], source["url"]
    providers = yaml.safe_load(_mounted(
        compose, "grafana", "/etc/grafana/provisioning/dashboards").joinpath(
            "notiflow.yml").read_text())["providers"]
    (provider,) = providers
    dashboards = _mounted(compose, "grafana", provider["options"]["path"])
    assert list(dashboards.glob("*.json")), "no dashboard JSON to provision"


def _dashboards() -> list[dict]:
    return [json.loads(p.read_text())
            for p in sorted((ROOT / "ops" / "grafana" / "dashboards").glob("*.json"))]


def test_dashboard_queries_use_declared_metrics() -> None:
    declared = names.prometheus_series()
    used: set[str] = set()
    for dashboard in _dashboards():
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids)), f"{dashboard['uid']}: duplicate panel ids"
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                assert target["datasource"]["uid"] == "prometheus"
                found = metric_names(target["expr"])
                assert found, f"{panel['title']}: no metric in {target['expr']!r}"
                unknown = found - declared.keys()
                assert not unknown, f"{panel['title']} uses undeclared {sorted(unknown)}"
                used |= found
    families = {declared[s].name for s in used}
    for required in (names.ACCEPT_TO_PROVIDER, names.QUEUE_OLDEST_AGE,
                     names.PROVIDER_REQUEST_DURATION, names.PROVIDER_ERRORS,
                     names.BREAKER_STATE, names.DLQ_DEPTH, names.DLQ_RECORDS,
                     names.RETRIES_SCHEDULED, names.SUPPRESSIONS, names.EXPIRATIONS):
        assert required in families, f"no panel shows {required}"


def test_dashboard_panels_do_not_overlap() -> None:
    for dashboard in _dashboards():
        cells: dict[tuple[int, int], str] = {}
        for panel in dashboard["panels"]:
            g = panel["gridPos"]
            assert g["x"] + g["w"] <= 24, panel["title"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                    cells[(x, y)] = panel["title"]
