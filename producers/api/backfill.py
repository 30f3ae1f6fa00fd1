"""Routes of backfills: ``POST /v1/jobs/{id}/backfill`` and the progress of a job's backfills.

A backfill runs each occurrence of a cron job's schedule in [from, to] once. The API checks
the request (the job exists, is a cron job, not cancelled; the range holds at most
``MAX_OCCURRENCES`` occurrences), records it in the ``backfills`` table (migration 0010) and
publishes a ``backfill`` control command; the job's scheduler works through the range as the
job's overlap policy allows (``duetime.schedulers.logic``), through failovers, each occurrence
under an execution id derived from the backfill and the occurrence.

The progress is not stored: it is counted from the projection's executions of the backfill's
ids, so it is as fresh as the projector. The same range asked for again is the same backfill
(200 with its progress; nothing is published again).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Query, Request, Response
from psycopg import AsyncConnection
from psycopg.rows import class_row
from pydantic import BaseModel, ConfigDict, Field

from duetime.core.backfill import MAX_OCCURRENCES, Occurrences, backfill_id, occurrences
from duetime.core.backfill import backfill_execution_id as execution_id
from duetime.core.errors import Conflict, NotFound, ValidationError
from duetime.core.models import Status
from duetime.core.schedule import Cron, parse_schedule, parse_timestamp

from . import store
from .deps import Res, Resources, parse_id, read_json, validated
from .rows import JobRow
from .schemas import errors, request_body

router = APIRouter()

BACKFILL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Backfill",
    "required": ["from", "to"],
    "properties": {
        "from": {"type": "string", "format": "date-time", "description": "first instant"},
        "to": {"type": "string", "format": "date-time", "description": "last instant"},
    },
    "additionalProperties": False,
}
DAG_LABEL = "duetime.dag"
"""A DAG's trigger job (its label): its runs are DAG runs, which a backfill does not start."""
_ENDED = ("success", "dead", "expired", "cancelled")
"""Execution statuses that end an occurrence of a backfill."""


class BackfillOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    backfill_id: str
    job_id: str
    from_: datetime = Field(alias="from")
    to: datetime
    requested_at: datetime
    state: Literal["running", "done"]
    occurrences: int
    """Occurrences the backfill runs (those the job's calendar excluded left out)."""
    excluded: int
    done: int
    succeeded: int
    failed: int
    """Ended dead, expired or cancelled."""
    running: int
    """Emitted and not ended: queued, running, or failed and waiting for a retry."""
    pending: int
    """Not emitted yet (the overlap policy lets one, or a few, run at a time)."""
    progress: str = ""
    """One line for people (the CLI and the dashboard show it)."""


class BackfillPage(BaseModel):
    items: list[BackfillOut]


@dataclass(frozen=True, slots=True)
class SavedBackfill:
    """A row of ``backfills``: what was asked for."""

    backfill_id: Any
    job_id: Any
    range_from: datetime
    range_to: datetime
    occurrences: int
    excluded: int
    requested_at: datetime
    requested_by: str | None


def _range(body: Any) -> tuple[datetime, datetime]:
    if not isinstance(body, dict):
        raise ValidationError('a backfill is a JSON object {"from": ..., "to": ...}', field="")
    unknown = sorted(str(k) for k in body if k not in ("from", "to"))
    if unknown:
        raise ValidationError(
            f"unknown backfill field(s): {', '.join(unknown)[:200]}", field=unknown[0][:80]
        )
    first, last = body.get("from"), body.get("to")
    for key, value in (("from", first), ("to", last)):
        if value is None:
            raise ValidationError(f"backfill needs {key!r} (an RFC 3339 timestamp)", field=key)
    return parse_timestamp(first, "from"), parse_timestamp(last, "to")


