"""The Helm chart (deploy/helm/notiflow): ``helm lint``, ``helm template`` and kubeconform's
strict validation against Kubernetes 1.37's and KEDA's schemas, offline, with the tools that
``notiflow stack kube-tools`` builds; then what the schemas cannot say (QoS, budgets, the
Bytewax clusters' names, settings that exist)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from notiflow.adapters.cluster_peers import spec_from_hostname
from notiflow.ops.kube_tools import KUBERNETES_VERSION, KubeTools, tools
from notiflow.settings import Settings

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "notiflow"
WORKLOADS = ("Deployment", "StatefulSet")


@pytest.fixture(scope="module")
def kube() -> KubeTools:
    t = tools(Settings().cache_dir.expanduser())
    missing = [p for p in (t.helm, t.kubeconform, t.schemas / ".complete") if not p.exists()]
    if missing:
        pytest.fail(f"missing {missing}: run `notiflow stack kube-tools` (ops/bootstrap.sh "
                    "does)")
    return t


def helm(kube: KubeTools, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(kube.helm), *args], capture_output=True, text=True, timeout=120)


def render(kube: KubeTools, *sets: str) -> str:
    args = [a for s in sets for a in ("--set", s)]
    done = helm(kube, "template", "nf", str(CHART), "--namespace", "notify", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(manifests: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in manifests if d["kind"] == kind}


def containers(workload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from workload["spec"]["template"]["spec"]["containers"]


def kubeconform(kube: KubeTools, text: str, tmp_path: Path) -> str:
    target = tmp_path / "rendered.yaml"
    target.write_text(text)
    locations = [a for loc in kube.schema_locations() for a in ("-schema-location", loc)]
    done = subprocess.run([str(kube.kubeconform), "-strict", "-summary", "-kubernetes-version",
                           KUBERNETES_VERSION, *locations, str(target)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_helm_lint_is_clean(kube: KubeTools) -> None:
    done = helm(kube, "lint", "--strict", str(CHART))
    assert done.returncode == 0, done.stdout + done.stderr


VARIANTS = {
    "defaults": (),
    "no-keda": ("keda.enabled=false",),
    "trial": ("fakes.enabled=true", "init.enabled=false", "serviceAccount.create=false",
              "keda.authenticationRef=prometheus-auth"),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_manifest_is_valid_against_the_schemas(kube: KubeTools, tmp_path: Path,
                                                     variant: str) -> None:
    text = render(kube, *VARIANTS[variant])
    summary = kubeconform(kube, text, tmp_path)
    assert f"{len(docs(text))} resources found" in summary
    assert "Invalid: 0, Errors: 0, Skipped: 0" in summary


def test_kubeconform_rejects_what_kubernetes_would(kube: KubeTools, tmp_path: Path) -> None:
    bad = render(kube).replace("podManagementPolicy: Parallel",
                               "podManagementPolicy: Parallel\n  replicaz: 2", 1)
    (tmp_path / "bad.yaml").write_text(bad)
    locations = [a for loc in kube.schema_locations() for a in ("-schema-location", loc)]
    done = subprocess.run([str(kube.kubeconform), "-strict", *locations,
                           str(tmp_path / "bad.yaml")], capture_output=True, text=True)
    assert done.returncode == 1 and "replicaz" in done.stdout


def test_p0_runs_in_the_guaranteed_qos_class(kube: KubeTools) -> None:
    m = docs(render(kube))
    p0 = [by_kind(m, "StatefulSet")["nf-notiflow-send-p0"],
          by_kind(m, "Deployment")["nf-notiflow-api-priority"]]
    for workload in p0:
        for c in containers(workload):
            r = c["resources"]
            assert set(r["requests"]) == {"cpu", "memory"}
            assert r["requests"] == r["limits"], workload["metadata"]["name"]
    bulk = by_kind(m, "StatefulSet")["nf-notiflow-send-p3"]
    assert all("cpu" not in c["resources"]["limits"] for c in containers(bulk))


def test_every_workload_has_a_disruption_budget_and_probes_where_it_serves(
        kube: KubeTools) -> None:
    m = docs(render(kube, "fakes.enabled=true"))
    budgets = [p["spec"]["selector"]["matchLabels"] for p in by_kind(m, "PodDisruptionBudget")
               .values()]
    for kind in WORKLOADS:
        for name, w in by_kind(m, kind).items():
            labels = w["spec"]["template"]["metadata"]["labels"]
            if "fakes" not in name:  # one emulator pod for a trial: no budget to block drains
                assert any(b.items() <= labels.items() for b in budgets), name
            if "scheduler" in name or "expander" in name:
                continue
            for c in containers(w):
                assert "livenessProbe" in c, name
    for name, api in by_kind(m, "Deployment").items():
        if "-api-" in name:
            (c,) = containers(api)
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_each_flow_is_a_bytewax_cluster_found_under_its_headless_service(
        kube: KubeTools) -> None:
    m = docs(render(kube))
    services = by_kind(m, "Service")
    claims = by_kind(m, "PersistentVolumeClaim")
    for name, sts in by_kind(m, "StatefulSet").items():
        svc = services[sts["spec"]["serviceName"]]
        assert svc["spec"]["clusterIP"] == "None"
        (c,) = containers(sts)
        if c["args"][:2] in (["flow", "scheduler"], ["flow", "expander"]):
            assert c["args"][-2:] == ["--name", "$(POD_NAME)"]
            continue
        assert svc["spec"]["publishNotReadyAddresses"] is True
        domain = c["args"][c["args"].index("--peers-dns") + 1]
        assert domain == f"{name}.$(POD_NAMESPACE).svc.cluster.local"
        spec = spec_from_hostname(f"{name}-0", domain.replace("$(POD_NAMESPACE)", "notify"),
                                  2101, 8)
        assert spec.address(0) == f"{name}-0.{name}.notify.svc.cluster.local:2101"
        volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
        claim = claims[volumes["recovery"]["persistentVolumeClaim"]["claimName"]]
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
        store = c["args"][c["args"].index("--recovery-dir") + 1]
        assert store in c["livenessProbe"]["exec"]["command"]
        assert any(mnt["mountPath"] == store for mnt in c["volumeMounts"])


def test_the_history_archive_runs_daily_with_the_platform_configuration(
        kube: KubeTools) -> None:
    [job] = by_kind(docs(render(kube)), "CronJob").values()
    assert job["spec"]["schedule"] == "17 3 * * *"
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    [c] = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["archive", "run"]
    assert {"configMapRef": {"name": "nf-notiflow"}} in c["envFrom"]
    assert {e["name"] for e in c["env"]} >= {"NOTIFLOW_SECRETS_DIR"}
    assert "CronJob" not in {d["kind"] for d in docs(render(kube, "archive.enabled=false"))}


def test_keda_scales_the_bulk_flows_on_lag_and_age_and_leaves_p0_alone(
        kube: KubeTools) -> None:
    m = docs(render(kube))
    scaled = by_kind(m, "ScaledObject")
    sets = by_kind(m, "StatefulSet")
    assert set(scaled) == {f"nf-notiflow-{f}" for f in ("send-p2", "send-p3", "reconcile",
                                                         "webhooks")}
    for name, so in scaled.items():
        assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                                "name": name}
        assert "replicas" not in sets[name]["spec"]
        queries = [t["metadata"]["query"] for t in so["spec"]["triggers"]]
        assert any("notiflow_consumer_lag" in q for q in queries)
    p2 = [t["metadata"]["query"] for t in scaled["nf-notiflow-send-p2"]["spec"]["triggers"]]
    assert p2 == ['sum(notiflow_consumer_lag{flow="send-p2"})',
                  'max(notiflow_queue_oldest_age_seconds{tier="P2"})']
    webhooks = scaled["nf-notiflow-webhooks"]["spec"]["triggers"][0]["metadata"]["query"]
    assert webhooks == 'sum(notiflow_consumer_lag{flow="client-webhooks"})'
    assert sets["nf-notiflow-send-p0"]["spec"]["replicas"] == 2
    no_keda = by_kind(docs(render(kube, "keda.enabled=false")), "StatefulSet")
    assert no_keda["nf-notiflow-send-p2"]["spec"]["replicas"] == 1


def test_a_cluster_larger_than_its_recovery_store_is_refused(kube: KubeTools) -> None:
    done = helm(kube, "template", "nf", str(CHART),
                "--set", "flows.send-p3.autoscaling.maxProcesses=9")
    assert done.returncode != 0
    assert "NOTIFLOW_RECOVERY_PARTITIONS is 8" in done.stderr


def test_a_secret_in_the_config_map_is_refused(kube: KubeTools) -> None:
    done = helm(kube, "template", "nf", str(CHART),
                "--set", "config.NOTIFLOW_DLQ_KEY=abc")
    assert done.returncode != 0 and "looks like a secret" in done.stderr


def test_every_configured_setting_exists(kube: KubeTools) -> None:
    """Settings ignores unknown variables, so a misspelt one would be silently lost."""
    manifests = docs(render(kube))
    config = by_kind(manifests, "ConfigMap")["nf-notiflow"]["data"]
    fields = set(Settings.model_fields)
    for key in config:
        if key.startswith("NOTIFLOW_"):
            assert key.removeprefix("NOTIFLOW_").split("__")[0].lower() in fields, key
    env = {e["name"] for w in by_kind(manifests, "Deployment").values()
           for c in containers(w) for e in c["env"]}
    for key in env:
        if key.startswith("NOTIFLOW_"):
            assert key.removeprefix("NOTIFLOW_").split("__")[0].lower() in fields, key
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    settings = Settings.model_validate(
        {k.removeprefix("NOTIFLOW_").lower(): v for k, v in values["config"].items()
         if k.startswith("NOTIFLOW_") and "__" not in k
         and k not in ("NOTIFLOW_CASSANDRA_HOSTS", "NOTIFLOW_CASSANDRA_REPLICATION")})
    assert settings.recovery_partitions == 8


def test_a_config_change_rolls_every_pod(kube: KubeTools) -> None:
    def checksums(*sets: str) -> set[str]:
        m = docs(render(kube, *sets))
        return {w["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
                for kind in WORKLOADS for name, w in by_kind(m, kind).items()
                if "fakes" not in name}

    before, after = checksums(), checksums("config.NOTIFLOW_TOPIC_PREFIX=x.")
    assert len(before) == len(after) == 1 and before != after


def test_the_secret_is_mounted_as_a_reloaded_directory_unless_told_otherwise(
        kube: KubeTools) -> None:
    def mounts(*sets: str) -> list[tuple[set[str], set[str], bool]]:
        out = []
        for kind in WORKLOADS:
            for name, w in by_kind(docs(render(kube, *sets)), kind).items():
                if "fakes" in name:
                    continue
                pod = w["spec"]["template"]["spec"]
                secret_volumes = {v["name"] for v in pod["volumes"]
                                  if v.get("secret", {}).get("secretName") == "notiflow-secrets"}
                for c in containers(w):
                    env = {e["name"]: e.get("value") for e in c["env"]}
                    mounted = {m["mountPath"] for m in c["volumeMounts"]
                               if m["name"] in secret_volumes and m.get("readOnly")}
                    refs = {r["secretRef"]["name"] for r in c["envFrom"] if "secretRef" in r}
                    out.append((mounted, refs, env.get("NOTIFLOW_SECRETS_DIR") in mounted))
        return out

    reloaded = mounts()
    assert reloaded and all(m == {"/run/secrets/notiflow"} and not refs and named
                            for m, refs, named in reloaded)
    plain = mounts("secretReload=false")
    assert all(not m and refs == {"notiflow-secrets"} and not named for m, refs, named in plain)


def test_egress_is_dns_the_stores_and_public_addresses_only(kube: KubeTools) -> None:
    """Every notiflow pod's egress: DNS, its namespace, the stores' namespaces, and public
    addresses; never the metadata, link-local, private or loopback ranges. Off by a value."""
    from ipaddress import ip_address, ip_network

    from notiflow.egress import METADATA_ADDRESSES

    policies = by_kind(docs(render(kube)), "NetworkPolicy")
    policy = policies["nf-notiflow-egress"]["spec"]
    assert policy["policyTypes"] == ["Egress"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "notiflow",
                                                    "app.kubernetes.io/instance": "nf"}
    dns, own, stores, public = policy["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert own == {"to": [{"podSelector": {}}]}
    assert {t["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            for t in stores["to"]} == {"kafka", "k8ssandra", "redis", "observability"}
    blocks = [t["ipBlock"] for t in public["to"]]
    assert {b["cidr"] for b in blocks} == {"0.0.0.0/0", "::/0"}
    excepted = [ip_network(c) for b in blocks for c in b["except"]]
    refused = [*METADATA_ADDRESSES, *(ip_address(a) for a in (
        "10.1.2.3", "172.16.0.1", "192.168.1.1", "127.0.0.1", "169.254.1.1", "100.64.0.1",
        "::1", "fe80::1", "fd00::1"))]
    for ip in refused:
        assert any(ip.version == n.version and ip in n for n in excepted), ip
    assert "NetworkPolicy" not in {
        d["kind"] for d in docs(render(kube, "networkPolicy.egress.enabled=false"))}
    extra = by_kind(docs(render(kube, "networkPolicy.egress.extraCIDRs={10.20.0.0/16}")),
                    "NetworkPolicy")["nf-notiflow-egress"]["spec"]["egress"]
    assert {"ipBlock": {"cidr": "10.20.0.0/16"}} in extra[3]["to"]
