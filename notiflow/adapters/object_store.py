"""Object storage behind one interface (on ``obstore``): ``file:///abs/dir/key`` on the local
file system (the embedded default), ``s3://bucket/key`` on S3 or any S3-compatible server
(the local stack's SeaweedFS, ``ObjectStoreSettings``). :meth:`ObjectStore.open` splits an
object's URI into the store that holds it (the local file system, or one bucket) and its key.
Failures come out as :class:`ObjectNotFound`, :class:`ObjectAccessDenied`,
:class:`ObjectStoreUnavailable` or their base :class:`ObjectStoreError`, never as the
library's own exceptions."""

from __future__ import annotations

import atexit
import re
import time
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit

import obstore
from obstore.exceptions import (
    BaseError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from obstore.store import LocalStore, S3Store

if TYPE_CHECKING:
    from obstore import GetOptions
    from obstore.store import ClientConfig, RetryConfig, S3Config

    from notiflow.settings import ObjectStoreSettings

SCHEMES = ("file", "s3")
_BUCKET = re.compile(r"^(?!\d+\.\d+\.\d+\.\d+$)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_CLIENT_SIDE = re.compile(r"status code: 4\d\d")
_DENIED = re.compile(r"status code: 40[13]\b")
_EXIT_PAUSE_S = 0.05


def _pause_at_exit() -> None:
    """obstore finishes each request on its own Tokio threads, which may still be busy when
    the interpreter tears down: of 200 processes that read an object and exited at once, 10
    (and in a second run 31) died of SIGABRT; with this pause at exit, none of 2 x 200."""
    time.sleep(_EXIT_PAUSE_S)


atexit.register(_pause_at_exit)


class ObjectStoreError(Exception):
    """An object storage operation failed (base of the errors below)."""


class ObjectNotFound(ObjectStoreError):
    """No object at ``uri``."""

    def __init__(self, uri: str) -> None:
        super().__init__(f"no object at {uri}")
        self.uri = uri


class ObjectAccessDenied(ObjectStoreError):
    """The store refused the request: credentials missing, unknown or not allowed."""


class ObjectStoreUnavailable(ObjectStoreError):
    """The store did not answer (refused connection, timeout, 5xx) after the retries."""


@dataclass(frozen=True)
class ObjectInfo:
    size: int
    etag: str | None
    last_modified: datetime


def _split(uri: str) -> tuple[str, str, str]:
    """``(scheme, bucket, key)`` of an object URI (bucket ``""`` for ``file://``)."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        found = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        raise ValueError(f"{uri!r} has {found}: use file:///absolute/path or s3://bucket/key")
    if parts.query or parts.fragment:
        raise ValueError(f"{uri!r}: an object URI has no query (?) or fragment (#)")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{uri!r}: file:// names a local file (file:///absolute/path), "
                             f"not one on host {parts.netloc!r}")
        bucket = ""
    else:
        bucket = parts.netloc
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise ValueError(f"{uri!r}: {bucket!r} is not a valid bucket name (3-63 lower-case "
                             "letters, digits, '.' and '-')")
    key = unquote(parts.path)[1:]
    if not key or key.endswith("/"):
        raise ValueError(f"{uri!r} names no object (its key is empty or ends with '/')")
    if any(seg in ("", ".", "..") for seg in key.split("/")):
        raise ValueError(f"{uri!r}: empty, '.' or '..' path segments are not allowed")
    return scheme, bucket, key


def split_uri(uri: str) -> tuple[str, str, str]:
    """``(scheme, bucket, key)`` of an object URI (bucket ``""`` for ``file://``; a local key
    is the absolute path without its first ``/``); ValueError as :func:`validate_uri`."""
    return _split(uri)


def validate_uri(uri: str, file_root: str | Path | None = None) -> str:
    """Return ``uri`` if it names an object this module can address, else raise ValueError
    saying why (an API answers 422 with it). With ``file_root``, a ``file://`` URI must lie
    under that directory (so callers cannot name arbitrary local files). Reachability is not
    checked: that needs the store."""
    scheme, _bucket, key = _split(uri)
    if scheme == "file" and file_root is not None:
        root = Path(file_root).resolve()
        if not Path("/", key).resolve().is_relative_to(root):
            raise ValueError(f"{uri!r} is outside the allowed directory {root}")
    return uri


class ObjectStore:
    """The local file system, or one bucket; keys are ``/``-separated, without a leading
    ``/`` (a local key is the absolute path without its first ``/``)."""

    def __init__(self, store: LocalStore | S3Store, base: str) -> None:
        self._store = store
        self._base = base

    @classmethod
    def open(cls, uri: str, settings: ObjectStoreSettings) -> tuple[ObjectStore, str]:
        """``(store, key)`` of the object ``uri`` names; ValueError (with the reason) for a
        URI :func:`validate_uri` refuses. Opening does no I/O."""
        scheme, bucket, key = _split(uri)
        if scheme == "file":
            return cls(LocalStore(), "file:///"), key
        return cls.bucket(bucket, settings), key

    @classmethod
    def bucket(cls, bucket: str, settings: ObjectStoreSettings) -> ObjectStore:
        """An S3 bucket at ``settings.endpoint``, signed with the configured keys (none
        configured: the AWS default chain of ``AWS_*`` variables and instance roles)."""
        config: S3Config = {"endpoint": settings.endpoint, "region": settings.region,
                            "virtual_hosted_style_request": settings.virtual_hosted_style}
        key_id, secret = settings.access_key_id, settings.secret_access_key
        if (key_id is None) != (secret is None):
            raise ValueError("object_store: set both access_key_id and secret_access_key")
        if key_id is not None and secret is not None:
            config["access_key_id"] = key_id.get_secret_value()
            config["secret_access_key"] = secret.get_secret_value()
        client: ClientConfig = {"allow_http": settings.allow_http,
                                "connect_timeout": settings.connect_timeout,
                                "timeout": settings.timeout}
        retry: RetryConfig = {"max_retries": settings.max_retries,
                              "retry_timeout": settings.connect_timeout
                              * (settings.max_retries + 1)}
        store = S3Store(bucket, config=config, client_options=client, retry_config=retry)
        return cls(store, f"s3://{bucket}/")

    def uri(self, key: str) -> str:
        """The URI of ``key`` in this store (inverse of :meth:`open`)."""
        return self._base + quote(key, safe="/")

    def _error(self, exc: Exception, key: str) -> ObjectStoreError:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, FileNotFoundError | NotFoundError):
            return ObjectNotFound(self.uri(key))
        denied = (PermissionDeniedError, UnauthenticatedError, PermissionError)
        if isinstance(exc, denied) or _DENIED.search(detail):
            return ObjectAccessDenied(f"{self._base}: access denied: {detail}")
        if isinstance(self._store, S3Store) and not _CLIENT_SIDE.search(detail):
            return ObjectStoreUnavailable(f"{self._base}: store unavailable: {detail}")
        return ObjectStoreError(f"{self.uri(key)}: {detail}")

    async def put(self, key: str, data: bytes | AsyncIterable[bytes]) -> None:
        """Store ``data`` (bytes, or chunks read as they come) at ``key``, replacing any
        object there; readers see the old or the new object, never a part."""
        try:
            await obstore.put_async(self._store, key, data)
        except (BaseError, OSError) as exc:
            raise self._error(exc, key) from exc

    async def head(self, key: str) -> ObjectInfo:
        """Size, ETag and modification time of ``key``; ObjectNotFound if there is none."""
        try:
            meta = await obstore.head_async(self._store, key)
        except (BaseError, OSError) as exc:
            raise self._error(exc, key) from exc
        return ObjectInfo(meta["size"], meta["e_tag"], meta["last_modified"])

    async def stream(self, key: str, start: int = 0, chunk: int = 1 << 20,
                     end: int | None = None) -> AsyncIterator[bytes]:
        """The bytes of ``key`` from offset ``start`` up to ``end`` (exclusive; None: the end
        of the object), in chunks of ``chunk`` bytes (the last may be shorter), over one
        ranged GET read as it is consumed: at most about two chunks are in memory. Nothing
        when ``start`` is at or past the end. A consumer slower than the ``timeout`` setting
        loses the request (ObjectStoreUnavailable): resume with ``start`` at the offset
        reached. ObjectNotFound if there is no object."""
        if start < 0 or chunk < 1 or (end is not None and end < start):
            raise ValueError("stream: need 0 <= start <= end and chunk >= 1")
        if end == start:
            return
        options: GetOptions = {}
        if end is not None:
            options["range"] = (start, end)
        elif start:
            options["range"] = {"offset": start}
        try:
            result = await obstore.get_async(self._store, key, options=options)
        except (BaseError, OSError) as exc:
            error = self._error(exc, key)
            if type(error) is ObjectStoreError and (await self.head(key)).size <= start:
                return  # the range starts at or past the end: nothing to read
            raise error from exc
        buffer = bytearray()
        try:
            async for piece in result.stream(min_chunk_size=chunk):
                buffer += piece
                while len(buffer) >= chunk:
                    yield bytes(buffer[:chunk])
                    del buffer[:chunk]
        except (BaseError, OSError) as exc:
            raise self._error(exc, key) from exc
        if buffer:
            yield bytes(buffer)

    async def read(self, key: str, start: int, length: int) -> bytes:
        """Up to ``length`` bytes of ``key`` from offset ``start``, in one ranged request
        that holds no connection afterwards (fewer at the end, ``b""`` at or past it)."""
        if length < 1:
            raise ValueError("read: length must be >= 1")
        return b"".join([part async for part in self.stream(key, start, length,
                                                              end=start + length)])

    async def delete(self, key: str) -> None:
        """Remove ``key``; removing an object that is not there is not an error."""
        try:
            await obstore.delete_async(self._store, key)
        except (BaseError, OSError) as exc:
            error = self._error(exc, key)
            if not isinstance(error, ObjectNotFound):
                raise error from exc

    async def list(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix``, sorted, recursively. A prefix matches whole path segments:
        ``a/b`` lists ``a/b/c`` but not ``a/bc``."""
        try:
            found = await obstore.list(self._store, prefix or None).collect_async()
        except (BaseError, OSError) as exc:
            raise self._error(exc, prefix) from exc
        return sorted(meta["path"] for meta in found)
