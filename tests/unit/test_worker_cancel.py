"""The pure parts of cancelling a running execution: the renewal bound, the cancelled outcome,
the id checks of the cancel writer and the context's flag."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.consumers.tasks import ExecutionContext
from duetime.consumers.worker.results import cancelled
from duetime.consumers.worker.settings import CANCEL_CHECK_S, WorkerSettings
from duetime.core.cancel import _checked
from duetime.core.config import Env
from duetime.core.models import ErrorReason, ResultStatus


@given(st.floats(min_value=0.5, max_value=3600.0))
def test_renewals_come_often_enough_for_a_cancel_within_5_s(ttl_s: float) -> None:
    s = WorkerSettings.from_env(Env({"DUETIME_LEASE_TTL_S": repr(ttl_s)}))
    # a renewal both keeps the lease (under a third of the TTL) and reads the cancel flag
    assert s.renew_interval_s <= ttl_s / 3 + 1e-9
    assert s.renew_interval_s <= CANCEL_CHECK_S < 5.0


def test_the_default_ttl_renews_every_2_s() -> None:
    assert WorkerSettings.from_env(Env({})).renew_interval_s == 2.0


@given(st.text(max_size=40))
def test_a_cancel_is_a_permanent_failure_with_reason_cancelled(when: str) -> None:
    outcome = cancelled(when)
    assert outcome.status is ResultStatus.FAILURE and outcome.error is not None
    assert outcome.error.reason is ErrorReason.CANCELLED and outcome.error.retryable is False
    assert outcome.reason == "cancelled"


@given(st.text(min_size=1, max_size=200).filter(lambda t: "\x00" not in t))
def test_ids_duetime_could_have_issued_are_accepted(value: str) -> None:
    assert _checked(value, "job_id") == value


@pytest.mark.parametrize("value", ["", "x" * 201, "a\x00b", None, 42, b"job"])
def test_hostile_ids_are_refused_naming_the_field(value: object) -> None:
    with pytest.raises(ValueError, match="dag_run_id must be"):
        _checked(value, "dag_run_id")


def test_each_context_has_its_own_cancel_flag_unset_at_first() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    a, b = (ExecutionContext("j", f"e{i}", 1, at, None) for i in range(2))
    assert not a.cancelled.is_set() and a.cancelled is not b.cancelled
    a.cancelled.set()
    assert not b.cancelled.is_set()
