"""Outcomes of attempts and the ExecutionResult records that report them (pure).

An :class:`Outcome` is what running a target produced; :func:`result_record` turns a request,
the lease token and an outcome into the ``result`` event of ``schemas/ExecutionResult.avsc``.
The error field's ``reason`` is one of the schema's ``ErrorReason`` symbols, and
``retryable`` tells the scheduler whether its retry policy applies.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from duetime.core.errors import FailPermanently, PermanentError, RetryLater

MAX_MESSAGE_CHARS = 2000
MAX_OUTPUT_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Outcome:
    status: str
    """``success`` or ``failure``."""
    error: dict[str, Any] | None = None
    retry_after_s: float | None = None
    output_json: str | None = None

    @property
    def reason(self) -> str:
        return "" if self.error is None else str(self.error["reason"])


def success(output: Any = None) -> Outcome:
    return Outcome("success", output_json=encode_output(output))


def truncated(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying so and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [truncated: {len(text)} characters, limit {limit}]"


def failure(
    error_type: str,
    message: str,
    *,
    retryable: bool,
    reason: str = "error",
    http_status: int | None = None,
    retry_after_s: float | None = None,
) -> Outcome:
    return Outcome(
        "failure",
        error={
            "type": truncated(error_type, 200),
            "message": truncated(message, MAX_MESSAGE_CHARS),
            "retryable": retryable,
            "reason": reason,
            "http_status": http_status,
        },
        retry_after_s=retry_after_s,
    )


def from_exception(exc: BaseException) -> Outcome:
    """A task's exception: RetryLater / FailPermanently steer, anything else is retryable."""
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    if isinstance(exc, RetryLater):
        return failure(type(exc).__name__, message, retryable=True, retry_after_s=exc.delay_s)
    if isinstance(exc, FailPermanently | PermanentError):
        reason = "unknown_target" if getattr(exc, "code", "") == "unknown_target" else "error"
        return failure(type(exc).__name__, message, retryable=False, reason=reason)
    return failure(type(exc).__name__, message, retryable=True)


def timed_out(timeout_s: float) -> Outcome:
    return failure(
        "Timeout",
        f"the attempt ran longer than its timeout of {timeout_s:g} s",
        retryable=True,
        reason="timeout",
    )


def encode_output(value: Any) -> str | None:
    """The task's return value as JSON text; None for None or unserialisable. An output over
    ``MAX_OUTPUT_BYTES`` is replaced by a marker saying so (the result must stay a small
    record: it shares the results topic with every other execution's)."""
    if value is None:
        return None
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        return None
    size = len(text.encode())
    if size <= MAX_OUTPUT_BYTES:
        return text
    return json.dumps(
        {"duetime_truncated": True, "size_bytes": size, "limit_bytes": MAX_OUTPUT_BYTES}
    )


def result_record(
    request: dict[str, Any],
    *,
    status: str,
    worker_id: str,
    token: int,
    started_at_ms: int,
    finished_at_ms: int | None = None,
    outcome: Outcome | None = None,
) -> dict[str, Any]:
    """The ``result`` event for ``request``'s attempt."""
    return {
        "execution_id": request["execution_id"],
        "job_id": request["job_id"],
        "attempt": request["attempt"],
        "status": status,
        "worker_id": worker_id,
        "lease_token": token,
        "scheduled_at_ms": request["scheduled_at_ms"],
        "started_at_ms": started_at_ms,
        "finished_at_ms": finished_at_ms,
        "error": None if outcome is None else outcome.error,
        "retry_after_s": None if outcome is None else outcome.retry_after_s,
        "output_json": None if outcome is None else outcome.output_json,
        "priority": request["priority"],
        "dag_id": request.get("dag_id"),
        "dag_run_id": request.get("dag_run_id"),
        "dag_key": request.get("dag_key"),
    }


def check_request(request: dict[str, Any]) -> None:
    """Refuse a decodable request no scheduler can have written (it goes to the poison topic)."""
    for name in ("execution_id", "job_id"):
        try:
            uuid.UUID(request[name])
        except (ValueError, TypeError, AttributeError):
            raise ValueError(f"{name} {request[name]!r} is not a UUID") from None
    if request["attempt"] < 1:
        raise ValueError(f"attempt {request['attempt']} is not 1-based")
    if not request["timeout_s"] > 0:
        raise ValueError(f"timeout_s {request['timeout_s']} is not positive")
