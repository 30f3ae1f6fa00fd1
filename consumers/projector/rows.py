"""Pure mapping from decoded records to projection rows: no I/O, no clock.

Every merge here is *commutative and idempotent*: the row a set of events produces does not
depend on the order in which the topics were read, and applying an event twice changes
nothing. That is what makes ``duetime projector --rebuild`` (which reads the topics in another
interleaving than the live run did) produce identical tables.

- jobs: the definition with the highest ``revision`` wins (from the jobs topic or from the
  definition embedded in a scheduler state); the status, ``next_run_at`` and ``status_at``
  come from the scheduler state with the highest offset in its state partition.
- executions: one row per execution, merged from its requests (one per attempt), the
  worker's results and its dead letter. Each attempt's fields have exactly one source event
  kind; duplicates of the same kind are resolved by the highest lease fencing token.
- dead letters, DAGs: the highest ``attempts`` / ``revision`` wins.
- DAG runs: events of one run share a partition of the dag_runs topic, so they are folded in
  offset order.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeAlias

from duetime.core.jobspec import schedule_to_api, target_to_api
from duetime.core.models import (
    DagRunEventKind,
    ErrorReason,
    Priority,
    ResultStatus,
    Status,
    Trigger,
)
from duetime.core.projection import Row, dt, job_row
from duetime.core.records import (
    AvroRecord,
    DagDefinition,
    DagRunEvent,
    DeadLetter,
    ErrorInfo,
    ExecutionRequest,
    ExecutionResult,
    JobDefinition,
    SchedulerState,
)
from duetime.core.topics import DEFAULT_QUEUE

__all__ = [
    "Attempt",
    "DagRunDelta",
    "Execution",
    "ExecutionEvent",
    "Row",
    "StateHead",
    "StoredExecution",
    "apply",
    "dag_row",
    "dead_letter_row",
    "dt",
    "execution_from_row",
    "execution_row",
    "fold_dag_runs",
    "iso",
    "job_row",
    "job_row_of",
    "kept_fields",
    "status_columns",
]

ExecutionEvent: TypeAlias = ExecutionRequest | ExecutionResult | DeadLetter
"""What an execution's row is merged from."""


_last_second: tuple[int, str] = (0, "1970-01-01T00:00:00")
"""The second ``iso`` formatted last, and its text (swapped whole: safe across threads)."""


def iso(ms: int | None) -> str | None:
    """``ms`` (Unix milliseconds) as UTC ISO 8601 text with milliseconds, for COPY. A batch's
    times mostly share their second, so the second's text is reused: building it through
    datetime for every column was 6 % of the projector's CPU at 350 jobs/s."""
    global _last_second
    if ms is None:
        return None
    second, milli = divmod(ms, 1000)
    last = _last_second
    if last[0] != second:
        last = _last_second = (second, datetime.fromtimestamp(second, tz=UTC).isoformat()[:-6])
    return f"{last[1]}.{milli:03d}Z"


# --- jobs ----------------------------------------------------------------------------------


def job_row_of(definition: JobDefinition | None, state: SchedulerState | None, offset: int) -> Row:
    """A job's row from the newest definition and the newest scheduler state (at ``offset``
    in its state partition) a batch holds; at least one of them is given.

    The definition columns come from whichever definition has the higher revision (the
    state's own on a tie), the status columns from the state: what the upsert's guards keep
    when the two rows meet in PostgreSQL.
    """
    if state is None:
        if definition is None:
            raise ValueError("a job row needs a definition or a scheduler state")
        return job_row(definition)
    newest = state.definition
    if definition is not None and definition.revision > newest.revision:
        newest = definition
    return {
        **job_row(newest, with_next_run=False),
        "status": state.status,
        "next_run_at": dt(state.next_run_at_ms),
        "status_at": dt(state.updated_at_ms),
        "state_offset": offset,
    }


@dataclass(slots=True, frozen=True, kw_only=True)
class DefinitionRevision(AvroRecord):
    """Of the definition a scheduler state embeds, what the projection reads first."""

    AVRO_NAME: ClassVar[str] = "duetime.JobDefinition"
    revision: int


