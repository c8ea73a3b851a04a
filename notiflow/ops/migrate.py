"""Versioned CQL migrations: ``schemas/cql/NNNN_name.cql`` applied in order, each recorded.

A migration's checksum (of its statements, not its comments) is stored with it; a migration
whose statements changed after it was applied is refused (write a new migration instead).
Its comments may be edited freely.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any, Literal, cast

from cassandra.cluster import Session

from notiflow.settings import Settings

log = logging.getLogger("notiflow.ops.migrate")

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.cql$")

FILE_CHECKSUMS: dict[int, str] = {
    1: "ca687bd07f1dd2f92acf524de2171bb7ca5ab394894fedd4a14484cb87b7c9d4",
    2: "4c3ae06298dbf10447a9122294bfb9c9e7393e898f2fa1e5a7daac1e69f0786e",
    3: "ff7af3003f9a3eddf4d2201e435858e9964ca7ad29c1cb88f92899ab9944f49a",
    4: "79bf5acf1215aba94986a08f4bac4829f1035e0317c9db04548020ca4e655c31",
    5: "acd0a7fc0a09996d89df76f6960c436429d5d403e6bb05b672360423876f895d",
    6: "77a48bfd0dd705a537a58c71e49a3debe342064b8a991019fe74aa91f94b824b",
    7: "6400512a9da3765c77d27c83a13ed2d22daea0d565c9a0238a6fb242d2dcfc83",
    8: "b33b14ff29c59fe9296500c0ac21750ab6971f906e958c8e455dca85bdd96a8b",
    9: "60d735feb54ac32a9e1ec794721bc0f22c9e34b50c869e07afe6327564deb6d0",
    10: "1ed3150f1add5edcdb6eae02d500ef3632267bf0cb0646f04135fa8cc8f327e8",
    11: "b1be1c1fbcd51a9321aabd0b248b37291db44ad790a26d69661c8adccec915ac",
    12: "87f3e61fde35e35021d133c10847bb935c4abaa35205573243cdb852e1eca425",
    13: "1550ad0a7de79ba922cc2752fa2e137abf79c9fae89b92d2d67e2cb091396f1d",
}
"""Version → the whole-file sha256 an installation may hold for that migration in
``schema_migrations`` (of the file's text up to its comment rewrite). A stored checksum found
here is replaced by the statement checksum once (:func:`recorded_checksum`); these values
never change."""

Recorded = Literal["current", "rerecord", "changed"]


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        """sha256 of the statements only: comment lines and blank lines dropped, each run
        of whitespace (also inside a statement's string literals) one space, ``{ttl}``
        unsubstituted. A comment edit keeps it; any statement edit changes it."""
        normalised = ";\n".join(" ".join(s.split()) for s in self._split(self.text))
        return hashlib.sha256(normalised.encode()).hexdigest()

    def statements(self, ttl_seconds: int) -> list[str]:
        return self._split(self.text.replace("{ttl}", str(ttl_seconds)))

    @staticmethod
    def _split(text: str) -> list[str]:
        """The statements of ``text``: its ``--`` comment lines dropped, split at a ``;``
        that ends a line."""
        body = "\n".join(line for line in text.splitlines() if not line.strip().startswith("--"))
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


def recorded_checksum(version: int, stored: str, checksum: str,
                      file_checksums: dict[int, str]) -> Recorded:
    """How an applied migration's ``stored`` checksum compares with its ``checksum`` now:
    ``current`` (equal), ``rerecord`` (``file_checksums`` holds it for ``version``: store
    ``checksum`` in its place) or ``changed`` (anything else: refused)."""
    if stored == checksum:
        return "current"
    if file_checksums.get(version) == stored:
        return "rerecord"
    return "changed"


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
            recorded = recorded_checksum(mig.version, applied[mig.version], mig.checksum,
                                         FILE_CHECKSUMS)
            if recorded == "changed":
                raise MigrationError(
                    f"migration {mig.version:04d}_{mig.name} changed after it was applied"
                )
            if recorded == "rerecord":
                session.execute(
                    f"UPDATE {ks}.schema_migrations SET checksum = %s WHERE version = %s",
                    (mig.checksum, mig.version))
                log.warning("migration %04d_%s: whole-file checksum %s re-recorded as "
                            "statement checksum %s (once)", mig.version, mig.name,
                            applied[mig.version], mig.checksum)
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
