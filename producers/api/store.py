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
from datetime import UTC, datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from duetime.core.jobspec import schedule_to_api
from duetime.core.projection import JOB_COLUMNS, job_row

Row = dict[str, Any]

_TERMINAL = frozenset({"success", "dead", "skipped", "cancelled"})


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


async def insert_new_job(conn: AsyncConnection[Any], definition: Mapping[str, Any]) -> Row | None:
    """Insert a new job's row and return it; None when the job_id exists (the row is then
    locked until the caller's transaction ends, so two creates of one id are serialised)."""
    row = job_row(definition)
    cur = await conn.execute(
        f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) "
        f"VALUES ({', '.join(['%s'] * len(JOB_COLUMNS))}) "
        "ON CONFLICT (job_id) DO NOTHING RETURNING job_id",
        [row[c] for c in JOB_COLUMNS],
    )
    return row if await cur.fetchone() is not None else None


async def insert_new_dag(conn: AsyncConnection[Any], definition: Mapping[str, Any]) -> None:
    schedule = schedule_to_api(definition.get("schedule"))
    nodes = [
        {"key": n["key"], "job_id": n["job_id"], "depends_on": list(n["depends_on"])}
        for n in definition["nodes"]
    ]
    await conn.execute(
        "INSERT INTO dags (dag_id, name, schedule, overlap, nodes, revision, created_at, "
        "updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (dag_id) DO NOTHING",
        (
            definition["dag_id"],
            definition["name"],
            None if schedule is None else json.dumps(schedule),
            definition["overlap"],
            json.dumps(nodes),
            definition["revision"],
            _dt(definition["created_at_ms"]),
            _dt(definition["created_at_ms"]),
        ),
    )


# --- reads -----------------------------------------------------------------------------------

_LAST_EXECUTION = """
LEFT JOIN LATERAL (
    SELECT to_jsonb(x) AS last_execution FROM executions x WHERE x.job_id = j.job_id
    ORDER BY x.scheduled_at DESC, x.execution_id DESC LIMIT 1
) e ON true
"""


async def get_job(conn: AsyncConnection[Any], job_id: str) -> Row | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"SELECT j.*, e.* FROM jobs j {_LAST_EXECUTION} WHERE j.job_id = %s", (job_id,)
        )
        return await cur.fetchone()


async def job_status(conn: AsyncConnection[Any], job_id: str) -> str | None:
    cur = await conn.execute("SELECT status FROM jobs WHERE job_id = %s", (job_id,))
    row = await cur.fetchone()
    return None if row is None else str(row[0])


async def job_status_and_owner(conn: AsyncConnection[Any], job_id: str) -> tuple[str, bool] | None:
    """(status, whether a scheduler state of the job has been projected)."""
    cur = await conn.execute(
        "SELECT status, state_offset >= 0 FROM jobs WHERE job_id = %s", (job_id,)
    )
    row = await cur.fetchone()
    return None if row is None else (str(row[0]), bool(row[1]))


async def list_jobs(
    conn: AsyncConnection[Any],
    *,
    status: str | None,
    priority: str | None,
    name: str | None,
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[Row]:
    where: list[str] = []
    args: list[Any] = []
    for col, value in (("status", status), ("priority", priority), ("name", name)):
        if value is not None:
            where.append(f"j.{col} = %s")
            args.append(value)
    if after is not None:
        where.append("(j.created_at, j.job_id) < (%s, %s)")
        args += [after[0], after[1]]
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"SELECT j.*, e.* FROM (SELECT * FROM jobs j {clause} "
            "ORDER BY j.created_at DESC, j.job_id DESC LIMIT %s) j "
            f"{_LAST_EXECUTION} ORDER BY j.created_at DESC, j.job_id DESC",
            [*args, limit],
        )
        return await cur.fetchall()


