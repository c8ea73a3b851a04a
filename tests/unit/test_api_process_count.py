"""``notiflow api --processes N``: the setting, the option, and what the supervisor hands its
workers (their settings come from the environment, their app from an import string)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from notiflow import cli, telemetry, tuning
from notiflow.gateway import app as gateway
from notiflow.settings import Settings, load_settings

WORKER_VARS = ("NOTIFLOW_API_LANE", "NOTIFLOW_API_PORT", "NOTIFLOW_API_PROCESSES")


def test_one_process_by_default_and_the_environment_sets_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().api_processes == 1
    monkeypatch.setenv("NOTIFLOW_API_PROCESSES", "4")
    assert load_settings().api_processes == 4


@pytest.mark.parametrize("value", ["0", "65"])
def test_process_count_is_bounded(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("NOTIFLOW_API_PROCESSES", value)
    with pytest.raises(ValidationError):
        load_settings()


def _served(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    served: list[Settings] = []
    monkeypatch.setattr(gateway, "serve", served.append)
    return served


def test_the_options_reach_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    served = _served(monkeypatch)
    result = CliRunner().invoke(cli.app, ["api", "--lane", "bulk", "--port", "18181",
                                          "--processes", "2"])
    assert result.exit_code == 0, result.output
    (settings,) = served
    assert (settings.api_lane, settings.api_port, settings.api_processes) == ("bulk", 18181, 2)


def test_without_the_option_the_setting_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    served = _served(monkeypatch)
    monkeypatch.setenv("NOTIFLOW_API_PROCESSES", "3")
    assert CliRunner().invoke(cli.app, ["api"]).exit_code == 0
    assert served[0].api_processes == 3


def test_zero_processes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    served = _served(monkeypatch)
    assert CliRunner().invoke(cli.app, ["api", "--processes", "0"]).exit_code == 2
    assert served == []


def _quiet_setup(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[str]]:
    """Record run_server's calls and telemetry's process names; no priority change."""
    runs: list[Any] = []
    names: list[str] = []
    monkeypatch.setattr(gateway, "run_server",
                        lambda app, settings, log_config, **kw: runs.append((app, settings, kw)))
    monkeypatch.setattr(gateway, "build_app", lambda settings: ("app", settings.api_lane))
    monkeypatch.setattr(telemetry, "setup", lambda _s, process, **_kw: names.append(process))
    monkeypatch.setattr(tuning, "set_nice", lambda nice: nice)
    monkeypatch.setattr(tuning, "set_realtime", lambda _priority: False)
    for name in WORKER_VARS:
        monkeypatch.setenv(name, "-")  # so that the variables serve sets are removed
        monkeypatch.delenv(name)       # after the test
    return runs, names


def test_one_process_serves_its_app_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    runs, names = _quiet_setup(monkeypatch)
    gateway.serve(Settings(api_lane="priority"))
    (app, _settings, kw) = runs[0]
    assert app == ("app", "priority") and kw == {}
    assert names == ["api-priority"]


def test_workers_get_the_command_line_through_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runs, names = _quiet_setup(monkeypatch)
    gateway.serve(Settings(api_lane="bulk", api_port=18282, api_processes=2))
    (app, _settings, kw) = runs[0]
    assert app == gateway.WORKER_APP and kw == {"workers": 2}
    assert names == []  # the supervisor exports no telemetry: its workers do
    worker = load_settings()
    assert (worker.api_lane, worker.api_port, worker.api_processes) == ("bulk", 18282, 2)
    assert gateway.worker_app() == ("app", "bulk")
    assert names == ["api-bulk"]


def test_the_worker_app_string_names_the_factory() -> None:
    module, _, attr = gateway.WORKER_APP.partition(":")
    assert module == gateway.__name__ and getattr(gateway, attr) is gateway.worker_app


def test_real_time_processes_as_many_as_cores_are_flagged() -> None:
    priority = Settings(api_lane="priority", api_processes=2)
    assert priority.lane_realtime("priority") > 0
    assert gateway.starves_host(priority, 2)
    assert not gateway.starves_host(priority, 4)
    assert not gateway.starves_host(priority.model_copy(update={"api_processes": 1}), 2)
    assert not gateway.starves_host(Settings(api_lane="bulk", api_processes=2), 2)
    assert not gateway.starves_host(priority, None)
