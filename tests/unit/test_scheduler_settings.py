"""The scheduler's settings (and the worker's group timing): the heartbeat must fit inside the
session; the cycle fire limit."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.consumers.worker.settings import WorkerSettings
from duetime.core.config import Env
from duetime.core.errors import ConfigError
from duetime.schedulers.settings import SchedulerSettings

HEARTBEAT = "DUETIME_SCHEDULER_HEARTBEAT_INTERVAL_MS"
SESSION = "DUETIME_SESSION_TIMEOUT_MS"
WORKER_HEARTBEAT = "DUETIME_WORKER_HEARTBEAT_INTERVAL_MS"
# the roles that set their KIP-848 group's timing, and the variable of their heartbeat
ROLES = pytest.mark.parametrize(
    ("role", "heartbeat"),
    [(SchedulerSettings, HEARTBEAT), (WorkerSettings, WORKER_HEARTBEAT)],
    ids=["scheduler", "worker"],
)


def test_defaults_fit() -> None:
    s = SchedulerSettings.from_env(Env({}))
    assert s.heartbeat_interval_ms == 500 and s.session_timeout_ms == 3000
    w = WorkerSettings.from_env(Env({}))
    assert w.heartbeat_interval_ms == 1000 and w.session_timeout_ms == 3000


@ROLES
@given(
    session_ms=st.integers(min_value=500, max_value=300_000),
    heartbeat_ms=st.integers(min_value=100, max_value=60_000),
)
def test_a_heartbeat_inside_the_session_or_a_named_refusal(
    role: Any, heartbeat: str, session_ms: int, heartbeat_ms: int
) -> None:
    env = Env({SESSION: str(session_ms), heartbeat: str(heartbeat_ms)})
    if heartbeat_ms < session_ms:
        s = role.from_env(env)
        assert (s.session_timeout_ms, s.heartbeat_interval_ms) == (session_ms, heartbeat_ms)
        return
    with pytest.raises(ConfigError) as info:
        role.from_env(env)
    assert heartbeat in info.value.message and SESSION in info.value.message
    assert info.value.details["variable"] == heartbeat


def test_a_classic_worker_takes_no_group_heartbeat() -> None:
    """A classic worker's session is not judged against the KIP-848 group heartbeat."""
    env = {SESSION: "500", WORKER_HEARTBEAT: "1000", "DUETIME_WORKER_GROUP_PROTOCOL": "classic"}
    assert WorkerSettings.from_env(Env(env)).session_timeout_ms == 500


@ROLES
@pytest.mark.parametrize("value", ["99", "60001", "fast", "2.5"])
def test_a_heartbeat_out_of_bounds_is_refused(role: Any, heartbeat: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        role.from_env(Env({heartbeat: value}))
    assert info.value.details["variable"] == heartbeat


CYCLE_FIRE_LIMIT = "DUETIME_SCHEDULER_CYCLE_FIRE_LIMIT"


def test_the_cycle_fire_limit_is_read() -> None:
    assert SchedulerSettings.from_env(Env({})).cycle_fire_limit == 1_000_000  # no limit
    assert SchedulerSettings.from_env(Env({CYCLE_FIRE_LIMIT: "250"})).cycle_fire_limit == 250


@pytest.mark.parametrize("value", ["0", "-5", "1000001", "lots", "2.5"])
def test_a_cycle_fire_limit_out_of_bounds_is_refused(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        SchedulerSettings.from_env(Env({CYCLE_FIRE_LIMIT: value}))
    assert CYCLE_FIRE_LIMIT in info.value.message
