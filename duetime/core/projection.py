"""The job row of the PostgreSQL projection, built from a definition record.

The projector and the REST API (its read-your-writes row for a job created a moment ago) both
build it here, so the two can never disagree.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from .jobspec import schedule_to_api, target_to_api
from .models import Status
from .records import ConcurrencyLimit, Fairness, JobDefinition, RateLimit
from .schedule import first_fire, parse_schedule

__all__ = [
    "JOB_COLUMNS",
    "JOB_DEFINITION_COLUMNS",
    "JOB_STATUS_COLUMNS",
    "Row",
    "dt",
    "job_row",
]

Row = dict[str, Any]
"""A row for PostgreSQL: column name → value."""

JOB_DEFINITION_COLUMNS = (
    "name",
    "priority",
    "schedule",
    "target",
    "payload",
    "retry",
    "timeout_s",
    "misfire",
    "overlap",
    "dag_id",
    "dag_key",
    "depends_on",
    "labels",
    "revision",
    "created_at",
    "updated_at",
    "start_within_s",
    "queue",
    "concurrency",
    "rate_limit",
    "fairness",
)
"""Columns of the jobs table that come from the definition (highest revision wins)."""
JOB_STATUS_COLUMNS = ("status", "next_run_at", "status_at", "state_offset")
"""Columns that come from the scheduler's state (latest state-topic offset wins)."""
JOB_COLUMNS = ("job_id", *JOB_DEFINITION_COLUMNS, *JOB_STATUS_COLUMNS)
"""Every column ``job_row`` fills."""


def dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def job_row(definition: JobDefinition, *, with_next_run: bool = True) -> Row:
    """The definition columns of a job row, and the status it has before any scheduler state
    (``with_next_run=False``: the caller has the scheduler's own next run)."""
    blocked = bool(definition.dag_id) and bool(definition.depends_on)
    schedule = schedule_to_api(definition.schedule)
    next_run = None
    if with_next_run and schedule is not None and not blocked:
        # parsed from its API form, as the API validated it
        next_run = first_fire(
            parse_schedule(schedule), datetime.fromtimestamp(definition.created_at_ms / 1000, UTC)
        )
    return {
        "job_id": definition.job_id,
        "name": definition.name,
        "status": Status.BLOCKED if blocked else Status.PENDING,
        "priority": definition.priority,
        "schedule": None if schedule is None else json.dumps(schedule),
        "target": json.dumps(target_to_api(definition.target)),
        "payload": definition.payload_json,
        "retry": json.dumps(definition.retry.to_avro()),
        "timeout_s": definition.timeout_s,
        "misfire": definition.misfire,
        "overlap": definition.overlap,
        "dag_id": definition.dag_id,
        "dag_key": definition.dag_key,
        "depends_on": list(definition.depends_on),
        "labels": json.dumps(dict(definition.labels), sort_keys=True),
        "revision": definition.revision,
        "created_at": dt(definition.created_at_ms),
        "updated_at": dt(definition.updated_at_ms),
        "start_within_s": definition.start_within_s,
        "queue": definition.queue,
        "concurrency": _limit_json(definition.concurrency),
        "rate_limit": _limit_json(definition.rate_limit),
        "fairness": _limit_json(definition.fairness),
        "next_run_at": next_run,
        "status_at": dt(definition.created_at_ms),
        "state_offset": -1,
    }


def _limit_json(limit: ConcurrencyLimit | RateLimit | Fairness | None) -> str | None:
    """A limit as the API shows it (``jobs.concurrency`` / ``jobs.rate_limit``, migration 0009;
    ``jobs.fairness``, migration 0013)."""
    return None if limit is None else json.dumps(limit.to_avro())
