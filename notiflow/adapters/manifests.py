"""Campaign manifests read from object storage (``adapters/object_store.py``): their size
and their bytes from an offset, a ranged request per chunk, so a campaign paced to a few
rows a second holds no connection open between chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator

from notiflow.adapters.object_store import (
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
    validate_uri,
)
from notiflow.settings import Settings


class ManifestUnreadable(Exception):
    """The manifest cannot be read: ``reason`` says why (no recipient data)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Manifests:
    """Size and chunks of manifests named by URI (``s3://`` or ``file://``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.chunk = settings.campaigns.chunk_bytes

    def _open(self, uri: str) -> tuple[ObjectStore, str]:
        """The store and key of ``uri``: ``s3://``, or ``file://`` under
        ``campaigns.file_root`` when one is configured."""
        root = self.settings.campaigns.file_root
        try:
            if uri.startswith("file:"):
                if root is None:
                    raise ManifestUnreadable("file:// manifests are not enabled here; use "
                                             "an s3:// URI")
                try:
                    validate_uri(uri, root)
                except ValueError:
                    raise ManifestUnreadable("the file:// manifest is outside the directory "
                                             "manifests are read from") from None
            return ObjectStore.open(uri, self.settings.object_store)
        except ValueError as exc:
            raise ManifestUnreadable(str(exc)) from None

    async def size(self, uri: str) -> int:
        """The manifest's size in bytes; :class:`ManifestUnreadable` when it is missing or
        its URI is unusable, :class:`ObjectStoreUnavailable` when the store does not
        answer."""
        store, key = self._open(uri)
        try:
            return (await store.head(key)).size
        except ObjectNotFound:
            raise ManifestUnreadable(f"no object at {uri}") from None

    async def chunks(self, uri: str, start: int,
                     size: int | None = None) -> AsyncIterator[bytes]:
        """The manifest's bytes from ``start`` to its end, ``campaigns.chunk_bytes`` at a
        time; ``size``, when the caller knows it, saves asking the store."""
        store, key = self._open(uri)
        try:
            if size is None:
                size = (await store.head(key)).size
            at = start
            while at < size:
                data = await store.read(key, at, min(self.chunk, size - at))
                if not data:
                    return
                at += len(data)
                yield data
        except ObjectNotFound:
            raise ManifestUnreadable(f"no object at {uri}") from None


__all__ = ["ManifestUnreadable", "Manifests", "ObjectStoreUnavailable"]
