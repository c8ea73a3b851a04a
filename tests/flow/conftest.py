"""Flow tests run real dataflows in-process: close each worker's clients after every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from notiflow.adapters.worker import close_all


@pytest.fixture(autouse=True)
def _close_worker_resources() -> Iterator[None]:
    yield
    close_all()
