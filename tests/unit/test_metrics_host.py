"""``DUETIME_METRICS_HOST`` and ``DUETIME_LOG_LEVEL``: parsed and checked in config, and the
metrics server really listens where it is told (a real socket, a real scrape)."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.config import LOG_LEVELS, CommonSettings, Env
from duetime.core.errors import ConfigError
from duetime.core.metrics_server import serve_metrics


def _settings(**env: str) -> CommonSettings:
    return CommonSettings.from_env(Env(env))


def test_metrics_host_defaults_to_loopback() -> None:
    assert _settings().metrics_host == "127.0.0.1"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "::1", "10.1.2.3", "metrics.internal", "pod-1"])
def test_metrics_host_accepts_addresses_and_names(host: str) -> None:
    assert _settings(DUETIME_METRICS_HOST=host).metrics_host == host


@pytest.mark.parametrize(
    "host", ["0.0.0.0:9400", "http://x", "a b", "host/path", "-lead", "x" * 254, "a..b;c"]
)
def test_a_bad_metrics_host_is_refused_by_name(host: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _settings(DUETIME_METRICS_HOST=host)
    assert "DUETIME_METRICS_HOST" in caught.value.message


@given(st.sampled_from((*LOG_LEVELS, "WARN")), st.lists(st.booleans(), min_size=7, max_size=7))
def test_log_level_in_any_case(level: str, upper: list[bool]) -> None:
    mixed = "".join(c.upper() if u else c.lower() for c, u in zip(level, upper, strict=False))
    parsed = _settings(DUETIME_LOG_LEVEL=mixed).log_level
    assert parsed == ("WARNING" if level == "WARN" else level)


@given(st.text(max_size=12))
def test_any_other_log_level_is_refused_by_name(raw: str) -> None:
    known = {*LOG_LEVELS, "WARN"}
    if raw.strip().upper() in known or not raw.strip():
        return  # a valid level, or empty (the default applies)
    with pytest.raises(ConfigError) as caught:
        _settings(DUETIME_LOG_LEVEL=raw)
    assert "DUETIME_LOG_LEVEL" in caught.value.message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_metrics_server_listens_on_the_configured_host() -> None:
    port = _free_port()
    serve_metrics(port, _settings(DUETIME_METRICS_HOST="127.0.0.1").metrics_host)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert b"python_info" in response.read()


def test_a_metrics_host_that_cannot_be_bound_fails_at_start() -> None:
    # TEST-NET-1 is never a local address: binding to it must fail loudly, not silently serve
    # somewhere else
    with pytest.raises(OSError):
        serve_metrics(_free_port(), "192.0.2.1")
