"""Unit tests are hermetic: no NOTIFLOW_* variable of the integration session leaks in."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("NOTIFLOW_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _recipient_hash_key() -> Iterator[None]:
    """A fixed recipient hash key (keyed hashes need one; the environment has none here)."""
    from notiflow import redact

    redact.use(redact.RecipientHasher((b"unit-test-recipient-hash-key-0001",)))
    yield
    redact.use(None)
