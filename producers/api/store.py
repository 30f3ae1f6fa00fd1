"""The API's PostgreSQL side: reads of the projection, and the few rows the API writes itself.

The API writes two things, both inside the request that published the event, and both such
that the projector's later write of the same event gives the same row:

- a new job's row (status ``pending``/``blocked``, ``state_offset = -1``), so a job created a
  moment ago is readable at once; the projector's own row for the definition has the same
  revision (it replaces the definition columns) and any scheduler state outranks it;
- ``replayed_at`` of a replayed dead letter (``GREATEST`` of the API's clock and the command's
  ``issued_at``, taken just after, so the projector's value wins).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads

from duetime.core.errors import Conflict
from duetime.core.jobspec import schedule_to_api
from duetime.core.models import Status
from duetime.core.projection import JOB_COLUMNS, job_row
from duetime.core.records import DagDefinition, DagNode, JobDefinition
from duetime.core.states import TERMINAL

from .jsondepth import exceeds_depth
from .rows import DagRow, DagRunRow, DeadLetterRow, ExecutionRow, JobRow, NewJob, ReplayRow

__all__ = [
    "MAX_DECODED_DEPTH",
    "TOO_DEEP",
    "TooDeep",
    "configure",
    "job_row",
    "json_loads",
]
"""``job_row`` is re-exported: the API's read-your-writes row of a job is the projector's."""

Row = dict[str, Any]
R = TypeVar("R", JobRow, ExecutionRow, DeadLetterRow, DagRow, DagRunRow)


class TooDeep:
    """What a stored JSON value nested deeper than ``MAX_DECODED_DEPTH`` decodes to: such a
    value (written before the API limited nesting, or by an older SDK) would break the
    decoder and every encoder after it, so it is not decoded at all (see ``convert``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "TOO_DEEP"


TOO_DEEP = TooDeep()
MAX_DECODED_DEPTH = 64


def json_loads(data: bytes | bytearray | memoryview | str) -> Any:
    """The API connections' json/jsonb decoder: depth-checked on the bytes first."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if exceeds_depth(raw, MAX_DECODED_DEPTH):
        return TOO_DEEP
    return json.loads(raw)


async def configure(conn: AsyncConnection[Any]) -> None:
    """Every pooled connection decodes JSON with ``json_loads``."""
    set_json_loads(json_loads, conn)


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


async def _one(conn: AsyncConnection[Any], cls: type[R], query: str, args: Any) -> R | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, args)
        row = await cur.fetchone()
    return None if row is None else cls.from_row(row)


async def _all(conn: AsyncConnection[Any], cls: type[R], query: str, args: Any) -> list[R]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, args)
        return [cls.from_row(row) for row in await cur.fetchall()]


_INSERT_JOB = (
    f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) "
    f"VALUES ({', '.join(['%s'] * len(JOB_COLUMNS))}) "
    "ON CONFLICT (job_id) DO NOTHING RETURNING job_id"
)
"""A new job's row; nothing (and no row back) when its job_id exists."""


async def insert_new_job(conn: AsyncConnection[Any], definition: JobDefinition) -> NewJob | None:
    """Insert a new job's row and return it; None when the job_id exists (the row is then
    locked until the caller's transaction ends, so two creates of one id are serialised)."""
    row = job_row(definition)
    cur = await conn.execute(
        _INSERT_JOB,
        [row[c] for c in JOB_COLUMNS],
    )
    return NewJob.from_row(row) if await cur.fetchone() is not None else None


async def insert_new_jobs(
    conn: AsyncConnection[Any], definitions: Sequence[JobDefinition]
) -> list[NewJob | None]:
    """``insert_new_job`` for many jobs in one pipelined round of statements (in order); each
    item None when that job_id exists (its row is then locked as there)."""
    rows = [job_row(d) for d in definitions]
    out: list[NewJob | None] = []
    async with conn.cursor() as cur:
        await cur.executemany(
            _INSERT_JOB,
            [[row[c] for c in JOB_COLUMNS] for row in rows],
            returning=True,
        )
        for row in rows:  # one result set per statement, in order
            out.append(NewJob.from_row(row) if await cur.fetchone() is not None else None)
            cur.nextset()
    return out


async def insert_new_dag(conn: AsyncConnection[Any], definition: DagDefinition) -> bool:
    """Insert a new DAG's row; False when the dag_id exists (the row is then locked until the
    caller's transaction ends, as in ``insert_new_job``)."""
    schedule = schedule_to_api(definition.schedule)
    cur = await conn.execute(
        "INSERT INTO dags (dag_id, name, schedule, overlap, nodes, revision, created_at, "
        "updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (dag_id) DO NOTHING "
        "RETURNING dag_id",
        (
            definition.dag_id,
            definition.name,
            None if schedule is None else json.dumps(schedule),
            definition.overlap.value,
            json.dumps(_nodes(definition.nodes)),
            definition.revision,
            _dt(definition.created_at_ms),
            _dt(definition.created_at_ms),
        ),
    )
    return await cur.fetchone() is not None


def _nodes(nodes: Sequence[DagNode]) -> list[dict[str, Any]]:
    return [n.to_avro() for n in nodes]


def dag_spec(definition: DagDefinition) -> dict[str, Any]:
    """What makes a DAG, from its definition record: compared with a stored row's
    (``dag_row_spec``) to tell an idempotent re-post from a conflicting one."""
    return {
        "name": definition.name,
        "schedule": schedule_to_api(definition.schedule),
        "overlap": definition.overlap.value,
        "nodes": _nodes(definition.nodes),
    }


def dag_row_spec(row: DagRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "schedule": row.schedule,
        "overlap": row.overlap,
        "nodes": _nodes(row.nodes),
    }


# --- reads -----------------------------------------------------------------------------------

EXECUTION_LISTED = ", ".join(
    f"x.{name}" for name in ExecutionRow.__dataclass_fields__ if name != "traceback"
)
"""The executions columns a list reads: all that ``ExecutionRow`` knows but the traceback (up
to 8 KiB a row, shown by the single execution's read only)."""

_LAST_EXECUTION = """
LEFT JOIN LATERAL (
    SELECT to_jsonb(x) - 'traceback' AS last_execution FROM executions x
    WHERE x.job_id = j.job_id
    ORDER BY x.scheduled_at DESC, x.execution_id DESC LIMIT 1
) e ON true
"""


async def get_job(conn: AsyncConnection[Any], job_id: str) -> JobRow | None:
    return await _one(
        conn,
        JobRow,
        f"SELECT j.*, e.* FROM jobs j {_LAST_EXECUTION} WHERE j.job_id = %s",
        (job_id,),
    )


async def existing_job(conn: AsyncConnection[Any], job_id: str) -> JobRow:
    """The row of a job whose insert just found it there (``insert_new_job`` gave None)."""
    row = await get_job(conn, job_id)
    if row is None:  # its creator's transaction rolled back meanwhile: the client retries
        raise Conflict(
            f"job {job_id} is being created by another request: retry",
            details={"job_id": job_id},
        )
    return row


async def job_status(conn: AsyncConnection[Any], job_id: str) -> Status | None:
    cur = await conn.execute("SELECT status FROM jobs WHERE job_id = %s", (job_id,))
    row = await cur.fetchone()
    return None if row is None else Status(row[0])


async def job_status_and_owner(
    conn: AsyncConnection[Any], job_id: str
) -> tuple[Status, bool] | None:
    """(status, whether a scheduler state of the job has been projected)."""
    cur = await conn.execute(
        "SELECT status, state_offset >= 0 FROM jobs WHERE job_id = %s", (job_id,)
    )
    row = await cur.fetchone()
    return None if row is None else (Status(row[0]), bool(row[1]))


async def list_jobs(
    conn: AsyncConnection[Any],
    *,
    status: str | None,
    priority: str | None,
    name: str | None,
    after: tuple[datetime, str] | None,
    limit: int,
    name_contains: str | None = None,
    queue: str | None = None,
) -> list[JobRow]:
    where: list[str] = ["NOT j.deleted"]  # deleted jobs answer by id only
    args: list[Any] = []
    for col, value in (
        ("status", status),
        ("priority", priority),
        ("name", name),
        ("queue", queue),
    ):
        if value is not None:
            where.append(f"j.{col} = %s")
            args.append(value)
    if name_contains is not None:
        where.append("j.name ILIKE %s")
        args.append(f"%{_like_escape(name_contains)}%")
    if after is not None:
        where.append("(j.created_at, j.job_id) < (%s, %s)")
        args += [after[0], after[1]]
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    return await _all(
        conn,
        JobRow,
        f"SELECT j.*, e.* FROM (SELECT * FROM jobs j {clause} "
        "ORDER BY j.created_at DESC, j.job_id DESC LIMIT %s) j "
        f"{_LAST_EXECUTION} ORDER BY j.created_at DESC, j.job_id DESC",
        [*args, limit],
    )


async def list_executions(
    conn: AsyncConnection[Any], job_id: str, after: tuple[datetime, str] | None, limit: int
) -> list[ExecutionRow]:
    where: list[str] = ["job_id = %s"]
    args: list[Any] = [job_id]
    if after is not None:
        where.append("(scheduled_at, execution_id) < (%s, %s)")
        args += [after[0], after[1]]
    return await _all(
        conn,
        ExecutionRow,
        f"SELECT {EXECUTION_LISTED} FROM executions x WHERE {' AND '.join(where)} "
        "ORDER BY scheduled_at DESC, execution_id DESC LIMIT %s",
        [*args, limit],
    )


async def get_execution(conn: AsyncConnection[Any], execution_id: str) -> ExecutionRow | None:
    return await _one(
        conn,
        ExecutionRow,
        "SELECT * FROM executions WHERE execution_id = %s ORDER BY scheduled_at LIMIT 1",
        (execution_id,),
    )


# --- dead letters ----------------------------------------------------------------------------


async def list_dead_letters(
    conn: AsyncConnection[Any],
    *,
    job_id: str | None = None,
    name: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    include_replayed: bool = True,
    after: tuple[datetime, str] | None = None,
    limit: int = 100,
) -> list[DeadLetterRow]:
    where: list[str] = []
    args: list[Any] = []
    for cond, value in (
        ("job_id = %s", job_id),
        ("name = %s", name),
        ("dead_at >= %s", since),
        ("dead_at < %s", until),
    ):
        if value is not None:
            where.append(cond)
            args.append(value)
    if not include_replayed:
        where.append("replayed_at IS NULL")
    if after is not None:
        where.append("(dead_at, execution_id) < (%s, %s)")
        args += [after[0], after[1]]
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    return await _all(
        conn,
        DeadLetterRow,
        f"SELECT * FROM dead_letters {clause} ORDER BY dead_at DESC, execution_id DESC LIMIT %s",
        [*args, limit],
    )


async def get_dead_letter(conn: AsyncConnection[Any], execution_id: str) -> DeadLetterRow | None:
    return await _one(
        conn, DeadLetterRow, "SELECT * FROM dead_letters WHERE execution_id = %s", (execution_id,)
    )


async def replay_executions(
    conn: AsyncConnection[Any], execution_ids: Sequence[str], skew_s: float
) -> tuple[int, list[ReplayRow]]:
    """(how many of these dead letters are marked replayed, the executions their replays
    started). A replay runs as a new execution of the same job (trigger ``replay``), with
    no link back to the dead one: per job, the first k replay executions scheduled at or
    after the replays' mark (less ``skew_s`` of clock skew between the API and the
    scheduler) answer its k replayed dead letters."""
    async with conn.cursor() as cur:
        await cur.execute(
            "WITH d AS (SELECT job_id, count(*) AS n, min(replayed_at) AS since "
            "FROM dead_letters WHERE execution_id = ANY(%s::uuid[]) AND replayed_at IS NOT NULL "
            "GROUP BY job_id), "
            "r AS (SELECT e.*, d.n, row_number() OVER (PARTITION BY e.job_id "
            "ORDER BY e.scheduled_at, e.execution_id) AS k FROM d JOIN executions e "
            "ON e.job_id = d.job_id AND e.trigger = 'replay' "
            "AND e.scheduled_at >= d.since - make_interval(secs => %s)) "
            "SELECT (SELECT coalesce(sum(n), 0) FROM d)::int, "
            "r.execution_id, r.job_id, r.status FROM r WHERE k <= n ORDER BY scheduled_at",
            (list(execution_ids), skew_s),
        )
        rows = await cur.fetchall()
        if rows:
            started = [ReplayRow(execution_id=e, job_id=j, status=s) for _, e, j, s in rows]
            return int(rows[0][0]), started
        await cur.execute(
            "SELECT count(*) FROM dead_letters "
            "WHERE execution_id = ANY(%s::uuid[]) AND replayed_at IS NOT NULL",
            (list(execution_ids),),
        )
        row = await cur.fetchone()
        return (0 if row is None else int(row[0])), []


async def statuses(conn: AsyncConnection[Any], job_ids: Sequence[str]) -> dict[str, Status]:
    cur = await conn.execute(
        "SELECT job_id::text, status FROM jobs WHERE job_id = ANY(%s::uuid[])", (list(job_ids),)
    )
    return {job_id: Status(status) for job_id, status in await cur.fetchall()}


async def claim_replays(
    conn: AsyncConnection[Any], execution_ids: Sequence[str], at: datetime
) -> list[str]:
    """Mark these dead letters replayed and return those that were not yet: only they may
    be replayed now. Inside the caller's transaction the claimed rows stay locked until it
    ends, so a concurrent claim of the same dead letter (from any API process) waits, then
    finds it taken; a rolled-back claim (the publish failed) leaves it free again. A replay
    the projector saw (the SDK's ``replay``) counts as taken too."""
    ids = list(execution_ids)
    cur = await conn.execute(
        "INSERT INTO dlq_replays (execution_id, replayed_at) SELECT unnest(%s::uuid[]), %s "
        "ON CONFLICT (execution_id) DO NOTHING RETURNING execution_id::text",
        (ids, at),
    )
    claimed = [str(r[0]) for r in await cur.fetchall()]
    if claimed:
        await conn.execute(
            "UPDATE dead_letters d SET replayed_at = r.replayed_at FROM dlq_replays r "
            "WHERE d.execution_id = r.execution_id AND r.execution_id = ANY(%s::uuid[])",
            (claimed,),
        )
    return claimed


# --- DAGs ------------------------------------------------------------------------------------


async def get_dag(conn: AsyncConnection[Any], dag_id: str) -> DagRow | None:
    return await _one(conn, DagRow, "SELECT * FROM dags WHERE dag_id = %s", (dag_id,))


async def list_dags(
    conn: AsyncConnection[Any],
    *,
    name_contains: str | None,
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[DagRow]:
    """DAGs newest first, each with its latest run (``last_run``, a row as JSON, or None)."""
    where: list[str] = []
    args: list[Any] = []
    if name_contains is not None:
        where.append("d.name ILIKE %s")
        args.append(f"%{_like_escape(name_contains)}%")
    if after is not None:
        where.append("(d.created_at, d.dag_id) < (%s, %s)")
        args += [after[0], after[1]]
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    return await _all(
        conn,
        DagRow,
        f"SELECT d.*, r.last_run FROM (SELECT * FROM dags d {clause} "
        "ORDER BY d.created_at DESC, d.dag_id DESC LIMIT %s) d "
        "LEFT JOIN LATERAL (SELECT to_jsonb(x) AS last_run FROM dag_runs x "
        "WHERE x.dag_id = d.dag_id ORDER BY x.started_at DESC, x.dag_run_id DESC LIMIT 1"
        ") r ON true ORDER BY d.created_at DESC, d.dag_id DESC",
        [*args, limit],
    )


def _like_escape(text: str) -> str:
    """``text`` matched literally inside an ILIKE pattern (backslash is the default escape)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


async def list_dag_runs(
    conn: AsyncConnection[Any], dag_id: str, after: tuple[datetime, str] | None, limit: int
) -> list[DagRunRow]:
    where: list[str] = ["dag_id = %s"]
    args: list[Any] = [dag_id]
    if after is not None:
        where.append("(started_at, dag_run_id) < (%s, %s)")
        args += [after[0], after[1]]
    runs = await _all(
        conn,
        DagRunRow,
        f"SELECT * FROM dag_runs WHERE {' AND '.join(where)} "
        "ORDER BY started_at DESC, dag_run_id DESC LIMIT %s",
        [*args, limit],
    )
    if not runs:
        return runs
    # per-job status of each run from its executions (fresher than the resolver's events
    # while a node runs; the resolver's terminal statuses, e.g. skipped, win)
    cur = await conn.execute(
        "SELECT dag_run_id, job_id::text, status FROM executions "
        "WHERE dag_run_id = ANY(%s) ORDER BY scheduled_at",
        ([r.dag_run_id for r in runs],),
    )
    by_run: dict[str, dict[str, str]] = {}
    for dag_run_id, job_id, status in await cur.fetchall():
        by_run.setdefault(dag_run_id, {})[job_id] = status
    return [replace(r, execution_statuses=by_run.get(r.dag_run_id, {})) for r in runs]


def node_statuses(run: DagRunRow, key_of_job: Mapping[str, str]) -> dict[str, str]:
    merged = dict(run.node_statuses or {})
    for job_id, status in run.execution_statuses.items():
        key = key_of_job.get(job_id)
        if key is not None and merged.get(key) not in TERMINAL:
            merged[key] = status
    return merged
