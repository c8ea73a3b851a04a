"""The object store: SeaweedFS's ``weed`` in one process (master, volume server, filer, S3
gateway) on loopback, built once with the Go toolchain, its bucket made once healthy."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from notiflow.ops.stack.base import Component, Paths, StackError
from notiflow.ops.stack.process import port_open, run_async
from notiflow.settings import Settings

GRPC_OFFSET = 10_000
"""SeaweedFS serves each HTTP port's gRPC on that port + 10000 (its default, passed
explicitly): 28333, 29333, 28380, 28888 with the default ports."""
WEED_MODULE = "github.com/seaweedfs/seaweedfs/weed"


def weed(s: Settings, p: Paths) -> Path:
    """Where the pinned ``weed`` binary lives once built."""
    return p.cache / "bin" / f"weed-{s.object_store.seaweedfs_version}"


def build_weed(s: Settings, p: Paths, log: Callable[[str], None]) -> None:
    """Build SeaweedFS's ``weed`` once with the Go toolchain from the Go module proxy, in a
    throw-away module (``ops/go/``: ``go install`` refuses SeaweedFS's module, whose
    go.mod has a replace directive). The Go build cache makes a rebuild quick."""
    target, version = weed(s, p), s.object_store.seaweedfs_version
    if target.exists():
        return
    go = shutil.which("go")
    if not go:
        raise StackError("the Go toolchain (go, 1.26.6 or newer) is not on PATH: it builds "
                         f"SeaweedFS's weed {version} for the local S3 store")
    log(f"building SeaweedFS weed {version} into {target} (once; minutes) ...")
    target.parent.mkdir(parents=True, exist_ok=True)
    src = resources.files("notiflow.ops") / "go"
    with tempfile.TemporaryDirectory(prefix=".weed-build-", dir=target.parent) as tmp:
        (Path(tmp) / "go.mod").write_text((src / "weed-go.mod").read_text())
        (Path(tmp) / "tools.go").write_text((src / "weed-tools.go").read_text())
        built = Path(tmp) / "weed"
        for cmd in ([go, "get", f"{WEED_MODULE}@{version}"],
                    [go, "build", "-o", str(built), WEED_MODULE]):
            done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
            if done.returncode != 0:
                raise StackError(f"`go {cmd[1]}` of SeaweedFS's weed {version} failed:\n"
                                 f"{done.stderr[-3000:]}")
        built.replace(target)


def credentials(s: Settings, p: Paths) -> tuple[str, str]:
    """The access key id and secret the local S3 gateway accepts: the configured ones, else
    the stack directory's generated pair (``devenv.object_store_credentials``)."""
    o = s.object_store
    if o.access_key_id is not None and o.secret_access_key is not None:
        return o.access_key_id.get_secret_value(), o.secret_access_key.get_secret_value()
    from notiflow.devenv import object_store_credentials

    env = object_store_credentials(p.root)
    return (env["NOTIFLOW_OBJECT_STORE__ACCESS_KEY_ID"],
            env["NOTIFLOW_OBJECT_STORE__SECRET_ACCESS_KEY"])


def probe(s: Settings, p: Paths, key: str) -> str:
    """One signed request to the local gateway: ``ok``, ``missing`` (it answered that the
    object or bucket is not there), ``denied`` or ``down``."""
    from datetime import timedelta

    from pydantic import SecretStr

    from notiflow.adapters.object_store import (
        ObjectAccessDenied,
        ObjectNotFound,
        ObjectStore,
        ObjectStoreError,
    )

    o = s.object_store
    key_id, secret = credentials(s, p)
    local = o.model_copy(update={
        "endpoint": f"http://127.0.0.1:{o.s3_port}", "allow_http": True,
        "access_key_id": SecretStr(key_id), "secret_access_key": SecretStr(secret),
        "connect_timeout": timedelta(seconds=2), "timeout": timedelta(seconds=10),
        "max_retries": 0})
    try:
        run_async(ObjectStore.bucket(o.bucket, local).head(key))
    except ObjectNotFound:
        return "missing"
    except ObjectAccessDenied:
        return "denied"
    except ObjectStoreError:
        return "down"
    return "ok"


