"""The scheduler's side of a DAG run's repair and of a cancelled member (pure functions of
``schedulers/logic.py``): a repair's release runs a dead or skipped member again, a replay of
a member's dead letter asks the resolver to repair the run, a cancelled member tells it."""

from __future__ import annotations

import random

from duetime.core.dag import REPAIR_REASON
from duetime.core.models import (
    ControlKind,
    DagRunEventKind,
    ErrorReason,
    Priority,
    ResultStatus,
    Status,
    Trigger,
)
from duetime.core.records import ErrorInfo, ExecutionResult, SchedulerState
from duetime.schedulers import logic
from tests.unit.test_dag_trigger_logic import (
    DAG_ID,
    NOW,
    POLICY,
    command,
    control,
    member_state,
    trigger_state,
)


def dead_in_run(key: str, run_id: str = "r") -> tuple[SchedulerState, str]:
    """A member whose execution in ``run_id`` died (a permanent error); its execution id."""
    state = member_state(key)
    if state.definition.depends_on:
        state, _ = control(
            state, command(ControlKind.DAG_RUN_START, state.job_id, run_id), NOW, POLICY
        )
        state, out = control(state, command(ControlKind.RELEASE, state.job_id, run_id), NOW, POLICY)
    else:
        state, out = control(
            state, command(ControlKind.DAG_RUN_START, state.job_id, run_id), NOW, POLICY
        )
    [request] = out.executions
    failure = ExecutionResult(
        execution_id=request.execution_id,
        job_id=state.job_id,
        attempt=1,
        status=ResultStatus.FAILURE,
        worker_id="w",
        lease_token=1,
        scheduled_at_ms=NOW,
        priority=Priority.NORMAL,
        error=ErrorInfo(type="E", message="no", retryable=False, reason=ErrorReason.ERROR),
    )
    new, died = logic.on_result(state, failure, NOW + 1, random.Random(1))
    assert new is not None and len(died.dead_letters) == 1
    assert new.dag_runs[run_id] is Status.DEAD and new.status is Status.DEAD
    return new, request.execution_id


def repair_release(state: SchedulerState, run_id: str = "r", cid: str = "rep-1") -> logic.Outputs:
    cmd = command(ControlKind.RELEASE, state.job_id, run_id, reason=REPAIR_REASON)
    cmd = type(cmd)(**{**cmd.to_avro(), "command_id": cid, "kind": ControlKind.RELEASE})
    return control(state, cmd, NOW + 10, POLICY)[1]


def test_a_repair_release_runs_a_dead_member_again_in_its_run() -> None:
    state, dead_id = dead_in_run("a")
    out = repair_release(state)
    [request] = out.executions
    assert request.dag_run_id == "r" and request.trigger is Trigger.RELEASE
    assert request.execution_id != dead_id
    assert state.dag_runs["r"] is Status.QUEUED and state.status is Status.QUEUED
    # the same repair's release again (a resend) does nothing
    assert repair_release(state).executions == []


def test_a_plain_release_of_a_dead_member_does_nothing() -> None:
    """A stale release from before the repair (a redelivery) must not run it by itself."""
    state, _ = dead_in_run("a")
    _, out = control(state, command(ControlKind.RELEASE, state.job_id, "r"), NOW + 10, POLICY)
    assert out.executions == [] and state.dag_runs["r"] is Status.DEAD


def test_a_repair_release_runs_a_skipped_member() -> None:
    b = member_state("b")
    b, _ = control(b, command(ControlKind.DAG_RUN_START, b.job_id, "r"), NOW, POLICY)
    b, _ = control(b, command(ControlKind.SKIP, b.job_id, "r"), NOW, POLICY)
    assert (b.dag_runs["r"], b.status) == (Status.SKIPPED, Status.SKIPPED)
    [request] = repair_release(b).executions
    assert (request.dag_run_id, b.status) == ("r", Status.QUEUED)


def test_each_repair_runs_a_new_execution() -> None:
    state, _ = dead_in_run("a")
    [first] = repair_release(state, cid="rep-1").executions
    state.inflight.clear()
    state.dag_runs["r"] = Status.DEAD  # it died again
    [second] = repair_release(state, cid="rep-2").executions
    assert first.execution_id != second.execution_id


