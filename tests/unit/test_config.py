"""Configuration: every bad value stops a role with a message naming the variable."""

from __future__ import annotations

import pytest

from duetime.core.config import CommonSettings, Env
from duetime.core.errors import ConfigError
from duetime.schedulers.settings import SchedulerSettings


def test_defaults() -> None:
    s = CommonSettings.from_env(Env({}))
    assert s.topic_prefix == "duetime." and s.partitions == 12


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DUETIME_PARTITIONS", "zero"),
        ("DUETIME_PARTITIONS", "0"),
        ("DUETIME_TOPIC_PREFIX", "bad prefix!"),
        ("DUETIME_DATABASE_URL", "mysql://x"),
        ("DUETIME_LOG_FORMAT", "xml"),
        ("DUETIME_METRICS_PORT", "70000"),
        ("DUETIME_SCHEDULER_WINDOW_S", "-1"),
        ("DUETIME_SESSION_TIMEOUT_MS", "1e3"),
    ],
)
def test_invalid_values_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        SchedulerSettings.from_env(Env({variable: value}))
    assert variable in info.value.message
    assert info.value.details["variable"] == variable


def test_settings_are_frozen() -> None:
    s = CommonSettings.from_env(Env({}))
    with pytest.raises(AttributeError):
        s.partitions = 3  # type: ignore[misc]  # the point: it must refuse
