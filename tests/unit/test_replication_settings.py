"""Replication as configuration: topic replicas and ``min.insync.replicas`` on the topics
notiflow creates, the keyspace's ``NetworkTopologyStrategy`` map, and the settings' checks."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from notiflow.ops import migrate, topics
from notiflow.settings import Settings


def test_defaults_fit_the_one_node_local_stack() -> None:
    s = Settings()
    assert (s.kafka_replication_factor, s.kafka_min_insync_replicas) == (1, 1)
    assert migrate.replication_cql(s) == (
        "{'class': 'NetworkTopologyStrategy', 'datacenter1': 1}")


def test_replicas_per_data_centre_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFLOW_CASSANDRA_REPLICATION", '{"eu-west": 3, "us_east": 3}')
    s = Settings()
    assert s.cassandra_replication == {"eu-west": 3, "us_east": 3}
    assert migrate.replication_cql(s) == (
        "{'class': 'NetworkTopologyStrategy', 'eu-west': 3, 'us_east': 3}")
    assert migrate.replication(s) == {
        "class": "org.apache.cassandra.locator.NetworkTopologyStrategy",
        "eu-west": "3", "us_east": "3"}


@pytest.mark.parametrize("overrides", [
    {"kafka_replication_factor": 2, "kafka_min_insync_replicas": 3},
    {"cassandra_replication": {}},
    {"cassandra_replication": {"dc1'; DROP": 3}},
    {"cassandra_replication": {"dc1": 0}},
    {"kafka_replication_factor": 0},
])
def test_inconsistent_replication_is_refused(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Settings(**overrides)


class FakeAdmin:
    created: list[Any] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        pass

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(topics={})

    def poll(self, timeout: float) -> int:
        return 0

    def create_topics(self, new: list[Any], **_: Any) -> dict[str, Future[None]]:
        FakeAdmin.created = new
        out: dict[str, Future[None]] = {}
        for t in new:
            fut: Future[None] = Future()
            fut.set_result(None)
            out[t.topic] = fut
        return out


def test_topics_are_created_with_the_configured_replicas(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topics, "AdminClient", FakeAdmin)
    s = Settings(kafka_replication_factor=3, kafka_min_insync_replicas=2)
    names = topics.ensure_topics(s)
    assert set(names) == {spec.name for spec in topics.topic_specs(s)}
    for t in FakeAdmin.created:
        assert t.replication_factor == 3
        assert t.config["min.insync.replicas"] == "2"
    compacted = [t for t in FakeAdmin.created if t.topic == s.preferences_topic]
    assert compacted[0].config["cleanup.policy"] == "compact"
