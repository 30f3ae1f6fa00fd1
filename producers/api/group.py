"""Group commit of single creates: concurrent ``POST /v1/jobs`` share one transaction.

Each create of ``POST /v1/jobs`` (without ``unique``/``debounce``, which lock a key row of
their own and keep the single path) hands its built definition to :class:`CreateGroups` and
awaits its own :class:`Created` or error. The creates that arrive within ``wait_s`` of a
group's first one (at most ``max_jobs``) are written together, as ``POST /v1/jobs:batch``
writes one caller's jobs: their rows inserted in one PostgreSQL transaction (in job-id order,
so two groups never wait on each other's rows in opposite orders), every new definition
published, and the transaction committed only once Kafka acknowledged all of them. One
connection, two round trips and one wait for Kafka's acks serve the whole group instead of
each create: that is the saving (CPU of the API and of PostgreSQL per create, connections
held per create).

Each request keeps its own outcome:

- a job whose id exists with the same body answers 200, with another body 409; neither writes
  anything, and neither touches another job of the group;
- a failure of Kafka (refused, not acknowledged in time) rolls the group's rows back and
  answers 503 to every create that was new in it (each client retries with its job id, the
  idempotency key); the 200/409 answers of the group stand, they wrote nothing;
- any other database error of the group (a value PostgreSQL refuses in one job) makes each of
  its creates run again alone, so only the job at fault gets the error;
- two creates of one job id never share a group: the later one waits for the next.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from duetime.core.errors import Conflict, RetryableError
from duetime.core.models import Status
from duetime.core.records import JobDefinition
from duetime.producers.sdk import JobClient

from . import convert, metrics, store
from .writer import Writer

log = logging.getLogger("duetime.api")


@dataclass(frozen=True, slots=True)
class Created:
    """One create's answer: 201 when ``new``, else 200 (the job exists with this body)."""

    job_id: str
    status: Status
    next_run_at: datetime | None
    new: bool


@dataclass(slots=True)
class _Pending:
    definition: JobDefinition
    trace: str | None
    future: asyncio.Future[Created]
    queued_s: float = field(default_factory=time.perf_counter)


