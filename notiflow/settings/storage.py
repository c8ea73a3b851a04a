"""Object storage (``s3://`` and ``file://`` URIs, the local stack's SeaweedFS) and the
history archive kept in it."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, SecretStr

from notiflow.settings.section import _Frozen


class ArchiveSettings(_Frozen):
    """The history archive (``notiflow/archive.py``, ``notiflow archive``) and what ``notiflow
    report`` reads."""

    uri: str = "s3://notiflow/archive"
    """Where the archive lives: ``s3://bucket/prefix`` or ``file:///abs/dir``."""
    settle: timedelta = timedelta(days=2)
    """How old a day must be before it is archived: its retries, receipts and expiries are
    done (and it is still well inside ``operational_ttl``)."""
    slice: int = Field(2000, ge=1, le=100_000)
    """Messages read and encoded at a time (a Parquet row group each)."""
    concurrency: int = Field(64, ge=1, le=1024)
    """Most Cassandra reads in flight (P0's latency signal narrows it, ``bulk_yield``)."""


class ObjectStoreSettings(_Frozen):
    """Object storage (``adapters/object_store.py``): ``file://`` URIs need nothing, ``s3://``
    URIs go to ``endpoint`` signed with these credentials (unset: the AWS default chain,
    ``AWS_ACCESS_KEY_ID`` or an instance role). The local stack serves ``endpoint`` with
    SeaweedFS (``weed server -s3``) on the ports below, all on loopback."""

    endpoint: str = "http://127.0.0.1:18333"
    region: str = "us-east-1"
    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
    allow_http: bool = True
    """Whether a plain ``http://`` endpoint is allowed (the local stack's)."""
    virtual_hosted_style: bool = False
    """``bucket.host`` requests instead of ``host/bucket`` (then ``endpoint`` names the
    bucket); path style suits SeaweedFS, MinIO and AWS alike."""
    connect_timeout: timedelta = timedelta(seconds=5)
    timeout: timedelta = timedelta(minutes=5)
    """Longest a request may take, reading its body included (a slow reader of a stream
    loses it after this and resumes from its offset)."""
    max_retries: int = Field(3, ge=0, le=20)
    """Retries of a failed request (with backoff) before the store counts as unavailable."""
    bucket: str = "notiflow"
    """The bucket ``notiflow stack up`` creates."""
    seaweedfs_version: str = "v0.0.0-20261109003541-7506e5f91cd6"
    """Go module version of ``github.com/seaweedfs/seaweedfs`` that ``notiflow stack fetch``
    builds ``weed`` from (SeaweedFS 4.53)."""
    s3_port: int = 18333
    master_port: int = 19333
    volume_port: int = 18380
    filer_port: int = 18888
    """HTTP ports of the local SeaweedFS; each serves gRPC on its port + 10000."""
    memory_limit_mb: int = Field(512, ge=256)
    """Soft memory limit of the local SeaweedFS process (``GOMEMLIMIT``). Its filer keeps
    about 130 MB of heap from the start (metadata log buffers, LevelDB memtables), and a limit
    close to the live heap keeps the collector running while idle (with LevelDB's default
    buffers, 250 MB of heap under a 256 MB limit: 6 % of a core)."""
