"""The start gate's pure parts (issue 14, items 4 and 8): the window arithmetic, the
validation of ``start_within_s``, the scheduler's handling of an expired result and the
projected status of an expired attempt. The worker applying the gate is tested against the
real broker in ``tests/integration/test_worker_gate.py``."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.consumers.projector.rows import Attempt
from duetime.consumers.worker import gate
from duetime.core.errors import ValidationError
from duetime.core.inputs import MAX_TIME_MS
from duetime.core.jobspec import MAX_START_WITHIN_S, build_job, job_to_api
from duetime.core.models import ErrorReason, Priority, ResultStatus, Status, Trigger
from duetime.core.records import ErrorInfo, ExecutionRequest, ExecutionResult, PythonTarget
from duetime.schedulers import logic
from duetime.schemas.codec import Codec

NOW = 1_800_000_000_000
RNG = random.Random(0)
WEEK_S = 7 * 24 * 3600.0


def request(due_at_ms: int, window: float | None, scheduled_at_ms: int | None = None) -> Any:
    return ExecutionRequest(
        execution_id="6f1d3a56-1f9e-4a8e-9a55-0c0f3e1c2b7d",
        job_id="0d6c7f3e-5b3a-4a57-8f0e-2c9a1f7d4e21",
        name="n",
        attempt=1,
        scheduled_at_ms=due_at_ms if scheduled_at_ms is None else scheduled_at_ms,
        due_at_ms=due_at_ms,
        emitted_at_ms=due_at_ms,
        priority=Priority.NORMAL,
        target=PythonTarget(ref="m:f"),
        payload_json="null",
        timeout_s=10.0,
        trigger=Trigger.SCHEDULE,
        start_within_s=window,
    )


times = st.integers(min_value=0, max_value=MAX_TIME_MS)
windows = st.floats(min_value=1e-6, max_value=WEEK_S, allow_nan=False, allow_infinity=False)


# --- the window arithmetic ---------------------------------------------------------------


@given(due=times, window=windows, now=times)
def test_expired_exactly_past_the_window(due: int, window: float, now: int) -> None:
    req = request(due, window)
    deadline = gate.start_deadline_ms(req)
    assert deadline is not None and deadline >= due + window * 1000  # never cut short
    assert deadline - due - window * 1000 < 1  # by less than the millisecond rounding
    assert gate.expired(req, now) is (now > deadline)
    assert gate.late_ms(req, now) == max(0, now - deadline)
    assert not gate.expired(req, due)  # at its due time an attempt may always start


@given(due=times, now=times)
def test_no_window_never_expires(due: int, now: int) -> None:
    req = request(due, None)
    assert gate.start_deadline_ms(req) is None
    assert not gate.expired(req, now) and gate.late_ms(req, now) == 0


@given(scheduled=times, due=times, now=times, later=st.integers(min_value=0, max_value=10**9))
def test_early_until_the_later_of_occurrence_and_due_time(
    scheduled: int, due: int, now: int, later: int
) -> None:
    req = request(due, None, scheduled_at_ms=scheduled)
    not_before = max(scheduled, due)
    assert gate.early_ms(req, now) == max(0, not_before - now)
    # time only makes a request less early; at its due time it is not early at all
    assert gate.early_ms(req, now + later) <= gate.early_ms(req, now)
    assert gate.early_ms(req, not_before) == 0


def test_a_retry_window_counts_from_its_own_due_time() -> None:
    first = request(NOW, 60.0)
    retry = replace(first, attempt=2, due_at_ms=NOW + 600_000, trigger=Trigger.RETRY)
    assert gate.expired(first, NOW + 61_000)
    assert not gate.expired(retry, NOW + 61_000 + 600_000 - 2_000)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, WEEK_S + 1])
def test_a_request_window_no_job_can_carry_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="start_within_s"):
        gate.check_window(bad)


def test_the_expired_outcome_is_a_permanent_failure_with_reason_expired() -> None:
    outcome = gate.expired_outcome(request(NOW, 2.0), NOW + 2_500)
    assert outcome.status is ResultStatus.FAILURE and outcome.error is not None
    assert outcome.error.reason is ErrorReason.EXPIRED and not outcome.error.retryable
    assert "0.500 s past its start window of 2 s" in outcome.error.message


# --- validation ---------------------------------------------------------------------------

BODY = {"name": "w", "target": {"type": "http", "url": "http://127.0.0.1:9/x"}}


@pytest.mark.parametrize(
    "bad", [0, 0.0, -1, -0.5, math.nan, math.inf, 604_801, 10**400, "10", True, [5], {}]
)
def test_a_bad_start_within_s_is_refused_naming_the_field(bad: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        build_job({**BODY, "start_within_s": bad}, now_ms=NOW)
    assert caught.value.details["field"] == "start_within_s", caught.value.details
    assert "start_within_s" in caught.value.message


@given(window=st.one_of(windows, st.integers(min_value=1, max_value=int(WEEK_S))))
def test_a_good_start_within_s_travels_and_shows_as_given(window: float) -> None:
    definition = build_job({**BODY, "start_within_s": window}, now_ms=NOW)
    assert definition.start_within_s == float(window)
    assert job_to_api(definition)["start_within_s"] == float(window)
    codec = Codec()
    assert codec.load(type(definition), codec.dump(definition)) == definition


def test_no_start_within_s_means_no_limit() -> None:
    definition = build_job(BODY, now_ms=NOW)
    assert definition.start_within_s is None and MAX_START_WITHIN_S == WEEK_S


def test_a_dag_member_may_not_have_a_window() -> None:
    with pytest.raises(ValidationError) as caught:
        build_job({**BODY, "depends_on": ["a"], "start_within_s": 5}, now_ms=NOW)
    assert caught.value.details["field"] == "start_within_s"


# --- the scheduler ------------------------------------------------------------------------


def expired_result(req: ExecutionRequest, token: int = 3) -> ExecutionResult:
    return ExecutionResult(
        execution_id=req.execution_id,
        job_id=req.job_id,
        attempt=req.attempt,
        status=ResultStatus.FAILURE,
        worker_id="w",
        lease_token=token,
        scheduled_at_ms=req.scheduled_at_ms,
        started_at_ms=req.due_at_ms + 9_000,
        finished_at_ms=req.due_at_ms + 9_000,
        error=ErrorInfo(type="Expired", message="m", retryable=False, reason=ErrorReason.EXPIRED),
        priority=req.priority,
    )


def fire(schedule: dict[str, Any], window: float | None = 5.0) -> tuple[Any, ExecutionRequest]:
    body = {**BODY, "schedule": schedule, "retry": {"max_retries": 5, "base_delay_s": 1}}
    definition = build_job({**body, "start_within_s": window}, now_ms=NOW)
    state, _ = logic.on_definition(None, definition, NOW)
    assert state is not None
    due = state.next_run_at_ms
    assert due is not None
    [req] = logic.fire_due(state, due, logic.Policy()).executions
    return state, req


def test_the_request_carries_the_jobs_window() -> None:
    _, req = fire({"at": "2020-01-01T00:00:00Z"}, window=7.5)
    assert req.start_within_s == 7.5
    _, unlimited = fire({"at": "2020-01-01T00:00:00Z"}, window=None)
    assert unlimited.start_within_s is None


def test_an_expired_one_time_job_ends_expired_without_retry_or_dead_letter() -> None:
    state, req = fire({"at": "2020-01-01T00:00:00Z"})
    new, out = logic.on_result(state, expired_result(req), NOW + 10_000, RNG)
    assert new is not None and new.status is Status.EXPIRED
    assert not new.inflight and not out.dead_letters and not out.executions
    # nothing is due later: no retry was scheduled
    assert logic.wake_at_ms(new) is None
    # a republished copy of the same result changes nothing
    again, out2 = logic.on_result(new, expired_result(req), NOW + 11_000, RNG)
    assert again is not None and again.status is Status.EXPIRED and not out2.records()


def test_a_recurring_job_goes_on_to_its_next_occurrence_after_an_expired_one() -> None:
    state, req = fire({"cron": "*/10 * * * * *"})
    due = req.due_at_ms
    state, _ = logic.on_result(state, expired_result(req), due + 9_000, RNG)
    assert state is not None and state.status is Status.EXPIRED
    assert state.next_run_at_ms == due + 10_000
    [following] = logic.fire_due(state, due + 10_000, logic.Policy()).executions
    assert following.scheduled_at_ms == due + 10_000 and following.start_within_s == 5.0
    now_status: Status = state.status
    assert now_status is Status.QUEUED


def test_a_running_attempt_can_expire_too() -> None:
    # the worker's running notice never precedes an expired report, but a rescued copy's
    # may: the expired report still ends the occurrence
    state, req = fire({"at": "2020-01-01T00:00:00Z"})
    running = replace(expired_result(req), status=ResultStatus.RUNNING, error=None)
    state, _ = logic.on_result(state, running, NOW + 1, RNG)
    assert state is not None and state.status is Status.RUNNING
    state, out = logic.on_result(state, expired_result(req), NOW + 2, RNG)
    assert state is not None and state.status is Status.EXPIRED and not out.dead_letters


# --- the projection -----------------------------------------------------------------------


def test_an_expired_attempt_is_projected_expired_and_a_failed_one_failed() -> None:
    expired = Attempt(1)
    expired.result, expired.error, expired.has_error = "failure", {"reason": "expired"}, True
    assert expired.status() == Status.EXPIRED.value
    failed = Attempt(1)
    failed.result, failed.error, failed.has_error = "failure", {"reason": "timeout"}, True
    assert failed.status() == Status.FAILED.value
