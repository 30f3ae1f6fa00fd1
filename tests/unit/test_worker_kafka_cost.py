"""The worker's settings that set what each execution costs the broker (issue 15, goal 1):
how long results wait to share a batch, how long lease completions wait to share a PostgreSQL
round trip, how often offsets are committed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.consumers.worker.settings import WorkerSettings
from duetime.core.config import Env
from duetime.core.errors import ConfigError


def test_results_linger_and_offsets_commit_less_often_by_default() -> None:
    s = WorkerSettings.from_env(Env({}))
    assert s.result_linger_ms == 200
    assert s.complete_gather_ms == 20
    assert s.commit_interval_s == 1.0
    assert s.running_event_after_s == 0.5


_WAITS_MS = {
    "DUETIME_WORKER_RESULT_LINGER_MS": "result_linger_ms",
    "DUETIME_WORKER_COMPLETE_GATHER_MS": "complete_gather_ms",
}


@pytest.mark.parametrize("variable", sorted(_WAITS_MS))
@given(wait_ms=st.integers(0, 1000))
def test_the_results_waits_are_read_from_the_environment(variable: str, wait_ms: int) -> None:
    s = WorkerSettings.from_env(Env({variable: str(wait_ms)}))
    assert getattr(s, _WAITS_MS[variable]) == wait_ms


@pytest.mark.parametrize("variable", sorted(_WAITS_MS))
@pytest.mark.parametrize("value", ["-1", "1001", "5.5", "soon"])
def test_a_bad_results_wait_is_refused_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        WorkerSettings.from_env(Env({variable: value}))
