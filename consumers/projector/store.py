"""The projector's PostgreSQL side: one transaction per batch, rows and offsets together.

A batch is staged with COPY into temporary tables and merged with one ``INSERT … ON CONFLICT``
per table; the consumed offsets are written in the same transaction, so after a crash the
projector resumes exactly after the last batch that was committed (exactly-once projection).
Merges carry their own guards (revision, state offset, lease token), so replaying an event
that is already projected changes nothing either.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import class_row

from duetime.core.cancel import flag_cancelled_jobs, flag_queued_of_cancelled
from duetime.core.clock import SYSTEM_CLOCK, Clock
from duetime.core.models import Status
from duetime.core.pgarrays import int_array, ms_timestamp_array, text_array
from duetime.core.projection import JOB_COLUMNS, JOB_DEFINITION_COLUMNS, JOB_STATUS_COLUMNS
from duetime.core.records import (
    DagDefinition,
    DagRunEvent,
    DeadLetter,
    ExecutionRequest,
    JobDefinition,
    SchedulerState,
)

from . import rows

log = logging.getLogger("duetime.projector")

PROJECTION_TABLES = ("jobs", "executions", "dead_letters", "dlq_replays", "dags", "dag_runs")
"""What ``--rebuild`` empties (with this projector's offsets) and the checksum covers."""

EXECUTION_COLS = (
    "execution_id",
    "scheduled_at",
    "job_id",
    "name",
    "priority",
    "status",
    "attempt",
    "trigger",
    "queued_at",
    "started_at",
    "finished_at",
    "worker_id",
    "error",
    "attempts",
    "lateness_ms",
    "dag_id",
    "dag_run_id",
    "output_json",
    "traceback",
    "queue",
)
DEAD_COLS = (
    "execution_id",
    "job_id",
    "name",
    "dead_at",
    "attempts",
    "errors",
    "request",
    "dag_run_id",
)
DAG_COLS = (
    "dag_id",
    "name",
    "schedule",
    "overlap",
    "nodes",
    "revision",
    "created_at",
    "updated_at",
)

_PARTITION_RE = re.compile(r"^executions_(\d{8})$")
_PARTITION_LOCK = 0x70726F6A  # "proj": serialises partition creation between projectors


def _cols(cols: Sequence[str]) -> str:
    return ", ".join(cols)


def _job_upsert() -> str:
    sets = [
        f"{c} = CASE WHEN EXCLUDED.revision >= j.revision THEN EXCLUDED.{c} ELSE j.{c} END"
        for c in JOB_DEFINITION_COLUMNS
    ] + [
        f"{c} = CASE WHEN EXCLUDED.state_offset > j.state_offset THEN EXCLUDED.{c} ELSE j.{c} END"
        for c in JOB_STATUS_COLUMNS
    ]
    return (
        f"INSERT INTO jobs AS j ({_cols(JOB_COLUMNS)}) SELECT {_cols(JOB_COLUMNS)} FROM stage_jobs "
        f"ON CONFLICT (job_id) DO UPDATE SET {', '.join(sets)} "
        "WHERE EXCLUDED.revision >= j.revision OR EXCLUDED.state_offset > j.state_offset"
    )


_JOB_UPSERT = _job_upsert()
# The statuses of jobs whose rows hold their states' definition revision; the query answers
# the job ids whose rows do not (missing, or an older revision). Its SELECT reads the table as
# it was before the UPDATE (one snapshot), which changes no revision anyway.
_STATUS_UPDATE = """
WITH s AS (
    SELECT * FROM unnest(%s::uuid[], %s::bigint[], %s::text[], %s::timestamptz[],
                         %s::timestamptz[], %s::bigint[])
        AS s(job_id, revision, status, next_run_at, status_at, state_offset)
), updated AS (
    UPDATE jobs j SET status = s.status, next_run_at = s.next_run_at,
                      status_at = s.status_at, state_offset = s.state_offset
    FROM s
    WHERE j.job_id = s.job_id AND j.revision >= s.revision AND s.state_offset > j.state_offset
)
SELECT s.job_id FROM s LEFT JOIN jobs j ON j.job_id = s.job_id
WHERE j.job_id IS NULL OR j.revision < s.revision
"""
_EXECUTION_UPSERT = (
    f"INSERT INTO executions ({_cols(EXECUTION_COLS)}) "
    f"SELECT {_cols(EXECUTION_COLS)} FROM stage_executions "
    "ON CONFLICT (scheduled_at, execution_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in EXECUTION_COLS[2:])
)
_DEAD_UPSERT = (
    f"INSERT INTO dead_letters AS d ({_cols(DEAD_COLS)}, replayed_at) "
    f"SELECT {', '.join('s.' + c for c in DEAD_COLS)}, r.replayed_at FROM stage_dead s "
    "LEFT JOIN dlq_replays r ON r.execution_id = s.execution_id "
    "ON CONFLICT (execution_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in DEAD_COLS[1:])
    + " WHERE EXCLUDED.attempts >= d.attempts"
)
_DAG_UPSERT = (
    f"INSERT INTO dags AS d ({_cols(DAG_COLS)}) VALUES ({', '.join(['%s'] * len(DAG_COLS))}) "
    "ON CONFLICT (dag_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in DAG_COLS[1:])
    + " WHERE EXCLUDED.revision >= d.revision"
)
_DAG_RUN_UPSERT = """
INSERT INTO dag_runs AS r (dag_run_id, dag_id, status, started_at, finished_at, node_statuses)
VALUES (%(id)s, %(dag_id)s, COALESCE(%(status)s, 'running'), %(started_at)s, %(finished_at)s,
        %(nodes)s::jsonb)
ON CONFLICT (dag_run_id) DO UPDATE SET
    status = COALESCE(%(status)s, r.status),
    finished_at = CASE WHEN %(reopened)s THEN EXCLUDED.finished_at
                       ELSE COALESCE(EXCLUDED.finished_at, r.finished_at) END,
    started_at = LEAST(r.started_at, EXCLUDED.started_at),
    node_statuses = CASE WHEN %(replace)s THEN EXCLUDED.node_statuses
                         ELSE r.node_statuses || EXCLUDED.node_statuses END
"""
_LAST_EXECUTION = """
UPDATE jobs j SET last_execution_id = l.execution_id
FROM unnest(%s::uuid[]) AS t(job_id)
CROSS JOIN LATERAL (
    SELECT e.execution_id FROM executions e WHERE e.job_id = t.job_id
    ORDER BY e.scheduled_at DESC, e.execution_id DESC LIMIT 1
) l
WHERE j.job_id = t.job_id AND j.last_execution_id IS DISTINCT FROM l.execution_id
"""


@dataclass
class Batch:
    """What one consume cycle brings, reduced per key: only the newest definition and the
    newest state of a job are turned into a row (see ``rows``)."""

    definitions: dict[str, JobDefinition] = field(default_factory=dict)
    states: dict[str, tuple[int, rows.StateHead, Callable[[], SchedulerState]]] = field(
        default_factory=dict
    )
    """job_id → (offset in its state partition, the newest state's head, a decode of that
    whole state: called only when its definition is needed)."""
    executions: dict[str, tuple[int, str, list[rows.ExecutionEvent]]] = field(default_factory=dict)
    """execution_id → (scheduled_at_ms, job_id, its events in consumption order)."""
    dead: dict[str, tuple[int, rows.Row]] = field(default_factory=dict)
    """execution_id → (attempts, the dead letter's row) of the most attempts."""
    replays: dict[str, int] = field(default_factory=dict)
    dags: dict[str, tuple[int, rows.Row]] = field(default_factory=dict)
    """dag_id → (revision, the DAG's row) of the highest revision."""
    dag_run_events: list[DagRunEvent] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    events: int = 0

    def add_definition(self, record: JobDefinition) -> None:
        seen = self.definitions.get(record.job_id)
        if seen is None or record.revision >= seen.revision:
            self.definitions[record.job_id] = record

    def add_state(
        self, head: rows.StateHead, offset: int, whole: Callable[[], SchedulerState]
    ) -> None:
        seen = self.states.get(head.job_id)
        if seen is None or offset > seen[0]:
            self.states[head.job_id] = (offset, head, whole)

    def status_only(self) -> list[tuple[int, rows.StateHead]]:
        """The newest states of jobs with no definition in this batch: their rows usually
        hold the definition already (the API writes it at create), so only the status columns
        are written (``ProjectionStore._write_statuses``)."""
        return [
            (o, h) for job_id, (o, h, _) in self.states.items() if job_id not in self.definitions
        ]

    def job_rows(self, whole: Collection[str] = ()) -> list[rows.Row]:
        """Whole rows: of every definition (with its job's state, if any), and of the states
        whose job is in ``whole`` (their rows lack the definition they embed)."""
        out = []
        for job_id in self.definitions.keys() | whole:
            definition = self.definitions.get(job_id)
            entry = self.states.get(job_id)
            if entry is None:
                if definition is not None:
                    out.append(rows.job_row(definition))
                continue
            offset, head, decode = entry
            if definition is not None and definition.revision >= head.definition.revision:
                # the same definition, or a newer one than the state's: no need to decode it
                out.append(
                    {
                        **rows.job_row(definition, with_next_run=False),
                        **rows.status_columns(head, offset),
                    }
                )
            else:
                out.append(rows.job_row_of(definition, decode(), offset))
        return out

    def add_execution_event(self, record: rows.ExecutionEvent) -> None:
        scheduled_ms = (
            record.request.scheduled_at_ms
            if isinstance(record, DeadLetter)
            else record.scheduled_at_ms
        )
        entry = self.executions.get(record.execution_id)
        if entry is None:
            entry = self.executions[record.execution_id] = (scheduled_ms, record.job_id, [])
        entry[2].append(record)

    def requested_jobs(self) -> set[str]:
        """The jobs of the execution requests (runs emitted) in the batch."""
        return {
            job_id
            for _, job_id, events in self.executions.values()
            if any(isinstance(event, ExecutionRequest) for event in events)
        }

    def add_dead(self, record: DeadLetter) -> None:
        row = rows.dead_letter_row(record)
        seen = self.dead.get(record.execution_id)
        if seen is None or record.attempts >= seen[0]:
            self.dead[record.execution_id] = (record.attempts, row)
        self.add_execution_event(record)

    def add_replay(self, execution_id: str, issued_at_ms: int) -> None:
        self.replays[execution_id] = max(issued_at_ms, self.replays.get(execution_id, 0))

    def add_dag(self, record: DagDefinition) -> None:
        seen = self.dags.get(record.dag_id)
        if seen is None or record.revision >= seen[0]:
            self.dags[record.dag_id] = (record.revision, rows.dag_row(record))

    def rows_written(self) -> int:
        return (
            len(self.definitions.keys() | self.states.keys())
            + len(self.executions)
            + len(self.dead)
            + len(self.replays)
            + len(self.dags)
            + len(self.dag_run_events)
        )


class ProjectionStore:
    """One PostgreSQL connection, owned by the projector's loop thread."""

    def __init__(
        self,
        database_url: str,
        consumer_name: str,
        retention_days: int,
        cache_size: int = 200_000,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.database_url = database_url
        self.clock = clock
        self.consumer_name = consumer_name
        self.retention_days = retention_days
        self.conn: psycopg.Connection[Any] | None = None
        self.days: set[date] = set()
        # Executions as last written by this process. Valid while the partitions stay here
        # (one writer per partition): forget() on every rebalance and after a failed batch.
        self.cache: OrderedDict[str, rows.Execution] = OrderedDict()
        self.cache_size = cache_size

    def forget(self) -> None:
        self.cache.clear()

    # --- connection ---------------------------------------------------------------------

    def connect(self) -> psycopg.Connection[Any]:
        if self.conn is not None and not self.conn.closed:
            return self.conn
        conn = psycopg.connect(self.database_url, autocommit=True)
        for table, like in (
            ("stage_jobs", "jobs"),
            ("stage_executions", "executions"),
            ("stage_dead", "dead_letters"),
        ):
            conn.execute(
                f"CREATE TEMP TABLE IF NOT EXISTS {table} (LIKE {like} INCLUDING DEFAULTS) "
                "ON COMMIT DELETE ROWS"
            )
        self.conn = conn
        self.days = self._existing_days(conn)
        return conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    # --- offsets ------------------------------------------------------------------------

    def offsets(self) -> dict[tuple[str, int], int]:
        conn = self.connect()
        return {
            (topic, partition): offset
            for topic, partition, offset in conn.execute(
                "SELECT topic, partition, next_offset FROM projector_offsets WHERE consumer = %s",
                (self.consumer_name,),
            )
        }

    # --- the batch ----------------------------------------------------------------------

    def write(self, batch: Batch) -> None:
        try:
            self._write(batch)
        except BaseException:
            self.forget()  # the cached executions may hold what was rolled back
            raise

    def _write(self, batch: Batch) -> None:
        conn = self.connect()
        with conn.transaction():
            self._ensure_days(conn, batch)
            if batch.executions:
                self._write_executions(conn, batch)
            status_only = batch.status_only()
            whole = self._write_statuses(conn, status_only) if status_only else []
            job_rows = batch.job_rows(whole)
            if job_rows:
                self._copy(conn, "stage_jobs", JOB_COLUMNS, job_rows)
                conn.execute(_JOB_UPSERT)
            # a job turned cancelled (by any client): its running work is told to stop through
            # its leases, in the transaction that records the status (duetime.core.cancel)
            cancelled = sorted(
                job_id
                for job_id, (_, head, _) in batch.states.items()
                if head.status is Status.CANCELLED
            )
            if cancelled:
                flag_cancelled_jobs(conn, cancelled)
            # and so are its runs emitted but not started (a backlog, or a run emitted ahead of
            # its time), whichever of the cancel and the run's request came first
            queued = batch.requested_jobs()
            if cancelled or queued:
                flag_queued_of_cancelled(conn, sorted(queued.union(cancelled)))
            touched = {job_id for _, job_id, _ in batch.executions.values()}
            touched |= batch.definitions.keys() | batch.states.keys()
            if touched:
                conn.execute(_LAST_EXECUTION, (text_array(sorted(touched)),))
            if batch.dead:
                self._copy(conn, "stage_dead", DEAD_COLS, [row for _, row in batch.dead.values()])
                conn.execute(_DEAD_UPSERT)
            if batch.replays:
                self._write_replays(conn, batch.replays)
            for _, dag in batch.dags.values():
                conn.execute(_DAG_UPSERT, [dag[c] for c in DAG_COLS])
            if batch.dag_run_events:
                self._write_dag_runs(conn, batch.dag_run_events)
            if batch.offsets:
                self._write_offsets(conn, batch.offsets)

    def _copy(
        self,
        conn: psycopg.Connection[Any],
        table: str,
        cols: Sequence[str],
        records: Iterable[rows.Row],
    ) -> None:
        with conn.cursor() as cur, cur.copy(f"COPY {table} ({_cols(cols)}) FROM STDIN") as copy:
            for record in records:
                copy.write_row([record[c] for c in cols])

    def _write_statuses(
        self, conn: psycopg.Connection[Any], states: list[tuple[int, rows.StateHead]]
    ) -> list[str]:
        """Write the status columns of jobs whose rows hold their state's definition revision
        (or a newer one); return the job ids whose rows do not (no row yet, or an older
        revision): those get a whole row from the whole state. The same outcome as the whole
        row's upsert, whose guards would keep these rows' definition columns."""
        cur = conn.execute(
            _STATUS_UPDATE,
            (
                text_array([h.job_id for _, h in states]),
                int_array([h.definition.revision for _, h in states]),
                text_array([h.status.value for _, h in states]),
                ms_timestamp_array([h.next_run_at_ms for _, h in states]),
                ms_timestamp_array([h.updated_at_ms for _, h in states]),
                int_array([o for o, _ in states]),
            ),
        )
        return [str(job_id) for (job_id,) in cur.fetchall()]

    def _write_executions(self, conn: psycopg.Connection[Any], batch: Batch) -> None:
        missing = [i for i in batch.executions if i not in self.cache]
        existing: dict[str, rows.Execution] = {}
        if missing:
            scheduled = sorted({batch.executions[i][0] for i in missing})
            with conn.cursor(row_factory=class_row(rows.StoredExecution)) as cur:
                cur.execute(
                    f"SELECT {_cols(rows.StoredExecution.COLUMNS)} FROM executions "
                    "WHERE execution_id = ANY(%s::uuid[]) "
                    "AND scheduled_at = ANY(%s::timestamptz[])",
                    (text_array(missing), ms_timestamp_array(scheduled)),
                )
                for row in cur:
                    loaded = rows.execution_from_row(row)
                    existing[loaded.execution_id] = loaded
        merged = []
        for execution_id, (scheduled_ms, job_id, events) in batch.executions.items():
            known = self.cache.pop(execution_id, None) or existing.get(execution_id)
            ex = known or rows.Execution(execution_id, scheduled_ms, job_id)
            for event in events:
                rows.apply(ex, event)
            merged.append(rows.execution_row(ex))
            self.cache[execution_id] = ex
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        self._copy(conn, "stage_executions", EXECUTION_COLS, merged)
        conn.execute(_EXECUTION_UPSERT)

    def _write_replays(self, conn: psycopg.Connection[Any], replays: dict[str, int]) -> None:
        ids = text_array(replays)
        conn.execute(
            "INSERT INTO dlq_replays AS r (execution_id, replayed_at) "
            "SELECT * FROM unnest(%s::uuid[], %s::timestamptz[]) "
            "ON CONFLICT (execution_id) DO UPDATE "
            "SET replayed_at = GREATEST(r.replayed_at, EXCLUDED.replayed_at)",
            (ids, ms_timestamp_array(replays.values())),
        )
        conn.execute(
            "UPDATE dead_letters d SET replayed_at = r.replayed_at FROM dlq_replays r "
            "WHERE d.execution_id = r.execution_id AND r.execution_id = ANY(%s::uuid[]) "
            "AND d.replayed_at IS DISTINCT FROM r.replayed_at",
            (ids,),
        )

    def _write_dag_runs(self, conn: psycopg.Connection[Any], events: list[DagRunEvent]) -> None:
        for delta in rows.fold_dag_runs(events).values():
            conn.execute(
                _DAG_RUN_UPSERT,
                {
                    "id": delta.dag_run_id,
                    "dag_id": delta.dag_id,
                    "status": delta.status,
                    "started_at": rows.dt(delta.first_at_ms),
                    "finished_at": rows.dt(delta.finished_at_ms),
                    "nodes": json.dumps(delta.nodes, sort_keys=True),
                    "replace": delta.replace_nodes,
                    "reopened": delta.reopened,
                },
            )

    def _write_offsets(
        self, conn: psycopg.Connection[Any], offsets: dict[tuple[str, int], int]
    ) -> None:
        keys = sorted(offsets)
        conn.execute(
            "INSERT INTO projector_offsets AS o (consumer, topic, partition, next_offset) "
            "SELECT %s, * FROM unnest(%s::text[], %s::int[], %s::bigint[]) "
            "ON CONFLICT (consumer, topic, partition) DO UPDATE "
            "SET next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset)",
            (
                self.consumer_name,
                text_array([t for t, _ in keys]),
                int_array([p for _, p in keys]),
                int_array([offsets[k] for k in keys]),
            ),
        )

    # --- daily partitions and retention ---------------------------------------------------

    @staticmethod
    def _existing_days(conn: psycopg.Connection[Any]) -> set[date]:
        names = conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'executions'::regclass"
        ).fetchall()
        days = set()
        for (name,) in names:
            m = _PARTITION_RE.match(name)
            if m:
                days.add(datetime.strptime(m.group(1), "%Y%m%d").date())
        return days

    def horizon_day(self, now: datetime | None = None) -> date:
        """The oldest day that is still kept; older executions go to the default partition."""
        now = now or self._now()
        return (now - timedelta(days=self.retention_days)).date()

    def _ensure_days(self, conn: psycopg.Connection[Any], batch: Batch) -> None:
        oldest = self.horizon_day()
        wanted = {
            day
            for s, _, _ in batch.executions.values()
            if (day := datetime.fromtimestamp(s / 1000, tz=UTC).date()) >= oldest
        }
        missing = sorted(wanted - self.days)
        if missing:
            self.ensure_partitions(conn, missing)

    def ensure_partitions(self, conn: psycopg.Connection[Any], days: Sequence[date]) -> int:
        """Create the daily partitions of ``days`` that do not exist yet (inside the caller's
        transaction, so a failed batch does not leave them half made)."""
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PARTITION_LOCK,))
        made = 0
        for day in days:
            row = conn.execute("SELECT duetime_ensure_execution_partitions(%s, 1)", (day,))
            made += (row.fetchone() or (0,))[0]
        self.days.update(days)
        return made

    def housekeeping(self, now: datetime | None = None, ahead_days: int = 2) -> dict[str, int]:
        """Create the next days' partitions, drop those past retention, delete old rows.

        Runs on its own connection (beside the loop); safe to run from several projectors.
        """
        now = now or self._now()
        oldest = self.horizon_day(now)
        horizon = now - timedelta(days=self.retention_days)
        dropped = 0
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            with conn.transaction():
                today = now.date()
                created = self.ensure_partitions(
                    conn, [today + timedelta(days=i) for i in range(ahead_days + 1)]
                )
            for day in sorted(self._existing_days(conn)):
                if day >= oldest:
                    continue
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PARTITION_LOCK,))
                    conn.execute(f"DROP TABLE IF EXISTS executions_{day:%Y%m%d}")
                dropped += 1
                self.days.discard(day)
            # rows whose occurrence is older than the horizon live in the default partition
            # (e.g. a one-time job for 2020 that ran today): keep them until they are as old
            deleted_executions = conn.execute(
                "DELETE FROM executions_default WHERE scheduled_at < %s "
                "AND COALESCE(finished_at, started_at, queued_at, scheduled_at) < %s",
                (horizon, horizon),
            ).rowcount
            deleted_dead_letters = conn.execute(
                "DELETE FROM dead_letters WHERE dead_at < %s", (horizon,)
            ).rowcount
        return {
            "created": created,
            "dropped": dropped,
            "deleted_executions": deleted_executions,
            "deleted_dead_letters": deleted_dead_letters,
        }

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now_ms() / 1000, tz=UTC)

    def dlq_depth(self) -> int:
        """Dead letters not replayed yet (its own short connection: beside the loop)."""
        with psycopg.connect(self.database_url, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT count(*) FROM dead_letters WHERE replayed_at IS NULL"
            ).fetchone()
        return 0 if row is None else int(row[0])

    # --- rebuild and checksums ----------------------------------------------------------

    def truncate(self) -> None:
        """Empty the projection and forget this projector's offsets, in one transaction."""
        conn = self.connect()
        with conn.transaction():
            conn.execute(f"TRUNCATE {', '.join(PROJECTION_TABLES)}")
            conn.execute("DELETE FROM projector_offsets WHERE consumer = %s", (self.consumer_name,))


_CHECKSUM_KEYS = {
    "jobs": "job_id",
    "executions": "execution_id",
    "dead_letters": "execution_id",
    "dlq_replays": "execution_id",
    "dags": "dag_id",
    "dag_runs": "dag_run_id",
}


def checksums(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, str]]:
    """(row count, md5 of every row in key order) of each projected table."""
    out = {}
    for table in PROJECTION_TABLES:
        key = _CHECKSUM_KEYS[table]
        count, digest = conn.execute(
            f"SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t.{key})), '') "
            f"FROM {table} t"
        ).fetchone() or (0, "")
        out[table] = (int(count), str(digest))
    return out
