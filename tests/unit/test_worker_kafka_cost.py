"""The worker's settings that set what each execution costs the broker (issue 15, goal 1):
how long results wait to share a batch, how often offsets are committed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.consumers.worker.settings import WorkerSettings
from duetime.core.config import Env
from duetime.core.errors import ConfigError


def test_results_linger_and_offsets_commit_less_often_by_default() -> None:
    s = WorkerSettings.from_env(Env({}))
    assert s.result_linger_ms == 50
    assert s.commit_interval_s == 1.0
    assert s.running_event_after_s == 0.5


@given(st.integers(0, 1000))
def test_the_results_linger_is_read_from_the_environment(linger_ms: int) -> None:
    s = WorkerSettings.from_env(Env({"DUETIME_WORKER_RESULT_LINGER_MS": str(linger_ms)}))
    assert s.result_linger_ms == linger_ms


@pytest.mark.parametrize("value", ["-1", "1001", "5.5", "soon"])
def test_a_bad_results_linger_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match="DUETIME_WORKER_RESULT_LINGER_MS"):
        WorkerSettings.from_env(Env({"DUETIME_WORKER_RESULT_LINGER_MS": value}))
