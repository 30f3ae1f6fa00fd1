"""The projector's fold of a repaired DAG run's events (consumers/projector/rows.py)."""

from __future__ import annotations

from duetime.consumers.projector.rows import fold_dag_runs
from duetime.core.models import DagRunEventKind, DagRunStatus, Status
from duetime.core.records import DagRunEvent

K = DagRunEventKind


def event(kind: DagRunEventKind, at_ms: int, **fields: object) -> DagRunEvent:
    return DagRunEvent(dag_id="d", dag_run_id="r", kind=kind, at_ms=at_ms, **fields)  # type: ignore[arg-type]


def test_a_reopened_run_is_running_again_with_no_end_then_ends_anew() -> None:
    failed = {"a": Status.DEAD, "b": Status.SKIPPED}
    reopened = {"a": Status.PENDING, "b": Status.BLOCKED}
    events = [
        event(K.COMPLETED, 5, status=DagRunStatus.FAILED, node_statuses=failed),
        event(K.RETRY, 6, request_id="x"),  # the request: not the projector's business
        event(K.REOPENED, 7, status=DagRunStatus.RUNNING, node_statuses=reopened),
        event(K.NODE_STATUS, 8, node_key="a", node_status=Status.SUCCESS),
    ]
    [delta] = fold_dag_runs(events).values()
    assert (delta.status, delta.finished_at_ms, delta.reopened) == ("running", None, True)
    assert delta.replace_nodes and delta.nodes == {"a": "success", "b": "blocked"}
    done = [*events, event(K.COMPLETED, 9, status=DagRunStatus.SUCCESS,
                           node_statuses=dict.fromkeys("ab", Status.SUCCESS))]  # fmt: skip
    [delta] = fold_dag_runs(done).values()
    assert (delta.status, delta.finished_at_ms) == ("success", 9)


def test_a_retry_request_alone_makes_no_row() -> None:
    """A request for a run nobody knows (an SDK call with a wrong id) must not create one."""
    assert fold_dag_runs([event(K.RETRY, 1, request_id="x")]) == {}


def test_a_cancelled_member_and_a_cancelled_run() -> None:
    events = [
        event(K.NODE_CANCELLED, 3, node_key="b", node_status=Status.CANCELLED),
        event(K.COMPLETED, 4, status=DagRunStatus.CANCELLED),
    ]
    [delta] = fold_dag_runs(events).values()
    assert delta.nodes == {"b": "cancelled"}
    assert (delta.status, delta.finished_at_ms, delta.reopened) == ("cancelled", 4, False)
