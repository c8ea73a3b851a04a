"""Unit tests are hermetic: no NOTIFLOW_* variable of the integration session leaks in."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("NOTIFLOW_"):
            monkeypatch.delenv(name)