def _cron_of(row: JobRow) -> Cron:
    """The job's cron schedule, or a 422 saying why it cannot be backfilled."""
    if DAG_LABEL in (row.labels or {}):
        raise ValidationError("a DAG's runs cannot be backfilled (yet): trigger them", field="")
    schedule = None if row.schedule is None else parse_schedule(row.schedule)
    if not isinstance(schedule, Cron):
        raise ValidationError(
            "only a cron job has occurrences to backfill (this job has "
            f"{'no schedule' if schedule is None else 'a one-time schedule'})",
            field="schedule",
        )
    return schedule


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


@router.post(
    "/jobs/{job_id}/backfill",
    status_code=202,
    response_model=BackfillOut,
    responses={
        200: {"model": BackfillOut, "description": "this range was asked for already"},
        **errors(400, 401, 404, 409, 415, 422, 503),
    },
    openapi_extra=request_body(BACKFILL_SCHEMA),
    summary=f"run each occurrence of a cron job in [from, to] (at most {MAX_OCCURRENCES})",
)
async def create_backfill(
    job_id: str, request: Request, response: Response, res: Res
) -> BackfillOut:
    job_id = parse_id(job_id, "job")
    first, last = _range(await read_json(request, res.settings))
    async with res.pool.connection() as conn:
        row = await store.get_job(conn, job_id)
    if row is None:
        raise NotFound(f"no job {job_id}", details={"job_id": job_id})
    if row.status is Status.CANCELLED:
        raise Conflict(
            f"cannot backfill job {job_id}: it is cancelled",
            details={"job_id": job_id, "status": row.status.value},
        )
    cron = validated(_cron_of, row)
    async with res.cron_slots:  # up to 10,000 cron steps: CPU work beside the event loop
        occ = await asyncio.to_thread(validated, occurrences, cron, first, last)
    if not occ.runs and not occ.excluded:
        raise ValidationError(
            "the job's schedule has no occurrence in the range (mind its start_at and end_at)",
            field="from",
        )
    bid = backfill_id(job_id, _ms(first), _ms(last))
    async with res.pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            "INSERT INTO backfills (backfill_id, job_id, range_from, range_to, occurrences, "
            "excluded, requested_at, requested_by) VALUES (%s, %s, %s, %s, %s, %s, %s, 'api') "
            "ON CONFLICT (backfill_id) DO NOTHING",
            (bid, job_id, first, last, len(occ.runs), occ.excluded, res.now()),
        )
        if cur.rowcount == 1:
            await res.writer.publish(
                lambda done: res.client.backfill(
                    job_id, first, last, wait=False, on_delivery=done, requested_by="api"
                )
            )
        else:
            response.status_code = 200  # asked for already: its progress, nothing published
        saved = await _saved(conn, job_id, bid)
        assert saved is not None  # inserted (or found) in this transaction
        return await _with_progress(conn, saved, occ)


async def _saved(conn: AsyncConnection[Any], job_id: str, bid: str) -> SavedBackfill | None:
    async with conn.cursor(row_factory=class_row(SavedBackfill)) as cur:
        await cur.execute(
            f"SELECT {_SAVED} FROM backfills WHERE backfill_id = %s AND job_id = %s",
            (bid, job_id),
        )
        return await cur.fetchone()


_SAVED = ", ".join(f.name for f in fields(SavedBackfill))


