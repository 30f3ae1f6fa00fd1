"""Routes of jobs and executions: create (idempotent), read, list, state changes."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response

from duetime.core import tracing
from duetime.core.errors import IllegalTransition, NotFound, ValidationError
from duetime.core.models import Status as StatusValue
from duetime.core.records import JobDefinition
from duetime.core.schedule import OneTime, next_fire, parse_schedule, upcoming
from duetime.core.topics import QUEUE_PATTERN
from duetime.producers import updates

from . import convert, store, uniqueness
from .calendars import resolve_calendar
from .deps import Res, Resources, parse_id, read_json, resources_of, validated
from .errors import PreconditionFailed
from .group import existing
from .pagination import decode_cursor, page_of
from .rows import JobRow
from .schemas import (
    CREATE_JOB_SCHEMA,
    JOB_UPDATE_SCHEMA,
    CommandOut,
    ExecutionDetailOut,
    ExecutionPage,
    JobCreatedOut,
    JobOut,
    JobPage,
    NextRunsOut,
    Priority,
    Status,
    errors,
    request_body,
)

router = APIRouter()

MAX_NEXT_RUNS = 100
"""The most fire times ``next_runs`` computes in one call."""

Limit = Query(100, ge=1, le=500, description="page size")
Cursor = Query(None, max_length=200, description="next_cursor of the previous page")


@router.post(
    "/jobs",
    status_code=201,
    response_model=JobCreatedOut,
    # deduplicated / replaced_job_id appear only when they say something: a plain create's
    # answer stays {"job_id", "status", "next_run_at"} (API.md)
    response_model_exclude_defaults=True,
    responses={
        200: {
            "model": JobCreatedOut,
            "description": "the job_id exists with this same job, or a unique key's window "
            "holds a job (deduplicated: true, header Duetime-Deduplicated)",
        },
        **errors(400, 401, 409, 413, 422, 503),
    },
    openapi_extra=request_body(CREATE_JOB_SCHEMA),
    summary="create a job",
)
async def create_job(request: Request, response: Response) -> dict[str, Any]:
    res = resources_of(request)  # not a dependency: one fewer for FastAPI to solve per create
    body = await read_json(request, res.settings)
    if not isinstance(body, dict):
        raise ValidationError("a job must be a JSON object", field="")
    body, directive = uniqueness.take_directive(body, res.now())  # unique / debounce
    body = await resolve_calendar(res, body)  # a calendar's name → the copy of its rules
    definition = validated(res.client.build, body)
    if directive is None and res.groups is not None:
        # with the creates of the same few ms: one transaction, one wait for Kafka (group.py)
        created = await res.groups.create(definition, tracing.from_mapping(request.headers))
        if not created.new:
            response.status_code = 200
        return _created(created.job_id, created.status, created.next_run_at)
    # pipeline mode: BEGIN travels with the INSERT (one round trip to PostgreSQL fewer per
    # create); every statement below still reads its own result before the next step
    async with res.pool.connection() as conn, conn.pipeline(), conn.transaction():
        claim = uniqueness.Claim()
        if directive is not None:  # the key's row stays locked until this transaction ends
            claim = await uniqueness.claim(conn, directive, definition.job_id, res.now())
            if claim.duplicate_of is not None:
                return await uniqueness.deduplicated(conn, claim.duplicate_of, response)
        new = await store.insert_new_job(conn, definition)
        if new is None:
            found = await existing(conn, definition)  # 200 with the same body, else 409
            if isinstance(found, Exception):
                raise found
            response.status_code = 200
            return _created(found.job_id, found.status, found.next_run_at)
        # the request's trace: a malformed or oversized header is ignored (core/tracing.py)
        trace = tracing.from_mapping(request.headers)
        await res.writer.publish(
            lambda done: res.client.publish_definition(
                definition, wait=False, on_delivery=done, traceparent=trace
            )
        )
        if claim.replaces is not None:
            await uniqueness.cancel_replaced(res, claim.replaces)
            return {
                **_created(definition.job_id, new.status, new.next_run_at),
                "replaced_job_id": claim.replaces,
            }
    return _created(definition.job_id, new.status, new.next_run_at)


def _created(job_id: str, status: StatusValue, next_run_at: datetime | None) -> dict[str, Any]:
    return {"job_id": job_id, "status": status.value, "next_run_at": next_run_at}


@router.get("/jobs/{job_id}", response_model=JobOut, responses=errors(401, 404), summary="one job")
async def get_job(job_id: str, res: Res) -> dict[str, Any]:
    job_id = parse_id(job_id, "job")
    async with res.pool.connection() as conn:
        row = await store.get_job(conn, job_id)
    if row is None:
        raise NotFound(f"no job {job_id}", details={"job_id": job_id})
    return convert.job_out(row)


IfMatch = Header(
    None,
    max_length=40,
    description="the job's revision this change was built on (from GET): 412 if it moved on",
)


@router.patch(
    "/jobs/{job_id}",
    response_model=JobOut,
    responses=errors(400, 401, 404, 409, 412, 413, 415, 422, 503),
    openapi_extra=request_body(JOB_UPDATE_SCHEMA),
    summary="change a job: the fields given replace the current ones (next revision)",
)
async def update_job(
    job_id: str, request: Request, res: Res, if_match: str | None = IfMatch
) -> dict[str, Any]:
    job_id = parse_id(job_id, "job")
    changes = await resolve_calendar(res, await read_json(request, res.settings))
    expected = _revision_of(if_match)
    updates.merged({}, changes)  # a bad field is refused before the database is asked

    def build(
        body: dict[str, Any], revision: int, created: datetime, status: StatusValue
    ) -> JobDefinition:
        updates.check_changeable(job_id, body, status, "update")
        updates.check_revision(job_id, revision, expected, PreconditionFailed)
        return validated(
            res.client.build_update, body, changes, revision=revision, created_at=created
        )

    # the change's trace: later executions of the job belong to it (none: to no trace)
    return await _revise(job_id, res, build, tracing.from_mapping(request.headers))


@router.delete(
    "/jobs/{job_id}",
    response_model=JobOut,
    responses=errors(401, 404, 409, 503),
    summary="delete a job: cancel it and hide it from lists; GET by id and its history stay",
)
async def delete_job(job_id: str, res: Res) -> dict[str, Any]:
    job_id = parse_id(job_id, "job")

    async def build(
        body: dict[str, Any], revision: int, created: datetime, status: StatusValue
    ) -> JobDefinition | None:
        if updates.DELETED_LABEL in (body.get("labels") or {}):
            return None  # deleted already: the same answer, nothing published again
        updates.check_changeable(job_id, body, status, "delete")
        if status is not StatusValue.CANCELLED:
            await res.writer.publish(
                lambda done: res.client.command(
                    job_id, "cancel", wait=False, on_delivery=done, requested_by="api"
                )
            )
        return validated(res.client.build_deleted, body, revision=revision, created_at=created)

    return await _revise(job_id, res, build)


Build = Callable[
    [dict[str, Any], int, datetime, StatusValue],
    JobDefinition | Awaitable[JobDefinition | None] | None,
]
"""Builds a job's next revision from (its current body, revision, created_at, status)."""


