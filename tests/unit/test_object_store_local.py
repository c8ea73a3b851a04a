"""Object storage on the local file system (``file://``): the contracts of
``adapters/object_store.py`` (put, head, ranged streams and reads, list, delete), its errors
(missing object, unusable URI, unreachable S3 endpoint) and that a 5 MB object streams back
in bounded chunks."""

from __future__ import annotations

import os
from collections.abc import AsyncIterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from notiflow.adapters.object_store import (
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
    validate_uri,
)
from notiflow.devenv import free_port
from notiflow.settings import ObjectStoreSettings
from tests.object_store_checks import check_replace_and_delete, check_round_trip, collect

SETTINGS = ObjectStoreSettings()


def opened(path: Path) -> tuple[ObjectStore, str]:
    return ObjectStore.open(path.as_uri(), SETTINGS)


async def test_put_head_stream_list_delete(tmp_path: Path) -> None:
    store, key = opened(tmp_path / "manifests" / "m1.csv")
    assert key == str(tmp_path / "manifests" / "m1.csv").lstrip("/")
    before = datetime.now(UTC) - timedelta(seconds=2)
    assert (await check_round_trip(store, key)).last_modified >= before
    assert await store.list(str(tmp_path / "manifests").lstrip("/")) == [key]
    await check_replace_and_delete(store, key)


@pytest.mark.parametrize("start", [0, 1, 499, 500, 999, 1000, 1001, 5000])
async def test_stream_from_offset_to_end(tmp_path: Path, start: int) -> None:
    data = os.urandom(1000)
    store, key = opened(tmp_path / "o.bin")
    await store.put(key, data)
    chunks = await collect(store.stream(key, start=start, chunk=64))
    assert b"".join(chunks) == data[start:]
    assert all(len(c) == 64 for c in chunks[:-1]) and all(0 < len(c) <= 64 for c in chunks)


async def test_read_is_one_bounded_range(tmp_path: Path) -> None:
    data = bytes(range(256)) * 4
    store, key = opened(tmp_path / "r.bin")
    await store.put(key, data)
    assert await store.read(key, 10, 5) == data[10:15]
    assert await store.read(key, 1000, 100) == data[1000:]
    assert await store.read(key, 1024, 10) == b""
    assert b"".join(await collect(store.stream(key, 100, 7, end=130))) == data[100:130]


async def test_five_megabytes_stream_back_in_chunks(tmp_path: Path) -> None:
    data = os.urandom(5 * 1024 * 1024 + 123)
    store, key = opened(tmp_path / "big.bin")
    await store.put(key, data)
    chunks = await collect(store.stream(key, chunk=1 << 20))
    assert len(chunks) == 6 and {len(c) for c in chunks[:-1]} == {1 << 20}
    assert b"".join(chunks) == data


async def test_put_from_async_chunks(tmp_path: Path) -> None:
    async def parts() -> AsyncIterable[bytes]:
        for i in range(5):
            yield f"row{i}\n".encode()

    store, key = opened(tmp_path / "deep" / "er" / "rows.csv")
    await store.put(key, parts())
    assert await store.read(key, 0, 100) == b"row0\nrow1\nrow2\nrow3\nrow4\n"


async def test_missing_object(tmp_path: Path) -> None:
    store, key = opened(tmp_path / "nope.csv")
    uri = (tmp_path / "nope.csv").as_uri()
    for attempt in (store.head(key), collect(store.stream(key)), store.read(key, 5, 5)):
        with pytest.raises(ObjectNotFound) as err:
            await attempt
        assert err.value.uri == uri and uri in str(err.value)
    await store.delete(key)


async def test_list_matches_whole_segments(tmp_path: Path) -> None:
    store, base = opened(tmp_path / "x")
    for name in ("a/1", "a/b/2", "ab/3"):
        await store.put(f"{base}/{name}", b".")
    assert await store.list(f"{base}/a") == [f"{base}/a/1", f"{base}/a/b/2"]
    assert await store.list(f"{base}/nothing") == []


async def test_uri_round_trip_with_odd_characters(tmp_path: Path) -> None:
    store, key = opened(tmp_path / "with space" / "100%.csv")
    await store.put(key, b"x")
    again, same = ObjectStore.open(store.uri(key), SETTINGS)
    assert same == key and await again.read(same, 0, 1) == b"x"


@pytest.mark.parametrize("uri, reason", [
    ("http://example.com/a.csv", "scheme 'http'"),
    ("ftp://host/a.csv", "scheme 'ftp'"),
    ("/plain/path.csv", "no scheme"),
    ("s3://Bad_Bucket/a.csv", "not a valid bucket"),
    ("s3://ab/a.csv", "not a valid bucket"),
    ("s3://192.168.1.1/a.csv", "not a valid bucket"),
    ("s3://bucket", "names no object"),
    ("s3://bucket/dir/", "names no object"),
    ("file://otherhost/a.csv", "not one on host"),
    ("file:///a/../etc/passwd", "'..'"),
    ("s3://bucket/a//b", "empty"),
    ("s3://bucket/a.csv?versionId=1", "no query"),
])
def test_unusable_uris_say_why(uri: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("?", r"\?")):
        validate_uri(uri)
    with pytest.raises(ValueError, match=reason.replace("?", r"\?")):
        ObjectStore.open(uri, SETTINGS)


def test_valid_uris_and_file_root(tmp_path: Path) -> None:
    assert validate_uri("s3://notiflow/manifests/a.csv") == "s3://notiflow/manifests/a.csv"
    assert validate_uri("file:///srv/data/a.csv")
    inside = (tmp_path / "m" / "a.csv").as_uri()
    assert validate_uri(inside, file_root=tmp_path) == inside
    with pytest.raises(ValueError, match="outside the allowed directory"):
        validate_uri("file:///etc/passwd", file_root=tmp_path)


def test_half_configured_credentials_are_refused() -> None:
    half = ObjectStoreSettings(access_key_id="AKIA0")
    with pytest.raises(ValueError, match="both access_key_id and secret_access_key"):
        ObjectStore.open("s3://notiflow/a.csv", half)


async def test_unreachable_s3_endpoint_is_unavailable() -> None:
    dead = ObjectStoreSettings(endpoint=f"http://127.0.0.1:{free_port()}", max_retries=0,
                               access_key_id="k", secret_access_key="s")
    store, key = ObjectStore.open("s3://notiflow/a.csv", dead)
    for attempt in (store.head(key), store.put(key, b"x"), store.list("")):
        with pytest.raises(ObjectStoreUnavailable, match="s3://notiflow/"):
            await attempt