@dataclass(slots=True, frozen=True, kw_only=True)
class StateHead(AvroRecord):
    """A scheduler state as the projection reads it: the job's status columns and the revision
    of the definition it embeds. Decoded through a projection of the state's schema, which
    skips the definition instead of building it (whole states were a quarter of the
    projector's CPU); the store decodes the whole state only for a job whose row does not
    hold that revision yet."""

    AVRO_NAME: ClassVar[str] = "duetime.SchedulerState"
    EVENT_TYPE: ClassVar[str | None] = "state"
    job_id: str
    definition: DefinitionRevision
    status: Status
    next_run_at_ms: int | None = None
    updated_at_ms: int


def kept_fields(cls: type[AvroRecord]) -> dict[str, Any]:
    """``Codec.projection``'s field mapping for a partial record class: each field, a nested
    record's as a mapping of its own fields."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]  # every record class is a dataclass
        hint = hints[f.name]
        nested = isinstance(hint, type) and issubclass(hint, AvroRecord)
        out[f.name] = kept_fields(hint) if nested else None
    return out


def status_columns(state: StateHead, offset: int) -> Row:
    """The columns of a job's row that come from its newest scheduler state (at ``offset``)."""
    return {
        "status": state.status,
        "next_run_at": dt(state.next_run_at_ms),
        "status_at": dt(state.updated_at_ms),
        "state_offset": offset,
    }


# --- executions ----------------------------------------------------------------------------


@dataclass(slots=True)
class Attempt:
    """One attempt of an execution as merged so far; stored as JSON in the row's ``attempts``.

    A JSON key is present only once the event that writes it was seen (``to_json``), exactly
    as the projection has always stored them: requested (due/queued/trigger), started
    (``_start``, started_at), finished (``_end``, result, finished_at, error), dead_at.
    """

    attempt: int
    due_at_ms: int | None = None
    queued_at_ms: int | None = None
    trigger: str | None = None
    start: tuple[int, str] | None = None
    """(lease token, worker) of the ``running`` report shown."""
    started_at_ms: int | None = None
    started_at: str | None = None
    end: tuple[int, str] | None = None
    """(lease token, worker) of the final report shown."""
    result: str | None = None
    finished_at: str | None = None
    error: Any = None
    """The error as JSON (the worker's ErrorInfo, or the dead letter's)."""
    has_error: bool = False
    worker_id: str | None = None
    dead_at: str | None = None
    output_json: str | None = None
    """The final report's ``output_json``. Kept only while this is the latest attempt (its
    own column, not in ``to_json``), like ``traceback``: the history stays small."""
    traceback: str | None = None
    """The final report's ``error.traceback`` (bounded and redacted by the worker)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attempt:
        """From a stored attempt (a row read back from PostgreSQL)."""
        get = data.get
        start, end = get("_start"), get("_end")
        return cls(
            attempt=int(get("attempt", 0)),
            due_at_ms=get("due_at_ms"),
            queued_at_ms=get("queued_at_ms"),
            trigger=get("trigger"),
            start=None if start is None else (int(start[0]), str(start[1])),
            started_at_ms=get("started_at_ms"),
            started_at=get("started_at"),
            end=None if end is None else (int(end[0]), str(end[1])),
            result=get("result"),
            finished_at=get("finished_at"),
            error=get("error"),
            has_error="error" in data,
            worker_id=get("worker_id"),
            dead_at=get("dead_at"),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"attempt": self.attempt}
        if self.due_at_ms is not None:
            out.update(
                due_at=iso(self.due_at_ms),
                queued_at=iso(self.queued_at_ms),
                due_at_ms=self.due_at_ms,
                queued_at_ms=self.queued_at_ms,
                trigger=self.trigger,
            )
        if self.start is not None:
            out.update(_start=list(self.start))
        if self.start is not None or self.started_at_ms is not None:
            out.update(started_at=self.started_at, started_at_ms=self.started_at_ms)
        if self.end is not None:
            out.update(_end=list(self.end))
        if self.result is not None:
            out.update(result=self.result, finished_at=self.finished_at)
        if self.has_error:
            out.update(error=self.error)
        if self.worker_id is not None:
            out.update(worker_id=self.worker_id)
        if self.dead_at is not None:
            out.update(dead_at=self.dead_at)
        return out

    def status(self) -> str:
        """The attempt's status, from the furthest phase it reached."""
        if self.dead_at is not None:
            return Status.DEAD.value
        if self.result == "success":
            return Status.SUCCESS.value
        if self.result == "failure":
            # a worker refused to start it past the job's start_within_s: it never ran
            if isinstance(self.error, dict) and self.error.get("reason") == "expired":
                return Status.EXPIRED.value
            return Status.FAILED.value
        if self.started_at is not None:
            return Status.RUNNING.value
        return Status.QUEUED.value


