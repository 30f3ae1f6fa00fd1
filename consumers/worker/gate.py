"""The worker's start gate: never start early, never start stale work (issue 14, items 4, 8).

Pure arithmetic on an :class:`~duetime.core.records.ExecutionRequest` and the worker's own
clock reading (``now_ms``); the worker applies it at two moments:

- **before taking a slot** (``early_ms``): a request whose due time has not come yet by this
  worker's clock waits outside the concurrency slots, without a lease, until its due time.
  Its due time is ``max(scheduled_at_ms, due_at_ms)``: the occurrence, or a retry's later due
  time. Most are early on purpose: the scheduler emits runs its fire lead ahead (``led_ms``);
  one earlier than that comes from a scheduler whose clock runs ahead, or a worker whose clock
  runs behind, and is counted and logged.
- **after the lease claim, just before running** (``expired``): a request whose attempt can no
  longer start within the job's ``start_within_s`` of its due time is reported ``expired`` and
  not run. The window counts from ``due_at_ms``, so a retry gets a whole window of its own.

The window travels in the request as the job's ``start_within_s`` (not as an absolute
deadline computed by the scheduler): the deadline is then derived in one place, here, from
fields every request already has, and a rescued or retried request carries it unchanged.
"""

from __future__ import annotations

import math

from duetime.core.jobspec import MAX_START_WITHIN_S
from duetime.core.records import ExecutionRequest

from .results import Outcome, failure

__all__ = [
    "check_window",
    "early_ms",
    "expired",
    "expired_outcome",
    "late_ms",
    "led_ms",
    "not_before_ms",
    "start_deadline_ms",
]


def check_window(start_within_s: float | None) -> None:
    """Refuse a window no validated job can carry (above ``jobspec.MAX_START_WITHIN_S``, not
    finite, or not positive): the request is then parked as poison."""
    if start_within_s is None:
        return
    if not (math.isfinite(start_within_s) and 0 < start_within_s <= MAX_START_WITHIN_S):
        raise ValueError(f"start_within_s {start_within_s} is not in (0, {MAX_START_WITHIN_S:g}]")


def not_before_ms(request: ExecutionRequest) -> int:
    """The earliest instant the attempt may start: its occurrence, or its retry's due time."""
    return max(request.scheduled_at_ms, request.due_at_ms)


def led_ms(request: ExecutionRequest) -> int:
    """How long before its due time the scheduler emitted the request on purpose (its fire
    lead, DUETIME_SCHEDULER_FIRE_LEAD_MS), by the scheduler's clock. A request early by up to
    this much is expected; one earlier still came from a clock ahead of this worker's."""
    return max(0, not_before_ms(request) - request.emitted_at_ms)


def early_ms(request: ExecutionRequest, now_ms: int) -> int:
    """How long before its due time the request is at ``now_ms`` (0: it may start)."""
    return max(0, not_before_ms(request) - now_ms)


def start_deadline_ms(request: ExecutionRequest) -> int | None:
    """The last instant the attempt may start (inclusive); None: no window.

    Rounded up to the millisecond: a window of 0.0004 s still lets an attempt start in the
    millisecond it became due, and a start is never refused inside its window."""
    if request.start_within_s is None:
        return None
    return request.due_at_ms + math.ceil(request.start_within_s * 1000)


def expired(request: ExecutionRequest, now_ms: int) -> bool:
    """True when the attempt can no longer start within its window at ``now_ms``."""
    deadline = start_deadline_ms(request)
    return deadline is not None and now_ms > deadline


def late_ms(request: ExecutionRequest, now_ms: int) -> int:
    """How far past its start deadline ``now_ms`` is (0 within the window or without one)."""
    deadline = start_deadline_ms(request)
    return 0 if deadline is None else max(0, now_ms - deadline)


def expired_outcome(request: ExecutionRequest, now_ms: int) -> Outcome:
    """The result of an attempt refused at its start: not retryable (a retry would be later
    still), reason ``expired`` (the scheduler ends the occurrence ``expired``)."""
    return failure(
        "Expired",
        f"not started: {late_ms(request, now_ms) / 1000:.3f} s past its start window of "
        f"{request.start_within_s:g} s after its due time",
        retryable=False,
        reason="expired",
    )
