"""The scheduler's pure transform: results, retries, dead letters, stale and repeated reports."""

from __future__ import annotations

import random
import uuid
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core.jobspec import build_job
from duetime.core.models import ControlKind, ErrorReason, ResultStatus, Status, Trigger
from duetime.core.records import (
    ControlCommand,
    ErrorInfo,
    ExecutionRequest,
    ExecutionResult,
    SchedulerState,
)
from duetime.schedulers import logic
from duetime.schemas.codec import Codec

NOW = 1_800_000_000_000


def fired(max_retries: int = 3) -> tuple[SchedulerState, ExecutionRequest]:
    definition = build_job(
        {
            "name": "x",
            "schedule": {"at": "2020-01-01T00:00:00Z"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
            "retry": {"max_retries": max_retries, "base_delay_s": 1, "jitter": False},
        },
        now_ms=NOW,
    )
    state, _ = logic.on_definition(None, definition, NOW)
    out = logic.fire_due(state, NOW, logic.Policy())
    assert len(out.executions) == 1
    return state, out.executions[0]


def result(
    request: ExecutionRequest, status: ResultStatus, attempt: int = 1, token: int = 5
) -> ExecutionResult:
    return ExecutionResult(
        execution_id=request.execution_id,
        job_id=request.job_id,
        attempt=attempt,
        status=status,
        worker_id="w",
        lease_token=token,
        scheduled_at_ms=request.scheduled_at_ms,
        finished_at_ms=NOW + 10,
        error=None
        if status is not ResultStatus.FAILURE
        else ErrorInfo(type="X", message="m", retryable=True, reason=ErrorReason.ERROR),
        retry_after_s=None,
        priority=request.priority,
    )


def on_result(
    state: SchedulerState, res: ExecutionResult, now_ms: int, rng: random.Random
) -> tuple[SchedulerState, logic.Outputs]:
    new, out = logic.on_result(state, res, now_ms, rng)
    assert new is not None
    return new, out


def test_a_repeated_failure_report_changes_nothing() -> None:
    state, request = fired()
    state, _ = on_result(state, result(request, ResultStatus.FAILURE), NOW + 10, random.Random(1))
    entry = replace(state.inflight[0])
    assert entry.status is Status.FAILED and entry.due_at_ms == NOW + 10 + 1000
    state, out = on_result(
        state, result(request, ResultStatus.FAILURE), NOW + 900, random.Random(2)
    )
    assert not out.state_changed
    assert state.inflight[0].due_at_ms == entry.due_at_ms
    assert len(state.inflight[0].errors) == 1


def test_retries_then_dead_letter_with_the_whole_history() -> None:
    state, request = fired(max_retries=2)
    now = NOW
    for attempt in (1, 2, 3):
        now += 10_000
        state, out = on_result(
            state, result(request, ResultStatus.FAILURE, attempt), now, random.Random(attempt)
        )
        if attempt < 3:
            assert state.status is Status.FAILED
            out = logic.fire_due(state, now + 10_000, logic.Policy())
            assert [e.attempt for e in out.executions] == [attempt + 1]
            assert out.executions[0].execution_id == request.execution_id
    assert state.status is Status.DEAD and state.inflight == []
    [dead] = out.dead_letters
    assert dead.attempts == 3 and [e.attempt for e in dead.errors] == [1, 2, 3]


def replay_command(job_id: str, execution_id: str, command_id: str) -> ControlCommand:
    return ControlCommand(
        command_id=command_id,
        job_id=job_id,
        kind=ControlKind.REPLAY,
        issued_at_ms=NOW,
        execution_id=execution_id,
    )


def test_replaying_one_dead_execution_twice_emits_one_execution() -> None:
    """Issue 13, finding 12: two replay commands of the same dead execution (a double click,
    two API processes) derive the same new execution, emitted once."""
    state, request = fired(max_retries=0)
    state, out = on_result(state, result(request, ResultStatus.FAILURE), NOW + 10, random.Random(1))
    [dead] = out.dead_letters
    emitted = []
    for command_id in ("c1", "c2"):
        new, out = logic.on_control(
            state,
            replay_command(state.job_id, dead.execution_id, command_id),
            NOW + 20,
            logic.Policy(),
        )
        assert new is not None
        state = new
        emitted += out.executions
    assert len(emitted) == 1 and emitted[0].trigger is Trigger.REPLAY
    assert emitted[0].execution_id != dead.execution_id


def test_a_stale_fencing_token_is_ignored() -> None:
    state, request = fired()
    running, success = ResultStatus.RUNNING, ResultStatus.SUCCESS
    state, _ = on_result(state, result(request, running, token=7), NOW + 1, random.Random())
    state, out = on_result(state, result(request, success, token=6), NOW + 2, random.Random())
    assert not out.state_changed and state.status is Status.RUNNING
    state, _ = on_result(state, result(request, success, token=7), NOW + 3, random.Random())
    assert state.status is Status.SUCCESS and state.inflight == []


def test_late_because_busy_is_not_a_misfire() -> None:
    """A cron occurrence handled late by an owner that held the partition all along fires;
    one that fell due before the owner took over follows the misfire policy (skip here)."""
    definition = build_job(
        {
            "name": "c",
            "schedule": {"cron": "* * * * * *"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
            "misfire": "skip",
            "overlap": "allow",
        },
        now_ms=NOW,
    )
    policy = logic.Policy(misfire_threshold_ms=5_000)
    state, _ = logic.on_definition(None, definition, NOW)
    due = state.next_run_at_ms
    assert due is not None
    busy = logic.fire_due(state, due + 8_000, policy, owned_since_ms=due - 60_000)
    assert [e.scheduled_at_ms for e in busy.executions] == [due]
    state, _ = logic.on_definition(None, definition, NOW)
    down = logic.fire_due(state, due + 8_000, policy, owned_since_ms=due + 7_000)
    assert down.executions == []


def test_the_store_knows_which_jobs_have_held_commands_across_a_rollback() -> None:
    from duetime.schedulers.store import StateStore

    store = StateStore(None, 300_000)
    assert not store.has_held("j") and store.held_for("j") == []
    store.hold("held/j/1/a", "j", b"x")
    store.commit()
    store.hold("held/j/2/b", "j", b"y")
    assert store.has_held("j") and [k for k, _ in store.held_for("j")] == [
        "held/j/1/a",
        "held/j/2/b",
    ]
    store.rollback()  # the second command was not committed
    assert [k for k, _ in store.held_for("j")] == ["held/j/1/a"]
    store.hold("held/j/1/a", "j", None)
    assert not store.has_held("j")
    store.rollback()  # the delete was not committed either
    assert store.has_held("j")


# --- properties over command sequences ---------------------------------------------------

JOB_ID = "00000000-0000-0000-0000-0000000000c1"
CODEC = Codec()
_step = st.one_of(
    st.tuples(
        st.just("command"),
        st.sampled_from(list(ControlKind)),
        st.sampled_from(["c1", "c2"]),
        st.sampled_from([None, "r1", "r2"]),
    ),
    st.tuples(st.just("fire"), st.integers(0, 5_000)),
    st.tuples(st.just("result"), st.sampled_from(list(ResultStatus))),
)


def cron_state(overlap: str, depends_on: list[str]) -> SchedulerState:
    definition = build_job(
        {
            "job_id": JOB_ID,
            "name": "p",
            "schedule": None if depends_on else {"cron": "* * * * * *"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
            "overlap": overlap,
            "misfire": "run_all",
            "retry": {"max_retries": 1, "base_delay_s": 1, "jitter": False},
            **(
                {"dag_id": "00000000-0000-0000-0000-0000000000d1", "dag_key": "k"}
                if depends_on
                else {}
            ),
            "depends_on": depends_on,
        },
        now_ms=NOW,
    )
    state, _ = logic.on_definition(None, definition, NOW)
    return state


def _apply_step(state: SchedulerState, step: tuple[Any, ...], now: int) -> logic.Outputs:
    if step[0] == "fire":
        return logic.fire_due(state, now, logic.Policy())
    if step[0] == "result":
        live = [e for e in state.inflight if e.status is not Status.FAILED]
        if not live:
            return logic.Outputs()
        request = logic.execution_request(state, live[0], now)
        _, out = logic.on_result(state, result(request, step[1], live[0].attempt), now, RNG)
        return out
    _, kind, command_id, run_id = step
    cmd = ControlCommand(
        command_id=command_id, job_id=JOB_ID, kind=kind, issued_at_ms=now, dag_run_id=run_id
    )
    _, out = logic.on_control(state, cmd, now, logic.Policy())
    again_state = replace(state, inflight=[replace(e) for e in state.inflight])
    _, again = logic.on_control(again_state, cmd, now, logic.Policy())
    # a command delivered twice (a redelivery) writes nothing new the second time
    assert again.executions == [] and again.controls == [] and again.dag_run_events == []
    return out


RNG = random.Random(0)


@settings(max_examples=150, deadline=None)
@given(
    overlap=st.sampled_from(["allow", "skip", "queue_one"]),
    member=st.booleans(),
    steps=st.lists(_step, max_size=25),
)
def test_any_sequence_keeps_the_state_well_formed(
    overlap: str, member: bool, steps: list[tuple[Any, ...]]
) -> None:
    """Whatever commands, fires and results arrive, in any order: the status is a Status,
    execution ids in flight are unique, every live execution has a rescue deadline, a
    cancelled job wakes up only to rescue its live executions, a
    redelivered command writes nothing new, and the state always encodes (the changelog can
    always be written)."""
    state = cron_state(overlap, ["a"] if member else [])
    now = NOW
    for step in steps:
        now += 700
        out = _apply_step(state, step, now)
        assert isinstance(state.status, Status)
        ids = [e.execution_id for e in state.inflight]
        assert len(ids) == len(set(ids))
        assert all(e.job_id == JOB_ID for e in out.executions)
        live = [e for e in state.inflight if e.status is not Status.FAILED]
        # every execution that waits for a result has a rescue deadline (nothing is stuck)
        assert all(e.deadline_ms is not None and e.deadline_ms > now for e in live)
        if state.status is Status.CANCELLED:
            # a cancelled job wakes only to rescue what it still has in flight
            deadlines = [e.deadline_ms for e in live if e.deadline_ms is not None]
            assert state.next_run_at_ms is None
            assert logic.wake_at_ms(state) == (min(deadlines) if deadlines else None)
        CODEC.load(SchedulerState, CODEC.dump(state))


def test_a_missed_one_time_run_under_misfire_skip_ends_skipped() -> None:
    definition = build_job(
        {
            "name": "missed",
            "schedule": {"at": "2020-01-01T00:00:00Z"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
            "misfire": "skip",
        },
        now_ms=NOW,
    )
    state, _ = logic.on_definition(None, definition, NOW)
    out = logic.fire_due(state, NOW + 60_000, logic.Policy(), owned_since_ms=NOW + 30_000)
    assert out.executions == [] and state.status is Status.SKIPPED
    assert state.next_run_at_ms is None and logic.wake_at_ms(state) is None


def test_a_recurring_jobs_next_occurrence_is_queued_after_success() -> None:
    definition = build_job(
        {
            "name": "every-second",
            "schedule": {"cron": "* * * * * *"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
        },
        now_ms=NOW,
    )
    state, _ = logic.on_definition(None, definition, NOW)
    due = state.next_run_at_ms
    assert due is not None
    [request] = logic.fire_due(state, due, logic.Policy()).executions
    state, _ = on_result(state, result(request, ResultStatus.SUCCESS), due + 10, RNG)
    assert state.status is Status.SUCCESS
    [following] = logic.fire_due(state, due + 1000, logic.Policy()).executions
    after: Status = state.status  # (mypy keeps the narrowing above across the call)
    assert after is Status.QUEUED and following.scheduled_at_ms == due + 1000


@settings(max_examples=300, deadline=None)
@given(
    job_id=st.text(max_size=60),
    scheduled_at_ms=st.integers(-(2**63), 2**63 - 1),
    trigger=st.sampled_from(list(Trigger)),
    salt=st.text(max_size=40),
)
def test_execution_ids_are_the_uuid5_of_the_occurrence(
    job_id: str, scheduled_at_ms: int, trigger: Trigger, salt: str
) -> None:
    # written out for speed: the ids must stay those of every earlier release (a restore
    # re-derives them to recognise occurrences already emitted)
    name = f"{job_id}/{scheduled_at_ms}/{trigger}/{salt}"
    expected = str(uuid.uuid5(uuid.UUID("6f9f3c1e-5d1b-4c1e-9a63-6a0d7e1f2b10"), name))
    assert logic.execution_id_for(job_id, scheduled_at_ms, trigger, salt) == expected
