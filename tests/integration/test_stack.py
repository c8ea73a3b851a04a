"""The local stack: health, topics, and migrations applied once and recorded."""

from __future__ import annotations

import pytest
from cassandra.cluster import Session

from notiflow.ops.migrate import Migration, MigrationError, apply, available
from notiflow.ops.stack import Stack
from notiflow.ops.topics import delete_topics, ensure_topics, topic_specs
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings
from tests.helpers import read_topic

pytestmark = pytest.mark.integration


def test_status_reports_every_component_healthy(stack: Settings) -> None:
    local = Stack(stack, log=lambda _m: None)
    status = local.status()
    kinds = ["redis", *(["kafka"] * local.nodes), *(["cassandra"] * local.nodes), "s3"]
    assert [(name.split("-")[0], healthy) for name, _pid, _port, healthy in status] == [
        (kind, True) for kind in kinds]


def test_topics_and_keyspace_have_the_configured_replicas(stack: Settings,
                                                          cql: Session) -> None:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": stack.kafka_bootstrap}).list_topics(timeout=10)
    topic = md.topics[stack.ingest_topic("SMS", "P0")]
    assert {len(p.replicas) for p in topic.partitions.values()} == {
        stack.kafka_replication_factor}
    assert len(md.brokers) >= stack.kafka_replication_factor
    row = cql.execute("SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s",
                      (stack.cassandra_keyspace,)).one()
    assert row is not None
    replication = dict(row["replication"])
    assert replication.pop("class").endswith("NetworkTopologyStrategy")
    assert {dc: int(rf) for dc, rf in replication.items()} == stack.cassandra_replication


def test_up_is_idempotent(stack: Settings) -> None:
    lines: list[str] = []
    Stack(stack, log=lines.append).up()
    assert any("already running" in line for line in lines)
    assert "kafka: topics ok" in lines and "cassandra: schema ok" in lines


def test_every_design_topic_exists(stack: Settings) -> None:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": stack.kafka_bootstrap}).list_topics(timeout=10)
    names = {s.name for s in topic_specs(stack)}
    assert len(names) == 4 * len(Channel) + 1 + 5 + 6
    assert {stack.preferences_topic, stack.users_topic} <= names
    assert names <= set(md.topics)
    assert len(md.topics[stack.ingest_topic("SMS", "P0")].partitions) == stack.ingest_partitions
    list(read_topic(stack, stack.preferences_topic, timeout=2))


def test_delete_topics_removes_only_one_prefix(stack: Settings) -> None:
    from confluent_kafka.admin import AdminClient

    doomed = stack.model_copy(update={"topic_prefix": f"{stack.topic_prefix}doomed."})
    kept = stack.model_copy(update={"topic_prefix": f"{stack.topic_prefix}kept."})
    ensure_topics(doomed)
    ensure_topics(kept)
    deleted = delete_topics(doomed)
    assert deleted == sorted(s.name for s in topic_specs(doomed))
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    left = set(admin.list_topics(timeout=10).topics)
    assert not any(t.startswith(doomed.topic_prefix) for t in left)
    assert {s.name for s in topic_specs(kept)} <= left
    assert {s.name for s in topic_specs(stack)} <= left
    with pytest.raises(ValueError, match="non-empty prefix"):
        delete_topics(stack, prefix="")


def test_migrations_recorded_and_not_reapplied(stack: Settings, cql: Session) -> None:
    rows = {r["version"]: r for r in cql.execute("SELECT * FROM schema_migrations")}
    assert sorted(rows) == [m.version for m in available()]
    assert rows[1]["checksum"] == available()[0].checksum
    assert apply(cql, stack) == []


def test_edited_migration_is_refused(stack: Settings, cql: Session,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    original = available()
    edited = [Migration(m.version, m.name, m.text + "\nALTER TABLE messages ADD edited text;")
              for m in original]
    monkeypatch.setattr("notiflow.ops.migrate.available", lambda: edited)
    with pytest.raises(MigrationError, match="changed after it was applied"):
        apply(cql, stack)


def test_a_comment_edit_is_not_a_change(stack: Settings, cql: Session,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    edited = [Migration(m.version, m.name, f"-- reworded\n\n{m.text}\n-- edited\n")
              for m in available()]
    monkeypatch.setattr("notiflow.ops.migrate.available", lambda: edited)
    assert apply(cql, stack) == []


def test_statements_split_and_ttl_substituted() -> None:
    mig = available()[0]
    stmts = mig.statements(2_592_000)
    assert all(s.upper().startswith("CREATE TABLE") for s in stmts)
    assert "{ttl}" not in " ".join(stmts) and "2592000" in " ".join(stmts)


def test_port_in_use_is_a_clear_error(stack: Settings, tmp_path) -> None:
    import socket

    from notiflow.ops.stack import StackError

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        other = stack.model_copy(update={"redis_port": port, "stack_dir": tmp_path})
        with pytest.raises(StackError, match=f"port {port} is already in use on 127.0.0.1"
                           ) as refused:
            Stack(other, log=lambda _m: None).up()
    assert str(tmp_path.resolve()) in str(refused.value)
    assert "NOTIFLOW_STACK_DIR" in str(refused.value)


def test_missing_java_is_a_clear_error(stack: Settings, tmp_path) -> None:
    from notiflow.ops.stack import StackError
    from notiflow.ops.stack.jvm import java

    with pytest.raises(StackError, match="Java not found"):
        java(stack.model_copy(update={"java_home": tmp_path / "no-jdk"}))
