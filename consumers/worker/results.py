"""Outcomes of attempts and the ExecutionResult records that report them (pure).

An :class:`Outcome` is what running a target produced; :func:`result_record` turns a request,
the lease token and an outcome into the :class:`~duetime.core.records.ExecutionResult` that
reports it. The error's ``reason`` is an :class:`~duetime.core.models.ErrorReason`, and
``retryable`` tells the scheduler whether its retry policy applies.

Every error message goes through :func:`~duetime.core.redact.redact_text` here, in one place:
a URL's ``user:password@`` and query values never reach a result, a dead letter or a log line
(the message is logged from the outcome). A reason the schema does not know yet (``egress_denied``
before the schema carries it) is written as ``error``; the error's ``type`` still names it.
"""

from __future__ import annotations

import json
import math
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from duetime.core.errors import FailPermanently, PermanentError, RetryLater
from duetime.core.inputs import MAX_TIME_MS, is_uuid_text
from duetime.core.models import ErrorReason, ResultStatus
from duetime.core.records import ErrorInfo, ExecutionRequest, ExecutionResult
from duetime.core.redact import escape_control, redact_text
from duetime.core.retry_rules import exception_types

MAX_MESSAGE_CHARS = 2000
MAX_TRACEBACK_BYTES = 8 * 1024
"""A failed task's traceback is cut to this (UTF-8), its innermost frames kept: a result shares
the results topic with every other execution's, and the projector stores it on the row."""
MAX_TRACEBACK_FRAMES = 100
"""Frames formatted per exception of a chain, innermost first: 8 KiB rarely hold more, and
the formatting runs on the worker's event loop. Python 3.11 computes the code positions of
every frame it is given, so the outer ones are cut off before (measured: 0.2 ms for a shallow
traceback; 900 distinct frames 2.7 ms, 45 ms when all were given; a RecursionError 0.5 ms)."""
MAX_TRACEBACK_LINE_CHARS = 500
"""One traceback line is cut to this: an exception's own text can be megabytes long (its
message is kept separately, in ``ErrorInfo.message``)."""
MAX_OUTPUT_BYTES = 64 * 1024
MAX_TIMEOUT_S = 30 * 24 * 3600.0
"""A request's timeout above this (or not finite) is refused as undecodable: no job spec allows
it, and an infinite one breaks timer arithmetic (``ceil(inf)``)."""


_KNOWN_REASONS = frozenset(reason.value for reason in ErrorReason)
"""The reasons a result may carry (``ErrorReason``, checked against the schema by
``tests/unit/test_records.py``)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    status: ResultStatus
    """``success`` or ``failure``."""
    error: ErrorInfo | None = None
    retry_after_s: float | None = None
    output_json: str | None = None

    @property
    def reason(self) -> str:
        return "" if self.error is None else self.error.reason.value


def success(output: Any = None) -> Outcome:
    return Outcome(ResultStatus.SUCCESS, output_json=encode_output(output))


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
    traceback_text: str | None = None,
    exception_types: list[str] | None = None,
) -> Outcome:
    """A failed attempt; ``traceback_text`` must come from :func:`task_traceback` (bounded
    and redacted there)."""
    return Outcome(
        ResultStatus.FAILURE,
        error=ErrorInfo(
            type=truncated(error_type, 200),
            message=truncated(redact_text(message), MAX_MESSAGE_CHARS),
            retryable=retryable,
            reason=ErrorReason(reason) if reason in _KNOWN_REASONS else ErrorReason.ERROR,
            http_status=http_status,
            traceback=traceback_text,
            exception_types=exception_types or [],
        ),
        retry_after_s=retry_after_s,
    )


def describe(exc: BaseException) -> str:
    """An exception's message, whatever its ``__str__`` does (a task's exception is hostile
    input too: its ``__str__`` may raise or return something that is not text)."""
    message = getattr(exc, "message", None)
    if isinstance(message, str) and message:
        return message
    try:
        text = str(exc)
    except Exception:
        text = ""
    return text if isinstance(text, str) and text else type(exc).__name__


def from_exception(exc: BaseException) -> Outcome:
    """A task's exception: RetryLater / FailPermanently steer, anything else is retryable;
    what is not an ``Exception`` at all (SystemExit, KeyboardInterrupt, GeneratorExit...) was
    contained by the worker and fails permanently."""
    message = describe(exc)
    if not isinstance(exc, Exception):
        return contained(exc)
    kind = type(exc).__name__
    if isinstance(exc, RetryLater):  # the task asked for it: no traceback to read
        snooze = getattr(exc, "snooze", False) is True
        return failure(
            kind,
            message,
            retryable=True,
            reason="snoozed" if snooze else "error",
            retry_after_s=_delay_s(exc.delay_s),
        )
    trace = task_traceback(exc)
    if isinstance(exc, FailPermanently | PermanentError):
        reason = "unknown_target" if getattr(exc, "code", "") == "unknown_target" else "error"
        return failure(kind, message, retryable=False, reason=reason, traceback_text=trace)
    # the class and its bases, for the retry policy's non_retryable_errors (scheduler side)
    types = exception_types(type(exc))
    return failure(kind, message, retryable=True, traceback_text=trace, exception_types=types)


def _delay_s(value: object) -> float | None:
    """A task's own retry delay, if it is a sane number of seconds (else the policy's)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and 0 <= seconds <= MAX_TIMEOUT_S else None


