"""Projection rows → the API's JSON shapes (see ``schemas``).

Every read goes through here, and so does redaction (``duetime.core.redact``): an HTTP
target's URL loses its userinfo and query values and its secret-looking headers are masked;
every string of an execution's or dead letter's errors has its URLs and credentials
redacted. A payload nested deeper than the API accepts (stored before the limit existed, or
published by an older SDK) is left out with a note rather than breaking the whole page.
``job_spec`` is not redacted: it compares a create body with what is stored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from duetime.core.jobspec import job_to_api
from duetime.core.records import JobDefinition
from duetime.core.redact import redact_headers, redact_text, redact_url
from duetime.core.retry import RetryPolicy

from .jsondepth import exceeds_depth, nesting_depth
from .lifecycle import dag_out, lifecycle
from .rows import DeadLetterRow, ExecutionRow, JobRow
from .store import MAX_DECODED_DEPTH, TooDeep

MAX_SHOWN_DEPTH = MAX_DECODED_DEPTH
"""Payloads nested deeper than this are not shown (the answer's encoders recurse per level)."""


def _decoded(value: Any, instead: Any) -> Any:
    """A JSON column's value, or ``instead`` where it was too deep to decode."""
    return instead if isinstance(value, TooDeep) else value


_HIDDEN_ATTEMPT_KEYS = ("due_at_ms", "queued_at_ms", "started_at_ms", "result")


def _s(value: Any) -> str | None:
    return None if value is None else str(value)


def attempt_out(a: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: redact_deep(v) if k == "error" else v
        for k, v in a.items()
        if not k.startswith("_") and k not in _HIDDEN_ATTEMPT_KEYS
    }


def redact_target(target: Any) -> Any:
    """A stored target (JSON, as the API shows it) with its URL and headers redacted."""
    if not isinstance(target, Mapping) or target.get("type") != "http":
        return target
    out = dict(target)
    url, headers = target.get("url"), target.get("headers")
    if isinstance(url, str):
        out.update(url=redact_url(url))
    if isinstance(headers, Mapping):
        out.update(headers=redact_headers(headers))
    return out


def redact_deep(value: Any, depth: int = 0) -> Any:
    """Every string inside ``value`` with its URLs and credentials redacted."""
    if isinstance(value, str):
        return redact_text(value)
    if depth > MAX_SHOWN_DEPTH:
        return None
    if isinstance(value, Mapping):
        return {k: redact_deep(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_deep(v, depth + 1) for v in value]
    return value


MAX_LISTED_OUTPUT_BYTES = 1024
"""An output larger than this is left out of lists (a page of 100 stays small): the single
execution's read shows it whole."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def output_of(text: str | None, limit_bytes: int | None) -> tuple[Any, str | None]:
    """(the output to show, why it is not shown): the stored JSON text decoded, unless it is
    over ``limit_bytes``, not strict JSON (Python writes NaN and Infinity, a JSON answer may
    not hold them) or nested deeper than the API decodes."""
    if text is None:
        return None, None
    raw = text.encode("utf-8", "backslashreplace")
    if limit_bytes is not None and len(raw) > limit_bytes:
        return None, (
            f"{len(raw)} bytes, over {limit_bytes} in a list: "
            "GET /v1/executions/{execution_id} shows it"
        )
    if exceeds_depth(raw, MAX_SHOWN_DEPTH):
        return None, "nested too deep to show"
    try:
        return json.loads(raw, parse_constant=_refuse_constant), None
    except ValueError as exc:
        return None, f"not strict JSON ({str(exc)[:80]})"


def execution_detail(e: ExecutionRow) -> dict[str, Any]:
    """One execution as ``GET /v1/executions/{id}`` shows it: the output whole (up to the
    worker's cap) and the latest attempt's traceback (redacted again: it was on the worker)."""
    out = execution_out(e, output_limit_bytes=None)
    out["traceback"] = None if e.traceback is None else redact_text(e.traceback)
    return out


def execution_out(
    e: ExecutionRow, output_limit_bytes: int | None = MAX_LISTED_OUTPUT_BYTES
) -> dict[str, Any]:
    """From a row, or from ``to_jsonb`` of a row (then times are strings)."""
    output, output_omitted = output_of(e.output_json, output_limit_bytes)
    return {
        "execution_id": str(e.execution_id),
        "job_id": str(e.job_id),
        "name": e.name,
        "status": e.status,
        "attempt": e.attempt,
        "trigger": e.trigger,
        "priority": e.priority,
        "queue": e.queue,
        "scheduled_at": e.scheduled_at,
        "queued_at": e.queued_at,
        "started_at": e.started_at,
        "finished_at": e.finished_at,
        "worker_id": e.worker_id,
        "error": redact_deep(_decoded(e.error, {"omitted": "nested too deep to show"})),
        "lateness_ms": e.lateness_ms,
        "dag_id": _s(e.dag_id),
        "dag_run_id": e.dag_run_id,
        "attempts": [attempt_out(a) for a in _decoded(e.attempts, []) or []],
        "output": redact_deep(output),
        "output_omitted": output_omitted,
    }


def job_out(row: JobRow) -> dict[str, Any]:
    last = _decoded(row.last_execution, None)
    last_row = None if last is None else ExecutionRow.from_row(last)
    payload, omitted = row.payload, None
    if isinstance(payload, TooDeep) or nesting_depth(payload) > MAX_SHOWN_DEPTH:
        payload = None
        omitted = f"the payload nests deeper than {MAX_SHOWN_DEPTH} levels and is not shown"
    out = {
        "job_id": str(row.job_id),
        "name": row.name,
        "status": row.status.value,
        "next_run_at": row.next_run_at,
        "schedule": row.schedule,
        "priority": row.priority,
        "target": redact_target(row.target),
        "payload": payload,
        "retry": retry_of(row.retry),
        "timeout_s": row.timeout_s,
        "start_within_s": row.start_within_s,
        "queue": row.queue,
        "concurrency": row.concurrency,
        "rate_limit": row.rate_limit,
        "fairness": row.fairness,
        "misfire": row.misfire,
        "overlap": row.overlap,
        "labels": row.labels,
        "dag_id": _s(row.dag_id),
        "dag_key": row.dag_key,
        "depends_on": list(row.depends_on or []),
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "revision": row.revision,
        "deleted": bool(row.deleted),
        "last_execution": None if last_row is None else execution_out(last_row),
        # lifecycle and last outcome apart (the status is the current occurrence's)
        "lifecycle": lifecycle(
            row.status,
            deleted=bool(row.deleted),
            schedule=row.schedule,
            next_run_at=row.next_run_at,
            dag_member=row.dag_id is not None,
        ),
        "last_outcome": None if last_row is None else last_row.status,
        "dag": dag_out(
            _s(row.dag_id),
            row.dag_key,
            row.labels,
            None if last_row is None else last_row.dag_run_id,
        ),
    }
    if omitted is not None:
        out["payload_omitted"] = omitted
    return out


def retry_of(stored: Any) -> Any:
    """A row's retry policy with the fields added since it was written (issue 18's error
    classes) at their defaults: shown as a new job shows it, and equal to the same body
    created again (the idempotency check compares them)."""
    if not isinstance(stored, Mapping):
        return stored
    return {**_RETRY_DEFAULTS, **stored}


_RETRY_DEFAULTS = RetryPolicy().to_dict()


def job_spec(row: JobRow) -> dict[str, Any]:
    """What a create body said, from a row: compared with a new body for idempotency."""
    return {
        "name": row.name,
        "schedule": row.schedule,
        "priority": row.priority,
        "target": row.target,
        "payload": row.payload,
        "retry": retry_of(row.retry),
        "timeout_s": row.timeout_s,
        "misfire": row.misfire,
        "overlap": row.overlap,
        "labels": row.labels or {},
        "dag_id": _s(row.dag_id),
        "dag_key": row.dag_key,
        "depends_on": list(row.depends_on or []),
        "start_within_s": row.start_within_s,
        "queue": row.queue,
        "concurrency": row.concurrency,
        "rate_limit": row.rate_limit,
        "fairness": row.fairness,
    }


def definition_spec(definition: JobDefinition) -> dict[str, Any]:
    """What a create body said, from its definition record (as ``job_spec`` from a row)."""
    return {k: v for k, v in job_to_api(definition).items() if k != "job_id"}


def dead_letter_out(row: DeadLetterRow) -> dict[str, Any]:
    return {
        "execution_id": str(row.execution_id),
        "job_id": str(row.job_id),
        "name": row.name,
        "dead_at": row.dead_at,
        "attempts": row.attempts,
        "errors": redact_deep(_decoded(row.errors, [])),
        "dag_run_id": row.dag_run_id,
        "replayed_at": row.replayed_at,
    }
