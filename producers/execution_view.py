"""One execution as the SDK reads it from the PostgreSQL projection (``JobClient.get_execution``).

The same facts as ``GET /v1/executions/{id}``, typed: status, attempts with their errors, the
latest attempt's output (decoded from its JSON text) and traceback. What a read shows is
redacted here as the API redacts it (``duetime.core.redact``): a URL's credentials and query
values and bearer credentials in an error or a traceback never reach the caller.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row

from duetime.core.errors import NotFound
from duetime.core.redact import redact_text

_HIDDEN_ATTEMPT_KEYS = ("due_at_ms", "queued_at_ms", "started_at_ms", "result")


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionView:
    execution_id: str
    job_id: str
    name: str
    status: str
    attempt: int
    """The latest attempt's number (1-based)."""
    trigger: str | None
    priority: str
    scheduled_at: datetime
    queued_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    error: dict[str, Any] | None
    """The latest attempt's error (type, message, retryable, reason, http_status)."""
    attempts: list[dict[str, Any]]
    """Every attempt, oldest first: status, times, worker, error."""
    dag_id: str | None
    dag_run_id: str | None
    output: Any
    """The latest attempt's return value (JSON-decoded; NaN and Infinity as Python reads
    them); None when it returned nothing."""
    output_json: str | None
    """The same as the worker published it (JSON text, at most 64 KiB)."""
    traceback: str | None
    """The latest attempt's traceback when a Python task raised (at most 8 KiB, redacted)."""


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


def _output(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not ours to fail on: the text is still there
        return None


@dataclass(slots=True, kw_only=True)
class _Stored:
    """The columns read (psycopg's ``class_row``: attributes, not ``row["..."]``)."""

    execution_id: Any
    job_id: Any
    name: str
    status: str
    attempt: int
    trigger: str | None
    priority: str
    scheduled_at: datetime
    queued_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    error: Any
    attempts: Any
    dag_id: Any
    dag_run_id: str | None
    output_json: str | None
    traceback: str | None


_SELECT = (
    f"SELECT {', '.join(f.name for f in fields(_Stored))} FROM executions "
    "WHERE execution_id = %s ORDER BY scheduled_at LIMIT 1"
)


def _attempt(stored: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: _redacted(v) if k == "error" else v
        for k, v in stored.items()
        if not k.startswith("_") and k not in _HIDDEN_ATTEMPT_KEYS
    }


def read_execution(conn: psycopg.Connection[Any], execution_id: str) -> ExecutionView:
    """The execution ``execution_id`` (a canonical UUID); :class:`NotFound` if the projection
    does not hold it."""
    with conn.cursor(row_factory=class_row(_Stored)) as cur:
        row = cur.execute(_SELECT, (execution_id,)).fetchone()
    if row is None:
        raise NotFound(f"no execution {execution_id}", details={"execution_id": execution_id})
    return ExecutionView(
        execution_id=str(row.execution_id),
        job_id=str(row.job_id),
        name=row.name,
        status=row.status,
        attempt=row.attempt,
        trigger=row.trigger,
        priority=row.priority,
        scheduled_at=row.scheduled_at,
        queued_at=row.queued_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        worker_id=row.worker_id,
        error=_redacted(row.error),
        attempts=[_attempt(a) for a in row.attempts or []],
        dag_id=None if row.dag_id is None else str(row.dag_id),
        dag_run_id=row.dag_run_id,
        output=_output(row.output_json),
        output_json=row.output_json,
        traceback=None if row.traceback is None else redact_text(row.traceback),
    )
