"""Which manifest URIs a campaign may name: s3:// always, file:// only under the configured
directory (a tenant must not read the server's files), each under the tenant's own prefix."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from notiflow.adapters.manifests import Manifests, ManifestUnreadable
from notiflow.settings import Settings


def manifests(root: Path | None) -> Manifests:
    s = Settings()
    return Manifests(s.model_copy(update={"campaigns": s.campaigns.model_copy(
        update={"file_root": root})}))


def test_file_manifests_need_a_root_and_stay_inside_it(tmp_path: Path) -> None:
    own = tmp_path / "tenants" / "mkt"
    own.mkdir(parents=True)
    (own / "m.csv").write_bytes(b"phone\n+14155550100\n" * 3)
    uri = f"file://{own}/m.csv"
    with pytest.raises(ManifestUnreadable, match="not enabled"):
        asyncio.run(manifests(None).size(uri, "mkt"))
    with pytest.raises(ManifestUnreadable, match="outside"):
        asyncio.run(manifests(tmp_path / "sub").size(uri, "mkt"))
    with pytest.raises(ManifestUnreadable, match="outside"):
        asyncio.run(manifests(tmp_path).size(f"file://{tmp_path}/../etc/passwd", "mkt"))
    inside = manifests(tmp_path)
    assert asyncio.run(inside.size(uri, "mkt")) == 57

    async def read_all(size: int | None = None) -> bytes:
        return b"".join([c async for c in inside.chunks(uri, "mkt", 6, size)])

    assert asyncio.run(read_all()) == (b"phone\n+14155550100\n" * 3)[6:]
    assert asyncio.run(read_all(size=20)) == (b"phone\n+14155550100\n" * 3)[6:20]
    with pytest.raises(ManifestUnreadable, match="no object"):
        asyncio.run(inside.size(f"file://{own}/missing.csv", "mkt"))
