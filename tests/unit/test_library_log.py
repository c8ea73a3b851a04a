"""librdkafka's log lines reach Python logging, never the terminal directly: the topics'
admin client hands them to ``notiflow.kafka.admin``, and ``notiflow demo`` writes its own
process's log records to a file (its first screen carries only its own lines)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from notiflow.ops.demo import library_log
from notiflow.ops.topics import ensure_topics
from notiflow.settings import Settings


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_admin_clients_log_goes_to_python_logging(
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    settings = Settings(kafka_bootstrap=f"127.0.0.1:{closed_port()}")
    with caplog.at_level(logging.INFO, logger="notiflow.kafka.admin"), \
            pytest.raises(KafkaException):
        ensure_topics(settings, timeout=1.0)
    failures = [r for r in caplog.records if r.name == "notiflow.kafka.admin"]
    assert failures and all(r.levelno == logging.ERROR for r in failures)
    assert "Connection refused" in failures[0].getMessage()
    assert not [line for line in capfd.readouterr().err.splitlines() if line.startswith("%")]


def test_the_demo_writes_its_library_log_to_a_file(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    path = tmp_path / "logs" / "demo.log"
    with library_log(path):
        # loggers of their own: another test's logging.config may have disabled the real ones
        logging.getLogger("test.demo.kafka").error("FAIL [rdkafka#producer-1] refused")
        logging.getLogger("test.demo.driver").warning("host marked down")
        logging.getLogger("test.demo.driver").debug("not kept")
        logging.getLogger("test.demo.driver").warning("to +14155552671")
    text = path.read_text()
    assert "ERROR test.demo.kafka: FAIL [rdkafka#producer-1] refused" in text
    assert "WARNING test.demo.driver: host marked down" in text
    assert "not kept" not in text
    assert "+14155552671" not in text
    assert "refused" not in capfd.readouterr().err
    assert (list(root.handlers), root.level) == before
