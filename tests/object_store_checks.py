"""What the tests of every :class:`~notiflow.adapters.object_store.ObjectStore` backend
(local files, S3) check alike."""

from __future__ import annotations

from collections.abc import AsyncIterable

import pytest

from notiflow.adapters.object_store import ObjectInfo, ObjectNotFound, ObjectStore

CSV = b"phone,name\n+15550001,Ann\n"


async def collect(chunks: AsyncIterable[bytes]) -> list[bytes]:
    return [c async for c in chunks]


async def check_round_trip(store: ObjectStore, key: str) -> ObjectInfo:
    """``put`` of :data:`CSV` at ``key``: ``head`` gives its size and an etag, ``stream``
    gives it back; returns the head."""
    await store.put(key, CSV)
    info = await store.head(key)
    assert info.size == len(CSV) and info.etag
    assert b"".join(await collect(store.stream(key))) == CSV
    return info


async def check_replace_and_delete(store: ObjectStore, key: str) -> None:
    """A second ``put`` at ``key`` replaces the object; ``delete`` removes it, and again is
    a no-op."""
    await store.put(key, b"replaced")
    assert (await store.head(key)).size == 8
    await store.delete(key)
    await store.delete(key)
    with pytest.raises(ObjectNotFound):
        await store.head(key)
