"""The tools that check the Helm chart (``deploy/helm/notiflow``) offline: ``helm`` and
``kubeconform`` built with Go from the Go module proxy, and the JSON schemas they validate
against, written once into ``cache_dir``.

- Kubernetes' schemas come from the ``kubernetes-validate`` wheel on PyPI (generated from
  Kubernetes' own OpenAPI document); its schemas point into one shared definitions file, so
  each is written here standalone, with only the definitions it reaches, in kubeconform's
  file layout (``<kind>-<group>-<version>.json``).
- KEDA's ``ScaledObject`` and ``TriggerAuthentication`` schemas come from the CRDs in KEDA's
  Go module (``config/crd/bases``), made strict the way kubeconform's
  ``openapi2jsonschema`` does: an object that lists its properties admits no others.

Every download is pinned by version and checked by SHA-256."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HELM = ("helm.sh/helm/v4/cmd/helm", "v4.3.2")
KUBECONFORM = ("github.com/yannh/kubeconform/cmd/kubeconform", "v0.7.0")
KUBERNETES_VERSION = "1.37.0"
SCHEMA_WHEEL = ("kubernetes-validate", "1.37.0",
                "85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9")
KEDA = ("github.com/kedacore/keda/v2", "v2.21.1",
        "872fa4b9d4282969ece753727ca31a7a31eaf341a52fa0972148297521ca9a75")
KEDA_CRDS = ("keda.sh_scaledobjects.yaml", "keda.sh_triggerauthentications.yaml")


class KubeToolsError(RuntimeError):
    """A tool could not be built or a schema source failed its checksum."""


@dataclass(frozen=True)
class KubeTools:
    helm: Path
    kubeconform: Path
    schemas: Path

    def schema_locations(self) -> list[str]:
        """kubeconform ``-schema-location`` templates: Kubernetes' kinds, then CRDs."""
        return [f"{self.schemas}/kubernetes/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
                f"{self.schemas}/crds/{{{{ .Group }}}}/{{{{ .ResourceKind }}}}_"
                "{{ .ResourceAPIVersion }}.json"]


def tools(cache: Path) -> KubeTools:
    """Where the pinned tools and schemas live (present once :func:`ensure` ran)."""
    return KubeTools(helm=cache / "bin" / f"helm-{HELM[1]}",
                     kubeconform=cache / "bin" / f"kubeconform-{KUBECONFORM[1]}",
                     schemas=cache / "kube-schemas" / f"k{KUBERNETES_VERSION}-keda{KEDA[1]}")


def ensure(cache: Path, log: Any = print) -> KubeTools:
    """Build the tools and write the schemas once; later calls only check they exist."""
    t = tools(cache)
    for target, (module, version) in ((t.helm, HELM), (t.kubeconform, KUBECONFORM)):
        if not target.exists():
            log(f"building {module.rsplit('/', 1)[-1]} {version} with Go (once; minutes) ...")
            _go_install(module, version, target)
    if not (t.schemas / ".complete").exists():
        log(f"writing Kubernetes {KUBERNETES_VERSION} and KEDA {KEDA[1]} schemas ...")
        with tempfile.TemporaryDirectory(prefix=".schemas-", dir=cache) as tmp:
            staging = Path(tmp) / "schemas"
            _kubernetes_schemas(Path(tmp), staging / "kubernetes")
            _keda_schemas(staging / "crds")
            (staging / ".complete").write_text("ok\n")
            if t.schemas.exists():
                shutil.rmtree(t.schemas)
            t.schemas.parent.mkdir(parents=True, exist_ok=True)
            staging.replace(t.schemas)
    return t


def _go() -> str:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists()
                                else None)
    if not go:
        raise KubeToolsError("the Go toolchain (go) is not on PATH: it builds helm and "
                             "kubeconform for the chart's tests")
    return go


def _go_env() -> dict[str, str]:
    return {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}


def _go_install(module: str, version: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".go-install-", dir=target.parent) as tmp:
        done = subprocess.run([_go(), "install", f"{module}@{version}"],
                              env={**_go_env(), "GOBIN": tmp}, capture_output=True, text=True)
        if done.returncode != 0:
            raise KubeToolsError(f"`go install {module}@{version}` failed:\n"
                                 f"{done.stderr[-3000:]}")
        (Path(tmp) / module.rsplit("/", 1)[-1]).replace(target)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checked(path: Path, want: str) -> Path:
    got = _sha256(path)
    if got != want:
        raise KubeToolsError(f"{path.name}: SHA-256 {got}, expected {want}")
    return path


def _kubernetes_schemas(tmp: Path, out: Path) -> None:
    name, version, sha = SCHEMA_WHEEL
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                           "--disable-pip-version-check", f"{name}=={version}", "-d", str(tmp)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise KubeToolsError(f"pip download {name}=={version} failed:\n{done.stderr[-2000:]}")
    wheel = _checked(next(tmp.glob(f"{name.replace('-', '_')}-{version}-*.whl")), sha)
    folder = f"kubernetes_validate/kubernetes-json-schema/v{KUBERNETES_VERSION}-local-strict/"
    with zipfile.ZipFile(wheel) as z:
        files = {n.removeprefix(folder): n for n in z.namelist()
                 if n.startswith(folder) and n.endswith(".json")}
        definitions = json.loads(z.read(files.pop("_definitions.json")))["$defs"]
        out.mkdir(parents=True)
        for short, full in files.items():
            schema = json.loads(z.read(full))
            if "kind" not in schema.get("properties", {}):
                continue
            (out / short).write_text(json.dumps(standalone(schema, definitions)))


def standalone(schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its references into the shared definitions file
    (``/api/_definitions.json#/$defs/X``, and ``#/$defs/X`` within it) pointing into a
    ``$defs`` of its own that holds every definition it reaches."""
    prefixes = ("/api/_definitions.json#/$defs/", "#/$defs/")
    reached: dict[str, Any] = {}

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(prefixes):
                key = ref.split("/$defs/", 1)[1]
                if key not in reached:
                    reached[key] = None
                    reached[key] = rewrite(definitions[key])
                node = {**node, "$ref": f"#/$defs/{key}"}
            return {k: (v if k == "$ref" else rewrite(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    top = rewrite(schema)
    return {**top, "$defs": reached}


def _keda_schemas(out: Path) -> None:
    module, version, sha = KEDA
    done = subprocess.run([_go(), "mod", "download", "-json", f"{module}@{version}"],
                          env=_go_env(), capture_output=True, text=True)
    info = json.loads(done.stdout or "{}")
    if not info.get("Zip"):
        raise KubeToolsError(f"go mod download {module}@{version} failed:\n"
                             f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    with zipfile.ZipFile(_checked(Path(info["Zip"]), sha)) as z:
        for crd_file in KEDA_CRDS:
            crd = yaml.safe_load(z.read(f"{module}@{version}/config/crd/bases/{crd_file}"))
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"].lower()
            for v in crd["spec"]["versions"]:
                target = out / group / f"{kind}_{v['name']}.json"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps(strict(v["schema"]["openAPIV3Schema"])))


def strict(schema: Any) -> Any:
    """An OpenAPI v3 CRD schema as a strict JSON schema: objects that list ``properties``
    and say nothing of others admit no others; ``x-kubernetes-*`` hints dropped, except
    ``int-or-string``, which becomes the union it means."""
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out