@dataclass
class CreateGroups:
    """The process's group committer (one per API process, on its event loop)."""

    pool: AsyncConnectionPool[Any]
    writer: Writer
    client: JobClient
    max_jobs: int
    """At most this many creates in one group (1: each create alone, grouping off)."""
    wait_s: float
    """How long a group's first create waits for others to join it."""
    _queue: list[_Pending] = field(default_factory=list)
    _timer: asyncio.TimerHandle | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _closed: bool = False

    async def create(self, definition: JobDefinition, trace: str | None) -> Created:
        """Write this job with the next group; its own answer, or its own error."""
        if self._closed:
            raise RetryableError("the API is shutting down: retry")
        loop = asyncio.get_running_loop()
        pending = _Pending(definition, trace, loop.create_future())
        self._queue.append(pending)
        if len(self._queue) >= self.max_jobs:
            self._start()
        elif self._timer is None:
            self._timer = loop.call_later(self.wait_s, self._start)
        try:
            # shielded: a caller that goes away (client disconnect) does not cancel the group's
            # write for everyone else; its own job is written or not like the others
            return await asyncio.shield(pending.future)
        except asyncio.CancelledError:
            pending.future.add_done_callback(_retrieve)  # nobody else will read its outcome
            raise

    def _start(self) -> None:
        """Take the queued creates (one per job id) as a group and write it in a task."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        taken, left = take_group([p.definition.job_id for p in self._queue], self.max_jobs)
        group = [self._queue[i] for i in taken]
        later = [self._queue[i] for i in left]
        self._queue = later
        if later:
            self._timer = asyncio.get_running_loop().call_later(self.wait_s, self._start)
        if group:
            task = asyncio.ensure_future(self._commit(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _commit(self, group: list[_Pending]) -> None:
        metrics.GROUP_SIZE.observe(len(group))
        try:
            outcomes = await self._write(group)
        except psycopg.Error as exc:
            if len(group) > 1 and not isinstance(exc, psycopg.OperationalError):
                # one job's value refused by PostgreSQL: each create again alone, so that
                # only the job at fault gets the error
                log.info("a group of %d creates failed (%s): each again alone", len(group), exc)
                await asyncio.gather(*(self._commit([p]) for p in group))
                return
            outcomes = [exc] * len(group)
        except Exception as exc:  # every caller must get an answer, whatever went wrong
            outcomes = [exc] * len(group)
        for pending, outcome in zip(group, outcomes, strict=True):
            if pending.future.done():
                continue
            if isinstance(outcome, BaseException):
                pending.future.set_exception(outcome)
            else:
                pending.future.set_result(outcome)

    async def _write(self, group: Sequence[_Pending]) -> list[Created | Exception]:
        ordered = sorted(range(len(group)), key=lambda i: group[i].definition.job_id)
        definitions = [group[i].definition for i in ordered]
        outcomes: dict[int, Created | Exception] = {}
        fresh: list[int] = []
        # pipeline mode: BEGIN travels with the INSERTs and COMMIT is one round trip, so a
        # group costs PostgreSQL two round trips (each a wake-up of both processes)
        stage = _Stages(group[0].queued_s)  # the oldest create of the group
        stage.done("queued")  # until its group started
        async with self.pool.connection() as conn, conn.pipeline():
            try:
                async with conn.transaction():
                    stage.done("insert")  # a connection, BEGIN and the INSERTs
                    inserted = await store.insert_new_jobs(conn, definitions)
                    for index, new in zip(ordered, inserted, strict=True):
                        if new is None:
                            outcomes[index] = await existing(conn, group[index].definition)
                            continue
                        fresh.append(index)
                        job_id = group[index].definition.job_id
                        outcomes[index] = Created(job_id, new.status, new.next_run_at, new=True)
                    stage.done("insert")
                    await self.writer.publish_all([self._publisher(group[i]) for i in fresh])
                    stage.done("kafka")
                stage.done("commit")
            except RetryableError as exc:  # Kafka: the rows rolled back, the new ones retry
                for index in fresh:
                    outcomes[index] = exc
        return [outcomes[i] for i in range(len(group))]

    def _publisher(self, pending: _Pending) -> Any:
        def publish(done: Any) -> None:
            self.client.publish_definition(
                pending.definition, wait=False, on_delivery=done, traceparent=pending.trace
            )

        return publish

    async def close(self, timeout_s: float) -> None:
        """Write what is queued and wait (at most ``timeout_s``) for the groups in flight."""
        self._closed = True
        if self._queue:
            self._start()
        while self._timer is not None:  # creates over the bound: one more group each
            self._start()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)


class _Stages:
    """Times the stages of one group into ``GROUP_STAGE_SECONDS``: where a create's latency
    goes (queued until its group starts; then the wait for a connection and the INSERTs, for
    Kafka's acks, for COMMIT)."""

    __slots__ = ("_last", "_spent")

    def __init__(self, since_s: float) -> None:
        self._last = since_s
        self._spent: dict[str, float] = {}

    def done(self, stage: str) -> None:
        now = time.perf_counter()
        self._spent[stage] = self._spent.get(stage, 0.0) + now - self._last
        self._last = now
        if stage == "commit":  # the last stage: a failed group is not timed
            for name, seconds in self._spent.items():
                metrics.GROUP_STAGE_SECONDS.labels(name).observe(seconds)


def take_group(job_ids: Sequence[str], max_jobs: int) -> tuple[list[int], list[int]]:
    """(indexes of the next group, indexes left for later) of creates queued with these job
    ids, in arrival order: at most ``max_jobs``, and one create per job id (a second create of
    an id in the same transaction would find the first one's row, not yet committed, and
    answer 200 for a job that a failed publish may still roll back). Pure."""
    taken: list[int] = []
    left: list[int] = []
    ids: set[str] = set()
    for index, job_id in enumerate(job_ids):
        if job_id in ids or len(taken) >= max_jobs:
            left.append(index)
        else:
            ids.add(job_id)
            taken.append(index)
    return taken, left


def _retrieve(future: asyncio.Future[Created]) -> None:
    if not future.cancelled():
        future.exception()


async def existing(conn: AsyncConnection[Any], definition: JobDefinition) -> Created | Exception:
    """The answer to a create whose job id exists: 200 with the same body, 409 with another
    (as the single path answers; nothing is written either way)."""
    row = await store.get_job(conn, definition.job_id)
    if row is None:  # its creator's transaction rolled back meanwhile: the client retries
        return Conflict(
            f"job {definition.job_id} is being created by another request: retry",
            details={"job_id": definition.job_id},
        )
    if convert.job_spec(row) != convert.definition_spec(definition):
        return Conflict(
            f"job {definition.job_id} exists with a different definition",
            details={"job_id": definition.job_id},
        )
    return Created(definition.job_id, row.status, row.next_run_at, new=False)
