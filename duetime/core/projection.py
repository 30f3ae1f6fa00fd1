"""The job row of the PostgreSQL projection, built from a definition event.

The projector and the REST API (its read-your-writes row for a job created a moment ago) both
build it here, so the two can never disagree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from .jobspec import schedule_to_api, target_to_api
from .schedule import first_fire, parse_schedule

Record = dict[str, Any]

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
)
"""Columns of the jobs table that come from the definition (highest revision wins)."""
JOB_STATUS_COLUMNS = ("status", "next_run_at", "status_at", "state_offset")
"""Columns that come from the scheduler's state (latest state-topic offset wins)."""
JOB_COLUMNS = ("job_id", *JOB_DEFINITION_COLUMNS, *JOB_STATUS_COLUMNS)
"""Every column ``job_row`` fills."""


def dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def job_row(definition: Mapping[str, Any], *, with_next_run: bool = True) -> Record:
    """The definition columns of a job row, and the status it has before any scheduler state
    (``with_next_run=False``: the caller has the scheduler's own next run)."""
    blocked = bool(definition.get("dag_id")) and bool(definition.get("depends_on"))
    schedule = schedule_to_api(definition.get("schedule"))
    next_run = None
    if with_next_run and schedule is not None and not blocked:
        created = dt(definition["created_at_ms"])
        assert created is not None
        first = first_fire(parse_schedule(schedule), created)
        next_run = first
    return {
        "job_id": definition["job_id"],
        "name": definition["name"],
        "status": "blocked" if blocked else "pending",
        "priority": definition["priority"],
        "schedule": None if schedule is None else json.dumps(schedule),
        "target": json.dumps(target_to_api(definition["target"])),
        "payload": definition["payload_json"],
        "retry": json.dumps(definition["retry"]),
        "timeout_s": definition["timeout_s"],
        "misfire": definition["misfire"],
        "overlap": definition["overlap"],
        "dag_id": definition.get("dag_id"),
        "dag_key": definition.get("dag_key"),
        "depends_on": list(definition.get("depends_on") or []),
        "labels": json.dumps(dict(definition.get("labels") or {}), sort_keys=True),
        "revision": definition["revision"],
        "created_at": dt(definition["created_at_ms"]),
        "updated_at": dt(definition["updated_at_ms"]),
        "next_run_at": next_run,
        "status_at": dt(definition["created_at_ms"]),
        "state_offset": -1,
    }
