"""The shape of a local stack of several nodes (``ops/cluster.py``) and how ``Stack`` builds
its components from it; nothing is started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from notiflow.ops import cluster
from notiflow.ops.stack import Stack, StackError
from notiflow.settings import Settings


def props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(stack_dir=tmp_path / "stack", cache_dir=tmp_path / "cache")


def test_one_node_keeps_the_defaults(settings: Settings) -> None:
    assert cluster.client_env(settings, 1) == {}
    assert cluster.cluster_settings(settings, 1) is settings
    assert cluster.initial_token(1, 1) == 0
    p = props(cluster.kafka_properties(settings, 1, 1, Path("/data")))
    assert p["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert p["min.insync.replicas"] == p["offsets.topic.replication.factor"] == "1"


def test_three_nodes_replicate_three_times_and_tolerate_one_loss(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    env = cluster.client_env(settings, 3)
    assert env["NOTIFLOW_KAFKA_BOOTSTRAP"] == (
        "127.0.0.1:19092,127.0.0.2:19092,127.0.0.3:19092")
    assert (env["NOTIFLOW_KAFKA_REPLICATION_FACTOR"],
            env["NOTIFLOW_KAFKA_MIN_INSYNC_REPLICAS"]) == ("3", "2")
    assert json.loads(env["NOTIFLOW_CASSANDRA_HOSTS"]) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert json.loads(env["NOTIFLOW_CASSANDRA_REPLICATION"]) == {"datacenter1": 3}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    loaded = Settings()
    direct = cluster.cluster_settings(settings, 3)
    for field in ("kafka_bootstrap", "kafka_replication_factor", "kafka_min_insync_replicas",
                  "cassandra_hosts", "cassandra_replication", "cassandra_dc"):
        assert getattr(loaded, field) == getattr(direct, field), field


def test_every_broker_votes_and_listens_on_its_own_address(settings: Settings) -> None:
    for node in (1, 2, 3):
        p = props(cluster.kafka_properties(settings, node, 3, Path(f"/d/{node}")))
        assert p["node.id"] == str(node)
        assert p["controller.quorum.voters"] == (
            "1@127.0.0.1:19093,2@127.0.0.2:19093,3@127.0.0.3:19093")
        assert p["listeners"] == (f"PLAINTEXT://127.0.0.{node}:19092,"
                                  f"CONTROLLER://127.0.0.{node}:19093,"
                                  f"PROXIED://127.0.0.{node}:19094")
        assert p["advertised.listeners"] == (f"PLAINTEXT://127.0.0.{node}:19092,"
                                             f"PROXIED://127.0.0.{node}:19095")
        assert (p["offsets.topic.replication.factor"], p["transaction.state.log.min.isr"],
                p["min.insync.replicas"]) == ("3", "2", "2")


@pytest.mark.parametrize("nodes", [1, 2, 3, 4, 5])
def test_tokens_split_the_ring_evenly(nodes: int) -> None:
    tokens = [cluster.initial_token(i, nodes) for i in range(1, nodes + 1)]
    assert all(-(2**63) <= t < 2**63 for t in tokens)
    gaps = {b - a for a, b in zip(tokens, [*tokens[1:], tokens[0] + 2**64], strict=True)}
    assert max(gaps) - min(gaps) <= nodes


def test_node_counts_outside_the_range_are_refused(settings: Settings) -> None:
    for nodes in (0, 6):
        with pytest.raises(ValueError, match="1 to 5 nodes"):
            cluster.client_env(settings, nodes)


def test_a_three_node_stack_has_a_component_per_node_seed_first(settings: Settings) -> None:
    comps = Stack(settings, nodes=3).components()
    names = [c.name for c in comps]
    assert names == ["redis", "kafka-1", "kafka-2", "kafka-3", "cassandra-1", "cassandra-2",
                     "cassandra-3", "s3"]
    by_name = {c.name: c for c in comps}
    assert [by_name[f"cassandra-{i}"].host for i in (1, 2, 3)] == [
        "127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert [by_name[f"cassandra-{i}"].local_ports for i in (1, 2, 3)] == [
        (17199,), (17200,), (17201,)]
    assert by_name["cassandra-1"].wave < by_name["cassandra-2"].wave == by_name[
        "cassandra-3"].wave
    assert {c.wave for c in comps if not c.name.startswith("cassandra-")} == {0}


def test_a_one_node_stack_keeps_its_names(settings: Settings) -> None:
    assert [c.name for c in Stack(settings).components()] == [
        "redis", "kafka", "cassandra", "s3"]


def test_stack_env_names_the_generated_s3_key_pair(settings: Settings) -> None:
    assert "NOTIFLOW_OBJECT_STORE__ACCESS_KEY_ID" not in Stack(settings).client_env()
    from notiflow.devenv import object_store_credentials

    made = object_store_credentials(settings.stack_dir)
    env = Stack(settings).client_env()
    assert env["NOTIFLOW_OBJECT_STORE__ACCESS_KEY_ID"] == made[
        "NOTIFLOW_OBJECT_STORE__ACCESS_KEY_ID"]
    assert env["NOTIFLOW_OBJECT_STORE__SECRET_ACCESS_KEY"] == made[
        "NOTIFLOW_OBJECT_STORE__SECRET_ACCESS_KEY"]


def test_the_data_remembers_its_node_count(settings: Settings) -> None:
    conf = settings.stack_dir / "conf"
    conf.mkdir(parents=True)
    (conf / "nodes").write_text("3")
    stack = Stack(settings)
    assert stack.nodes == 3
    assert stack.s.kafka_replication_factor == 3
    assert stack.client_env()["NOTIFLOW_KAFKA_MIN_INSYNC_REPLICAS"] == "2"
    with pytest.raises(StackError, match="holds a 3-node stack, not 1"):
        Stack(settings, nodes=1).up()
