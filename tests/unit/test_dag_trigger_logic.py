"""The scheduler's DAG branches, as pure functions: trigger jobs start runs, members follow."""

from __future__ import annotations

import json
import random
from typing import Any

from duetime.core.jobspec import build_job
from duetime.core.models import (
    ControlKind,
    DagRunEventKind,
    Priority,
    ResultStatus,
    Status,
    Trigger,
)
from duetime.core.records import ControlCommand, DagNode, ExecutionResult, SchedulerState
from duetime.schedulers import logic

NOW = 1_800_000_000_000
POLICY = logic.Policy()
NODES = [
    {"key": "a", "job_id": "00000000-0000-0000-0000-00000000000a", "depends_on": []},
    {"key": "b", "job_id": "00000000-0000-0000-0000-00000000000b", "depends_on": ["a"]},
]
DAG_ID = "00000000-0000-0000-0000-0000000000da"
TARGET = {"type": "python", "ref": "x:y"}


def trigger_state(overlap: str = "skip", schedule: dict[str, Any] | None = None) -> SchedulerState:
    definition = build_job(
        {
            "job_id": "00000000-0000-0000-0000-0000000000ff",
            "name": "dag",
            "target": TARGET,
            "payload": {"nodes": NODES},
            "overlap": overlap,
            "schedule": schedule,
            "labels": {logic.DAG_LABEL: DAG_ID},
        },
        now_ms=NOW,
        internal=True,  # as the SDK builds a DAG's trigger job: the one reserved label
    )
    state, _ = logic.on_definition(None, definition, NOW)
    return state


def member_state(key: str) -> SchedulerState:
    node = next(n for n in NODES if n["key"] == key)
    definition = build_job(
        {
            "job_id": node["job_id"],
            "name": key,
            "target": TARGET,
            "dag_id": DAG_ID,
            "dag_key": key,
            "depends_on": node["depends_on"],
        },
        now_ms=NOW,
    )
    state, _ = logic.on_definition(None, definition, NOW)
    return state


def command(
    kind: ControlKind, job_id: str, run_id: str | None = None, **extra: Any
) -> ControlCommand:
    return ControlCommand(
        command_id=f"cmd-{kind}-{run_id}",
        job_id=job_id,
        kind=kind,
        issued_at_ms=NOW,
        dag_id=DAG_ID,
        dag_run_id=run_id,
        **extra,
    )


def control(
    state: SchedulerState, cmd: ControlCommand, now_ms: int, policy: logic.Policy
) -> tuple[SchedulerState, logic.Outputs]:
    new, out = logic.on_control(state, cmd, now_ms, policy)
    assert new is not None
    return new, out


def test_a_trigger_starts_a_run_instead_of_an_execution() -> None:
    state = trigger_state()
    state, out = control(state, command(ControlKind.TRIGGER, state.job_id, "run-1"), NOW, POLICY)
    assert state is not None
    assert out.executions == []
    assert [(c.kind, c.job_id, c.dag_run_id) for c in out.controls] == [
        (ControlKind.DAG_RUN_START, n["job_id"], "run-1") for n in NODES
    ]
    [started] = out.dag_run_events
    assert started.kind is DagRunEventKind.STARTED and started.dag_run_id == "run-1"
    assert started.node_statuses == {"a": Status.QUEUED, "b": Status.BLOCKED}
    assert started.nodes == [DagNode.from_avro(n) for n in NODES]
    assert started.trigger_job_id == state.job_id
    assert state.dag_runs == {"run-1": Status.RUNNING}
    # the same trigger again (a redelivered command) starts nothing
    _, again = control(state, command(ControlKind.TRIGGER, state.job_id, "run-1"), NOW, POLICY)
    assert again.controls == [] and again.dag_run_events == []


def test_a_scheduled_run_has_a_deterministic_id() -> None:
    schedule = {"cron": "* * * * * *"}
    first, second = trigger_state(schedule=schedule), trigger_state(schedule=schedule)
    due = first.next_run_at_ms
    assert due is not None
    out1 = logic.fire_due(first, due, POLICY)
    out2 = logic.fire_due(second, due, POLICY)
    assert out1.dag_run_events[0].dag_run_id == out2.dag_run_events[0].dag_run_id
    assert out1.executions == []