def test_a_replay_of_a_members_dead_letter_asks_for_a_repair_of_its_run() -> None:
    state, dead_id = dead_in_run("a")
    replay = command(ControlKind.REPLAY, state.job_id, "r", execution_id=dead_id)
    state, out = control(state, replay, NOW + 10, POLICY)
    assert out.executions == []  # the resolver releases it, in the run
    [event] = out.dag_run_events
    assert event.kind is DagRunEventKind.RETRY
    assert (event.dag_id, event.dag_run_id, event.node_key) == (DAG_ID, "r", "a")
    assert event.request_id == f"replay/{dead_id}"
    [node] = event.nodes  # the member, so the resolver can replay it alone if it must
    assert (node.key, node.job_id) == ("a", state.job_id)
    # once repaired (queued again), a replay of the same dead letter does nothing
    repair_release(state)
    _, again = control(state, replay, NOW + 20, POLICY)
    assert again.executions == [] and again.dag_run_events == []


def test_a_replay_without_its_run_runs_the_member_alone_as_before() -> None:
    state, dead_id = dead_in_run("a")
    replay = command(ControlKind.REPLAY, state.job_id, None, execution_id=dead_id)
    _, out = control(state, replay, NOW + 10, POLICY)
    [request] = out.executions
    assert request.trigger is Trigger.REPLAY and request.dag_run_id is None
    assert out.dag_run_events == []


def test_cancelling_a_member_tells_the_resolver_for_every_run_it_has_not_ended() -> None:
    b = member_state("b")
    b, _ = control(b, command(ControlKind.DAG_RUN_START, b.job_id, "r1"), NOW, POLICY)
    b, _ = control(b, command(ControlKind.DAG_RUN_START, b.job_id, "r2"), NOW, POLICY)
    b, _ = control(b, command(ControlKind.SKIP, b.job_id, "r2"), NOW, POLICY)  # r2 ended
    b, out = control(b, command(ControlKind.CANCEL, b.job_id), NOW + 5, POLICY)
    [event] = out.dag_run_events
    assert event.kind is DagRunEventKind.NODE_CANCELLED
    assert (event.dag_run_id, event.node_key, event.node_status) == ("r1", "b", Status.CANCELLED)
    assert b.dag_runs == {"r1": Status.CANCELLED, "r2": Status.SKIPPED}
    # a later run, or a release, of the cancelled member: told at once, never run
    b, started = control(b, command(ControlKind.DAG_RUN_START, b.job_id, "r3"), NOW, POLICY)
    assert [e.dag_run_id for e in started.dag_run_events] == ["r3"] and not started.executions
    a = member_state("a")
    a, _ = control(a, command(ControlKind.CANCEL, a.job_id), NOW, POLICY)
    _, root = control(a, command(ControlKind.DAG_RUN_START, a.job_id, "r4"), NOW, POLICY)
    assert root.executions == [] and root.dag_run_events[0].kind is DagRunEventKind.NODE_CANCELLED


def test_a_repaired_run_may_end_again_in_success_on_its_trigger() -> None:
    state = trigger_state()
    state, _ = control(state, command(ControlKind.TRIGGER, state.job_id, "r"), NOW, POLICY)
    failed = command(ControlKind.DAG_RUN_END, state.job_id, "r", reason="failed")
    state, _ = control(state, failed, NOW, POLICY)
    assert state.dag_runs["r"] is Status.DEAD
    success = command(ControlKind.DAG_RUN_END, state.job_id, "r", reason="success")
    state, out = control(state, success, NOW, POLICY)
    assert out.state_changed and state.dag_runs["r"] is Status.SUCCESS
    _, again = control(state, failed, NOW, POLICY)
    assert not again.state_changed  # a success is final


def test_a_stale_skip_does_not_touch_a_member_released_by_a_repair() -> None:
    """A resolver that restarts mid-repair resends the first run's skips before the repair's
    releases: a skip that finds the member released again must change nothing, or the
    repair's resent release would run it a second time."""
    b = member_state("b")
    b, _ = control(b, command(ControlKind.DAG_RUN_START, b.job_id, "r"), NOW, POLICY)
    b, _ = control(b, command(ControlKind.SKIP, b.job_id, "r"), NOW, POLICY)
    [request] = repair_release(b).executions
    _, stale = control(b, command(ControlKind.SKIP, b.job_id, "r"), NOW + 20, POLICY)
    assert not stale.state_changed
    assert (b.dag_runs["r"], b.status) == (Status.QUEUED, Status.QUEUED)
    assert repair_release(b).executions == []  # the resent release: still nothing new
    assert request.dag_run_id == "r"
