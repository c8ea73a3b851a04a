"""Object storage against the local stack's real S3 server (SeaweedFS, ``notiflow stack up``):
the same contracts as on ``file://`` (``tests/unit/test_object_store_local.py``), ranged
streams from the middle of a 3 MB object, and that the gateway enforces signatures: an
unsigned request and one signed with a wrong secret are refused."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest
from obstore.store import S3Store
from pydantic import SecretStr

from notiflow.adapters.object_store import (
    ObjectAccessDenied,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
)
from notiflow.settings import Settings
from tests.object_store_checks import check_replace_and_delete, check_round_trip, collect

pytestmark = pytest.mark.integration


@pytest.fixture
async def prefix(stack: Settings) -> AsyncIterator[str]:
    """A fresh key prefix in the stack's bucket, emptied afterwards."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    store = ObjectStore.bucket(stack.object_store.bucket, stack.object_store)
    for key in await store.list(name):
        await store.delete(key)


def uri(stack: Settings, key: str) -> str:
    return f"s3://{stack.object_store.bucket}/{key}"


async def test_put_head_stream_list_delete(stack: Settings, prefix: str) -> None:
    store, key = ObjectStore.open(uri(stack, f"{prefix}/manifests/m1.csv"), stack.object_store)
    assert key == f"{prefix}/manifests/m1.csv"
    assert store.uri(key) == uri(stack, key)
    assert (await check_round_trip(store, key)).last_modified is not None
    await store.put(f"{prefix}/manifestsX/other", b".")
    assert await store.list(f"{prefix}/manifests") == [key]
    await check_replace_and_delete(store, key)


async def test_ranged_stream_from_the_middle_of_3_mb(stack: Settings, prefix: str) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    store, key = ObjectStore.open(uri(stack, f"{prefix}/big.bin"), stack.object_store)
    await store.put(key, data)
    middle = len(data) // 2 + 3
    chunks = await collect(store.stream(key, start=middle, chunk=256 * 1024))
    assert b"".join(chunks) == data[middle:]
    assert {len(c) for c in chunks[:-1]} == {256 * 1024} and 0 < len(chunks[-1]) <= 256 * 1024
    assert await store.read(key, middle, 1000) == data[middle:middle + 1000]
    assert await store.read(key, len(data) - 5, 1000) == data[-5:]


@pytest.mark.parametrize("start", [0, 1, 4_999, 5_000, 5_001, 9_000])
async def test_stream_from_offset_to_end(stack: Settings, prefix: str, start: int) -> None:
    data = os.urandom(5_000)
    store, key = ObjectStore.open(uri(stack, f"{prefix}/o.bin"), stack.object_store)
    await store.put(key, data)
    chunks = await collect(store.stream(key, start=start, chunk=1_000))
    assert b"".join(chunks) == data[start:]
    assert all(0 < len(c) <= 1_000 for c in chunks)


async def test_five_megabytes_stream_back_in_chunks(stack: Settings, prefix: str) -> None:
    data = os.urandom(5 * 1024 * 1024 + 123)
    store, key = ObjectStore.open(uri(stack, f"{prefix}/five.bin"), stack.object_store)
    await store.put(key, data)
    chunks = await collect(store.stream(key, chunk=1 << 20))
    assert len(chunks) == 6 and {len(c) for c in chunks[:-1]} == {1 << 20}
    assert b"".join(chunks) == data


async def test_missing_object_and_bucket(stack: Settings, prefix: str) -> None:
    missing = uri(stack, f"{prefix}/nope.csv")
    store, key = ObjectStore.open(missing, stack.object_store)
    for attempt in (store.head(key), collect(store.stream(key)), store.read(key, 10, 10)):
        with pytest.raises(ObjectNotFound) as err:
            await attempt
        assert err.value.uri == missing
    await store.delete(key)

    other, key = ObjectStore.open(f"s3://no-such-bucket-{prefix}/a.csv", stack.object_store)
    with pytest.raises(ObjectNotFound):
        await other.head(key)
    with pytest.raises(ObjectStoreError):
        await other.put(key, b"x")


async def test_unsigned_and_wrongly_signed_requests_are_refused(stack: Settings,
                                                                 prefix: str) -> None:
    settings = stack.object_store
    store, key = ObjectStore.open(uri(stack, f"{prefix}/secret.csv"), settings)
    await store.put(key, b"kept")

    wrong = settings.model_copy(update={"secret_access_key": SecretStr("not-the-secret")})
    forged, _ = ObjectStore.open(uri(stack, key), wrong)
    unsigned = ObjectStore(S3Store(settings.bucket, endpoint=settings.endpoint,
                                   region=settings.region, skip_signature=True,
                                   client_options={"allow_http": True},
                                   retry_config={"max_retries": 0}),
                           f"s3://{settings.bucket}/")
    for intruder in (forged, unsigned):
        for attempt in (intruder.head(key), intruder.read(key, 0, 4),
                        intruder.put(key, b"overwritten"), intruder.delete(key),
                        intruder.list(prefix)):
            with pytest.raises(ObjectAccessDenied):
                await attempt
    assert await store.read(key, 0, 100) == b"kept"