async def _revise(
    job_id: str, res: Resources, build: Build, trace: str | None = None
) -> dict[str, Any]:
    """Lock the job's row, ``build(body, revision, created_at, status)`` its next revision
    (awaited when it is a coroutine; None: nothing to publish), publish it, write it into the
    row and answer the job as GET shows it. The lock serialises changes of one job across
    API processes: each builds on the one before it."""
    async with res.pool.connection() as conn, conn.transaction():
        cur = await conn.execute(updates.CURRENT_SQL, (job_id,))
        row = await cur.fetchone()
        if row is None:
            raise updates.not_found(job_id)
        built = build(*updates.current_body(job_id, row))
        definition = await built if inspect.isawaitable(built) else built
        if definition is not None:
            published: JobDefinition = definition
            await res.writer.publish(
                lambda done: res.client.publish_definition(
                    published, wait=False, on_delivery=done, traceparent=trace
                )
            )
            await conn.execute(updates.WRITE_SQL, updates.row_values(definition))
        shown = await store.get_job(conn, job_id)
    if shown is None:  # the row was locked by this transaction: it cannot have gone
        raise updates.not_found(job_id)
    return convert.job_out(shown)


def _revision_of(if_match: str | None) -> int | None:
    """``If-Match: "<revision>"`` (quoted as an ETag, or bare) → the revision; ``*``: any."""
    if if_match is None or if_match.strip() == "*":
        return None
    text = if_match.strip().removeprefix("W/").strip('"')
    if not text.isdigit() or len(text) > 20:
        raise ValidationError(
            f"If-Match must be a job's revision (digits), not {if_match[:40]!r}", field="If-Match"
        )
    return int(text)


