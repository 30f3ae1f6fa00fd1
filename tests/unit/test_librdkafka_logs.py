"""librdkafka's lines go through duetime's logging, rate-limited (issue 16, rough edges): a
client whose broker is unreachable says so once, as a duetime-level warning, instead of ~10
raw ``%3|...|FAIL|`` lines a second on stderr."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from duetime.core import kafka
from duetime.core.config import CommonSettings
from duetime.core.kafka import LibrdkafkaLogs

FAIL = "[thrd:x/bootstrap]: x/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused"


def line(facility: str, text: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(
        "duetime.kafka.librdkafka", level, __file__, 1, "%s [%s] %s",
        (facility, "rdkafka#producer-1", text), None,
    )  # fmt: skip


def test_a_failed_connection_is_one_warning_per_period_with_the_count_held_back() -> None:
    now = [0.0]
    logs = LibrdkafkaLogs(every_s=30, clock=lambda: now[0])
    first = line("FAIL", FAIL)
    assert logs.filter(first)
    assert first.levelno == logging.WARNING
    assert "Kafka broker unreachable from rdkafka#producer-1" in first.getMessage()
    assert "keeps retrying" in first.getMessage()
    passed = 0
    for _ in range(100):  # 10 s of librdkafka's retries
        now[0] += 0.1
        passed += logs.filter(line("FAIL", FAIL))
    assert passed == 0
    now[0] += 25
    later = line("FAIL", FAIL)
    assert logs.filter(later)
    assert "(100 more like it in the last 30 s)" in later.getMessage()


def test_other_kinds_and_other_clients_are_limited_apart() -> None:
    logs = LibrdkafkaLogs(every_s=30, clock=lambda: 0.0)
    assert logs.filter(line("FAIL", FAIL))
    other = line("MAXPOLL", "Application maximum poll interval exceeded", logging.WARNING)
    assert logs.filter(other)
    assert other.getMessage().startswith("librdkafka MAXPOLL [rdkafka#producer-1]")
    assert not logs.filter(line("MAXPOLL", "again", logging.WARNING))
    elsewhere = line("FAIL", FAIL)
    elsewhere.args = ("FAIL", "rdkafka#consumer-7", FAIL)
    assert logs.filter(elsewhere)
    plain = logging.LogRecord("x", logging.INFO, __file__, 1, "no args", None, None)
    assert logs.filter(plain) and plain.getMessage() == "no args"


def test_a_client_with_no_broker_logs_through_duetime_not_stderr(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    producer = kafka.producer(CommonSettings(bootstrap_servers=f"127.0.0.1:{port}"))
    caplog.set_level(logging.DEBUG, logger="duetime.kafka.librdkafka")
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # librdkafka retries the connection many times
        producer.poll(0.1)
    lines = [r for r in caplog.records if r.name == "duetime.kafka.librdkafka"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].levelno == logging.WARNING
    assert f"127.0.0.1:{port}" in lines[0].getMessage()
    assert "%3|" not in capfd.readouterr().err
