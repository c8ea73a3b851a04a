"""The local stack's pure helpers."""

from __future__ import annotations

import base64
import uuid

import pytest

from notiflow.ops.stack import kafka


def test_kafka_cluster_ids_never_start_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leading ``-`` made ``kafka-storage format -t <id>`` read the id as an option (one
    start in 64 failed)."""
    dashed = uuid.UUID(bytes=bytes([0xF8]) + bytes(15))
    assert base64.urlsafe_b64encode(dashed.bytes).decode().startswith("-")
    plain = uuid.UUID(bytes=bytes(16))
    ids = iter([dashed, dashed, plain])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(ids))
    cid = kafka.kafka_cluster_id()
    assert cid == base64.urlsafe_b64encode(plain.bytes).decode().rstrip("=")
    assert len(cid) == 22


def test_kafka_cluster_ids_are_random() -> None:
    ids = {kafka.kafka_cluster_id() for _ in range(200)}
    assert len(ids) == 200 and not any(i.startswith("-") for i in ids)
