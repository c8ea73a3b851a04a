"""A migration's checksum covers its statements only, and the whole-file checksums recorded
before are re-recorded once, not refused; no Cassandra."""

from __future__ import annotations

from typing import Any

import pytest

from notiflow.ops import migrate
from notiflow.ops.migrate import (
    FILE_CHECKSUMS,
    Migration,
    MigrationError,
    available,
    recorded_checksum,
)
from notiflow.settings import Settings

TEXT = """-- What the table is for.

CREATE TABLE IF NOT EXISTS t (
    k text PRIMARY KEY,
    v int
) WITH default_time_to_live = {ttl};

-- A column for something.
ALTER TABLE t ADD w text;
"""


def checksum(text: str) -> str:
    return Migration(1, "t", text).checksum


def test_comments_blank_lines_and_whitespace_keep_the_checksum() -> None:
    edited = ("-- Reworded: what the table holds, now.\n-- A second line.\n\n\n"
              "CREATE TABLE IF NOT EXISTS t (\n  k text   PRIMARY KEY,\n\n  v int\n)"
              "  WITH default_time_to_live = {ttl};\n"
              "ALTER TABLE t ADD w text;   \n-- trailing comment\n")
    assert checksum(edited) == checksum(TEXT)
    assert checksum(TEXT.replace("-- A column for something.\n", "")) == checksum(TEXT)


@pytest.mark.parametrize("edit", [
    ("v int", "v bigint"),
    ("ALTER TABLE t ADD w text;", "ALTER TABLE t ADD w int;"),
    ("{ttl}", "86400"),
    ("ALTER TABLE t ADD w text;\n", "ALTER TABLE t ADD w text;\nALTER TABLE t ADD x text;\n"),
    ("PRIMARY KEY", "primary key"),
])
def test_a_statement_edit_changes_the_checksum(edit: tuple[str, str]) -> None:
    assert checksum(TEXT.replace(*edit)) != checksum(TEXT)


def test_the_checksum_is_not_of_the_whole_file() -> None:
    for mig in available():
        assert mig.checksum != FILE_CHECKSUMS.get(mig.version)


def test_every_migration_has_a_recorded_whole_file_checksum() -> None:
    """Every installation may have recorded any of them; a migration added since is checked
    against its statement checksum alone."""
    assert set(FILE_CHECKSUMS) == set(range(1, 14))
    assert set(FILE_CHECKSUMS) <= {mig.version for mig in available()}


def test_the_stored_checksum_decides() -> None:
    legacy = {3: "f" * 64}
    assert recorded_checksum(3, "new", "new", legacy) == "current"
    assert recorded_checksum(3, "f" * 64, "new", legacy) == "rerecord"
    assert recorded_checksum(4, "f" * 64, "new", legacy) == "changed"
    assert recorded_checksum(3, "e" * 64, "new", legacy) == "changed"
    assert recorded_checksum(5, "old", "new", legacy) == "changed"


class Rows(list[dict[str, Any]]):
    class _Future:
        is_schema_agreed = True

    response_future = _Future()

    def one(self) -> dict[str, Any] | None:
        return self[0] if self else None


class FakeSession:
    """Answers the queries of :func:`migrate.apply`: the keyspace's replication as
    configured and ``recorded`` as ``schema_migrations``; records every statement."""

    def __init__(self, settings: Settings, recorded: dict[int, str]) -> None:
        self.settings, self.recorded = settings, recorded
        self.executed: list[tuple[str, Any]] = []

    def execute(self, statement: str, params: Any = None, timeout: float | None = None) -> Rows:
        self.executed.append((statement, params))
        if "system_schema.keyspaces" in statement:
            return Rows([{"replication": migrate.replication(self.settings)}])
        if statement.startswith("SELECT version, checksum"):
            return Rows({"version": v, "checksum": c} for v, c in self.recorded.items())
        return Rows()

    def set_keyspace(self, keyspace: str) -> None:
        pass

    def writes(self) -> list[tuple[str, Any]]:
        return [(s, p) for s, p in self.executed if s.startswith(("UPDATE", "INSERT", "ALTER"))
                or s.startswith("CREATE TABLE IF NOT EXISTS t")]


def one_migration(monkeypatch: pytest.MonkeyPatch, legacy: str) -> Migration:
    mig = Migration(1, "t", TEXT)
    monkeypatch.setattr(migrate, "available", lambda: [mig])
    monkeypatch.setattr(migrate, "FILE_CHECKSUMS", {1: legacy})
    return mig


def test_apply_rerecords_a_whole_file_checksum_once(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    mig = one_migration(monkeypatch, "a" * 64)
    settings = Settings()
    session = FakeSession(settings, {1: "a" * 64})
    with caplog.at_level("INFO", logger="notiflow.ops.migrate"):
        assert migrate.apply(session, settings) == []  # type: ignore[arg-type]
    ks = settings.cassandra_keyspace
    assert session.writes() == [
        (f"UPDATE {ks}.schema_migrations SET checksum = %s WHERE version = %s",
         (mig.checksum, 1))]
    assert "re-recorded" in caplog.text and mig.checksum in caplog.text

    again = FakeSession(settings, {1: mig.checksum})
    assert migrate.apply(again, settings) == []  # type: ignore[arg-type]
    assert again.writes() == []


def test_apply_refuses_any_other_checksum(monkeypatch: pytest.MonkeyPatch) -> None:
    one_migration(monkeypatch, "a" * 64)
    settings = Settings()
    session = FakeSession(settings, {1: "b" * 64})
    with pytest.raises(MigrationError, match="0001_t changed after it was applied"):
        migrate.apply(session, settings)  # type: ignore[arg-type]
    assert session.writes() == []
