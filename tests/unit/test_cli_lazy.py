"""The command line loads an operator command's module only when that command is named: a
process started as ``notiflow fakes``, ``api`` or ``flow send`` pays for no driver it does
not use, and every lazy command still answers under its own name."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from notiflow.cli import LAZY, app

DRIVERS = ("redis", "cassandra", "confluent_kafka", "pyarrow", "boto3", "botocore")


def _loaded_after(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}; import json, sys; "
                          "print(json.dumps(sorted(sys.modules)))"],
                         check=True, capture_output=True, text=True).stdout
    loaded: list[str] = json.loads(out.splitlines()[-1])
    return loaded


def test_importing_the_command_line_loads_no_driver_and_no_operator_command() -> None:
    loaded = _loaded_after("import notiflow.cli")
    assert [m for m in loaded if m.split(".")[0] in DRIVERS] == []
    lazy_modules = {target.split(":")[0] for target in LAZY.values()}
    assert lazy_modules.isdisjoint(loaded), sorted(lazy_modules & set(loaded))


def test_naming_a_lazy_command_loads_its_module() -> None:
    loaded = _loaded_after("from typer.testing import CliRunner; from notiflow.cli import app; "
                           "CliRunner().invoke(app, ['dlq', '--help'])")
    assert "notiflow.ops.dlq_cli" in loaded
    assert "notiflow.ops.archive_cli" not in loaded


def test_every_lazy_command_answers_its_help_under_its_name() -> None:
    runner = CliRunner()
    listing = runner.invoke(app, ["--help"], terminal_width=200)
    assert listing.exit_code == 0, listing.output
    for name in LAZY:
        assert f" {name} " in listing.output, name
        done = runner.invoke(app, [name, "--help"], prog_name="notiflow", terminal_width=200)
        assert done.exit_code == 0, (name, done.output)
        assert f"Usage: notiflow {name} [OPTIONS]" in done.output, (name, done.output[:300])


def test_an_unknown_command_is_still_refused() -> None:
    done = CliRunner().invoke(app, ["no-such-command"])
    assert done.exit_code == 2
