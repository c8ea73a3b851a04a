"""The core install runs the platform's processes: the CLI, the API and the flows import
without the extras' packages, and a feature that needs an extra names it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from notiflow.extras import MissingExtra, needs

ROOT = Path(__file__).resolve().parents[2]
EXTRAS_ONLY = {"aiosmtpd": "emulators", "h2": "emulators", "trustme": "emulators",
               "botocore": "ses", "pyarrow": "archive"}
"""Package → the extra that carries it (none of them in the core dependencies)."""

CORE_MODULES = ("notiflow.cli", "notiflow.gateway.app", "notiflow.flows.send.flow",
                "notiflow.flows.receipts.reconcile", "notiflow.flows.scheduling.due_work",
                "notiflow.flows.campaigns.expander", "notiflow.flows.common.runner",
                "notiflow.inbox.server",
                "notiflow.adapters.providers", "notiflow.ops.demo", "notiflow.ops.archive_cli")

_WITHOUT_EXTRAS = """
import importlib, sys

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Absent())
for module in {modules!r}:
    importlib.import_module(module)
from notiflow.cli import app
from typer.testing import CliRunner
done = CliRunner().invoke(app, ["--help"])
assert done.exit_code == 0, done.output
"""


def _pins(specs: list[str]) -> dict[str, str]:
    return {spec.partition("==")[0].partition("[")[0].lower(): spec for spec in specs}


def test_the_extras_packages_are_not_core_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _pins(project["dependencies"])
    extras = {name: _pins(specs) for name, specs in project["optional-dependencies"].items()}
    for package, extra in EXTRAS_ONLY.items():
        assert package not in core, package
        assert package in extras[extra], (package, extra)
    assert set(extras["emulators"]) == {"aiosmtpd", "botocore", "h2", "trustme"}


def test_the_platform_imports_without_the_extras() -> None:
    script = _WITHOUT_EXTRAS.format(blocked=set(EXTRAS_ONLY), modules=CORE_MODULES)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_missing_package_names_its_extra() -> None:
    with pytest.raises(MissingExtra) as raised, needs("archive", "the history archive"):
        import notiflow_no_such_package  # type: ignore[import-not-found]  # noqa: F401
    assert raised.value.extra == "archive"
    assert raised.value.missing == "notiflow_no_such_package"
    assert "'notiflow[archive]'" in str(raised.value)
