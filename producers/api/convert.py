"""Projection rows → the API's JSON shapes (see ``schemas``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_HIDDEN_ATTEMPT_KEYS = ("due_at_ms", "queued_at_ms", "started_at_ms", "result")


def _s(value: Any) -> str | None:
    return None if value is None else str(value)


def attempt_out(a: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in a.items() if not k.startswith("_") and k not in _HIDDEN_ATTEMPT_KEYS}


def execution_out(e: Mapping[str, Any]) -> dict[str, Any]:
    """From a row, or from ``to_jsonb`` of a row (then times are strings)."""
    return {
        "execution_id": str(e["execution_id"]),
        "job_id": str(e["job_id"]),
        "name": e["name"],
        "status": e["status"],
        "attempt": e["attempt"],
        "trigger": e["trigger"],
        "priority": e["priority"],
        "scheduled_at": e["scheduled_at"],
        "queued_at": e["queued_at"],
        "started_at": e["started_at"],
        "finished_at": e["finished_at"],
        "worker_id": e["worker_id"],
        "error": e["error"],
        "lateness_ms": e["lateness_ms"],
        "dag_id": _s(e["dag_id"]),
        "dag_run_id": e["dag_run_id"],
        "attempts": [attempt_out(a) for a in e["attempts"] or []],
    }


def job_out(row: Mapping[str, Any]) -> dict[str, Any]:
    last = row.get("last_execution")
    return {
        "job_id": str(row["job_id"]),
        "name": row["name"],
        "status": row["status"],
        "next_run_at": row["next_run_at"],
        "schedule": row["schedule"],
        "priority": row["priority"],
        "target": row["target"],
        "payload": row["payload"],
        "retry": row["retry"],
        "timeout_s": row["timeout_s"],
        "misfire": row["misfire"],
        "overlap": row["overlap"],
        "labels": row["labels"],
        "dag_id": _s(row["dag_id"]),
        "dag_key": row["dag_key"],
        "depends_on": list(row["depends_on"] or []),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "last_execution": None if last is None else execution_out(last),
    }


def job_spec(row: Mapping[str, Any]) -> dict[str, Any]:
    """What a create body said, from a row: compared with a new body for idempotency."""
    return {
        "name": row["name"],
        "schedule": row["schedule"],
        "priority": row["priority"],
        "target": row["target"],
        "payload": row["payload"],
        "retry": row["retry"],
        "timeout_s": row["timeout_s"],
        "misfire": row["misfire"],
        "overlap": row["overlap"],
        "labels": row["labels"] or {},
        "dag_id": _s(row["dag_id"]),
        "dag_key": row["dag_key"],
        "depends_on": list(row["depends_on"] or []),
    }


def dead_letter_out(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "execution_id": str(row["execution_id"]),
        "job_id": str(row["job_id"]),
        "name": row["name"],
        "dead_at": row["dead_at"],
        "attempts": row["attempts"],
        "errors": row["errors"],
        "dag_run_id": row["dag_run_id"],
        "replayed_at": row["replayed_at"],
    }
