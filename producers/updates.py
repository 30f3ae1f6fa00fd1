"""Changing and deleting a job: the rules shared by the REST API and the SDK.

A change is the next *revision* of the job's definition, published to the jobs topic like a
create; the scheduler applies a definition whose revision is higher than the one it holds
(``schedulers.logic.on_definition``). The current definition comes from the PostgreSQL
projection: both the API and the SDK lock the job's row (``SELECT … FOR UPDATE``), build the
next revision from it, publish it, wait for Kafka's acknowledgement and write the new
definition columns into the row before committing, so two updates of one job are serialised
and neither loses the other's fields. An ``expected_revision`` (REST: ``If-Match``) refuses a
change built on a definition that has changed since it was read.

A delete is a ``cancel`` command plus the next revision carrying the reserved label
:data:`DELETED_LABEL`; the projection's ``deleted`` column is derived from it (migration 0004),
so it needs no new event kind and survives a projection rebuild.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from duetime.core.errors import Conflict, NotFound, ValidationError
from duetime.core.jobspec import _KEYS as JOB_KEYS
from duetime.core.models import Status
from duetime.core.projection import JOB_DEFINITION_COLUMNS, dt, job_row
from duetime.core.records import JobDefinition

DELETED_LABEL = "duetime.deleted"
"""Label of a deleted job's last revision (reserved: users may not set ``duetime.`` labels)."""
DAG_LABEL = "duetime.dag"
"""Label of a DAG's trigger job (as in ``duetime.producers.sdk``)."""

_FIXED = frozenset({"job_id", "dag_id", "dag_key", "depends_on"})
UPDATABLE = JOB_KEYS - _FIXED
"""What an update may change: every field a create takes but the job's id and its DAG."""

CURRENT_SQL = (
    "SELECT name, schedule::text, priority, target::text, payload::text, retry::text, timeout_s, "
    "misfire, overlap, labels::text, dag_id::text, dag_key, depends_on, revision, created_at, "
    "status, start_within_s, queue, concurrency::text, rate_limit::text, fairness::text "
    "FROM jobs WHERE job_id = %s FOR UPDATE"
)
"""The row an update starts from, locked until the updater's transaction ends (JSON as text:
the API's pool leaves a too-deeply nested payload undecoded, and an update must carry it)."""
_WRITTEN = tuple(
    c
    for c in JOB_DEFINITION_COLUMNS
    if c not in ("dag_id", "dag_key", "depends_on", "revision", "created_at", "updated_at")
)
"""The definition columns an update changes (its DAG fields stay; created_at is the job's)."""
WRITE_SQL = (
    f"UPDATE jobs SET {', '.join(f'{c} = %s' for c in _WRITTEN)}, revision = %s, "
    "updated_at = %s WHERE job_id = %s AND revision < %s"
)
"""The updater's own read-your-writes row (the projector writes the same columns later)."""


def current_body(job_id: str, row: tuple[Any, ...]) -> tuple[dict[str, Any], int, datetime, Status]:
    """(the job as a create body, its revision, created_at, status) from a ``CURRENT_SQL``
    row."""
    (name, schedule, priority, target, payload, retry, timeout_s, misfire, overlap) = row[:9]
    labels, dag_id, dag_key, depends_on, revision, created_at, status, start_within_s = row[9:17]
    queue = row[17]
    concurrency, rate_limit = row[18:20]
    fairness = row[20]

    def decoded(value: Any) -> Any:
        return None if value is None else json.loads(value)

    body = {
        "job_id": job_id,
        "name": name,
        "schedule": decoded(schedule),
        "priority": priority,
        "target": decoded(target),
        "payload": decoded(payload),
        "retry": decoded(retry),
        "timeout_s": timeout_s,
        "misfire": misfire,
        "overlap": overlap,
        "labels": decoded(labels) or {},
        "dag_id": dag_id,
        "dag_key": dag_key,
        "depends_on": list(depends_on or []),
        "start_within_s": start_within_s,
        "queue": queue,
        "concurrency": decoded(concurrency),
        "rate_limit": decoded(rate_limit),
        "fairness": decoded(fairness),
    }
    return body, int(revision), created_at, Status(status)


def check_changeable(job_id: str, body: Mapping[str, Any], status: Status, action: str) -> None:
    """Refuse (409) to change a deleted or cancelled job, a DAG member or a DAG's trigger job
    (those change through their DAG)."""
    labels = body.get("labels") or {}
    if DELETED_LABEL in labels:
        raise Conflict(f"cannot {action} job {job_id}: it was deleted", details={"job_id": job_id})
    if body.get("dag_id") or DAG_LABEL in labels:
        raise Conflict(
            f"cannot {action} job {job_id}: it belongs to a DAG; change the DAG instead",
            details={"job_id": job_id},
        )
    if action == "update" and status is Status.CANCELLED:
        raise Conflict(
            f"cannot update job {job_id}: its status is 'cancelled'",
            details={"job_id": job_id, "status": status.value},
        )


def merged(current: Mapping[str, Any], changes: Any) -> dict[str, Any]:
    """The body of the next revision: ``current`` with each field of ``changes`` replaced as a
    whole (a new ``labels`` or ``retry`` replaces the old one; ``schedule: null`` removes it).
    Raises :class:`ValidationError` naming a field an update may not set."""
    if not isinstance(changes, Mapping):
        raise ValidationError("an update must be a JSON object", field="")
    if not changes:
        raise ValidationError("an update must change at least one field", field="")
    for key in sorted(changes, key=str):
        if key in _FIXED:
            raise ValidationError(f"{key} cannot be changed by an update", field=str(key))
        if key not in UPDATABLE:
            raise ValidationError(f"unknown job field(s): {key}", field=str(key))
    body = {k: v for k, v in current.items() if k not in _FIXED or k == "job_id"}
    body.update(changes)
    return body


def check_revision(
    job_id: str, revision: int, expected: int | None, error: type[Conflict] = Conflict
) -> None:
    """Refuse (``error``: 409, REST 412) a change built on another revision than the current
    one."""
    if expected is not None and expected != revision:
        raise error(
            f"job {job_id} is at revision {revision}, not {expected}: read it again",
            details={"job_id": job_id, "revision": revision, "expected_revision": expected},
        )


def next_revision(current: int, now_ms: int) -> int:
    """Higher than ``current`` whatever the clock says (a create's revision is ``now_ms*1000``;
    a clock that stepped back must not make the scheduler ignore the change)."""
    return max(now_ms * 1000, current + 1)


def with_history(built: JobDefinition, created_at: datetime) -> JobDefinition:
    """The built revision keeping the job's creation time."""
    return replace(built, created_at_ms=int(created_at.timestamp() * 1000))


def row_values(definition: JobDefinition) -> list[Any]:
    """``WRITE_SQL``'s parameters for a built revision."""
    row = job_row(definition, with_next_run=False)
    return [
        *(row[c] for c in _WRITTEN),
        definition.revision,
        dt(definition.updated_at_ms),
        definition.job_id,
        definition.revision,
    ]


def not_found(job_id: str) -> NotFound:
    return NotFound(f"no job {job_id}", details={"job_id": job_id})
