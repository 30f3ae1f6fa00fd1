"""The projection's rows, typed: what the API reads from PostgreSQL, one dataclass per table.

Role: the store turns each fetched row (a mapping of column → value) into one of these at the
database edge, so the routes and ``convert`` read attributes mypy checks, never ``row["..."]``.

Guarantees:

* A class lists the columns the API uses; other columns of a ``SELECT *`` are ignored, and a
  column the class needs but the row lacks is a ``TypeError`` naming it (a query that does not
  match its row type fails loudly, never shows ``None``).
* A job's ``status`` is a :class:`Status`; the other values are as PostgreSQL (and the
  API's depth-checked JSON decoder, ``store.json_loads``) gave them, ``TooDeep`` included:
  ``convert`` decides how each is shown.
* A nested row that arrives as JSON (``to_jsonb`` of an execution or a DAG run) is built the
  same way; its times are then ISO strings, not datetimes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime
from typing import Any, ClassVar, Self

from duetime.core.models import Status
from duetime.core.records import DagNode


class _Row:
    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        """The typed row from a fetched one (column name → value)."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in row:
                kwargs[f.name] = row[f.name]
            elif f.default is MISSING and f.default_factory is MISSING:
                raise TypeError(f"{cls.__name__}: the row has no column {f.name!r}")
        return cls(**kwargs)


Time = datetime | str
"""A timestamp column: a datetime from a row, an ISO string from a row turned into JSON."""


@dataclass(slots=True, frozen=True, kw_only=True)
class ExecutionRow(_Row):
    execution_id: Any
    job_id: Any
    name: str
    status: str
    attempt: int
    trigger: str
    priority: str
    scheduled_at: Time
    queued_at: Time | None
    started_at: Time | None
    finished_at: Time | None
    worker_id: str | None
    error: Any
    lateness_ms: int | None
    dag_id: Any
    dag_run_id: str | None
    attempts: Any
    output_json: str | None = None
    """The latest attempt's return value as JSON text (not decoded by the connection: text)."""
    traceback: str | None = None
    """The latest attempt's traceback; list queries leave it out (``store.EXECUTION_LISTED``)."""
    queue: str = "default"
    """The queue the execution was emitted to (migration 0008)."""


@dataclass(slots=True, frozen=True, kw_only=True)
class JobRow(_Row):
    job_id: Any
    name: str
    status: Status
    next_run_at: datetime | None
    schedule: Any
    priority: str
    target: Any
    payload: Any
    retry: Any
    timeout_s: float
    misfire: str
    overlap: str
    labels: Any
    dag_id: Any
    dag_key: str | None
    depends_on: list[str] | None
    created_at: datetime
    updated_at: datetime
    revision: int = 0
    deleted: bool = False
    start_within_s: float | None = None
    queue: str = "default"
    concurrency: Any = None
    rate_limit: Any = None
    fairness: Any = None
    last_execution: Any = None
    """The job's latest execution as JSON (``to_jsonb``), when the query joined it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))


@dataclass(slots=True, frozen=True, kw_only=True)
class NewJob(_Row):
    """What the API's own row of a job it just created says (``store.insert_new_job``)."""

    status: Status
    next_run_at: datetime | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))


@dataclass(slots=True, frozen=True, kw_only=True)
class DeadLetterRow(_Row):
    execution_id: Any
    job_id: Any
    name: str
    dead_at: datetime
    attempts: int
    errors: Any
    dag_run_id: str | None
    replayed_at: datetime | None


@dataclass(slots=True, frozen=True, kw_only=True)
class ReplayRow(_Row):
    """An execution that a replay started (``store.replay_executions``)."""

    execution_id: Any
    job_id: Any
    status: str


@dataclass(slots=True, frozen=True, kw_only=True)
class DagRunRow(_Row):
    dag_run_id: str
    dag_id: Any
    status: str
    started_at: Time
    finished_at: Time | None
    node_statuses: dict[str, str] | None
    execution_statuses: dict[str, str] = field(default_factory=dict)
    """job_id → status of the run's executions (fresher than ``node_statuses`` while a node
    runs); filled by ``store.list_dag_runs``, empty elsewhere."""


@dataclass(slots=True, frozen=True, kw_only=True)
class DagRow(_Row):
    dag_id: Any
    name: str
    schedule: Any
    overlap: str
    nodes: list[DagNode]
    created_at: datetime
    updated_at: datetime
    last_run: DagRunRow | None = None
    """The DAG's latest run, when the query joined it (``store.list_dags``)."""

    def __post_init__(self) -> None:
        nodes = [n if isinstance(n, DagNode) else DagNode.from_avro(n) for n in self.nodes or []]
        object.__setattr__(self, "nodes", nodes)
        run = self.last_run
        if run is not None and not isinstance(run, DagRunRow):
            object.__setattr__(self, "last_run", DagRunRow.from_row(run))

    def key_of_job(self) -> dict[str, str]:
        return {n.job_id: n.key for n in self.nodes}
