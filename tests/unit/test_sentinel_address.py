"""``redis+sentinel://`` URLs (``adapters/redis_pool.py``): sentinels, service, database and
the primary's password; other schemes are plain Redis URLs."""

from __future__ import annotations

import pytest

from notiflow.adapters.redis_pool import SentinelAddress, sentinel_address


def test_a_plain_redis_url_is_not_a_sentinel_address() -> None:
    assert sentinel_address("redis://127.0.0.1:16379/0") is None


def test_sentinels_service_and_database() -> None:
    assert sentinel_address("redis+sentinel://10.0.0.1:26379,sentinel-b:26380/notiflow/2") == (
        SentinelAddress((("10.0.0.1", 26379), ("sentinel-b", 26380)), "notiflow", 2))


def test_the_primarys_password_is_unquoted() -> None:
    address = sentinel_address("redis+sentinel://:p%40ss@127.0.0.1:26379/notiflow")
    assert address == SentinelAddress((("127.0.0.1", 26379),), "notiflow", 0, "p@ss")


@pytest.mark.parametrize("url", [
    "redis+sentinel:///notiflow",
    "redis+sentinel://127.0.0.1:26379",
    "redis+sentinel://127.0.0.1:26379/notiflow/x",
    "redis+sentinel://127.0.0.1/notiflow",
    "redis+sentinel://127.0.0.1:26379/a/1/2",
])
def test_incomplete_sentinel_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        sentinel_address(url)
