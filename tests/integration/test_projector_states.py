"""The projector's scheduler states without their definitions (issue 15): a state whose job's
row already holds its definition's revision writes only the status columns, and its whole
record (with the definition) is decoded only for a job whose row lacks that revision. The rows
must be those the whole-state path always wrote."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from duetime.consumers.projector.rows import DefinitionRevision, StateHead
from duetime.consumers.projector.store import Batch, ProjectionStore
from duetime.core.jobspec import build_job
from duetime.core.models import Status
from duetime.core.records import JobDefinition, SchedulerState

NOW_MS = 1_790_000_000_000


@pytest.fixture
def store(database_url: str) -> Iterator[ProjectionStore]:
    s = ProjectionStore(database_url, "states-test", retention_days=30)
    yield s
    s.close()


def _definition(name: str = "s", revision: int | None = None) -> JobDefinition:
    body = {
        "name": name,
        "schedule": {"cron": "0 3 * * *"},
        "target": {"type": "python", "ref": "m:f"},
    }
    return build_job(body, now_ms=NOW_MS, revision=revision)


def _state(definition: JobDefinition, status: Status, at_ms: int) -> SchedulerState:
    return SchedulerState(
        job_id=definition.job_id,
        definition=definition,
        status=status,
        next_run_at_ms=at_ms + 60_000,
        updated_at_ms=at_ms,
    )


class Decodes:
    """The whole-state decode the store may ask for, counted."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def of(self, state: SchedulerState) -> Callable[[], SchedulerState]:
        def whole() -> SchedulerState:
            self.calls.append(state.job_id)
            return state

        return whole


def _add(batch: Batch, state: SchedulerState, offset: int, decodes: Decodes) -> None:
    head = StateHead(
        job_id=state.job_id,
        definition=DefinitionRevision(revision=state.definition.revision),
        status=state.status,
        next_run_at_ms=state.next_run_at_ms,
        updated_at_ms=state.updated_at_ms,
    )
    batch.add_state(head, offset, decodes.of(state))


def _row(url: str, job_id: str) -> tuple[Any, ...]:
    with psycopg.connect(url) as conn:
        got = conn.execute(
            "SELECT name, revision, status, next_run_at, status_at, state_offset FROM jobs "
            "WHERE job_id = %s",
            (job_id,),
        ).fetchone()
    assert got is not None, f"no row for {job_id}"
    return tuple(got)


def test_a_state_ahead_of_its_definition_is_decoded_whole_once(
    store: ProjectionStore, database_url: str
) -> None:
    """No row yet (a rebuild reads the state partition before the jobs one): the row comes
    from the whole state; the next state of that job writes its status only."""
    definition = _definition("ahead")
    decodes = Decodes()
    batch = Batch()
    _add(batch, _state(definition, Status.QUEUED, NOW_MS + 1000), 5, decodes)
    store.write(batch)
    assert decodes.calls == [definition.job_id]
    name, revision, status, _, _, offset = _row(database_url, definition.job_id)
    assert (name, revision, status, offset) == ("ahead", definition.revision, "queued", 5)

    later, decodes = Batch(), Decodes()
    _add(later, _state(definition, Status.SUCCESS, NOW_MS + 2000), 9, decodes)
    _add(later, _state(_definition("other-unknown"), Status.QUEUED, NOW_MS), 3, decodes)
    store.write(later)
    assert len(decodes.calls) == 1 and decodes.calls[0] != definition.job_id
    status, next_run_at, _, offset = _row(database_url, definition.job_id)[2:]
    assert (status, offset) == ("success", 9)
    assert next_run_at.timestamp() * 1000 == NOW_MS + 2000 + 60_000


def test_an_older_state_changes_nothing_and_decodes_nothing(
    store: ProjectionStore, database_url: str
) -> None:
    definition = _definition("older")
    first, decodes = Batch(), Decodes()
    first.add_definition(definition)
    _add(first, _state(definition, Status.RUNNING, NOW_MS + 5000), 20, decodes)
    store.write(first)
    assert decodes.calls == []  # the batch's own definition is the state's revision
    before = _row(database_url, definition.job_id)
    assert before[2] == "running" and before[5] == 20

    stale, decodes = Batch(), Decodes()
    _add(stale, _state(definition, Status.QUEUED, NOW_MS + 1000), 11, decodes)
    store.write(stale)
    assert decodes.calls == [] and _row(database_url, definition.job_id) == before


def test_a_state_with_a_newer_revision_than_the_row_brings_its_definition(
    store: ProjectionStore, database_url: str
) -> None:
    old = _definition("v1", revision=NOW_MS * 1000)
    first = Batch()
    first.add_definition(old)
    store.write(first)
    new = replace(_definition("v2", revision=NOW_MS * 1000 + 1), job_id=old.job_id)
    batch, decodes = Batch(), Decodes()
    _add(batch, _state(new, Status.PAUSED, NOW_MS + 3000), 4, decodes)
    store.write(batch)
    assert decodes.calls == [old.job_id]
    name, revision, status, _, _, offset = _row(database_url, old.job_id)
    assert (name, revision, status, offset) == ("v2", new.revision, "paused", 4)


def test_a_batch_definition_older_than_its_state_takes_the_state_definition(
    store: ProjectionStore, database_url: str
) -> None:
    old = _definition("v1", revision=NOW_MS * 1000)
    new = replace(_definition("v2", revision=NOW_MS * 1000 + 1), job_id=old.job_id)
    batch, decodes = Batch(), Decodes()
    batch.add_definition(old)
    _add(batch, _state(new, Status.QUEUED, NOW_MS + 3000), 2, decodes)
    store.write(batch)
    assert decodes.calls == [old.job_id]
    assert _row(database_url, old.job_id)[:3] == ("v2", new.revision, "queued")


def test_a_cancelled_status_only_state_still_flags_the_leases(
    store: ProjectionStore, database_url: str
) -> None:
    """The status-only path keeps the cancel hand-off (duetime.core.cancel): the batch's
    cancelled jobs are read from the heads, whatever path their rows take."""
    definition = _definition("cancel-me")
    first = Batch()
    first.add_definition(definition)
    store.write(first)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO leases (execution_id, attempt, owner, fencing_token, expires_at, job_id) "
            "VALUES (gen_random_uuid(), 1, 'w', 1, now() + interval '1 hour', %s)",
            (definition.job_id,),
        )
    batch, decodes = Batch(), Decodes()
    _add(batch, _state(definition, Status.CANCELLED, NOW_MS + 1000), 7, decodes)
    store.write(batch)
    assert decodes.calls == []
    assert _row(database_url, definition.job_id)[2] == "cancelled"
    with psycopg.connect(database_url) as conn:
        flagged = conn.execute(
            "SELECT cancel_requested_at IS NOT NULL FROM leases WHERE job_id = %s",
            (definition.job_id,),
        ).fetchone()
    assert flagged == (True,)