async def _with_progress(
    conn: AsyncConnection[Any], saved: SavedBackfill, occ: Occurrences
) -> BackfillOut:
    """The backfill as the API answers it: its request and its executions so far."""
    bid = str(saved.backfill_id)
    # 10,000 UUIDs take ~0.2 s on a loaded machine: beside the event loop
    ids = await asyncio.to_thread(_execution_ids, bid, occ.runs)
    counts: dict[str, int] = {}
    if ids:
        cur = await conn.execute(
            "SELECT status, count(*) FROM executions WHERE job_id = %s AND scheduled_at "
            "BETWEEN %s AND %s AND execution_id = ANY(%s::uuid[]) GROUP BY status",
            (saved.job_id, saved.range_from, saved.range_to, ids),
        )
        counts = {str(status): int(n) for status, n in await cur.fetchall()}
    total = len(occ.runs)
    succeeded = counts.get("success", 0)
    done = sum(counts.get(s, 0) for s in _ENDED)
    seen = sum(counts.values())
    out = BackfillOut.model_validate(
        {
            "backfill_id": bid,
            "job_id": str(saved.job_id),
            "from": saved.range_from,
            "to": saved.range_to,
            "requested_at": saved.requested_at,
            "state": "done" if done >= total else "running",
            "occurrences": total,
            "excluded": occ.excluded,
            "done": done,
            "succeeded": succeeded,
            "failed": done - succeeded,
            "running": seen - done,
            "pending": max(0, total - seen),
        }
    )
    out.progress = progress_line(out)
    return out


def _execution_ids(bid: str, runs: list[int]) -> list[str]:
    return [execution_id(bid, t) for t in runs]


def progress_line(b: BackfillOut) -> str:
    """``backfill 2026-11-01 00:00 → 2026-11-30 00:00: 12/30 done (1 failed), 1 running, 17
    to go; 8 excluded by the calendar``."""
    text = f"backfill {_minute(b.from_)} → {_minute(b.to)}: {b.done}/{b.occurrences} done"
    if b.failed:
        text += f" ({b.failed} failed)"
    if b.state == "running":
        text += f", {b.running} running, {b.pending} to go"
    if b.excluded:
        text += f"; {b.excluded} excluded by the calendar"
    return text


def _minute(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


async def _progress_of(
    res: Resources, conn: AsyncConnection[Any], saved: SavedBackfill, cron: Cron
) -> BackfillOut:
    first, last = saved.range_from.astimezone(UTC), saved.range_to.astimezone(UTC)
    async with res.cron_slots:
        occ = await asyncio.to_thread(validated, occurrences, cron, first, last)
    return await _with_progress(conn, saved, occ)


MAX_LISTED = 20


@router.get(
    "/jobs/{job_id}/backfills",
    response_model=BackfillPage,
    responses=errors(400, 401, 404),
    summary=f"the job's backfills, newest first (the last {MAX_LISTED}), with their progress",
)
async def list_backfills(
    job_id: str,
    res: Res,
    limit: int = Query(5, ge=1, le=MAX_LISTED, description="how many"),
) -> BackfillPage:
    job_id = parse_id(job_id, "job")
    async with res.pool.connection() as conn:
        row = await store.get_job(conn, job_id)
        if row is None:
            raise NotFound(f"no job {job_id}", details={"job_id": job_id})
        async with conn.cursor(row_factory=class_row(SavedBackfill)) as cur:
            await cur.execute(
                f"SELECT {_SAVED} FROM backfills WHERE job_id = %s "
                "ORDER BY requested_at DESC, backfill_id LIMIT %s",
                (job_id, limit),
            )
            saved = await cur.fetchall()
        if not saved:
            return BackfillPage(items=[])
        cron = validated(_cron_of, row)
        return BackfillPage(items=[await _progress_of(res, conn, s, cron) for s in saved])


@router.get(
    "/jobs/{job_id}/backfills/{backfill_id}",
    response_model=BackfillOut,
    responses=errors(400, 401, 404),
    summary="one backfill and its progress",
)
async def get_backfill(job_id: str, backfill_id: str, res: Res) -> BackfillOut:
    job_id = parse_id(job_id, "job")
    bid = parse_id(backfill_id, "backfill")
    async with res.pool.connection() as conn:
        row = await store.get_job(conn, job_id)
        saved = None if row is None else await _saved(conn, job_id, bid)
        if row is None or saved is None:
            raise NotFound(
                f"no backfill {bid} of job {job_id}", details={"job_id": job_id, "backfill_id": bid}
            )
        return await _progress_of(res, conn, saved, validated(_cron_of, row))
