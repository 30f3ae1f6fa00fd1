"""The SDK fails fast, with a clear error, when Kafka cannot be reached (issue 16, rough
edges): it used to give up after 60 s with 251 raw librdkafka lines."""

from __future__ import annotations

import socket
import time

import pytest

from duetime.core.config import CommonSettings
from duetime.core.errors import ConfigError, RetryableError
from duetime.producers.sdk import JobClient

JOB = {"name": "x", "schedule": {"at": "2099-01-01T00:00:00Z"},
       "target": {"type": "http", "url": "http://127.0.0.1:9/x"}}  # fmt: skip


def nobody() -> str:
    """A loopback address nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_create_with_kafka_unreachable_raises_after_the_timeout_naming_where(
    capfd: pytest.CaptureFixture[str],
) -> None:
    where = nobody()
    client = JobClient(settings=CommonSettings(bootstrap_servers=where), timeout_s=2)
    started = time.monotonic()
    with pytest.raises(RetryableError) as raised:
        client.create_job(JOB)
    took = time.monotonic() - started
    assert where in raised.value.message and "DUETIME_KAFKA_BOOTSTRAP" in raised.value.message
    assert "not acknowledged" in raised.value.message
    assert took < 30  # not librdkafka's 300 s default (a bound, not a performance figure)
    # the event expired: a later flush has nothing left that could still be written
    client.flush(1)
    assert "%3|" not in capfd.readouterr().err  # librdkafka's lines go through logging


def test_the_timeout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUETIME_SDK_TIMEOUT_S", "4.5")
    assert JobClient(settings=CommonSettings(bootstrap_servers=nobody())).timeout_s == 4.5
    monkeypatch.setenv("DUETIME_SDK_TIMEOUT_S", "0")
    with pytest.raises(ConfigError, match="DUETIME_SDK_TIMEOUT_S"):
        JobClient(settings=CommonSettings(bootstrap_servers=nobody()))