@dataclass
class Execution:
    """An execution being merged: its identity, its context and its attempts."""

    execution_id: str
    scheduled_at_ms: int
    job_id: str
    name: str = ""
    priority: str = Priority.NORMAL.value
    trigger: str | None = None
    dag_id: str | None = None
    dag_run_id: str | None = None
    attempts: dict[int, Attempt] = field(default_factory=dict)
    queue: str = DEFAULT_QUEUE

    def attempt(self, n: int) -> Attempt:
        found = self.attempts.get(n)
        if found is None:
            found = self.attempts[n] = Attempt(n)
        return found


@dataclass(slots=True, kw_only=True)
class StoredExecution:
    """The columns of an execution row that a merge starts from (psycopg's ``class_row``)."""

    execution_id: Any  # uuid.UUID from PostgreSQL
    scheduled_at: datetime
    job_id: Any
    name: str
    priority: str
    trigger: str | None
    dag_id: Any
    dag_run_id: str | None
    attempts: list[dict[str, Any]] | None
    output_json: str | None = None
    traceback: str | None = None
    queue: str = DEFAULT_QUEUE

    COLUMNS: ClassVar[tuple[str, ...]] = (
        "execution_id",
        "scheduled_at",
        "job_id",
        "name",
        "priority",
        "trigger",
        "dag_id",
        "dag_run_id",
        "attempts",
        "output_json",
        "traceback",
        "queue",
    )


def execution_from_row(row: StoredExecution) -> Execution:
    """An execution as PostgreSQL holds it."""
    ex = Execution(
        execution_id=str(row.execution_id),
        scheduled_at_ms=int(row.scheduled_at.timestamp() * 1000),
        job_id=str(row.job_id),
        name=row.name,
        priority=row.priority,
        trigger=row.trigger,
        dag_id=None if row.dag_id is None else str(row.dag_id),
        dag_run_id=row.dag_run_id,
        queue=row.queue,
    )
    for stored in row.attempts or []:
        attempt = Attempt.from_json(stored)
        ex.attempts[attempt.attempt] = attempt
    if ex.attempts:  # the row's output and traceback are its latest attempt's
        latest = ex.attempts[max(ex.attempts)]
        latest.output_json, latest.traceback = row.output_json, row.traceback
    return ex


def _context_from_request(ex: Execution, request: ExecutionRequest) -> None:
    ex.name = request.name
    ex.priority = request.priority
    # the first attempt's trigger is why the execution exists; retries say "retry"
    if request.attempt == 1 or (ex.trigger is None and request.trigger != Trigger.RETRY):
        ex.trigger = request.trigger
    ex.dag_id = request.dag_id or ex.dag_id
    ex.dag_run_id = request.dag_run_id or ex.dag_run_id
    ex.queue = request.queue


def apply_request(ex: Execution, request: ExecutionRequest) -> None:
    _context_from_request(ex, request)
    a = ex.attempt(request.attempt)
    a.due_at_ms = request.due_at_ms
    a.queued_at_ms = request.emitted_at_ms
    a.trigger = request.trigger


