"""Versioned CQL migrations: ``schemas/cql/NNNN_name.cql`` applied in order, each recorded.

A migration's checksum is stored with it; a file edited after it was applied is refused
(write a new migration instead).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources

from cassandra.cluster import Session

from notiflow.settings import Settings

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.cql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def statements(self, ttl_seconds: int) -> list[str]:
        body = "\n".join(
            line for line in self.text.splitlines() if not line.strip().startswith("--")
        )
        body = body.replace("{ttl}", str(ttl_seconds))
        return [s.strip() for s in re.split(r";\s*(?:\n|$)", body) if s.strip()]


def available() -> list[Migration]:
    folder = resources.files("notiflow.schemas") / "cql"
    found = []
    for entry in folder.iterdir():
        m = _NAME.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text()))
    found.sort(key=lambda mig: mig.version)
    versions = [mig.version for mig in found]
    if len(versions) != len(set(versions)):
        raise RuntimeError(f"duplicate migration versions: {versions}")
    return found


class MigrationError(RuntimeError):
    pass


def apply(session: Session, settings: Settings) -> list[Migration]:
    """Create the keyspace if needed and apply the pending migrations; returns those applied."""
    ks = settings.cassandra_keyspace
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {ks}.schema_migrations ("
        "version int PRIMARY KEY, name text, checksum text, applied_at timestamp)"
    )
    applied = {
        row["version"]: row["checksum"]
        for row in session.execute(f"SELECT version, checksum FROM {ks}.schema_migrations")
    }
    ttl = int(settings.operational_ttl.total_seconds())
    done = []
    for mig in available():
        if mig.version in applied:
            if applied[mig.version] != mig.checksum:
                raise MigrationError(
                    f"migration {mig.version:04d}_{mig.name} changed after it was applied"
                )
            continue
        session.set_keyspace(ks)
        for stmt in mig.statements(ttl):
            session.execute(stmt, timeout=60)
        session.execute(
            f"INSERT INTO {ks}.schema_migrations (version, name, checksum, applied_at) "
            "VALUES (%s, %s, %s, %s)",
            (mig.version, mig.name, mig.checksum, datetime.now(UTC)),
        )
        done.append(mig)
    return done