async def list_executions(
    conn: AsyncConnection[Any], job_id: str, after: tuple[datetime, str] | None, limit: int
) -> list[Row]:
    where: list[str] = ["job_id = %s"]
    args: list[Any] = [job_id]
    if after is not None:
        where.append("(scheduled_at, execution_id) < (%s, %s)")
        args += [after[0], after[1]]
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"SELECT * FROM executions WHERE {' AND '.join(where)} "
            "ORDER BY scheduled_at DESC, execution_id DESC LIMIT %s",
            [*args, limit],
        )
        return await cur.fetchall()


async def get_execution(conn: AsyncConnection[Any], execution_id: str) -> Row | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "SELECT * FROM executions WHERE execution_id = %s ORDER BY scheduled_at LIMIT 1",
            (execution_id,),
        )
        return await cur.fetchone()


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
) -> list[Row]:
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
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"SELECT * FROM dead_letters {clause} "
            "ORDER BY dead_at DESC, execution_id DESC LIMIT %s",
            [*args, limit],
        )
        return await cur.fetchall()


async def get_dead_letter(conn: AsyncConnection[Any], execution_id: str) -> Row | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT * FROM dead_letters WHERE execution_id = %s", (execution_id,))
        return await cur.fetchone()


async def statuses(conn: AsyncConnection[Any], job_ids: Sequence[str]) -> dict[str, str]:
    cur = await conn.execute(
        "SELECT job_id::text, status FROM jobs WHERE job_id = ANY(%s::uuid[])", (list(job_ids),)
    )
    return {job_id: status for job_id, status in await cur.fetchall()}


async def mark_replayed(
    conn: AsyncConnection[Any], execution_ids: Sequence[str], at: datetime
) -> None:
    ids = list(execution_ids)
    await conn.execute(
        "INSERT INTO dlq_replays AS r (execution_id, replayed_at) "
        "SELECT unnest(%s::uuid[]), %s ON CONFLICT (execution_id) DO UPDATE "
        "SET replayed_at = GREATEST(r.replayed_at, EXCLUDED.replayed_at)",
        (ids, at),
    )
    await conn.execute(
        "UPDATE dead_letters d SET replayed_at = r.replayed_at FROM dlq_replays r "
        "WHERE d.execution_id = r.execution_id AND r.execution_id = ANY(%s::uuid[])",
        (ids,),
    )


# --- DAGs ------------------------------------------------------------------------------------


async def get_dag(conn: AsyncConnection[Any], dag_id: str) -> Row | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT * FROM dags WHERE dag_id = %s", (dag_id,))
        return await cur.fetchone()


async def list_dag_runs(
    conn: AsyncConnection[Any], dag_id: str, after: tuple[datetime, str] | None, limit: int
) -> list[Row]:
    where: list[str] = ["dag_id = %s"]
    args: list[Any] = [dag_id]
    if after is not None:
        where.append("(started_at, dag_run_id) < (%s, %s)")
        args += [after[0], after[1]]
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"SELECT * FROM dag_runs WHERE {' AND '.join(where)} "
            "ORDER BY started_at DESC, dag_run_id DESC LIMIT %s",
            [*args, limit],
        )
        runs = await cur.fetchall()
        if not runs:
            return runs
        # per-job status of each run from its executions (fresher than the resolver's events
        # while a node runs; the resolver's terminal statuses, e.g. skipped, win)
        await cur.execute(
            "SELECT dag_run_id, job_id::text AS job_id, status FROM executions "
            "WHERE dag_run_id = ANY(%s) ORDER BY scheduled_at",
            ([r["dag_run_id"] for r in runs],),
        )
        by_run: dict[str, dict[str, str]] = {}
        for e in await cur.fetchall():
            by_run.setdefault(e["dag_run_id"], {})[e["job_id"]] = e["status"]
    for run in runs:
        run["_execution_statuses"] = by_run.get(run["dag_run_id"], {})
    return runs


def node_statuses(run: Row, key_of_job: Mapping[str, str]) -> dict[str, str]:
    merged = dict(run["node_statuses"] or {})
    for job_id, status in run.get("_execution_statuses", {}).items():
        key = key_of_job.get(job_id)
        if key is not None and merged.get(key) not in _TERMINAL:
            merged[key] = status
    return merged
