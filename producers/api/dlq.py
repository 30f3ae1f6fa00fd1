"""Routes of the dead-letter list: list, replay one, replay many by a filter."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Query, Request

from duetime.core.errors import IllegalTransition, NotFound, ValidationError
from duetime.core.jobspec import parse_uuid
from duetime.core.models import ControlKind, Status

from . import convert, store
from .deps import Res, Resources, parse_id, read_json
from .pagination import decode_cursor, page_of
from .rows import DeadLetterRow
from .schemas import (
    DLQ_FILTER_SCHEMA,
    REPLAY_PROGRESS_SCHEMA,
    DeadLetterPage,
    ReplayOut,
    ReplayProgressOut,
    errors,
    request_body,
)
from .writer import Publish

router = APIRouter()
MAX_BULK = 10_000


@router.get(
    "/dlq",
    response_model=DeadLetterPage,
    responses=errors(400, 401),
    summary="dead-lettered executions, newest first",
)
async def list_dlq(
    res: Res,
    job_id: str | None = Query(None, max_length=64),
    limit: int = Query(100, ge=1, le=500),
    cursor: str | None = Query(None, max_length=200),
    name: str | None = Query(None, max_length=200, description="the job's name, exactly"),
    include_replayed: bool = Query(True, description="false: only those not replayed yet"),
) -> dict[str, Any]:
    from .pagination import BadRequest

    if job_id is not None:
        try:
            job_id = parse_uuid(job_id, "job_id")
        except ValidationError as exc:
            raise BadRequest(exc.message, details={"field": "job_id"}) from None
    after = decode_cursor(cursor)
    async with res.pool.connection() as conn:
        rows = await store.list_dead_letters(
            conn,
            job_id=job_id,
            name=name,
            include_replayed=include_replayed,
            after=after,
            limit=limit + 1,
        )
    return page_of(rows, limit, lambda r: (r.dead_at, r.execution_id), convert.dead_letter_out)


async def _replay(res: Resources, rows: list[DeadLetterRow]) -> dict[str, Any]:
    """Replay each dead letter once: publish a replay command for those not replayed yet and
    mark them, all or nothing. A dead letter replayed before (by any API process, or the
    SDK) is answered as replayed again, as its first replay was, and nothing is published:
    replaying twice never runs the job twice."""
    async with res.pool.connection() as conn:
        statuses = await store.statuses(conn, sorted({str(r.job_id) for r in rows}))
    todo: list[DeadLetterRow] = []
    skipped: list[dict[str, str]] = []
    for r in rows:
        status = statuses.get(str(r.job_id))
        if status is Status.CANCELLED and r.replayed_at is None:
            skipped.append({"execution_id": str(r.execution_id), "reason": "job cancelled"})
        else:
            todo.append(r)
    if todo:
        marked_at = res.now()  # before the commands' issued_at: the projector's value wins
        async with res.pool.connection() as conn, conn.transaction():
            claimed = set(
                await store.claim_replays(conn, [str(r.execution_id) for r in todo], marked_at)
            )

            def publish(r: DeadLetterRow) -> Publish:
                return lambda done: res.client.command(
                    str(r.job_id),
                    ControlKind.REPLAY,
                    wait=False,
                    execution_id=str(r.execution_id),
                    # a DAG member's replay repairs its run (the scheduler asks the resolver)
                    dag_run_id=r.dag_run_id,
                    on_delivery=done,
                    requested_by="api",
                )

            fresh = [r for r in todo if str(r.execution_id) in claimed]
            # the claim commits only once Kafka acknowledged every command (an error rolls
            # it back, so the dead letters can be replayed again)
            await res.writer.publish_many([publish(r) for r in fresh])
    return {
        "replayed": len(todo),
        "execution_ids": [str(r.execution_id) for r in todo],
        "skipped": skipped,
    }


@router.post(
    "/dlq/{execution_id}/replay",
    status_code=202,
    response_model=ReplayOut,
    responses=errors(401, 404, 409, 503),
    summary="replay one dead execution",
)
async def replay_one(execution_id: str, res: Res) -> dict[str, Any]:
    execution_id = parse_id(execution_id, "execution")
    async with res.pool.connection() as conn:
        row = await store.get_dead_letter(conn, execution_id)
    if row is None:
        raise NotFound(
            f"no dead-lettered execution {execution_id}", details={"execution_id": execution_id}
        )
    out = await _replay(res, [row])
    if out["skipped"]:
        raise IllegalTransition(
            f"cannot replay execution {execution_id}: its job is cancelled",
            details={"execution_id": execution_id, "job_id": str(row.job_id)},
        )
    return out


@dataclass(frozen=True, slots=True)
class ReplayFilter:
    """Which dead letters ``POST /dlq/replay`` replays (its JSON body, checked)."""

    job_id: str | None = None
    name: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    include_replayed: bool = False
    limit: int = 1000


_FILTER_FIELDS = frozenset(f.name for f in fields(ReplayFilter))


def _filter(body: Any) -> ReplayFilter:
    if not isinstance(body, dict):
        raise ValidationError("the filter must be a JSON object", field="")
    unknown = sorted(set(body) - _FILTER_FIELDS)
    if unknown:
        raise ValidationError(f"unknown filter field(s): {', '.join(unknown)}", field=unknown[0])
    job_id = None if body.get("job_id") is None else parse_uuid(body.get("job_id"), "job_id")
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise ValidationError("name must be a string", field="name")
    return ReplayFilter(
        job_id=job_id,
        name=name,
        since=_timestamp(body.get("since"), "since"),
        until=_timestamp(body.get("until"), "until"),
        include_replayed=_include_replayed(body.get("include_replayed", False)),
        limit=_bulk_limit(body.get("limit", 1000)),
    )


def _timestamp(raw: Any, key: str) -> datetime | None:
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError(f"{key} must be an RFC 3339 timestamp", field=key) from None
    if value.tzinfo is None:
        raise ValidationError(f"{key} needs a time zone offset", field=key)
    return value


def _include_replayed(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise ValidationError("include_replayed must be a boolean", field="include_replayed")
    return raw


def _bulk_limit(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_BULK:
        raise ValidationError(f"limit must be an integer in [1, {MAX_BULK}]", field="limit")
    return raw


@router.post(
    "/dlq/replay",
    status_code=202,
    response_model=ReplayOut,
    responses=errors(400, 401, 413, 422, 503),
    openapi_extra=request_body(DLQ_FILTER_SCHEMA),
    summary="replay every dead execution that matches a filter (not yet replayed by default)",
)
async def replay_many(request: Request, res: Res) -> dict[str, Any]:
    flt = _filter(await read_json(request, res.settings))
    async with res.pool.connection() as conn:
        rows = await store.list_dead_letters(
            conn,
            job_id=flt.job_id,
            name=flt.name,
            since=flt.since,
            until=flt.until,
            include_replayed=flt.include_replayed,
            limit=flt.limit,
        )
    return await _replay(res, rows)


# how far a replay execution's scheduled time (the scheduler's clock) may lie before the
# replay's mark (the API's clock) and still count as that replay's
CLOCK_SKEW_S = 5.0
_FINISHED: dict[str, str] = {
    Status.SUCCESS: "succeeded",
    Status.DEAD: "dead",
    Status.SKIPPED: "other",
    Status.CANCELLED: "other",
    Status.EXPIRED: "other",  # a replay that could not start within the job's window
}
"""How a replay execution that ended counts (its status: a job status string)."""


@router.post(
    "/dlq/replay-progress",
    response_model=ReplayProgressOut,
    responses=errors(400, 401, 413, 422),
    openapi_extra=request_body(REPLAY_PROGRESS_SCHEMA),
    summary="where the replays of these dead letters are: succeeded, dead again, running",
)
async def replay_progress(request: Request, res: Res) -> dict[str, Any]:
    body = await read_json(request, res.settings)
    ids = body.get("execution_ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_BULK:
        raise ValidationError(
            f"execution_ids must be a list of 1 to {MAX_BULK} execution ids",
            field="execution_ids",
        )
    unknown = sorted(set(body) - {"execution_ids"})
    if unknown:
        raise ValidationError(f"unknown field(s): {', '.join(unknown)}", field=unknown[0])
    wanted = sorted({parse_uuid(x, "execution_ids") for x in ids})
    async with res.pool.connection() as conn:
        replayed, rows = await store.replay_executions(conn, wanted, CLOCK_SKEW_S)
    counts = {"succeeded": 0, "dead": 0, "other": 0}
    for r in rows:
        outcome = _FINISHED.get(r.status)
        if outcome is not None:
            counts[outcome] += 1
    finished = sum(counts.values())
    return {
        "requested": len(wanted),
        "replayed": replayed,
        "started": len(rows),
        **counts,
        "in_progress": replayed - finished,
        "executions": [
            {"execution_id": str(r.execution_id), "job_id": str(r.job_id), "status": r.status}
            for r in rows
        ],
    }