def filer_toml(data: Path) -> str:
    """The filer's store: weed's default (leveldb2 under ``data``) with small buffers; its
    defaults, 8 partitions x (16 MB memtable + 32 MB block cache), made a heap of 250 MB and
    320 MB resident."""
    return (f'[leveldb2]\nenabled = true\ndir = "{data / "filerldb2"}"\n'
            "write_buffer_size_mb = 2\nblock_cache_size_mb = 4\n")


def identities(key_id: str, secret: str) -> str:
    """The gateway's ``-s3.config``: one identity, ``notiflow``, that may read, write, list
    and tag with this key pair."""
    return json.dumps({"identities": [{
        "name": "notiflow",
        "credentials": [{"accessKey": key_id, "secretKey": secret}],
        "actions": ["Read", "Write", "List", "Tagging"]}]}, indent=2)


def component(s: Settings, p: Paths, log: Callable[[str], None]) -> Component:
    """Loopback only, small volumes; requests must be signed with :func:`credentials`."""
    o = s.object_store
    data = p.run / "seaweedfs"
    identities_file = p.conf / "s3-identities.json"
    config_dir = p.conf / "seaweedfs"

    def prepare() -> None:
        data.mkdir(parents=True, exist_ok=True)
        config_dir.mkdir(exist_ok=True)
        (config_dir / "filer.toml").write_text(filer_toml(data))
        key_id, secret = credentials(s, p)
        identities_file.touch(mode=0o600)
        identities_file.chmod(0o600)
        identities_file.write_text(identities(key_id, secret))

    def start() -> list[str]:
        exe = weed(s, p)
        if not exe.exists():
            raise StackError(f"SeaweedFS's weed {o.seaweedfs_version} is not built: run "
                             "`notiflow stack fetch` (needs the Go toolchain on PATH)")
        g = GRPC_OFFSET
        return [str(exe), f"-config_dir={config_dir}", "server",
                "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}",
                f"-master.port={o.master_port}", f"-master.port.grpc={o.master_port + g}",
                "-master.volumeSizeLimitMB=64", "-master.telemetry=false",
                f"-volume.port={o.volume_port}", f"-volume.port.grpc={o.volume_port + g}",
                "-volume.max=64", "-volume.preStopSeconds=1",
                "-filer", f"-filer.port={o.filer_port}",
                f"-filer.port.grpc={o.filer_port + g}",
                "-s3", f"-s3.port={o.s3_port}", f"-s3.port.grpc={o.s3_port + g}",
                f"-s3.config={identities_file}", "-s3.autoCreateBucket=false",
                "-s3.port.iceberg=0", "-s3.port.lance=0"]

    def healthy() -> bool:
        return port_open(o.s3_port) and probe(s, p, "notiflow-health") in ("ok", "missing")

    def create_bucket() -> None:
        shell = subprocess.run(
            [str(weed(s, p)), "shell", f"-master=127.0.0.1:{o.master_port}",
             f"-filer=127.0.0.1:{o.filer_port}"],
            input=f"s3.bucket.create -name {o.bucket}\nexit\n", capture_output=True,
            text=True, timeout=120)
        out = shell.stdout + shell.stderr
        if shell.returncode != 0 and "already exists" not in out:
            raise StackError(f"s3: creating bucket {o.bucket} failed:\n{out[-2000:]}")
        log(f"s3: bucket {o.bucket} {'ok' if shell.returncode else 'created'}")

    ports = (o.master_port, o.volume_port, o.filer_port)
    return Component("s3", o.s3_port,
                     (*ports, *(port + GRPC_OFFSET for port in (o.s3_port, *ports))),
                     start, healthy, prepare,
                     env={"GOMEMLIMIT": f"{o.memory_limit_mb}MiB"},
                     after_healthy=create_bucket)
