"""The job state machine, written down once.

Role: the only place that says which status follows which. ``TRANSITIONS`` is the edge table
as data (the docs and the tests are generated from / checked against it); ``transition``
applies one event and refuses everything the table does not list.

Guarantees:

* ``transition(state, event)`` is pure and total over the table: a listed pair returns its
  target, any other pair raises :class:`IllegalTransition` naming the state and the event.
* ``state=None`` is "no job yet": the only events allowed there create the job.
* ``cancelled`` is terminal: nothing leaves it. Results of an execution that was already in
  flight when the job was paused or cancelled are absorbed (self-loops), so the caller can
  record them in the history without special cases.
* The status is that of the job's current occurrence: a recurring job goes back to
  ``pending`` (or ``blocked``, for a DAG member waiting for the next DAG run) when an
  occurrence ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from duetime.core.errors import IllegalTransition
from duetime.core.models import Status

__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "Event",
    "allowed_events",
    "is_terminal",
    "render_mermaid",
    "render_table",
    "transition",
]


class Event(StrEnum):
    """What can happen to a job (or to its current occurrence)."""

    CREATE = "create"  # a job definition arrives
    CREATE_BLOCKED = "create_blocked"  # a DAG member with upstreams arrives
    RELEASE = "release"  # all upstreams of a DAG member succeeded in this DAG run
    SKIP = "skip"  # an upstream ended dead: this DAG member will not run in this DAG run
    QUEUE = "queue"  # the occurrence is due: its execution request was emitted
    TRIGGER = "trigger"  # "run once now", outside the schedule
    START = "start"  # a worker claimed the lease and runs it
    SUCCEED = "succeed"
    FAIL_RETRYABLE = "fail_retryable"  # failed, the retry policy allows another attempt
    FAIL_FINAL = "fail_final"  # failed for good: retries exhausted or a permanent error
    RETRY_DUE = "retry_due"  # the backoff elapsed: the next attempt's request was emitted
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    REPLAY = "replay"  # re-inject a dead execution (from the DLQ)
    RESCHEDULE = "reschedule"  # recurring: this occurrence ended, wait for the next one
    BLOCK = "block"  # recurring DAG member: wait for its upstreams in the next DAG run
    QUARANTINE = "quarantine"  # the scheduler could not handle the job: it stops, on the DLQ
    MISS = "miss"  # a one-time run fell due while no scheduler ran and its misfire policy skips it
    EXPIRE = "expire"  # a worker could not start the execution within the job's start_within_s


S, E = Status, Event
_RESULTS = (E.START, E.SUCCEED, E.FAIL_RETRYABLE, E.FAIL_FINAL, E.EXPIRE)
_NEW_EXECUTION = (E.QUEUE, E.TRIGGER, E.REPLAY)
_FIRING = [s for s in S if s not in (S.PAUSED, S.CANCELLED)]
"""Statuses in which the job's schedule fires (a paused or cancelled job's does not)."""

_EDGES: dict[tuple[Status | None, Event], Status] = {
    # creation
    (None, E.CREATE): S.PENDING,
    (None, E.CREATE_BLOCKED): S.BLOCKED,
    # DAG members
    (S.BLOCKED, E.RELEASE): S.PENDING,
    (S.BLOCKED, E.SKIP): S.SKIPPED,
    # the main line
    (S.PENDING, E.QUEUE): S.QUEUED,
    (S.PENDING, E.TRIGGER): S.QUEUED,
    (S.SUCCESS, E.TRIGGER): S.QUEUED,
    (S.DEAD, E.TRIGGER): S.QUEUED,
    (S.QUEUED, E.START): S.RUNNING,
    (S.RUNNING, E.START): S.RUNNING,  # a redelivered request after a worker crash
    (S.RUNNING, E.SUCCEED): S.SUCCESS,
    (S.RUNNING, E.FAIL_RETRYABLE): S.FAILED,
    (S.RUNNING, E.FAIL_FINAL): S.DEAD,
    # a result may overtake the worker's start notice
    (S.QUEUED, E.SUCCEED): S.SUCCESS,
    (S.QUEUED, E.FAIL_RETRYABLE): S.FAILED,
    (S.QUEUED, E.FAIL_FINAL): S.DEAD,
    # stale work is dropped, not run late: the worker refused to start it past its window
    # (not retried, no dead letter). A worker reports it from the lease it claimed, so the
    # start notice may or may not have come first
    (S.QUEUED, E.EXPIRE): S.EXPIRED,
    (S.RUNNING, E.EXPIRE): S.EXPIRED,
    # retries and replays
    (S.FAILED, E.RETRY_DUE): S.QUEUED,
    (S.DEAD, E.REPLAY): S.QUEUED,
    # recurring jobs: the next occurrence
    (S.SUCCESS, E.RESCHEDULE): S.PENDING,
    (S.DEAD, E.RESCHEDULE): S.PENDING,
    (S.EXPIRED, E.RESCHEDULE): S.PENDING,
    (S.SUCCESS, E.BLOCK): S.BLOCKED,
    (S.DEAD, E.BLOCK): S.BLOCKED,
    (S.EXPIRED, E.BLOCK): S.BLOCKED,
    (S.SKIPPED, E.BLOCK): S.BLOCKED,
    # pause / resume (resume applies the misfire policy, then waits for the next fire)
    (S.PENDING, E.PAUSE): S.PAUSED,
    (S.QUEUED, E.PAUSE): S.PAUSED,
    (S.RUNNING, E.PAUSE): S.PAUSED,
    (S.FAILED, E.PAUSE): S.PAUSED,
    # a recurring job between runs keeps its last run's status: it can be paused too
    (S.SUCCESS, E.PAUSE): S.PAUSED,
    (S.DEAD, E.PAUSE): S.PAUSED,
    (S.EXPIRED, E.PAUSE): S.PAUSED,
    (S.PAUSED, E.RESUME): S.PENDING,
    # cancel: no further runs; a running execution finishes
    (S.PENDING, E.CANCEL): S.CANCELLED,
    (S.QUEUED, E.CANCEL): S.CANCELLED,
    (S.RUNNING, E.CANCEL): S.CANCELLED,
    (S.FAILED, E.CANCEL): S.CANCELLED,
    (S.DEAD, E.CANCEL): S.CANCELLED,
    (S.SUCCESS, E.CANCEL): S.CANCELLED,
    (S.EXPIRED, E.CANCEL): S.CANCELLED,
    (S.SKIPPED, E.CANCEL): S.CANCELLED,
    (S.BLOCKED, E.CANCEL): S.CANCELLED,
    (S.PAUSED, E.CANCEL): S.CANCELLED,
    # a job the scheduler cannot handle (content no producer of ours writes) stops for good,
    # with a dead letter saying why, instead of stopping its partition
    **{(s, E.QUARANTINE): S.DEAD for s in S if s is not S.CANCELLED},
    # a new execution of the job was emitted (its next occurrence, a catch-up run, a DAG
    # release, a manual trigger or a replay): whatever the previous occurrence ended in, and
    # whatever else is still in flight (overlap=allow), the job now has a queued execution.
    # A paused job keeps its status (a held occurrence firing as the live one ends, a manual
    # trigger, a replay); so does a cancelled DAG member released in a DAG run.
    **{(s, e): S.QUEUED for s in _FIRING for e in _NEW_EXECUTION},
    **{(S.PAUSED, e): S.PAUSED for e in _NEW_EXECUTION},
    (S.CANCELLED, E.QUEUE): S.CANCELLED,
    # a one-time run that fell due while no scheduler ran, under misfire=skip: it never runs
    **{(s, E.MISS): S.SKIPPED for s in _FIRING},
    # late results of an execution in flight when the job was paused or cancelled
    **{(S.PAUSED, e): S.PAUSED for e in _RESULTS},
    **{(S.CANCELLED, e): S.CANCELLED for e in _RESULTS},
}

TRANSITIONS: Mapping[tuple[Status | None, Event], Status] = MappingProxyType(_EDGES)


TERMINAL: frozenset[Status] = frozenset(
    {Status.SUCCESS, Status.DEAD, Status.SKIPPED, Status.CANCELLED, Status.EXPIRED}
)
"""Statuses in which an occurrence (or a DAG node in one DAG run) has ended: nothing more
will run for it (``expired``: it was dropped unrun). The one set every role uses: the
scheduler forgets ended DAG runs beyond its cap, the resolver decides a DAG run's end, the API
merges node statuses. (A recurring job leaves ``success``/``dead``/``expired`` for its *next*
occurrence; only ``cancelled`` is terminal for the job itself: :func:`is_terminal`.)"""


def transition(state: Status | None, event: Event) -> Status:
    """The status after ``event`` in ``state``; raise IllegalTransition if not allowed."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        shown = "no job" if state is None else f"status {state.value!r}"
        allowed = ", ".join(sorted(e.value for e in allowed_events(state))) or "none"
        raise IllegalTransition(
            f"event {Event(event).value!r} is not allowed in {shown} (allowed: {allowed})",
            details={"state": None if state is None else state.value, "event": str(event)},
        ) from None


def allowed_events(state: Status | None) -> frozenset[Event]:
    return frozenset(e for (s, e) in TRANSITIONS if s == state)


def is_terminal(status: Status) -> bool:
    """True when no event moves ``status`` to another status (only ``cancelled``)."""
    return all(target == status for (s, _), target in TRANSITIONS.items() if s == status)


def render_table() -> str:
    """The edge table as Markdown, in table order (docs/state_machine.md embeds it)."""
    lines = ["| from | event | to |", "|---|---|---|"]
    for (state, event), target in TRANSITIONS.items():
        lines.append(
            f"| {'(none)' if state is None else state.value} | {event.value} | {target.value} |"
        )
    return "\n".join(lines)


def render_mermaid() -> str:
    """The edge table as a mermaid state diagram (events on the same edge are merged)."""
    merged: dict[tuple[str, str], list[str]] = {}
    for (state, event), target in TRANSITIONS.items():
        key = ("[*]" if state is None else state.value, target.value)
        merged.setdefault(key, []).append(event.value)
    lines = ["stateDiagram-v2"]
    lines += [f"    {a} --> {b}: {', '.join(events)}" for (a, b), events in merged.items()]
    return "\n".join(lines)
