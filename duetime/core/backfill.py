"""Backfills: running a cron job's occurrences over a past (or any) range, once each.

Role: the pure parts shared by the producers (which check a request and show its progress)
and the scheduler (which works through it): the backfill's id, its executions' ids and the
occurrences of a range. No clock, no I/O.

Guarantees:

* A backfill is identified by its job and its range: asking twice for the same range is the
  same backfill (the second request changes nothing), and its id is the control command's
  ``command_id``, so a redelivered or replayed command is recognised by the scheduler.
* Each occurrence's execution id derives from the backfill id and the nominal occurrence:
  every scheduler (after a failover too) emits the same id for it, and the workers' fenced
  leases run one execution id once.
* A range holds at most ``MAX_OCCURRENCES`` occurrences: a request over it is refused before
  anything is written.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from .errors import ValidationError
from .schedule import Cron, excluded, fires_between

__all__ = [
    "MAX_OCCURRENCES",
    "Occurrences",
    "backfill_execution_id",
    "backfill_id",
    "occurrences",
]

MAX_OCCURRENCES = 10_000
"""The most occurrences one backfill may cover: its progress is derived from the ids of all
of them, and a bigger catch-up is better split (or run as misfire=run_all)."""
_BACKFILL_NS = uuid.UUID("b4c3f1a2-7d7e-4f39-9a0e-6c1d2e3f4a5b")
_ONE_MS = timedelta(milliseconds=1)


def backfill_id(job_id: str, from_ms: int, to_ms: int) -> str:
    """The backfill of this job over [from_ms, to_ms]: the same range, the same backfill."""
    return str(uuid.uuid5(_BACKFILL_NS, f"{job_id}/{from_ms}/{to_ms}"))


def backfill_execution_id(backfill: str, occurrence_ms: int) -> str:
    """The execution of one occurrence (nominal time, ms) of one backfill."""
    return str(uuid.uuid5(_BACKFILL_NS, f"{backfill}/{occurrence_ms}"))


@dataclass(frozen=True, slots=True)
class Occurrences:
    """A range's occurrences: ``runs`` (nominal times, ms, in order) and how many of the
    range's occurrences the job's calendar excluded."""

    runs: list[int]
    excluded: int


def occurrences(cron: Cron, first: datetime, last: datetime) -> Occurrences:
    """The cron's occurrences in [first, last] (its start and end bounds apply); more than
    ``MAX_OCCURRENCES`` of them (excluded ones included) is a ValidationError."""
    if last < first:
        raise ValidationError(
            f"backfill 'to' ({last.isoformat()}) is before 'from' ({first.isoformat()})",
            field="to",
        )
    fires = fires_between(cron, first - _ONE_MS, last, MAX_OCCURRENCES + 1)
    if len(fires) > MAX_OCCURRENCES:
        raise ValidationError(
            f"the range holds more than {MAX_OCCURRENCES} occurrences of the job's schedule; "
            "backfill a shorter range",
            field="to",
            details={"limit": MAX_OCCURRENCES},
        )
    runs = [int(t.timestamp() * 1000) for t in fires if not excluded(cron, t)]
    return Occurrences(runs, len(fires) - len(runs))