def test_overlap_skip_counts_live_runs_and_dag_run_end_frees_the_slot() -> None:
    state = trigger_state(overlap="skip", schedule={"cron": "* * * * * *"})
    due = state.next_run_at_ms
    assert due is not None
    assert len(logic.fire_due(state, due, POLICY).dag_run_events) == 1
    assert logic.fire_due(state, due + 1000, POLICY).dag_run_events == []  # still running
    [run_id] = state.dag_runs
    end = command(ControlKind.DAG_RUN_END, state.job_id, run_id, reason="failed")
    state, _ = control(state, end, due + 1500, POLICY)
    assert state is not None and state.dag_runs[run_id] is Status.DEAD
    _, repeated = control(state, end, due + 1600, POLICY)
    assert not repeated.state_changed  # a repeated report does nothing
    assert len(logic.fire_due(state, due + 2000, POLICY).dag_run_events) == 1


def test_overlap_queue_one_holds_a_run_until_the_live_one_ends() -> None:
    state = trigger_state(overlap="queue_one", schedule={"cron": "* * * * * *"})
    due = state.next_run_at_ms
    assert due is not None
    logic.fire_due(state, due, POLICY)
    assert logic.fire_due(state, due + 1000, POLICY).dag_run_events == []
    assert state.queued_occurrence_ms == due + 1000
    [run_id] = state.dag_runs
    end = command(ControlKind.DAG_RUN_END, state.job_id, run_id, reason="success")
    _, out = control(state, end, due + 1200, POLICY)
    assert len(out.dag_run_events) == 1  # the held run starts as the first one ends


def test_members_follow_the_run_and_a_second_release_does_nothing() -> None:
    a, b = member_state("a"), member_state("b")
    _, out_a = control(a, command(ControlKind.DAG_RUN_START, a.job_id, "r"), NOW, POLICY)
    assert [e.dag_run_id for e in out_a.executions] == ["r"]  # a root runs at once
    b, out_b = control(b, command(ControlKind.DAG_RUN_START, b.job_id, "r"), NOW, POLICY)
    assert b is not None and out_b.executions == [] and b.dag_runs == {"r": Status.BLOCKED}
    b, released = control(b, command(ControlKind.RELEASE, b.job_id, "r"), NOW, POLICY)
    assert b is not None and [e.trigger for e in released.executions] == [Trigger.RELEASE]
    _, twice = control(b, command(ControlKind.RELEASE, b.job_id, "r"), NOW, POLICY)
    assert twice.executions == []


def test_ended_runs_are_forgotten_beyond_the_cap_live_ones_never() -> None:
    state = trigger_state(overlap="allow")
    for i in range(logic.MAX_DAG_RUNS_KEPT + 50):
        state, _ = control(state, command(ControlKind.TRIGGER, state.job_id, f"r{i}"), NOW, POLICY)
        assert state is not None
        if i % 2 == 0:
            end = command(ControlKind.DAG_RUN_END, state.job_id, f"r{i}", reason="success")
            state, _ = control(state, end, NOW, POLICY)
            assert state is not None
    runs = state.dag_runs
    assert len(runs) <= logic.MAX_DAG_RUNS_KEPT
    live = [r for r, s in runs.items() if s is Status.RUNNING]
    assert len(live) == (logic.MAX_DAG_RUNS_KEPT + 50) // 2  # every live run is still there


def test_a_trigger_job_is_never_replayed_and_its_payload_lists_the_nodes() -> None:
    state = trigger_state()
    assert json.loads(state.definition.payload_json)["nodes"] == NODES
    assert logic.dag_nodes(state.definition.payload_json) == [DagNode.from_avro(n) for n in NODES]
    cmd = command(ControlKind.REPLAY, state.job_id, None, execution_id="x")
    _, out = control(state, cmd, NOW, POLICY)
    assert out.executions == [] and not out.state_changed
    late = ExecutionResult(
        execution_id="x",
        job_id=state.job_id,
        attempt=1,
        status=ResultStatus.SUCCESS,
        worker_id="w",
        lease_token=1,
        scheduled_at_ms=NOW,
        priority=Priority.NORMAL,
    )
    assert logic.on_result(state, late, NOW, random.Random(1))[1].executions == []
