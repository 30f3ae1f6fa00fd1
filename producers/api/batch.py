"""``POST /v1/jobs:batch``: up to ``MAX_BATCH`` jobs in one call, all or none.

Every job is validated exactly as ``POST /v1/jobs`` validates one; if any is invalid nothing is
written and the 422 names each bad job by its index. Otherwise the rows are inserted in one
database transaction, every new definition is published, and the transaction commits only
once Kafka acknowledged all of them (``acks=all``): a 201 means every job is on the jobs topic.
A failure before that (Kafka down: 503) leaves no row, and events already sent are re-creates
of the same jobs when the client retries (job ids are the idempotency keys).

Re-sending a job that exists with the same body answers it as it is (``created: false``);
one that exists with a different body makes the whole batch 409, as a single create would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from confluent_kafka import KafkaError
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from duetime.core import tracing
from duetime.core.errors import Conflict, DuetimeError, ValidationError
from duetime.core.models import Status as StatusValue
from duetime.core.records import JobDefinition
from duetime.producers.sdk import JobClient

from . import convert, store
from .calendars import resolve_calendars
from .deps import Res, read_json, validated
from .schemas import JOB_SCHEMA, Status, errors, request_body
from .writer import Publish

router = APIRouter()

MAX_BATCH = 1000
"""The most jobs one call creates: the body limit (DUETIME_API_MAX_BODY_BYTES) also applies."""
MAX_REPORTED = 100
"""A 422 lists at most this many bad jobs (the first ones)."""

JOB_BATCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "JobBatch",
    "required": ["jobs"],
    "properties": {
        "jobs": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH, "items": JOB_SCHEMA}
    },
    "additionalProperties": False,
}


class JobBatchItemOut(BaseModel):
    job_id: str
    status: Status
    next_run_at: datetime | None
    created: bool
    """False: the job existed with this same body (nothing was published again)."""


class JobBatchOut(BaseModel):
    items: list[JobBatchItemOut]
    """One per job of the request, in its order."""


@router.post(
    "/jobs:batch",
    status_code=201,
    response_model=JobBatchOut,
    responses=errors(400, 401, 409, 413, 415, 422, 503),
    openapi_extra=request_body(JOB_BATCH_SCHEMA),
    summary=f"create up to {MAX_BATCH} jobs in one call: all or none",
)
async def create_jobs(request: Request, response: Response, res: Res) -> dict[str, Any]:
    items = _items(await read_json(request, res.settings))
    # calendar names → the copies of their rules (one query; an unknown one names its job)
    items = await resolve_calendars(res, items, [f"jobs[{i}].schedule" for i in range(len(items))])
    # building a job is pure CPU (~0.1 ms): a thousand of them beside the event loop
    definitions = await asyncio.to_thread(_build_all, res.client, items)
    out: list[dict[str, Any]] = []
    fresh: list[JobDefinition] = []
    async with res.pool.connection() as conn, conn.transaction():
        inserted = await store.insert_new_jobs(conn, definitions)
        for index, (definition, new) in enumerate(zip(definitions, inserted, strict=True)):
            if new is not None:
                fresh.append(definition)
                out.append(_item(definition.job_id, new.status, new.next_run_at, created=True))
                continue
            row = await store.existing_job(conn, definition.job_id)
            if convert.job_spec(row) != convert.definition_spec(definition):
                raise Conflict(
                    f"jobs[{index}]: job {definition.job_id} exists with a different "
                    "definition: nothing was created",
                    details={"index": index, "job_id": definition.job_id},
                )
            out.append(_item(definition.job_id, row.status, row.next_run_at, created=False))
        # the request's trace, on every job of it (a malformed header is ignored)
        trace = tracing.from_mapping(request.headers)
        await res.writer.publish_many([_publisher(res.client, d, trace) for d in fresh])
    if not fresh:
        response.status_code = 200  # every job existed as sent: nothing new
    return {"items": out}


def _items(body: Any) -> list[Any]:
    if not isinstance(body, dict) or set(body) != {"jobs"}:
        raise ValidationError('a batch must be a JSON object {"jobs": [...]}', field="")
    items = body["jobs"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        raise ValidationError(f"jobs must be a list of 1 to {MAX_BATCH} jobs", field="jobs")
    return items


def _build_all(client: JobClient, items: Sequence[Any]) -> list[JobDefinition]:
    """Every job built as ``POST /v1/jobs`` builds one; 422 naming every bad one (by index)
    and every job id given twice, before anything is written."""
    built: list[JobDefinition] = []
    problems: list[dict[str, Any]] = []
    first_index: dict[str, int] = {}
    for index, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise ValidationError("a job must be a JSON object", field="")
            definition = validated(client.build, item)
        except DuetimeError as exc:
            problems.append({"index": index, "message": exc.message, **exc.details})
            continue
        seen = first_index.setdefault(definition.job_id, index)
        if seen != index:
            problems.append(
                {
                    "index": index,
                    "message": f"job_id {definition.job_id} is also jobs[{seen}]",
                    "field": "job_id",
                }
            )
        built.append(definition)
    if problems:
        raise ValidationError(
            f"{len(problems)} of {len(items)} jobs are invalid: nothing was created "
            f"(first: jobs[{problems[0]['index']}]: {problems[0]['message']})",
            field=f"jobs[{problems[0]['index']}]",
            details={"errors": problems[:MAX_REPORTED], "invalid": len(problems)},
        )
    return built


def _publisher(client: JobClient, definition: JobDefinition, trace: str | None) -> Publish:
    def publish(done: Callable[[KafkaError | None], None]) -> None:
        client.publish_definition(definition, wait=False, on_delivery=done, traceparent=trace)

    return publish


def _item(
    job_id: str, status: StatusValue, next_run_at: datetime | None, *, created: bool
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "status": status.value,
        "next_run_at": next_run_at,
        "created": created,
    }
