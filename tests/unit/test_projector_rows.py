"""The projector's rows from typed records (pure: no broker, no database).

The golden attempts JSON below is what the projection stored before the rows were built from
typed records (produced by the dict-based code it replaced): rows already in PostgreSQL and
rows written now must read the same, and a merge must go on from either.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.consumers.projector import rows
from duetime.core.models import DagRunEventKind, ErrorReason, Priority, ResultStatus, Trigger
from duetime.core.records import (
    AttemptError,
    DagRunEvent,
    DeadLetter,
    ErrorInfo,
    ExecutionRequest,
    ExecutionResult,
    HttpTarget,
)

T0 = 1_700_000_000_000


def request(attempt: int, trigger: Trigger) -> ExecutionRequest:
    return ExecutionRequest(
        execution_id="e1",
        job_id="j1",
        name="n",
        attempt=attempt,
        scheduled_at_ms=T0,
        due_at_ms=T0 + attempt * 1000,
        emitted_at_ms=T0 + attempt * 1000 + 7,
        priority=Priority.HIGH,
        target=HttpTarget(url="http://x"),
        payload_json="null",
        timeout_s=1.0,
        trigger=trigger,
    )


def result(
    attempt: int, status: ResultStatus, token: int, worker: str, started: bool = True
) -> ExecutionResult:
    failed = status is ResultStatus.FAILURE
    return ExecutionResult(
        execution_id="e1",
        job_id="j1",
        attempt=attempt,
        status=status,
        worker_id=worker,
        lease_token=token,
        scheduled_at_ms=T0,
        started_at_ms=T0 + 500 + attempt if started else None,
        finished_at_ms=None if status is ResultStatus.RUNNING else T0 + 900 + attempt,
        error=ErrorInfo(type="E", message="m", retryable=True, reason=ErrorReason.ERROR)
        if failed
        else None,
        priority=Priority.HIGH,
    )


def dead(attempts: int, worker: str | None) -> DeadLetter:
    return DeadLetter(
        execution_id="e1",
        job_id="j1",
        name="n",
        dead_at_ms=T0 + 9000,
        attempts=attempts,
        errors=[
            AttemptError(
                attempt=i,
                at_ms=T0 + i,
                worker_id=worker,
                error=ErrorInfo(
                    type="E", message=f"m{i}", retryable=False, reason=ErrorReason.TIMEOUT
                ),
            )
            for i in range(1, attempts + 1)
        ],
        request=request(attempts, Trigger.RETRY),
    )


GOLDEN_ATTEMPTS = [
    {
        "_end": [1, "w1"],
        "_start": [1, "w1"],
        "attempt": 1,
        "due_at": "2023-11-14T22:13:21.000Z",
        "due_at_ms": 1700000001000,
        "error": {
            "http_status": None,
            "message": "m",
            "reason": "error",
            "retryable": True,
            "type": "E",
        },
        "finished_at": "2023-11-14T22:13:20.901Z",
        "queued_at": "2023-11-14T22:13:21.007Z",
        "queued_at_ms": 1700000001007,
        "result": "failure",
        "started_at": "2023-11-14T22:13:20.501Z",
        "started_at_ms": 1700000000501,
        "status": "failed",
        "trigger": "schedule",
        "worker_id": "w1",
    },
    {
        "_end": [2, "w2"],
        "attempt": 2,
        "due_at": "2023-11-14T22:13:22.000Z",
        "due_at_ms": 1700000002000,
        "error": {
            "http_status": None,
            "message": "m",
            "reason": "error",
            "retryable": True,
            "type": "E",
        },
        "finished_at": "2023-11-14T22:13:20.902Z",
        "queued_at": "2023-11-14T22:13:22.007Z",
        "queued_at_ms": 1700000002007,
        "result": "failure",
        "status": "failed",
        "trigger": "retry",
        "worker_id": "w2",
    },
    {
        "attempt": 3,
        "dead_at": "2023-11-14T22:13:29.000Z",
        "due_at": "2023-11-14T22:13:23.000Z",
        "due_at_ms": 1700000003000,
        "error": {
            "http_status": None,
            "message": "m3",
            "reason": "timeout",
            "retryable": False,
            "type": "E",
        },
        "finished_at": "2023-11-14T22:13:20.003Z",
        "queued_at": "2023-11-14T22:13:23.007Z",
        "queued_at_ms": 1700000003007,
        "result": "failure",
        "status": "dead",
        "trigger": "retry",
    },
]


def test_attempts_are_stored_as_the_projection_always_stored_them() -> None:
    ex = rows.Execution("e1", T0, "j1")
    for event in (
        request(1, Trigger.SCHEDULE),
        result(1, ResultStatus.RUNNING, 1, "w1"),
        result(1, ResultStatus.FAILURE, 1, "w1"),
        request(2, Trigger.RETRY),
        result(2, ResultStatus.FAILURE, 2, "w2", started=False),
        request(3, Trigger.RETRY),
        dead(3, None),
    ):
        rows.apply(ex, event)
    row = rows.execution_row(ex)
    assert json.loads(row["attempts"]) == GOLDEN_ATTEMPTS
    assert row["attempts"] == json.dumps(GOLDEN_ATTEMPTS, sort_keys=True)  # byte for byte
    assert (row["status"], row["attempt"], row["trigger"], row["worker_id"]) == (
        "dead",
        3,
        "schedule",
        None,
    )
    assert json.loads(row["error"])["message"] == "m3"
    assert row["lateness_ms"] == 0.0  # attempt 1 started before it was due


def _stored(row: dict[str, Any]) -> rows.StoredExecution:
    """The row as PostgreSQL gives it back (attempts as parsed JSON)."""
    back = {**row, "attempts": json.loads(row["attempts"])}
    return rows.StoredExecution(**{c: back[c] for c in rows.StoredExecution.COLUMNS})


EVENTS = st.one_of(
    st.builds(request, st.integers(1, 3), st.sampled_from(list(Trigger))),
    st.builds(
        result,
        st.integers(1, 3),
        st.sampled_from(list(ResultStatus)),
        st.integers(1, 3),
        st.sampled_from(["w1", "w2"]),
        st.booleans(),
    ),
    st.builds(dead, st.integers(1, 3), st.sampled_from([None, "w1"])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, min_size=1, max_size=8), st.integers(0, 8))
def test_a_row_read_back_from_postgresql_merges_on_as_if_never_stored(
    events: list[rows.ExecutionEvent], cut: int
) -> None:
    """The projector's cache is dropped on every rebalance: the merge then starts from the
    stored row, and must reach the row it would have reached from memory."""
    memory = rows.Execution("e1", T0, "j1")
    for event in events:
        rows.apply(memory, event)
    reloaded = rows.Execution("e1", T0, "j1")
    for i, event in enumerate(events):
        if i == cut and reloaded.attempts:
            reloaded = rows.execution_from_row(_stored(rows.execution_row(reloaded)))
        rows.apply(reloaded, event)
    assert rows.execution_row(reloaded) == rows.execution_row(memory)


def test_dag_run_events_fold_in_offset_order() -> None:
    def event(kind: DagRunEventKind, at_ms: int, **fields: Any) -> DagRunEvent:
        return DagRunEvent(dag_id="d", dag_run_id="r", kind=kind, at_ms=at_ms, **fields)

    [delta] = rows.fold_dag_runs(
        [
            event(DagRunEventKind.STARTED, 1),
            event(DagRunEventKind.NODE_STATUS, 2, node_key="a", node_status="success"),
            event(DagRunEventKind.COMPLETED, 3, status="failed", node_statuses={"a": "dead"}),
        ]
    ).values()
    assert (delta.status, delta.first_at_ms, delta.finished_at_ms) == ("failed", 1, 3)
    assert delta.replace_nodes and delta.nodes == {"a": "dead"}


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _iso_by_datetime(ms: int) -> str:
    """The oracle: datetime's own arithmetic, in whole milliseconds. (``rows.iso`` used
    ``fromtimestamp(ms / 1000)``, which a float's precision made 1 ms early past ~2200.)"""
    text = (EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")
    return text[:-6] + "Z"


# from year 1 to 9999 (what datetime holds); times near each other share a second
_MS = st.integers(min_value=-62_135_596_800_000, max_value=253_402_300_799_999)


@given(st.lists(st.one_of(_MS, st.integers(1_790_000_000_000, 1_790_000_003_000)), max_size=40))
def test_iso_text_is_the_datetime_formula_in_any_order(times: list[int]) -> None:
    for ms in times:
        assert rows.iso(ms) == _iso_by_datetime(ms)
    assert rows.iso(None) is None
