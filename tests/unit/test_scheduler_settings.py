"""The scheduler's settings: the heartbeat must fit inside the session; the cycle fire limit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.config import Env
from duetime.core.errors import ConfigError
from duetime.schedulers.settings import SchedulerSettings

HEARTBEAT = "DUETIME_SCHEDULER_HEARTBEAT_INTERVAL_MS"
SESSION = "DUETIME_SESSION_TIMEOUT_MS"


def test_defaults_fit() -> None:
    s = SchedulerSettings.from_env(Env({}))
    assert s.heartbeat_interval_ms == 500 and s.session_timeout_ms == 3000


@given(
    session_ms=st.integers(min_value=500, max_value=300_000),
    heartbeat_ms=st.integers(min_value=100, max_value=60_000),
)
def test_a_heartbeat_inside_the_session_or_a_named_refusal(
    session_ms: int, heartbeat_ms: int
) -> None:
    env = Env({SESSION: str(session_ms), HEARTBEAT: str(heartbeat_ms)})
    if heartbeat_ms < session_ms:
        s = SchedulerSettings.from_env(env)
        assert (s.session_timeout_ms, s.heartbeat_interval_ms) == (session_ms, heartbeat_ms)
        return
    with pytest.raises(ConfigError) as info:
        SchedulerSettings.from_env(env)
    assert HEARTBEAT in info.value.message and SESSION in info.value.message
    assert info.value.details["variable"] == HEARTBEAT


@pytest.mark.parametrize("value", ["99", "60001", "fast", "2.5"])
def test_a_heartbeat_out_of_bounds_is_refused(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        SchedulerSettings.from_env(Env({HEARTBEAT: value}))
    assert info.value.details["variable"] == HEARTBEAT


CYCLE_FIRE_LIMIT = "DUETIME_SCHEDULER_CYCLE_FIRE_LIMIT"


def test_the_cycle_fire_limit_is_read() -> None:
    assert SchedulerSettings.from_env(Env({})).cycle_fire_limit == 1_000_000  # no limit
    assert SchedulerSettings.from_env(Env({CYCLE_FIRE_LIMIT: "250"})).cycle_fire_limit == 250


@pytest.mark.parametrize("value", ["0", "-5", "1000001", "lots", "2.5"])
def test_a_cycle_fire_limit_out_of_bounds_is_refused(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        SchedulerSettings.from_env(Env({CYCLE_FIRE_LIMIT: value}))
    assert CYCLE_FIRE_LIMIT in info.value.message