@router.get(
    "/jobs",
    response_model=JobPage,
    responses=errors(400, 401),
    summary="list jobs, newest first",
)
async def list_jobs(
    res: Res,
    status: Status | None = None,
    priority: Priority | None = None,
    name: str | None = Query(None, max_length=200),
    limit: int = Limit,
    cursor: str | None = Cursor,
    name_contains: str | None = Query(
        None, min_length=1, max_length=200, description="name contains this (case-insensitive)"
    ),
    queue: str | None = Query(
        None, pattern="^" + QUEUE_PATTERN + "$", description="jobs of this queue only"
    ),
) -> dict[str, Any]:
    after = decode_cursor(cursor)
    async with res.pool.connection() as conn:
        rows = await store.list_jobs(
            conn,
            status=status,
            priority=priority,
            name=name,
            after=after,
            limit=limit + 1,
            name_contains=name_contains,
            queue=queue,
        )
    return page_of(rows, limit, lambda r: (r.created_at, r.job_id), convert.job_out)


# which projected statuses a command cannot change (409): the scheduler would ignore it
_REFUSED: dict[str, frozenset[StatusValue]] = {
    "cancel": frozenset({StatusValue.CANCELLED}),
    "pause": frozenset({StatusValue.PAUSED, StatusValue.CANCELLED}),
    "resume": frozenset(StatusValue) - {StatusValue.PAUSED},
    "trigger": frozenset({StatusValue.CANCELLED}),
}


async def _command(job_id: str, kind: str, res: Resources) -> dict[str, Any]:
    job_id = parse_id(job_id, "job")
    async with res.pool.connection() as conn:
        known = await store.job_status_and_owner(conn, job_id)
    if known is None:
        raise NotFound(f"no job {job_id}", details={"job_id": job_id})
    # a job its scheduler has not read yet is fine: the scheduler holds a command that
    # overtakes its job's definition and applies it when the definition arrives
    status, _ = known
    if status in _REFUSED.get(kind, ()):
        raise IllegalTransition(
            f"cannot {kind} job {job_id}: its status is {status.value!r}",
            details={"job_id": job_id, "status": status.value, "command": kind},
        )
    command_id = await res.writer.publish(
        lambda done: res.client.command(
            job_id, kind, wait=False, on_delivery=done, requested_by="api"
        )
    )
    return {"job_id": job_id, "command": kind, "command_id": command_id, "status": status.value}


_COMMANDS: dict[str, str] = {
    "cancel": "cancel: no further runs; a running execution finishes",
    "pause": "pause: stop firing",
    "resume": "resume: restart firing, applying the job's misfire policy",
    "trigger": "trigger: run once now, outside the schedule",
}


