"""Campaign manifests read from object storage (``adapters/object_store.py``): their size
and their bytes from an offset, a ranged request per chunk, so a campaign paced to a few
rows a second holds no connection open between chunks.

A manifest belongs to a tenant by where it lies: under ``<manifest_prefix>/<tenant id>/`` of
the manifest bucket (``s3://``) or of ``campaigns.file_root`` (``file://``). Every read
checks that first (:func:`tenant_refusal`), before any request to the store, so a tenant
can neither read another tenant's object nor learn whether it exists or how large it is."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path

from notiflow.adapters.object_store import (
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
    split_uri,
    validate_uri,
)
from notiflow.settings import Settings


class ManifestUnreadable(Exception):
    """The manifest cannot be read: ``reason`` says why (no recipient data)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ManifestNotAllowed(ManifestUnreadable):
    """The manifest is not the tenant's: it lies outside the tenant's own prefix."""


def tenant_location(settings: Settings, tenant_id: str) -> str:
    """Where ``tenant_id``'s ``s3://`` manifests go: ``s3://<bucket>/<prefix>/<tenant>/``."""
    rule = settings.campaigns
    bucket = rule.manifest_bucket or settings.object_store.bucket
    return f"s3://{bucket}/{rule.manifest_prefix}/{tenant_id}/"


def tenant_refusal(settings: Settings, tenant_id: str, uri: str) -> str | None:
    """Why ``uri`` is not a manifest ``tenant_id`` may name (None: it may). Pure: looks at
    the URI and the settings only."""
    rule = settings.campaigns
    try:
        scheme, bucket, key = split_uri(uri)
    except ValueError:
        return None
    if scheme == "file":
        if rule.file_root is None:
            return None
        own = Path(rule.file_root, rule.manifest_prefix, tenant_id).resolve()
        if Path("/", key).resolve().is_relative_to(own):
            return None
        return f"a file:// manifest must lie under {rule.manifest_prefix}/{tenant_id}/ of " \
               "the manifest directory"
    if f"s3://{bucket}/{key}".startswith(tenant_location(settings, tenant_id)):
        return None
    return f"a manifest must be an object under {tenant_location(settings, tenant_id)}"


class Manifests:
    """Size and chunks of manifests named by URI (``s3://`` or ``file://``), each read on
    behalf of the tenant whose manifest it must be."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.chunk = settings.campaigns.chunk_bytes

    def _open(self, uri: str, tenant_id: str) -> tuple[ObjectStore, str]:
        """The store and key of ``uri``: ``s3://``, or ``file://`` under
        ``campaigns.file_root`` when one is configured; :class:`ManifestNotAllowed` when it
        is not under the tenant's prefix."""
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
            opened = ObjectStore.open(uri, self.settings.object_store)
        except ValueError as exc:
            raise ManifestUnreadable(str(exc)) from None
        refusal = tenant_refusal(self.settings, tenant_id, uri)
        if refusal is not None:
            raise ManifestNotAllowed(refusal)
        return opened

    async def size(self, uri: str, tenant_id: str) -> int:
        """The size in bytes of ``tenant_id``'s manifest ``uri``; :class:`ManifestNotAllowed`
        when it is not the tenant's (nothing asked of the store), :class:`ManifestUnreadable`
        when it is missing or its URI is unusable, :class:`ObjectStoreUnavailable` when the
        store does not answer."""
        store, key = self._open(uri, tenant_id)
        try:
            return (await store.head(key)).size
        except ObjectNotFound:
            raise ManifestUnreadable(f"no object at {uri}") from None

    async def chunks(self, uri: str, tenant_id: str, start: int,
                     size: int | None = None) -> AsyncIterator[bytes]:
        """The bytes of ``tenant_id``'s manifest from ``start`` to its end,
        ``campaigns.chunk_bytes`` at a time (refused as :meth:`size` is); ``size``, when the
        caller knows it, saves asking the store."""
        store, key = self._open(uri, tenant_id)
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


    async def write(self, uri: str, tenant_id: str, data: AsyncIterable[bytes]) -> int:
        """Store ``data`` as ``tenant_id``'s manifest ``uri`` (a topic send's snapshot),
        replacing it; its size (refused as :meth:`size` is)."""
        store, key = self._open(uri, tenant_id)
        await store.put(key, data)
        return (await store.head(key)).size


__all__ = ["ManifestNotAllowed", "ManifestUnreadable", "Manifests", "ObjectStoreUnavailable",
           "tenant_location", "tenant_refusal"]