def _newer(seen: tuple[int, str] | None, token: int, worker: str) -> bool:
    """A report replaces the stored one when its (lease token, worker) is higher."""
    return seen is None or (token, worker) >= seen


def apply_result(ex: Execution, result: ExecutionResult) -> None:
    ex.priority = result.priority or ex.priority
    a = ex.attempt(result.attempt)
    token, worker = int(result.lease_token), result.worker_id
    if result.status is ResultStatus.RUNNING:
        if not _newer(a.start, token, worker):
            return
        a.start = (token, worker)
        a.started_at = iso(result.started_at_ms)
        a.started_at_ms = result.started_at_ms
        if a.end is None:  # the worker that finished the attempt is the one shown
            a.worker_id = worker
        return
    if not _newer(a.end, token, worker):
        return
    a.end = (token, worker)
    a.result = "success" if result.status is ResultStatus.SUCCESS else "failure"
    a.worker_id = worker
    a.finished_at = iso(result.finished_at_ms)
    if not _policy_verdict(a.error):  # the scheduler's verdict (dead letter) stays shown
        a.error = None if result.error is None else error_json(result.error)
    a.has_error = True
    a.output_json = result.output_json
    a.traceback = None if result.error is None else result.error.traceback
    if result.started_at_ms is not None and a.start is None:
        a.started_at = iso(result.started_at_ms)
        a.started_at_ms = result.started_at_ms


def apply_dead_letter(ex: Execution, dead: DeadLetter) -> None:
    _context_from_request(ex, dead.request)
    ex.attempt(dead.attempts).dead_at = iso(dead.dead_at_ms)
    for err in dead.errors:
        a = ex.attempt(err.attempt)
        # the worker's own report is richer; the dead letter fills attempts nobody reported,
        # and says when the retry policy refused the failure (issue 18: non_retryable)
        if not a.has_error or err.error.reason is ErrorReason.NON_RETRYABLE:
            a.error, a.has_error = error_json(err.error), True
        if a.worker_id is None and err.worker_id is not None:
            a.worker_id = err.worker_id
        if a.result is None:
            a.result = "failure"
            a.finished_at = iso(err.at_ms)


def _policy_verdict(error: Any) -> bool:
    """Whether a stored error is the scheduler's retry-policy verdict (from a dead letter)."""
    return isinstance(error, dict) and error.get("reason") == ErrorReason.NON_RETRYABLE.value


def error_json(error: ErrorInfo) -> dict[str, Any]:
    """An error as the ``error`` and ``attempts`` columns hold it: without its traceback,
    which has its own column (the latest attempt's only), so list reads stay small."""
    data = error.to_avro()
    data.pop("traceback", None)
    if not data.get("exception_types"):  # only a task's failure has them: rows stay as before
        data.pop("exception_types", None)
    return data


def apply(ex: Execution, event: ExecutionEvent) -> None:
    """Merge one of the execution's events into it."""
    if isinstance(event, ExecutionRequest):
        apply_request(ex, event)
    elif isinstance(event, ExecutionResult):
        apply_result(ex, event)
    else:
        apply_dead_letter(ex, event)


def execution_row(ex: Execution) -> Row:
    """The row of a merged execution: the latest attempt's fields, every attempt's history."""
    numbers = sorted(ex.attempts)
    latest = ex.attempts[numbers[-1]]
    first = ex.attempts[numbers[0]]
    history = [{**ex.attempts[n].to_json(), "status": ex.attempts[n].status()} for n in numbers]
    lateness_ms = None
    due = first.due_at_ms
    if due is not None:
        began = first.started_at_ms or first.queued_at_ms
        if began is not None:
            lateness_ms = float(max(0, began - due))
    error = latest.error
    return {
        "execution_id": ex.execution_id,
        "scheduled_at": dt(ex.scheduled_at_ms),
        "job_id": ex.job_id,
        "name": ex.name,
        "priority": ex.priority,
        "status": latest.status(),
        "attempt": numbers[-1],
        "trigger": ex.trigger,
        # ISO text, as COPY's text format sends it: a datetime took psycopg ~3.2 us a value to
        # format back into this text (the attempts' times are already text, from ``iso``)
        "queued_at": iso(latest.queued_at_ms),
        "started_at": latest.started_at,
        "finished_at": latest.finished_at,
        "worker_id": latest.worker_id,
        "error": None if error is None else json.dumps(error, sort_keys=True),
        "attempts": json.dumps(history, sort_keys=True),
        "lateness_ms": lateness_ms,
        "dag_id": ex.dag_id,
        "dag_run_id": ex.dag_run_id,
        "output_json": latest.output_json,
        "traceback": latest.traceback,
        "queue": ex.queue,
    }


