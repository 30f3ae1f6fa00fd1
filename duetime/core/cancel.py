"""Cancelling a running execution: the writer's side of the lease's cancel flag.

A cancel reaches the worker that runs an execution through the execution's lease row in
PostgreSQL (migration 0005): :func:`request_cancel` sets ``cancel_requested_at`` on every live
(``held``) lease of a job, :func:`request_cancel_dag_run` on those of a DAG run. The holder
reads the flag on its next renewal (every ``min(TTL/3, 2 s)``, so within ~2 s plus one round
trip), stops the work (a coroutine target is cancelled, an HTTP request aborted, a sync task
sees ``ctx.cancelled``) and reports the attempt failed with reason ``cancelled``, not
retryable. A request claimed after the flag was set (a redelivery that takes the lease over)
is reported cancelled without running. So is one nobody has claimed yet: a backlog, or a run
the scheduler emitted ahead of its time (decisions 20 and 21 in docs/decisions.md), flagged
through a lease row written for it (:func:`flag_queued_of_cancelled`).

Why the lease row and not the control topic: the lease row is where the holder already looks,
every few seconds, fenced by its token; a worker consuming the control topic would need every
partition of it in every worker (a broadcast), and a cancel published before the execution
was claimed would be missed. The flag is written *after* the cancel command was published, so
the scheduler has the job cancelled (no new attempt is emitted, late results are absorbed)
whichever of the two a crash interrupts.

Who writes the flag: the projector, which sees every job turn ``cancelled`` in the scheduler's
state changelog whichever client cancelled it (REST, CLI or the SDK over Kafka alone), flags
the leases of those jobs with :func:`flag_cancelled_jobs`, in the same transaction that records
the status (so a cancel reaches running work within ~the projector's lag + one renewal). The
API may call :func:`request_cancel` as well, to save the projector's lag. It lives in the core
because two roles write it and the worker reads it (roles do not import each other).

All calls are idempotent (a lease already flagged keeps its first time) and return how many
leases they flagged. The caller owns the connection and its transaction (with autocommit,
each call is its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection, Connection

_MAX_ID = 200
"""Longer than any id duetime issues (UUIDs): refused, not queried."""

_FLAG_JOB = """
UPDATE leases SET cancel_requested_at = now(), updated_at = now()
WHERE job_id = %(id)s AND state = 'held' AND cancel_requested_at IS NULL
"""

_FLAG_JOBS = """
UPDATE leases SET cancel_requested_at = now(), updated_at = now()
WHERE job_id = ANY(%(ids)s::text[]) AND state = 'held' AND cancel_requested_at IS NULL
"""

_FLAG_DAG_RUN = """
UPDATE leases SET cancel_requested_at = now(), updated_at = now()
WHERE dag_run_id = %(id)s AND state = 'held' AND cancel_requested_at IS NULL
"""


_FLAG_QUEUED = """
INSERT INTO leases AS l
    (execution_id, attempt, owner, fencing_token, expires_at, state, updated_at, job_id,
     dag_run_id, cancel_requested_at)
SELECT e.execution_id, 0, %(owner)s, nextval('lease_fencing_tokens'), now(), 'held', now(),
       e.job_id::text, e.dag_run_id, now()
FROM jobs AS j JOIN executions AS e ON e.job_id = j.job_id
WHERE j.job_id = ANY(%(ids)s::uuid[]) AND j.status = 'cancelled' AND e.status = 'queued'
ORDER BY e.execution_id
ON CONFLICT (execution_id) DO UPDATE
SET cancel_requested_at = coalesce(l.cancel_requested_at, now()), updated_at = now()
WHERE l.state = 'held'
"""

CANCEL_OWNER = "duetime:cancel"
"""The owner of a lease row written only to carry a cancel to a run nobody claimed yet."""


def flag_queued_of_cancelled(conn: Connection[Any], job_ids: Sequence[str]) -> int:
    """Blocking: carry the cancel of each job of ``job_ids`` whose projected status is
    ``cancelled`` to its executions still ``queued`` (emitted, not started: a backlog, or a run
    emitted ahead of its time by the scheduler's fire or crowd lead). Each gets a lease row
    already expired and flagged (attempt 0, so any claim takes it over, keeping the flag): the
    worker that claims it reports the attempt ``cancelled`` without running it. A row a worker
    holds already is flagged as :func:`flag_cancelled_jobs` does. Jobs not cancelled are
    skipped (the projector passes the jobs of the executions it has just recorded too: an
    execution may reach it after its job's cancel). Returns the rows written or flagged."""
    ids = [_checked(job_id, "job_id") for job_id in job_ids]
    if not ids:
        return 0
    cur = conn.execute(_FLAG_QUEUED, {"ids": ids, "owner": CANCEL_OWNER})
    return max(0, cur.rowcount)


def _checked(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > _MAX_ID or "\x00" in value:
        raise ValueError(f"{what} must be a non-empty string of at most {_MAX_ID} characters")
    return value


async def request_cancel(conn: AsyncConnection[Any], job_id: str) -> int:
    """Ask the workers running ``job_id``'s executions to stop them; returns how many leases
    were flagged (0: nothing of the job is running now)."""
    cur = await conn.execute(_FLAG_JOB, {"id": _checked(job_id, "job_id")})
    return max(0, cur.rowcount)


async def request_cancel_dag_run(conn: AsyncConnection[Any], dag_run_id: str) -> int:
    """Ask the workers running the executions of the DAG run ``dag_run_id`` to stop them."""
    cur = await conn.execute(_FLAG_DAG_RUN, {"id": _checked(dag_run_id, "dag_run_id")})
    return max(0, cur.rowcount)


def flag_cancelled_jobs(conn: Connection[Any], job_ids: Sequence[str]) -> int:
    """Blocking, batched :func:`request_cancel`: flag the held leases of every job in
    ``job_ids`` (in the caller's transaction); returns how many leases were flagged."""
    ids = [_checked(job_id, "job_id") for job_id in job_ids]
    if not ids:
        return 0
    cur = conn.execute(_FLAG_JOBS, {"ids": ids})
    return max(0, cur.rowcount)