def redacted_traceback(exc: BaseException) -> str:
    """A traceback fit for a log: URLs and credentials in it redacted, control characters
    escaped (an exception's text can hold what a job or a target wrote)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return escape_control(redact_text(text))


def task_traceback(exc: BaseException) -> str | None:
    """``exc``'s traceback as a failed attempt carries it: its whole chain (causes and
    contexts), frames and exception lines only (never local values), redacted, control
    characters escaped, bounded by :func:`bound_traceback`. None when it cannot be formatted
    at all (a task's exception is hostile input: formatting must not fail the report)."""
    try:
        summary = traceback.TracebackException(
            type(exc),
            exc,
            _innermost(exc.__traceback__, MAX_TRACEBACK_FRAMES),
            limit=-MAX_TRACEBACK_FRAMES,  # for the chained exceptions, which it walks itself
            capture_locals=False,
        )
        text = "".join(summary.format())
        unformatted = _frames_beyond(exc, MAX_TRACEBACK_FRAMES)
    except Exception:  # e.g. a RecursionError on a pathological chain: the message remains
        return None
    return bound_traceback(text, omitted_frames=unformatted)


def _innermost(tb: TracebackType | None, keep: int) -> TracebackType | None:
    """The link of ``tb`` from which only its innermost ``keep`` frames follow: Python computes
    the code positions of every frame it is given, even those a limit then drops."""
    frames = 0
    link = tb
    while link is not None:
        frames += 1
        link = link.tb_next
    for _ in range(frames - keep):
        if tb is None:
            break
        tb = tb.tb_next
    return tb


def _frames_beyond(exc: BaseException, limit: int) -> int:
    """How many frames of ``exc``'s chain (as a traceback shows it: the cause, else the
    context unless suppressed) are outside the innermost ``limit`` of each exception."""
    beyond = 0
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = 0
        tb = current.__traceback__
        while tb is not None:  # Python refuses a tb_next loop
            frames += 1
            tb = tb.tb_next
        beyond += max(0, frames - limit)
        if current.__cause__ is not None:
            current = current.__cause__
        else:
            current = None if current.__suppress_context__ else current.__context__
    return beyond


_FRAME_PREFIX = '  File "'


def bound_traceback(
    text: str, limit_bytes: int = MAX_TRACEBACK_BYTES, omitted_frames: int = 0
) -> str:
    """A formatted traceback fit to be shown: redacted as a whole (URLs' credentials and query
    values, bearer tokens: before any cut, so no cut leaves half a secret unredacted), then
    each line's control characters escaped and the line cut to ``MAX_TRACEBACK_LINE_CHARS``;
    when the whole is over ``limit_bytes`` (UTF-8), the outermost lines are dropped and one
    first line says how many frames were omitted. The innermost frames and the final
    exception line are where the error is, so they are what is kept. ``omitted_frames``: how
    many were left out before ``text`` was formatted (counted in the same line). Pure."""
    shown = [_shown_line(line) for line in redact_text(text).rstrip("\n").split("\n")]
    sizes = [len(line.encode()) + 1 for line in shown]
    if sum(sizes) <= limit_bytes and not omitted_frames:
        return "\n".join(shown)
    # room for the marker line, whatever number it ends up saying
    budget = limit_bytes - len(_omitted(len(shown) + omitted_frames).encode()) - 1
    kept = 0
    used = 0
    while kept < len(shown) and used + sizes[-1 - kept] <= budget:
        used += sizes[-1 - kept]
        kept += 1
    dropped = shown[: len(shown) - kept]
    frames = omitted_frames + sum(1 for line in dropped if line.startswith(_FRAME_PREFIX))
    return "\n".join([_omitted(frames), *shown[len(shown) - kept :]])


def _omitted(frames: int) -> str:
    return f"... {frames} outer frames omitted (the innermost are kept) ..."


def _shown_line(line: str) -> str:
    # lone surrogates (which UTF-8, Avro and PostgreSQL refuse) become escapes
    text = escape_control(line)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return truncated(text, MAX_TRACEBACK_LINE_CHARS)


def contained(exc: BaseException) -> Outcome:
    """A task raised something that would end the worker: the attempt fails for good."""
    kind = type(exc).__name__
    return failure(
        kind,
        f"the task raised {kind} ({describe(exc)}); the worker contained it: "
        "a task may not stop the worker",
        retryable=False,
        traceback_text=task_traceback(exc),
    )


def timed_out(timeout_s: float) -> Outcome:
    return failure(
        "Timeout",
        f"the attempt ran longer than its timeout of {timeout_s:g} s",
        retryable=True,
        reason="timeout",
    )


def cancelled(when: str) -> Outcome:
    """A cancel requested through the lease (``cancel.request_cancel``): not retryable, so the
    scheduler does not run the attempt again."""
    return failure(
        "Cancelled", f"the execution was cancelled {when}", retryable=False, reason="cancelled"
    )


def encode_output(value: Any) -> str | None:
    """The task's return value as JSON text; None for None or unserialisable. An output over
    ``MAX_OUTPUT_BYTES`` is replaced by a marker saying so (the result must stay a small
    record: it shares the results topic with every other execution's)."""
    if value is None:
        return None
    try:
        text = json.dumps(value, default=str)
    except Exception:  # unserialisable, too deep, or a __str__ that raises: no output
        return None
    size = len(text.encode())
    if size <= MAX_OUTPUT_BYTES:
        return text
    return json.dumps(
        {"duetime_truncated": True, "size_bytes": size, "limit_bytes": MAX_OUTPUT_BYTES}
    )


def result_record(
    request: ExecutionRequest,
    *,
    status: ResultStatus,
    worker_id: str,
    token: int,
    started_at_ms: int,
    finished_at_ms: int | None = None,
    outcome: Outcome | None = None,
) -> ExecutionResult:
    """The ``result`` event for ``request``'s attempt."""
    return ExecutionResult(
        execution_id=request.execution_id,
        job_id=request.job_id,
        attempt=request.attempt,
        status=status,
        worker_id=worker_id,
        lease_token=token,
        scheduled_at_ms=request.scheduled_at_ms,
        started_at_ms=started_at_ms,
        finished_at_ms=finished_at_ms,
        error=None if outcome is None else outcome.error,
        retry_after_s=None if outcome is None else outcome.retry_after_s,
        output_json=None if outcome is None else outcome.output_json,
        priority=request.priority,
        dag_id=request.dag_id,
        dag_run_id=request.dag_run_id,
        dag_key=request.dag_key,
    )


def check_request(request: ExecutionRequest) -> None:
    """Refuse a decodable request no scheduler can have written (it goes to the poison topic).

    Ids must be UUIDs in the hyphenated 36-character form: Python's ``uuid.UUID`` also takes
    ``urn:uuid:...`` and brace forms that PostgreSQL refuses, and a 36-character string with
    its four hyphens anywhere; a refused id in a batched lease statement would fail its
    neighbours too."""
    for name, value in (("execution_id", request.execution_id), ("job_id", request.job_id)):
        if not is_uuid_text(value):
            raise ValueError(f"{name} {str(value)[:100]!r} is not a UUID")
    if request.attempt < 1:
        raise ValueError(f"attempt {request.attempt} is not 1-based")
    timeout_s = request.timeout_s
    if not (math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise ValueError(f"timeout_s {timeout_s} is not in (0, {MAX_TIMEOUT_S:g}]")
    for name, at_ms in (
        ("scheduled_at_ms", request.scheduled_at_ms),
        ("due_at_ms", request.due_at_ms),
    ):
        if not 0 <= at_ms <= MAX_TIME_MS:
            raise ValueError(f"{name} {at_ms} is not a time duetime can have written")
