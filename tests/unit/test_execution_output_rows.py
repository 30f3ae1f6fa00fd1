"""Outputs and tracebacks in the projection and the scheduler (pure: no broker, no database).

- The execution row carries the latest attempt's ``output_json`` and ``traceback`` in their
  own columns, whatever order the events are read in (a rebuild reads another interleaving),
  and a merge that starts from a stored row keeps them.
- The attempts history and the ``error`` column never hold a traceback (list reads stay small).
- The scheduler keeps no traceback in its state or its dead letters (they would grow by up to
  8 KiB per retry); the projector has it from the result.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.consumers.projector import rows
from duetime.core.models import ErrorReason, Priority, ResultStatus, Trigger
from duetime.core.records import ErrorInfo, ExecutionRequest, ExecutionResult
from duetime.schedulers import logic
from tests.unit.test_projector_rows import T0
from tests.unit.test_projector_rows import request as projector_request
from tests.unit.test_scheduler_logic import NOW, fired

TRACE = 'Traceback (most recent call last):\n  File "t.py", line 1, in f\nValueError: no'


def request(attempt: int) -> ExecutionRequest:
    return projector_request(attempt, Trigger.SCHEDULE if attempt == 1 else Trigger.RETRY)


def result(attempt: int, ok: bool, token: int = 1) -> ExecutionResult:
    return ExecutionResult(
        execution_id="e1",
        job_id="j1",
        attempt=attempt,
        status=ResultStatus.SUCCESS if ok else ResultStatus.FAILURE,
        worker_id="w",
        lease_token=token,
        scheduled_at_ms=T0,
        started_at_ms=T0 + attempt * 1000 + 10,
        finished_at_ms=T0 + attempt * 1000 + 20,
        error=None
        if ok
        else ErrorInfo(
            type="ValueError",
            message=f"no {attempt}",
            retryable=True,
            reason=ErrorReason.ERROR,
            traceback=f"{TRACE} {attempt}",
        ),
        output_json=json.dumps({"attempt": attempt}) if ok else None,
        priority=Priority.HIGH,  # as the requests' (test_projector_rows)
    )


def merged(events: list[rows.ExecutionEvent]) -> dict[str, Any]:
    ex = rows.Execution("e1", T0, "j1")
    for event in events:
        rows.apply(ex, event)
    return rows.execution_row(ex)


def stored(row: dict[str, Any]) -> rows.StoredExecution:
    """The row as the projector reads it back from PostgreSQL."""
    return rows.StoredExecution(
        execution_id=row["execution_id"],
        scheduled_at=datetime.fromtimestamp(T0 / 1000, tz=UTC),
        job_id=row["job_id"],
        name=row["name"],
        priority=row["priority"],
        trigger=row["trigger"],
        dag_id=row["dag_id"],
        dag_run_id=row["dag_run_id"],
        attempts=json.loads(row["attempts"]),
        output_json=row["output_json"],
        traceback=row["traceback"],
    )


def test_a_failed_attempt_keeps_its_traceback_apart_from_its_error() -> None:
    row = merged([request(1), result(1, ok=False)])
    assert row["traceback"] == f"{TRACE} 1"
    assert row["output_json"] is None
    assert "traceback" not in json.loads(row["error"])
    assert "Traceback" not in row["attempts"]


def test_the_latest_attempt_decides_output_and_traceback() -> None:
    row = merged([request(1), result(1, ok=False), request(2), result(2, ok=True)])
    assert row["status"] == "success"
    assert json.loads(row["output_json"]) == {"attempt": 2}
    assert row["traceback"] is None
    # a retry that was requested but has not run yet: the old traceback is not its own
    row = merged([request(1), result(1, ok=False), request(2)])
    assert row["traceback"] is None and row["status"] == "queued"


_EVENTS: list[rows.ExecutionEvent] = [
    request(1),
    result(1, ok=False),
    result(1, ok=False, token=2),
    request(2),
    result(2, ok=False),
    request(3),
    result(3, ok=True),
]


@given(
    st.lists(st.sampled_from(range(len(_EVENTS))), min_size=1, max_size=10),
    st.randoms(use_true_random=False),
    st.integers(0, 10),
)
@settings(max_examples=200, deadline=None)
def test_any_order_and_any_split_through_a_stored_row_gives_the_same_row(
    picks: list[int], rng: random.Random, split: int
) -> None:
    events = [_EVENTS[i] for i in picks]
    expected = merged(events)
    shuffled = list(events)
    rng.shuffle(shuffled)
    # the first part merged and stored, the rest merged onto the row read back
    head, tail = shuffled[:split], shuffled[split:]
    if not head:
        assert merged(shuffled) == expected
        return
    ex = rows.execution_from_row(stored(merged(head)))
    for event in tail:
        rows.apply(ex, event)
    assert rows.execution_row(ex) == expected


def test_the_scheduler_keeps_no_traceback_in_its_state_or_dead_letter() -> None:
    state, req = fired(max_retries=1)
    now = NOW
    for attempt in (1, 2):
        now += 10_000
        failure = replace(
            result(attempt, ok=False),
            execution_id=req.execution_id,
            job_id=req.job_id,
            scheduled_at_ms=req.scheduled_at_ms,
        )
        new, out = logic.on_result(state, failure, now, random.Random(attempt))
        assert new is not None
        state = new
        if attempt == 1:
            errors = state.inflight[0].errors
            assert [e.error.traceback for e in errors] == [None]
            assert errors[0].error.message == "no 1"  # the rest of the error is kept
            out = logic.fire_due(state, now + 10_000, logic.Policy())
    [dead] = out.dead_letters
    assert [e.error.traceback for e in dead.errors] == [None, None]
