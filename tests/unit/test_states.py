"""The job state machine (duetime.core.states): every edge, every non-edge, and the docs."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from duetime.core.errors import IllegalTransition
from duetime.core.models import Status
from duetime.core.states import (
    TRANSITIONS,
    Event,
    allowed_events,
    is_terminal,
    render_mermaid,
    render_table,
    transition,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "state_machine.md"
STATES: list[Status | None] = [None, *Status]
ALL_PAIRS = list(itertools.product(STATES, Event))


@pytest.mark.parametrize(("pair", "target"), list(TRANSITIONS.items()), ids=str)
def test_every_edge(pair: tuple[Status | None, Event], target: Status) -> None:
    state, event = pair
    assert transition(state, event) is target


@pytest.mark.parametrize("pair", [p for p in ALL_PAIRS if p not in TRANSITIONS], ids=str)
def test_every_other_pair_is_refused(pair: tuple[Status | None, Event]) -> None:
    state, event = pair
    with pytest.raises(IllegalTransition) as info:
        transition(state, event)
    assert f"'{event.value}'" in info.value.message
    assert ("no job" if state is None else f"'{state.value}'") in info.value.message
    assert info.value.details["event"] == event.value
    assert info.value.code == "illegal_transition"


def test_table_covers_some_pairs_of_every_status() -> None:
    for status in Status:
        assert any(s is status for s, _ in TRANSITIONS), status


def test_every_status_is_reachable_from_creation() -> None:
    seen: set[Status | None] = {None}
    frontier: list[Status | None] = [None]
    while frontier:
        state = frontier.pop()
        for event in allowed_events(state):
            nxt = transition(state, event)
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(STATES)


def test_happy_path_and_retries() -> None:
    s = transition(None, Event.CREATE)
    for event, expected in [
        (Event.QUEUE, Status.QUEUED),
        (Event.START, Status.RUNNING),
        (Event.FAIL_RETRYABLE, Status.FAILED),
        (Event.RETRY_DUE, Status.QUEUED),
        (Event.START, Status.RUNNING),
        (Event.FAIL_FINAL, Status.DEAD),
        (Event.REPLAY, Status.QUEUED),
        (Event.START, Status.RUNNING),
        (Event.SUCCEED, Status.SUCCESS),
        (Event.RESCHEDULE, Status.PENDING),
    ]:
        s = transition(s, event)
        assert s is expected


def test_terminal() -> None:
    assert [s for s in Status if is_terminal(s)] == [Status.CANCELLED]
    for event in Event:
        if (Status.CANCELLED, event) in TRANSITIONS:
            assert transition(Status.CANCELLED, event) is Status.CANCELLED
    with pytest.raises(IllegalTransition):
        transition(Status.CANCELLED, Event.RESUME)


def test_pause_and_resume() -> None:
    for state in (Status.PENDING, Status.QUEUED, Status.RUNNING, Status.FAILED):
        assert transition(state, Event.PAUSE) is Status.PAUSED
    assert transition(Status.PAUSED, Event.RESUME) is Status.PENDING
    assert transition(Status.PAUSED, Event.SUCCEED) is Status.PAUSED  # a late result


def test_docs_show_the_table_and_the_diagram() -> None:
    text = DOC.read_text()
    assert render_table() in text
    assert render_mermaid() in text
    # and no stale edge rows beyond the generated table
    rows = re.findall(r"^\| (\S+) \| (\S+) \| (\S+) \|$", text, flags=re.MULTILINE)
    edge_rows = [r for r in rows if r[1] in {e.value for e in Event}]
    assert len(edge_rows) == len(TRANSITIONS)


@pytest.mark.parametrize("event", [Event.QUEUE, Event.TRIGGER, Event.REPLAY])
def test_a_new_execution_queues_the_job_whatever_its_occurrence_did(event: Event) -> None:
    """The scheduler queues a recurring job's next occurrence (or a manual run, a replay)
    after success, dead, a failure waiting for its retry, or beside a live run (overlap=allow);
    a paused job stays paused, a cancelled one takes no trigger or replay."""
    for state in Status:
        if state is Status.PAUSED:
            assert transition(state, event) is Status.PAUSED
        elif state is Status.CANCELLED:
            if event is Event.QUEUE:  # a cancelled DAG member released in a DAG run
                assert transition(state, event) is Status.CANCELLED
            else:
                with pytest.raises(IllegalTransition):
                    transition(state, event)
        else:
            assert transition(state, event) is Status.QUEUED, state


def test_a_missed_one_time_run_is_skipped_unless_paused_or_cancelled() -> None:
    for state in Status:
        if state in (Status.PAUSED, Status.CANCELLED):
            with pytest.raises(IllegalTransition):
                transition(state, Event.MISS)
        else:
            assert transition(state, Event.MISS) is Status.SKIPPED
