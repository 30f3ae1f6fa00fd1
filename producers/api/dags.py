"""Routes of DAGs: create (validated, a cycle → 422 naming it), read, runs, trigger, retry a run."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from pydantic import BaseModel, Field

from duetime.core.dag import repair_plan
from duetime.core.errors import Conflict, IllegalTransition, NotFound, ValidationError
from duetime.core.models import ControlKind, DagRunStatus
from duetime.core.records import DagDefinition, JobDefinition
from duetime.producers.sdk import dag_trigger_job_id

from . import convert, store
from .calendars import resolve_calendar
from .deps import Res, Resources, parse_id, read_json, validated
from .pagination import decode_cursor, page_of
from .rows import DagRow, DagRunRow, JobRow, NewJob
from .schemas import (
    DAG_SCHEMA,
    DagCreatedOut,
    DagOut,
    DagPage,
    DagRunPage,
    DagTriggeredOut,
    errors,
    request_body,
)
from .writer import Publish

router = APIRouter()


@router.post(
    "/dags",
    status_code=201,
    response_model=DagCreatedOut,
    responses={
        200: {"model": DagCreatedOut, "description": "the dag_id exists with this same DAG"},
        **errors(400, 401, 409, 413, 422, 503),
    },
    openapi_extra=request_body(DAG_SCHEMA),
    summary="create a DAG (jobs and their dependencies) in one call",
)
async def create_dag(request: Request, response: Response, res: Res) -> dict[str, Any]:
    body = await read_json(request, res.settings)
    if not isinstance(body, dict):
        raise ValidationError("a DAG must be a JSON object", field="")
    unknown = sorted(set(body) - {"dag_id", "name", "jobs", "schedule", "overlap"})
    if unknown:
        raise ValidationError(f"unknown DAG field(s): {', '.join(unknown)}", field=unknown[0])
    body = await resolve_calendar(res, body)  # the DAG's schedule may name a calendar
    name = body.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ValidationError(
            "name must be a non-empty string of at most 200 characters", field="name"
        )
    overlap = body.get("overlap", "skip")
    if not isinstance(overlap, str):
        raise ValidationError("overlap must be skip, allow or queue_one", field="overlap")
    definition, jobs = validated(
        res.client.build_dag,
        name,
        body.get("jobs"),
        schedule=body.get("schedule"),
        overlap=overlap,
        dag_id=body.get("dag_id"),
    )
    dag_id = definition.dag_id
    async with res.pool.connection() as conn, conn.transaction():
        # as POST /v1/jobs: an id that exists with another definition is a 409, for each
        # member (a member's explicit job_id must not take over another job) and for the
        # DAG itself (a re-post must not silently replace it); the same body again is a no-op
        existed: list[bool] = []
        trigger_row: JobRow | None = None
        for i, job in enumerate(jobs):
            if await store.insert_new_job(conn, job) is not None:
                existed.append(False)
                continue
            row = await store.existing_job(conn, job.job_id)
            if convert.job_spec(row) != convert.definition_spec(job):
                raise _conflict(dag_id, jobs, i)
            existed.append(True)
            trigger_row = row if i == len(jobs) - 1 else trigger_row
        if not await store.insert_new_dag(conn, definition):
            dag_row = await store.get_dag(conn, dag_id)
            if dag_row is None or store.dag_row_spec(dag_row) != store.dag_spec(definition):
                raise _conflict(dag_id, jobs, None)
            if all(existed):
                response.status_code = 200
                return _created(definition, jobs, trigger_row)
        # members first, then the trigger job, then the DAG (as JobClient.create_dag does)
        await res.writer.publish_many([_publish_job(res, job) for job in jobs[:-1]])
        await res.writer.publish(_publish_job(res, jobs[-1]))  # the trigger job
        await res.writer.publish(
            lambda done: res.client.publish_dag_definition(definition, wait=False, on_delivery=done)
        )
    return _created(definition, jobs, None)


def _conflict(dag_id: str, jobs: list[JobDefinition], index: int | None) -> Conflict:
    if index is None or index == len(jobs) - 1:  # the DAG's own row or its trigger job
        return Conflict(
            f"DAG {dag_id} exists with a different definition",
            details={"field": "dag_id", "dag_id": dag_id},
        )
    job = jobs[index]
    return Conflict(
        f"jobs[{index}] ({job.dag_key!r}): job {job.job_id} exists with a different definition",
        details={"field": f"jobs[{index}].job_id", "job_id": job.job_id, "dag_id": dag_id},
    )


def _created(
    definition: DagDefinition, jobs: list[JobDefinition], trigger_row: JobRow | None
) -> dict[str, Any]:
    if trigger_row is not None:
        next_run_at = trigger_row.next_run_at
    else:
        next_run_at = NewJob.from_row(store.job_row(jobs[-1])).next_run_at
    return {
        "dag_id": definition.dag_id,
        "job_ids": {j.dag_key: j.job_id for j in jobs[:-1]},
        "next_run_at": next_run_at,
    }


def _publish_job(res: Resources, job: JobDefinition) -> Publish:
    return lambda done: res.client.publish_definition(job, wait=False, on_delivery=done)


async def _dag(res: Resources, dag_id: str) -> DagRow:
    async with res.pool.connection() as conn:
        row = await store.get_dag(conn, dag_id)
    if row is None:
        raise NotFound(f"no DAG {dag_id}", details={"dag_id": dag_id})
    return row


@router.get(
    "/dags",
    response_model=DagPage,
    responses=errors(400, 401),
    summary="list DAGs, newest first, each with its latest run",
)
async def list_dags(
    res: Res,
    name_contains: str | None = Query(
        None, min_length=1, max_length=200, description="name contains this (case-insensitive)"
    ),
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = Query(None, max_length=200),
) -> dict[str, Any]:
    after = decode_cursor(cursor)
    async with res.pool.connection() as conn:
        rows = await store.list_dags(
            conn, name_contains=name_contains, after=after, limit=limit + 1
        )
    return page_of(rows, limit, lambda r: (r.created_at, r.dag_id), _dag_summary)


def _dag_summary(row: DagRow) -> dict[str, Any]:
    run = row.last_run
    return {
        "dag_id": str(row.dag_id),
        "name": row.name,
        "schedule": row.schedule,
        "overlap": row.overlap,
        "node_count": len(row.nodes),
        "created_at": row.created_at,
        "last_run": None if run is None else _run_out(run, row.key_of_job()),
    }


def _run_out(r: DagRunRow, key_of_job: dict[str, str]) -> dict[str, Any]:
    return {
        "dag_run_id": r.dag_run_id,
        "dag_id": str(r.dag_id),
        "status": r.status,
        "started_at": r.started_at,
        "finished_at": r.finished_at,
        "node_statuses": store.node_statuses(r, key_of_job),
    }


@router.get("/dags/{dag_id}", response_model=DagOut, responses=errors(401, 404), summary="a DAG")
async def get_dag(dag_id: str, res: Res) -> dict[str, Any]:
    dag_id = parse_id(dag_id, "dag")
    row = await _dag(res, dag_id)
    async with res.pool.connection() as conn:
        statuses = await store.statuses(conn, [n.job_id for n in row.nodes])
    return {
        "dag_id": str(row.dag_id),
        "name": row.name,
        "schedule": row.schedule,
        "overlap": row.overlap,
        "nodes": [{**n.to_avro(), "status": statuses.get(n.job_id)} for n in row.nodes],
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    }


@router.get(
    "/dags/{dag_id}/runs",
    response_model=DagRunPage,
    responses=errors(400, 401, 404),
    summary="the DAG's runs, newest first, each with per-job status",
)
async def list_runs(
    dag_id: str,
    res: Res,
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = Query(None, max_length=200),
) -> dict[str, Any]:
    dag_id = parse_id(dag_id, "dag")
    after = decode_cursor(cursor)
    dag = await _dag(res, dag_id)
    key_of_job = dag.key_of_job()
    async with res.pool.connection() as conn:
        runs = await store.list_dag_runs(conn, dag_id, after, limit + 1)
    return page_of(
        runs, limit, lambda r: (r.started_at, r.dag_run_id), lambda r: _run_out(r, key_of_job)
    )


@router.post(
    "/dags/{dag_id}/trigger",
    status_code=202,
    response_model=DagTriggeredOut,
    responses=errors(401, 404, 503),
    summary="start a run of the DAG now",
)
async def trigger_dag(dag_id: str, res: Res) -> dict[str, Any]:
    dag_id = parse_id(dag_id, "dag")
    await _dag(res, dag_id)
    dag_run_id = str(uuid.uuid4())
    # as JobClient.trigger_dag: the DAG's trigger job starts the run in the scheduler
    await res.writer.publish(
        lambda done: res.client.command(
            dag_trigger_job_id(dag_id),
            ControlKind.TRIGGER,
            wait=False,
            dag_id=dag_id,
            dag_run_id=dag_run_id,
            on_delivery=done,
            requested_by="api",
        )
    )
    return {"dag_id": dag_id, "dag_run_id": dag_run_id}


# --- repair a run ----------------------------------------------------------------------------


class DagRetryOut(BaseModel):
    dag_id: str
    dag_run_id: str
    rerun: list[str] = Field(description="the dead nodes that run again (keys)")
    reblock: list[str] = Field(
        description="their skipped descendants, back to blocked: they run as their upstreams "
        "succeed"
    )
    already_requested: bool = Field(
        description="true: the run is being repaired already (an earlier retry or a replay of "
        "its dead letter); nothing new was asked"
    )


_NOT_REPAIRABLE = {
    DagRunStatus.SUCCESS.value: "it succeeded",
    # a cancelled member runs no more, in any run: re-running the others could not make the
    # run succeed (cancel is final; create the job anew and trigger a new run instead)
    DagRunStatus.CANCELLED.value: "a member job was cancelled",
}


@router.post(
    "/dags/{dag_id}/runs/{dag_run_id}/retry",
    status_code=202,
    response_model=DagRetryOut,
    responses=errors(401, 404, 409, 503),
    summary="repair a failed run: re-run its dead nodes and carry on downstream",
)
async def retry_run(dag_id: str, dag_run_id: str, res: Res) -> dict[str, Any]:
    """Ask the DAG resolver to repair the run (a ``retry`` DagRunEvent): the run goes back to
    ``running`` and ends ``success`` when every node has. 409 for a run that succeeded, was
    cancelled, or is running with nothing dead; 202 with ``already_requested`` for a run
    being repaired already (its dead letters are marked replayed by the first request)."""
    dag_id = parse_id(dag_id, "dag")
    dag_run_id = parse_id(dag_run_id, "DAG run")
    dag = await _dag(res, dag_id)
    async with res.pool.connection() as conn:
        run = await _run(conn, dag_id, dag_run_id)
        dead_letters = await _dead_letters_of(conn, dag_run_id)
    reason = _NOT_REPAIRABLE.get(run.status)
    statuses = dict(run.node_statuses or {})
    plan = repair_plan({n.key: n.depends_on for n in dag.nodes}, statuses)
    claimed_before = any(replayed for _, _, replayed in dead_letters)
    if reason is None and not plan and not claimed_before:
        reason = (
            "it is still running and no job of it is dead"
            if run.status == DagRunStatus.RUNNING.value
            else "no job of it is dead or expired"
        )
    if reason is not None:
        raise IllegalTransition(
            f"cannot retry DAG run {dag_run_id}: {reason}",
            details={"dag_id": dag_id, "dag_run_id": dag_run_id, "status": run.status},
        )
    out = {"dag_id": dag_id, "dag_run_id": dag_run_id, "rerun": plan.rerun}
    out["reblock"] = plan.reblock
    if not plan:
        return {**out, "already_requested": True}  # a repair is under way
    async with res.pool.connection() as conn, conn.transaction():
        # the run's dead letters count as replayed: a replay of one of them later must not
        # run the node a second time, outside the run (the claim commits only once Kafka
        # acknowledged the request: an error rolls it back)
        ids = [execution_id for execution_id, _, _ in dead_letters]
        claimed = await store.claim_replays(conn, ids, res.now()) if ids else []
        key_of_job = dag.key_of_job()
        lettered = {key_of_job.get(job_id) for _, job_id, _ in dead_letters}
        # every job to re-run had its dead letter claimed before: a request was made for each
        # (an expired job has no dead letter: only the resolver can tell, so ask it)
        if ids and not claimed and all(key in lettered for key in plan.rerun):
            return {**out, "already_requested": True}
        await res.writer.publish(
            lambda done: res.client.retry_dag_run(dag_id, dag_run_id, wait=False, on_delivery=done)
        )
    return {**out, "already_requested": False}


async def _run(conn: AsyncConnection[Any], dag_id: str, dag_run_id: str) -> DagRunRow:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "SELECT * FROM dag_runs WHERE dag_run_id = %s AND dag_id = %s", (dag_run_id, dag_id)
        )
        row = await cur.fetchone()
    if row is None:
        raise NotFound(
            f"no run {dag_run_id} of DAG {dag_id}",
            details={"dag_id": dag_id, "dag_run_id": dag_run_id},
        )
    return DagRunRow.from_row(row)


async def _dead_letters_of(
    conn: AsyncConnection[Any], dag_run_id: str
) -> list[tuple[str, str, bool]]:
    """(execution_id, job_id, replayed already) of the run's dead letters (of dead nodes: an
    expired node has none)."""
    cur = await conn.execute(
        "SELECT d.execution_id::text, d.job_id::text, "
        "(r.execution_id IS NOT NULL OR d.replayed_at IS NOT NULL) "
        "FROM dead_letters d LEFT JOIN dlq_replays r USING (execution_id) "
        "WHERE d.dag_run_id = %s",
        (dag_run_id,),
    )
    rows = await cur.fetchall()
    return [(str(execution_id), str(job_id), bool(done)) for execution_id, job_id, done in rows]
