"""Versioned CQL migrations: ``schemas/cql/NNNN_name.cql`` applied in order, each recorded.

A migration's checksum is stored with it; a file edited after it was applied is refused
(write a new migration instead).
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any, cast

from cassandra.cluster import Session

from notiflow.settings import Settings

log = logging.getLogger("notiflow.ops.migrate")

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


def replication(settings: Settings) -> dict[str, str]:
    """The keyspace's replication map as Cassandra reports it
    (``system_schema.keyspaces``): ``NetworkTopologyStrategy`` with
    ``cassandra_replication``'s replicas per data centre."""
    return {"class": "org.apache.cassandra.locator.NetworkTopologyStrategy",
            **{dc: str(rf) for dc, rf in sorted(settings.cassandra_replication.items())}}


def replication_cql(settings: Settings) -> str:
    """``replication`` as a CQL map literal."""
    pairs = ", ".join(f"'{dc}': {rf}" for dc, rf in sorted(settings.cassandra_replication.items()))
    return "{'class': 'NetworkTopologyStrategy', " + pairs + "}"


def check_replication(session: Session, settings: Settings) -> bool:
    """Whether the keyspace is replicated as configured; logs the ``ALTER KEYSPACE`` to run
    (then a full repair) when it is not. Changing an existing keyspace's replicas is left to
    an operator: it moves data between nodes."""
    ks = settings.cassandra_keyspace
    row = session.execute("SELECT replication FROM system_schema.keyspaces "
                          "WHERE keyspace_name = %s", (ks,)).one()
    current = dict(row["replication"]) if row else {}
    if current == replication(settings):
        return True
    log.warning("keyspace %s is replicated as %s, not as configured; run ALTER KEYSPACE %s "
                "WITH replication = %s, then nodetool repair -full %s", ks, current, ks,
                replication_cql(settings), ks)
    return False


SCHEMA_AGREEMENT_S = 60.0


def ddl(session: Session, statement: str) -> None:
    """Run a schema change and wait until every live node has it (the driver waits 10 s by
    default; nodes that joined a moment ago took longer, and a read of the new table then
    failed with ``INCOMPATIBLE_SCHEMA``)."""
    result = session.execute(statement, timeout=60)
    if result.response_future.is_schema_agreed:
        return
    control: Any = cast(Any, session).cluster.control_connection
    if not control.wait_for_schema_agreement(wait_time=SCHEMA_AGREEMENT_S):
        raise MigrationError(f"nodes disagree on the schema {SCHEMA_AGREEMENT_S:.0f} s "
                             f"after: {statement[:80]}")


def apply(session: Session, settings: Settings) -> list[Migration]:
    """Create the keyspace if needed (replicated as ``cassandra_replication`` says:
    :func:`check_replication`) and apply the pending migrations; returns those applied."""
    ks = settings.cassandra_keyspace
    ddl(session,
        f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {replication_cql(settings)}")
    check_replication(session, settings)
    ddl(session,
        f"CREATE TABLE IF NOT EXISTS {ks}.schema_migrations ("
        "version int PRIMARY KEY, name text, checksum text, applied_at timestamp)")
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
            ddl(session, stmt)
        session.execute(
            f"INSERT INTO {ks}.schema_migrations (version, name, checksum, applied_at) "
            "VALUES (%s, %s, %s, %s)",
            (mig.version, mig.name, mig.checksum, datetime.now(UTC)),
        )
        done.append(mig)
    return done
