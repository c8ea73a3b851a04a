"""A campaign manifest is the tenant's own object: under ``tenants/<tenant id>/`` of the
manifest bucket (or of the manifest directory). Anything else is refused from the URI
alone, at the API (422 ``manifest_not_allowed``) and again by the expander, before the store
is asked anything: another tenant's object can be neither read nor probed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from notiflow.adapters import object_store
from notiflow.adapters.manifests import (
    ManifestNotAllowed,
    Manifests,
    ManifestUnreadable,
    tenant_location,
    tenant_refusal,
)
from notiflow.flows.campaigns.expander import Expander
from notiflow.gateway.app import build_app
from notiflow.ops.campaigns_cli import upload_target
from notiflow.settings import Settings
from tests.helpers import dev_environ
from tests.unit.test_expander import NOW, Board, Signals, Sink, request, row

OWN = "s3://notiflow/tenants/mkt/winter.csv"
FOREIGN = (
    "s3://notiflow/tenants/promo/list.csv",  # another tenant's
    "s3://notiflow/tenants/mk/list.csv",  # a tenant whose id mkt starts with ...
    "s3://notiflow/tenants/mkt2/list.csv",  # ... or that starts with mkt
    "s3://notiflow/manifests/winter.csv",  # outside every tenant's prefix
    "s3://other-bucket/tenants/mkt/winter.csv",  # the right key in another bucket
    "s3://notiflow/tenants/mkt",  # the prefix itself, not an object under it
    "s3://notiflow/Tenants/mkt/winter.csv",  # keys are case-sensitive
)


@pytest.fixture
def store_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every request made of an object store (none expected)."""
    calls: list[str] = []

    def record(name: str) -> Any:
        async def called(self: object, *args: object, **kwargs: object) -> Any:
            calls.append(name)
            raise AssertionError(f"the store was asked: {name}")
        return called

    for name in ("head", "read", "stream", "list"):
        monkeypatch.setattr(object_store.ObjectStore, name, record(name))
    return calls


def test_the_tenant_prefix_rule() -> None:
    s = Settings()
    assert tenant_location(s, "mkt") == "s3://notiflow/tenants/mkt/"
    assert tenant_refusal(s, "mkt", OWN) is None
    assert tenant_refusal(s, "mkt", "s3://notiflow/tenants/mkt/2026/12/a.jsonl") is None
    for uri in FOREIGN:
        reason = tenant_refusal(s, "mkt", uri)
        assert reason is not None and "tenants/mkt/" in reason, uri
    moved = s.model_copy(update={"campaigns": s.campaigns.model_copy(
        update={"manifest_bucket": "lists", "manifest_prefix": "in/tenants"})})
    assert tenant_refusal(moved, "mkt", "s3://lists/in/tenants/mkt/a.csv") is None
    assert tenant_refusal(moved, "mkt", OWN) is not None


@pytest.mark.parametrize("uri", [
    "s3://notiflow/tenants/mkt/../promo/list.csv",
    "s3://notiflow/tenants/mkt/%2E%2E/promo/list.csv",
    "s3://notiflow/tenants/mkt%2F..%2Fpromo/list.csv",
    "s3://notiflow/tenants/mkt//list.csv",
])
def test_no_path_trick_leaves_the_prefix(uri: str, store_calls: list[str]) -> None:
    """A URI that would climb out is no object URI at all: refused before the store."""
    with pytest.raises(ManifestUnreadable):
        asyncio.run(Manifests(Settings()).size(uri, "mkt"))
    assert store_calls == []


@pytest.mark.parametrize("uri", FOREIGN)
def test_reading_a_foreign_manifest_asks_the_store_nothing(
        uri: str, store_calls: list[str]) -> None:
    manifests = Manifests(Settings())
    with pytest.raises(ManifestNotAllowed):
        asyncio.run(manifests.size(uri, "mkt"))

    async def read() -> list[bytes]:
        return [c async for c in manifests.chunks(uri, "mkt", 0, 100)]

    with pytest.raises(ManifestNotAllowed):
        asyncio.run(read())
    assert store_calls == []


def test_file_manifests_are_the_tenants_own_too(tmp_path: Path) -> None:
    for tenant in ("mkt", "promo"):
        (tmp_path / "tenants" / tenant).mkdir(parents=True)
        (tmp_path / "tenants" / tenant / "m.csv").write_bytes(b"phone\n+14155550100\n")
    s = Settings()
    s = s.model_copy(update={"campaigns": s.campaigns.model_copy(
        update={"file_root": tmp_path})})
    manifests = Manifests(s)
    assert asyncio.run(manifests.size(f"file://{tmp_path}/tenants/mkt/m.csv", "mkt")) == 19
    for uri in (f"file://{tmp_path}/tenants/promo/m.csv", f"file://{tmp_path}/m.csv"):
        with pytest.raises(ManifestNotAllowed):
            asyncio.run(manifests.size(uri, "mkt"))
    (tmp_path / "tenants" / "mkt" / "link.csv").symlink_to(
        tmp_path / "tenants" / "promo" / "m.csv")
    with pytest.raises(ManifestNotAllowed):
        asyncio.run(manifests.size(f"file://{tmp_path}/tenants/mkt/link.csv", "mkt"))


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[TestClient, dict[str, str]]]:
    with dev_environ() as tokens:
        yield TestClient(build_app(Settings()), raise_server_exceptions=False), tokens


@pytest.mark.parametrize("uri", FOREIGN[:4])
def test_the_api_refuses_a_foreign_manifest_before_asking_the_store(
        uri: str, api: tuple[TestClient, dict[str, str]], store_calls: list[str]) -> None:
    client, tokens = api
    body = {"name": "theirs", "channel": "SMS", "template_id": "winter",
            "template_version": 1, "manifest": uri,
            "mapping": {"recipient": "phone", "variables": {"name": "first_name"}}}
    r = client.post("/v1/campaigns", json=body,
                    headers={"Authorization": f"Bearer {tokens['mkt']}"})
    assert r.status_code == 422, r.text
    assert r.json()["reason"] == "manifest_not_allowed"
    assert "tenants/mkt/" in r.json()["message"]
    assert store_calls == []


def test_the_expander_fails_a_foreign_campaign_unread(store_calls: list[str]) -> None:
    """A campaign row naming another tenant's object (written past the API) ends failed
    with ``manifest_not_allowed``; the store is never asked, no row becomes a message."""
    board = Board(row(request(manifest="s3://notiflow/tenants/promo/list.csv")))
    sink = Sink()
    settings = Settings(correlation_key=SecretStr("c" * 32))
    x = Expander(settings, board, Manifests(settings), sink.publish, sink.hold, Signals(),
                 "x1", clock=lambda: NOW)

    async def run() -> str:
        assert await x.tick() == 1
        return await next(iter(x.tasks.values()))

    assert asyncio.run(run()) == "failed"
    assert board.row.state == "failed"
    assert board.row.reason is not None
    assert board.row.reason.startswith("manifest_not_allowed")
    assert sink.records == [] and sink.held == [] and store_calls == []


def test_the_cli_uploads_under_the_tenants_prefix(tmp_path: Path) -> None:
    s = Settings()
    path = tmp_path / "winter.csv"
    assert upload_target(s, "mkt", path, None) == "s3://notiflow/tenants/mkt/winter.csv"
    assert upload_target(s, "mkt", path, OWN) == OWN
    with pytest.raises(ValueError, match="tenants/promo/"):
        upload_target(s, "promo", path, OWN)