# --- dead letters, DAGs, DAG runs ----------------------------------------------------------


def dead_letter_row(dead: DeadLetter) -> Row:
    request = {**dead.request.to_avro(), "target": target_to_api(dead.request.target)}
    return {
        "execution_id": dead.execution_id,
        "job_id": dead.job_id,
        "name": dead.name,
        "dead_at": dt(dead.dead_at_ms),
        "attempts": dead.attempts,
        "errors": json.dumps([e.to_avro() for e in dead.errors], sort_keys=True),
        "request": json.dumps(request, sort_keys=True),
        "dag_run_id": dead.dag_run_id,
    }


def dag_row(dag: DagDefinition) -> Row:
    schedule = schedule_to_api(dag.schedule)
    return {
        "dag_id": dag.dag_id,
        "name": dag.name,
        "schedule": None if schedule is None else json.dumps(schedule),
        "overlap": dag.overlap,
        "nodes": json.dumps(
            [
                {"key": n.key, "job_id": n.job_id, "depends_on": list(n.depends_on)}
                for n in dag.nodes
            ]
        ),
        "revision": dag.revision,
        "created_at": dt(dag.created_at_ms),
        "updated_at": dt(dag.created_at_ms),
    }


@dataclass
class DagRunDelta:
    """What a batch's events (in offset order) change in one DAG run."""

    dag_run_id: str
    dag_id: str
    first_at_ms: int
    status: str | None = None
    finished_at_ms: int | None = None
    replace_nodes: bool = False
    nodes: dict[str, str] = field(default_factory=dict)
    reopened: bool = False
    """A repair put the finished run back to running: its finished_at is cleared."""

    def apply(self, event: DagRunEvent) -> None:
        kind = event.kind
        if kind in _SNAPSHOTS and event.node_statuses:
            self.replace_nodes = True
            self.nodes = dict(event.node_statuses)
        if kind in _NODE_KINDS and event.node_key and event.node_status:
            self.nodes[event.node_key] = event.node_status
        if kind is DagRunEventKind.REOPENED:
            self.status = Status.RUNNING.value
            self.finished_at_ms = None
            self.reopened = True
        elif kind is DagRunEventKind.COMPLETED:
            self.status = event.status or Status.SUCCESS.value
            self.finished_at_ms = event.at_ms
        elif kind is DagRunEventKind.STARTED and self.status is None:
            self.status = Status.RUNNING.value


_SNAPSHOTS = (DagRunEventKind.STARTED, DagRunEventKind.COMPLETED, DagRunEventKind.REOPENED)
_NODE_KINDS = (DagRunEventKind.NODE_STATUS, DagRunEventKind.NODE_CANCELLED)


def fold_dag_runs(events: Iterable[DagRunEvent]) -> dict[str, DagRunDelta]:
    deltas: dict[str, DagRunDelta] = {}
    for event in events:
        if event.kind is DagRunEventKind.RETRY:
            continue  # a request to the resolver, which answers with reopened and node events
        run = deltas.get(event.dag_run_id)
        if run is None:
            run = deltas[event.dag_run_id] = DagRunDelta(
                event.dag_run_id, event.dag_id, event.at_ms
            )
        run.apply(event)
    return deltas
