"""The local stack's pure helpers: component names, the files it writes for Cassandra and
SeaweedFS, and the tail of a log; nothing is started."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from notiflow.ops.stack import kafka, s3
from notiflow.ops.stack.base import Paths, component_name, paths
from notiflow.ops.stack.cassandra import component, node_yaml
from notiflow.ops.stack.process import tail
from notiflow.settings import Settings


def test_a_component_is_named_by_its_node_only_in_a_stack_of_several() -> None:
    assert component_name("kafka", 1, 1) == "kafka"
    assert component_name("cassandra", 2, 3) == "cassandra-2"


def test_each_cassandra_node_has_its_address_and_token_and_node_one_seeds() -> None:
    s = Settings()
    nodes = [yaml.safe_load(node_yaml(s, i, 3, Path(f"/d/{i}"))) for i in (1, 2, 3)]
    assert [n["listen_address"] for n in nodes] == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert [n["rpc_address"] for n in nodes] == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert len({n["initial_token"] for n in nodes}) == 3
    assert {n["seed_provider"][0]["parameters"][0]["seeds"] for n in nodes} == {"127.0.0.1"}
    assert nodes[1]["data_file_directories"] == ["/d/2/data"]
    assert nodes[1]["commitlog_directory"] == "/d/2/commitlog"
    assert {n["native_transport_port"] for n in nodes} == {s.cassandra_port}
    one = yaml.safe_load(node_yaml(s, 1, 1, Path("/d")))
    assert (one["initial_token"], one["num_tokens"]) == (0, 1)


def test_only_a_stack_told_so_skips_the_schema_flush(tmp_path: Path) -> None:
    p = Paths(tmp_path / "stack", tmp_path / "cache")
    libs = p.libs("cassandra", Settings().cassandra_version)
    libs.mkdir(parents=True)
    (libs / "jamm-0.4.0.jar").touch()
    flag = "-Dcassandra.test.flush_local_schema_changes=false"

    def argv(**update: object) -> list[str]:
        return component(Settings().model_copy(update=update), p, 1, 1, print).start()

    assert flag not in argv()
    assert flag in argv(cassandra_flush_schema=False)


def test_the_filer_keeps_its_store_under_the_data_directory_with_small_buffers() -> None:
    toml = s3.filer_toml(Path("/data/seaweedfs"))
    assert 'dir = "/data/seaweedfs/filerldb2"' in toml
    assert "write_buffer_size_mb = 2" in toml and "block_cache_size_mb = 4" in toml


def test_the_gateway_accepts_one_identity_with_the_key_pair() -> None:
    (identity,) = json.loads(s3.identities("AKID", "SECRET"))["identities"]
    assert identity["credentials"] == [{"accessKey": "AKID", "secretKey": "SECRET"}]
    assert identity["actions"] == ["Read", "Write", "List", "Tagging"]


def test_the_kafka_cluster_id_is_made_once_per_stack_directory(tmp_path: Path) -> None:
    p = paths(Settings(stack_dir=tmp_path / "stack", cache_dir=tmp_path / "cache"))
    p.make()
    first = kafka.stack_cluster_id(p)
    assert kafka.stack_cluster_id(p) == first
    assert (p.conf / "kafka-cluster-id").read_text() == first


def test_tail_keeps_the_last_lines_and_names_a_missing_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    assert tail(log, 3) == "line 47\nline 48\nline 49"
    assert tail(tmp_path / "none.log") == "(no log)"
