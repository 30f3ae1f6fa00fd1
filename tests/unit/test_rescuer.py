"""The scheduler's rescuer (issue 14, item 2): deadlines, re-emission, bounded rescues, `lost`.

Pure logic driven by a ManualClock: nothing here waits.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core.clock import ManualClock
from duetime.core.config import Env
from duetime.core.errors import ConfigError
from duetime.core.jobspec import build_job
from duetime.core.models import ErrorReason, ResultStatus, Status, Trigger
from duetime.core.records import (
    ExecutionRequest,
    ExecutionResult,
    InflightExecution,
    SchedulerState,
)
from duetime.schedulers import logic
from duetime.schedulers.settings import SchedulerSettings
from duetime.schemas.codec import Codec

NOW = 1_800_000_000_000
TIMEOUT_S = 20
POLICY = logic.Policy(lease_ttl_ms=5_000, rescue_grace_ms=10_000, max_rescues=3)
WINDOW_MS = TIMEOUT_S * 1000 + 5_000 + 10_000
CODEC = Codec()


def one_time(max_retries: int = 2, overlap: str = "allow") -> dict[str, Any]:
    return {
        "name": "rescued",
        "schedule": {"at": "2020-01-01T00:00:00Z"},
        "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
        "timeout_s": TIMEOUT_S,
        "overlap": overlap,
        "retry": {"max_retries": max_retries, "base_delay_s": 1, "jitter": False},
    }


def fired(
    clock: ManualClock, body: dict[str, Any] | None = None
) -> tuple[SchedulerState, ExecutionRequest]:
    definition = build_job(body or one_time(), now_ms=clock.now_ms())
    state, _ = logic.on_definition(None, definition, clock.now_ms())
    out = logic.fire_due(state, clock.now_ms(), POLICY)
    assert len(out.executions) == 1
    return state, out.executions[0]


def report(
    state: SchedulerState,
    request: ExecutionRequest,
    status: ResultStatus,
    now_ms: int,
    token: int = 1,
) -> logic.Outputs:
    res = ExecutionResult(
        execution_id=request.execution_id,
        job_id=request.job_id,
        attempt=request.attempt,
        status=status,
        worker_id="w",
        lease_token=token,
        scheduled_at_ms=request.scheduled_at_ms,
        finished_at_ms=None if status is ResultStatus.RUNNING else now_ms,
        priority=request.priority,
    )
    _, out = logic.on_result(state, res, now_ms, random.Random(0), POLICY)
    return out


def only(state: SchedulerState) -> InflightExecution:
    assert len(state.inflight) == 1
    return state.inflight[0]


def same_request(a: ExecutionRequest, b: ExecutionRequest) -> bool:
    """The same request apart from when it was emitted."""
    return {**a.to_avro(), "emitted_at_ms": 0} == {**b.to_avro(), "emitted_at_ms": 0}


def test_an_emitted_execution_gets_its_deadline_in_the_timer() -> None:
    clock = ManualClock(NOW)
    state, _ = fired(clock)
    assert only(state).deadline_ms == NOW + WINDOW_MS
    assert logic.wake_at_ms(state) == NOW + WINDOW_MS
    clock.advance(WINDOW_MS - 1)
    out = logic.fire_due(state, clock.now_ms(), POLICY)
    assert out.executions == [] and out.rescues == [] and not out.state_changed


def test_no_result_by_the_deadline_re_emits_the_same_request() -> None:
    clock = ManualClock(NOW)
    state, request = fired(clock)
    clock.advance(WINDOW_MS)
    out = logic.fire_due(state, clock.now_ms(), POLICY)
    assert len(out.executions) == 1
    copy = out.executions[0]
    assert same_request(copy, request) and copy.emitted_at_ms == clock.now_ms()
    assert copy.attempt == 1 and copy.trigger is request.trigger
    assert out.rescues == [logic.Rescue(state.job_id, request.execution_id, 1, 1, Status.QUEUED, 0)]
    entry = only(state)
    assert entry.rescues == 1 and entry.deadline_ms == clock.now_ms() + WINDOW_MS
    assert state.status is Status.QUEUED  # a rescue changes no status
    assert logic.wake_at_ms(state) == entry.deadline_ms


def test_a_running_result_pushes_the_deadline_from_its_receipt() -> None:
    clock = ManualClock(NOW)
    state, request = fired(clock)
    clock.advance(WINDOW_MS - 1_000)
    report(state, request, ResultStatus.RUNNING, clock.now_ms())
    assert only(state).deadline_ms == clock.now_ms() + WINDOW_MS
    clock.advance(1_000)
    assert logic.fire_due(state, clock.now_ms(), POLICY).executions == []  # old deadline gone


def test_a_rescued_running_execution_is_re_emitted_and_its_result_still_counts() -> None:
    clock = ManualClock(NOW)
    state, request = fired(clock)
    report(state, request, ResultStatus.RUNNING, clock.now_ms())
    clock.advance(WINDOW_MS)
    out = logic.fire_due(state, clock.now_ms(), POLICY)
    assert [r.status for r in out.rescues] == [Status.RUNNING]
    assert len(out.executions) == 1 and same_request(out.executions[0], request)
    # the worker republishes the recorded result of the finished lease: the job completes
    clock.advance(500)
    report(state, request, ResultStatus.SUCCESS, clock.now_ms(), token=2)
    assert state.inflight == [] and state.status is Status.SUCCESS
    assert logic.wake_at_ms(state) is None


def test_a_retry_is_rescued_as_a_retry_with_its_rescues_counted_afresh() -> None:
    clock = ManualClock(NOW)
    state, request = fired(clock)
    clock.advance(WINDOW_MS)
    logic.fire_due(state, clock.now_ms(), POLICY)  # one rescue of attempt 1
    report(state, request, ResultStatus.FAILURE, clock.now_ms())
    entry = only(state)
    assert entry.status is Status.FAILED and entry.deadline_ms is None
    clock.set(entry.due_at_ms)
    retry = logic.fire_due(state, clock.now_ms(), POLICY).executions[0]
    assert retry.attempt == 2 and retry.trigger is Trigger.RETRY
    assert entry.rescues == 0 and entry.deadline_ms == clock.now_ms() + WINDOW_MS
    clock.advance(WINDOW_MS)
    copy = logic.fire_due(state, clock.now_ms(), POLICY).executions[0]
    assert same_request(copy, retry)


def exhaust(state: SchedulerState, clock: ManualClock) -> logic.Outputs:
    """Let every deadline of the latest attempt pass: max_rescues copies, then lost."""
    for n in range(1, POLICY.max_rescues + 1):
        clock.set(state.inflight[0].deadline_ms or 0)
        out = logic.fire_due(state, clock.now_ms(), POLICY)
        assert len(out.executions) == 1 and out.rescues[0].rescues == n
    clock.set(state.inflight[0].deadline_ms or 0)
    return logic.fire_due(state, clock.now_ms(), POLICY)


def test_after_the_last_rescue_the_attempt_fails_lost_and_is_retried() -> None:
    clock = ManualClock(NOW)
    state, request = fired(clock)
    out = exhaust(state, clock)
    assert out.executions == [] and [r.lost for r in out.rescues] == [True]
    entry = only(state)
    assert entry.status is Status.FAILED and state.status is Status.FAILED
    error = entry.errors[-1]
    assert error.attempt == 1 and error.error.reason is ErrorReason.LOST
    assert error.error.retryable and "3 rescue" in error.error.message
    clock.set(entry.due_at_ms)
    retry = logic.fire_due(state, clock.now_ms(), POLICY).executions
    assert [r.attempt for r in retry] == [2]
    # the lost attempt's result, republished late, is stale: it changes nothing
    assert not report(state, request, ResultStatus.SUCCESS, clock.now_ms()).state_changed


def test_a_lost_attempt_without_retries_left_ends_dead_with_a_dead_letter() -> None:
    clock = ManualClock(NOW)
    state, _ = fired(clock, one_time(max_retries=0))
    out = exhaust(state, clock)
    assert state.inflight == [] and state.status is Status.DEAD
    assert len(out.dead_letters) == 1
    assert out.dead_letters[0].errors[-1].error.reason is ErrorReason.LOST
    assert logic.wake_at_ms(state) is None


def test_overlap_skip_runs_again_once_a_lost_execution_is_settled() -> None:
    """The stuck case of the issue: a cron job with overlap=skip whose execution vanished."""
    clock = ManualClock(NOW)
    body = {**one_time(max_retries=0, overlap="skip"), "schedule": {"cron": "* * * * *"}}
    definition = build_job(body, now_ms=clock.now_ms())
    state, _ = logic.on_definition(None, definition, clock.now_ms())
    assert state.next_run_at_ms is not None
    clock.set(state.next_run_at_ms)
    assert len(logic.fire_due(state, clock.now_ms(), POLICY).executions) == 1
    fired_before = state.fired_count
    while state.inflight:  # every minute skipped while the lost execution is live
        wake = logic.wake_at_ms(state)
        assert wake is not None
        clock.set(wake)
        logic.fire_due(state, clock.now_ms(), POLICY)
    assert state.fired_count == fired_before
    wake = logic.wake_at_ms(state)
    assert wake is not None
    clock.set(wake)
    assert len(logic.fire_due(state, clock.now_ms(), POLICY).executions) == 1


def test_past_the_horizon_an_attempt_fails_lost_instead_of_being_rescued() -> None:
    """A copy that could reach a worker after the finished lease was purged is never sent."""
    clock = ManualClock(NOW)
    state, _ = fired(clock)
    policy = logic.Policy(
        lease_ttl_ms=5_000, rescue_grace_ms=10_000, max_rescues=3, rescue_horizon_ms=WINDOW_MS
    )
    clock.advance(WINDOW_MS + 1)
    out = logic.fire_due(state, clock.now_ms(), policy)
    assert out.executions == [] and [r.lost for r in out.rescues] == [True]
    assert only(state).errors[-1].error.reason is ErrorReason.LOST


def test_a_state_written_before_rescues_gets_a_deadline_at_its_next_wake() -> None:
    clock = ManualClock(NOW)
    state, _ = fired(clock)
    old = CODEC.load(SchedulerState, CODEC.dump(state))
    old.inflight[0].deadline_ms = None  # what a state of schema v1 decodes to
    assert logic.wake_at_ms(old) == old.inflight[0].due_at_ms  # wakes at once
    clock.advance(1_000)
    out = logic.fire_due(old, clock.now_ms(), POLICY)
    assert out.executions == [] and out.state_changed
    assert old.inflight[0].deadline_ms == clock.now_ms() + WINDOW_MS


def test_rescue_settings_are_read_and_checked_against_the_lease_retention() -> None:
    env = Env(
        {
            "DUETIME_LEASE_TTL_S": "4",
            "DUETIME_SCHEDULER_RESCUE_GRACE_S": "6",
            "DUETIME_SCHEDULER_MAX_RESCUES": "2",
            "DUETIME_LEASE_RETENTION_S": "7200",
        }
    )
    s = SchedulerSettings.from_env(env)
    assert (s.lease_ttl_s, s.rescue_grace_s, s.max_rescues) == (4.0, 6.0, 2)
    assert s.rescue_horizon_s == 3600.0
    with pytest.raises(ConfigError, match="DUETIME_LEASE_RETENTION_S"):
        SchedulerSettings.from_env(
            Env({"DUETIME_SCHEDULER_RESCUE_GRACE_S": "3600", "DUETIME_LEASE_RETENTION_S": "7200"})
        )
    with pytest.raises(ConfigError, match="DUETIME_SCHEDULER_MAX_RESCUES"):
        SchedulerSettings.from_env(Env({"DUETIME_SCHEDULER_MAX_RESCUES": "-1"}))


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["tick", "running", "success", "failure"]),
            st.integers(min_value=0, max_value=3 * WINDOW_MS),
        ),
        max_size=30,
    ),
    max_rescues=st.integers(min_value=0, max_value=4),
)
def test_any_history_rescues_boundedly_and_never_strands_an_execution(
    events: list[tuple[str, int]], max_rescues: int
) -> None:
    """Whatever results come (or not) and whenever the timer runs: every live execution has a
    deadline in the timer, no attempt is re-emitted more than max_rescues times, every
    re-emission is the attempt's own request, and the state always encodes."""
    policy = logic.Policy(lease_ttl_ms=5_000, rescue_grace_ms=10_000, max_rescues=max_rescues)
    clock = ManualClock(NOW)
    state, _ = fired(clock, one_time(max_retries=3))
    emitted: dict[int, list[ExecutionRequest]] = {}
    for kind, step_ms in events:
        clock.advance(step_ms)
        ticked = kind == "tick" or not state.inflight or state.inflight[0].status is Status.FAILED
        if ticked:
            out = logic.fire_due(state, clock.now_ms(), policy)
        else:
            entry = state.inflight[0]
            request = logic.execution_request(state, entry, clock.now_ms())
            status = ResultStatus(kind)
            out = report(state, request, status, clock.now_ms(), token=entry.lease_token + 1)
        for r in out.executions:
            emitted.setdefault(r.attempt, []).append(r)
        for entry in state.inflight:
            assert entry.rescues <= max_rescues
            if entry.status is not Status.FAILED:
                assert entry.deadline_ms is not None
                # the timer wakes the job by the deadline; once it ran, the deadline is ahead
                assert (logic.wake_at_ms(state) or 0) <= entry.deadline_ms
                assert not ticked or entry.deadline_ms > clock.now_ms()
        wake = logic.wake_at_ms(state)
        assert (wake is None) == (not state.inflight)
        CODEC.load(SchedulerState, CODEC.dump(state))
    for requests in emitted.values():
        assert len(requests) <= 1 + max_rescues
        assert all(same_request(r, requests[0]) for r in requests)