def _command_route(kind: Literal["cancel", "pause", "resume", "trigger"]) -> None:
    async def route(job_id: str, res: Res) -> dict[str, Any]:
        return await _command(job_id, kind, res)

    route.__name__ = f"{kind}_job"
    router.add_api_route(
        f"/jobs/{{job_id}}/{kind}",
        route,
        methods=["POST"],
        status_code=202,
        response_model=CommandOut,
        responses=errors(401, 404, 409, 503),
        summary=_COMMANDS[kind],
    )


for _kind in ("cancel", "pause", "resume", "trigger"):
    _command_route(_kind)


@router.get(
    "/jobs/{job_id}/next_runs",
    response_model=NextRunsOut,
    responses=errors(400, 401, 404),
    summary="the job's next fire times from its schedule (none while cancelled or finished)",
)
async def next_runs(
    job_id: str,
    res: Res,
    count: int = Query(
        5, ge=1, le=MAX_NEXT_RUNS, description=f"how many (at most {MAX_NEXT_RUNS})"
    ),
) -> dict[str, Any]:
    job_id = parse_id(job_id, "job")
    async with res.pool.connection() as conn:
        row = await store.get_job(conn, job_id)
    if row is None:
        raise NotFound(f"no job {job_id}", details={"job_id": job_id})
    # cron math is CPU work (hundreds of ms for a sparse expression): in a thread, a few at
    # a time, so the event loop keeps answering everyone else meanwhile
    async with res.cron_slots:
        runs = await asyncio.to_thread(validated, _next_runs, row, count, res.now())
    return {"job_id": job_id, "next_runs": runs}


def _next_runs(row: JobRow, count: int, now: datetime) -> list[datetime]:
    """From the scheduler's next (nominal) occurrence, then the schedule's own math; a paused
    cron job shows what resuming now would give (its misfire policy aside). The times are
    when the runs fire: each occurrence plus its jitter, those the job's calendar excludes
    left out."""
    if row.schedule is None or row.status is StatusValue.CANCELLED:
        return []
    schedule = parse_schedule(row.schedule)
    first = row.next_run_at
    if first is None:
        if row.status is not StatusValue.PAUSED or isinstance(schedule, OneTime):
            return []
        first = next_fire(schedule, now)
    return upcoming(schedule, str(row.job_id), first, count)


@router.get(
    "/jobs/{job_id}/executions",
    response_model=ExecutionPage,
    responses=errors(400, 401, 404),
    summary="the job's executions, newest first",
)
async def list_executions(
    job_id: str,
    res: Res,
    limit: int = Limit,
    cursor: str | None = Cursor,
) -> dict[str, Any]:
    job_id = parse_id(job_id, "job")
    after = decode_cursor(cursor)
    async with res.pool.connection() as conn:
        if await store.job_status(conn, job_id) is None:
            raise NotFound(f"no job {job_id}", details={"job_id": job_id})
        rows = await store.list_executions(conn, job_id, after, limit + 1)
    return page_of(rows, limit, lambda r: (r.scheduled_at, r.execution_id), convert.execution_out)


@router.get(
    "/executions/{execution_id}",
    response_model=ExecutionDetailOut,
    responses=errors(401, 404, 422),
    summary="one execution: its attempts and their errors, its output and traceback",
)
async def get_execution(execution_id: str, res: Res) -> dict[str, Any]:
    try:
        # the canonical form: PostgreSQL would take other spellings, the answer shows this one
        execution_id = str(uuid.UUID(execution_id))
    except ValueError:
        raise ValidationError(
            f"execution id {execution_id[:100]!r} is not a UUID",
            field="execution_id",
            details={"execution_id": execution_id[:100]},
        ) from None
    async with res.pool.connection() as conn:
        row = await store.get_execution(conn, execution_id)
    if row is None:
        raise NotFound(f"no execution {execution_id}", details={"execution_id": execution_id})
    return convert.execution_detail(row)
