"""Execution leases in PostgreSQL: at most one live attempt per execution, fenced by a token.

A lease is one row of ``leases`` per execution_id (the primary key: a UNIQUE constraint, no
advisory locks). Every claim takes a new ``fencing_token`` from one sequence, so tokens grow
with every claim of an execution and a stale holder is recognisable wherever it writes:

- **claim** (one round trip for a whole batch): insert the row, or take it over when the held
  lease has expired (same attempt) or belongs to an older attempt. Anything else is a
  conflict, reported with what holds the row: ``busy`` (held, not expired: wait and try again
  when it expires), ``done`` (this attempt already finished: do not run it again; republish
  its recorded result) or ``stale`` (a newer attempt exists: drop the request).
- **renew**: push ``expires_at`` out for the leases whose token is still current. A lease
  missing from the answer was taken over: its holder has *lost* it. An expired lease that
  nobody took over is renewed: only a new claim, not the clock, fences a holder out.
- **complete**: mark the lease ``done`` with its outcome and the encoded result, only where
  the token still matches (``WHERE fencing_token = …``). A worker publishes a result only
  after this succeeded, so a zombie's result never reaches the scheduler.
- **release**: a worker handing work back (shutdown) expires its leases at once, so the next
  owner need not wait for the TTL.
- **limits** (migration 0009, issue 18): an execution whose job has a concurrency or a rate
  limit is claimed by ``duetime_claim_limited`` instead, in one transaction per batch: the
  slot of its concurrency key (its live leases) and a token of its rate key's bucket are
  taken in the same transaction as the lease, or the answer is ``limited`` (``waiting``:
  ``concurrency`` or ``rate``) and nothing is written. Executions without limits never run
  that function: their claim is the statement above, unchanged.
- **cancel** (migration 0005): a claim records the execution's ``job_id`` and ``dag_run_id``;
  ``cancel.request_cancel`` sets ``cancel_requested_at`` on the held rows of a job (or DAG
  run). Every renewal answers which of the renewed leases carry the flag (the holder stops
  that work), and a claim that takes over a flagged row says so (it reports ``cancelled``
  without running). The flag survives takeovers: a cancelled execution stays cancelled.

Durability: claims and completions wait for the WAL flush: a published result must match a
durable ``done``, and a claim draws a fencing token from the sequence, whose values could be
handed out again after a crash if the claim's commit had not reached the disk (two holders
with one token would defeat the fencing). Renewals and releases run with
``synchronous_commit=off``: one PostgreSQL forgets after a crash only makes a lease expire
sooner (its holder is then fenced out) or later (its next owner waits for the TTL).

PostgreSQL being down is not fatal: every call retries with capped backoff (each waiting
caller stays blocked, nothing runs unleased) until it answers or the worker stops. Every
time is the database's ``now()``, so workers' clocks do not matter.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from duetime.core.backoff import Backoff, log_retry, retry_transient_async
from duetime.core.cancel import CANCEL_OWNER
from duetime.core.pgarrays import bytea_array, int_array, text_array

from . import metrics

log = logging.getLogger("duetime.worker.leases")

I = TypeVar("I")  # noqa: E741 - the item type of a batch
O = TypeVar("O")  # noqa: E741 - the answer type of a batch

_CLAIM = """
INSERT INTO leases AS l
    (execution_id, attempt, owner, fencing_token, expires_at, state, claimed_at, updated_at,
     job_id, dag_run_id)
SELECT t.e, t.a, %(owner)s, nextval('lease_fencing_tokens'),
       now() + make_interval(secs => %(ttl_s)s), 'held', now(), now(), t.j, t.d
FROM unnest(%(ids)s::uuid[], %(attempts)s::int[], %(jobs)s::text[], %(runs)s::text[])
     AS t(e, a, j, d)
ORDER BY t.e
ON CONFLICT (execution_id) DO UPDATE
SET attempt = excluded.attempt, owner = excluded.owner, fencing_token = excluded.fencing_token,
    expires_at = excluded.expires_at, state = 'held', outcome = NULL, result = NULL,
    claimed_at = now(), updated_at = now(), job_id = excluded.job_id,
    dag_run_id = excluded.dag_run_id
WHERE l.attempt < excluded.attempt
   OR (l.attempt = excluded.attempt AND l.state = 'held' AND l.expires_at < now())
-- cancel_requested_at is kept on a takeover: a cancelled execution stays cancelled
RETURNING execution_id::text, fencing_token, cancel_requested_at IS NOT NULL
"""

_CLAIM_LIMITED = """
SELECT execution_id, token, cancelled, waiting, retry_in_s FROM duetime_claim_limited(
    %(owner)s, %(ttl_s)s, %(ids)s::uuid[], %(attempts)s::int[], %(jobs)s::text[],
    %(runs)s::text[], %(ckeys)s::text[], %(climits)s::int[], %(rkeys)s::text[],
    %(rates)s::float8[], %(bursts)s::int[])
"""

_PURGE_BUCKETS = """
DELETE FROM rate_buckets WHERE key = ANY(ARRAY(
    SELECT key FROM rate_buckets WHERE full_at < now() LIMIT %(limit)s))
"""

_INSPECT = """
SELECT execution_id::text, attempt, state, owner,
       greatest(0, extract(epoch FROM expires_at - now()))::float8, result
FROM leases WHERE execution_id = ANY(%(ids)s::uuid[])
"""

_RENEW = """
UPDATE leases AS l SET expires_at = now() + make_interval(secs => %(ttl_s)s), updated_at = now()
FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS t(e, tok)
WHERE l.execution_id = t.e AND l.fencing_token = t.tok AND l.state = 'held'
RETURNING l.execution_id::text, l.cancel_requested_at IS NOT NULL
"""

_COMPLETE = """
UPDATE leases AS l
SET state = 'done', outcome = t.o, result = t.r, expires_at = now(), updated_at = now()
FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[], %(outcomes)s::text[], %(results)s::bytea[])
     AS t(e, tok, o, r)
-- no state check: a token belongs to one claim, so a 'done' row with our token is our own
-- completion, committed by an earlier try whose answer was lost (completing is idempotent)
WHERE l.execution_id = t.e AND l.fencing_token = t.tok
RETURNING l.execution_id::text
"""

_RELEASE = """
UPDATE leases AS l SET expires_at = now(), updated_at = now()
FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS t(e, tok)
WHERE l.execution_id = t.e AND l.fencing_token = t.tok AND l.state = 'held'
"""

_PURGE = """
DELETE FROM leases WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM leases
    WHERE state = 'done' AND updated_at < now() - make_interval(secs => %(age_s)s)
    LIMIT %(limit)s))
"""

_PURGE_UNCLAIMED_CANCELS = """
DELETE FROM leases WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM leases
    WHERE state = 'held' AND expires_at < now() - make_interval(secs => %(age_s)s)
      AND owner = %(owner)s
    LIMIT %(limit)s))
"""
"""A cancel's flag for a run nobody claimed (``duetime.core.cancel.flag_queued_of_cancelled``)
goes with the finished leases: by then its request has left the execution topics."""


LIMITED = "limited"
"""The conflict of a claim refused by a limit (see :class:`Claim`'s ``waiting``)."""

BUSY_RECHECK_S = 1.0
"""A lease held by another worker is claimed again at most this long after a ``busy``
answer (a conflict costs one small statement; it only happens after a rebalance)."""


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer to one claim: a token, or why not."""

    token: int | None = None
    conflict: str | None = None
    """None (claimed), ``busy``, ``done`` or ``stale``."""
    retry_in_s: float = 0.0
    """``busy``: when the holder's lease expires."""
    result: bytes | None = None
    """``done``: the result its holder recorded (None if it recorded none)."""
    owner: str | None = None
    cancelled: bool = False
    """Claimed, but a cancel was already requested for this execution: do not run it."""
    waiting: str | None = None
    """``limited``: which limit refused the claim, ``concurrency`` or ``rate``."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The resolved limits of one execution (``duetime.core.keys`` resolved the keys)."""

    concurrency_key: str | None = None
    concurrency_limit: int = 0
    rate_key: str | None = None
    per_s: float = 0.0
    burst: int = 0


@dataclass(frozen=True, slots=True)
class Renewal:
    """The answer to one renewal: which leases were taken over and which were cancelled."""

    lost: frozenset[str] = frozenset()
    cancelled: frozenset[str] = frozenset()
    """Still ours, but a cancel was requested (``cancel.request_cancel``): stop the work."""


class DatabaseUnavailable(Exception):
    """The worker stopped while PostgreSQL was not answering."""


def _transient(exc: BaseException) -> bool:
    return isinstance(
        exc,
        psycopg.OperationalError
        | psycopg.errors.SerializationFailure
        | psycopg.errors.DeadlockDetected,
    )


class _Batcher(Generic[I, O]):
    """Gathers concurrent calls into one database round trip.

    Callers ``await submit(item)``; one task takes everything queued so far (up to
    ``max_batch``) and runs ``flush`` on it while the next batch builds up. Under load a batch
    is whatever arrived during the previous round trip, so the cost per item falls as the load
    rises, and a lone call waits for nobody, unless ``gather_s``: then the oldest queued call
    waits up to that long from its arrival for others to share its round trip (for calls
    nothing waits on, such as completions, which arrive one at a time at a steady rate).
    """

    def __init__(
        self,
        name: str,
        flush: Callable[[list[I]], Awaitable[list[O]]],
        max_batch: int,
        stopping: Callable[[], bool],
        gather_s: float = 0.0,
    ) -> None:
        self.name = name
        self._flush = flush
        self._max_batch = max_batch
        self._stopping = stopping
        self._gather_s = gather_s
        self._queue: list[tuple[I, asyncio.Future[O]]] = []
        self._first_at = 0.0
        """When the oldest call of the queue arrived (monotonic; 0: it gathers no more)."""
        self._ready = asyncio.Event()

    async def submit(self, item: I) -> O:
        future: asyncio.Future[O] = asyncio.get_running_loop().create_future()
        if not self._queue:
            self._first_at = time.monotonic()
        self._queue.append((item, future))
        self._ready.set()
        return await future

    async def _gather(self) -> None:
        """Let the queue fill for up to ``gather_s`` after its oldest call's arrival."""
        if self._gather_s <= 0 or self._first_at <= 0 or self._stopping():
            return
        wait_s = self._first_at + self._gather_s - time.monotonic()
        if wait_s > 0 and len(self._queue) < self._max_batch:
            await asyncio.sleep(wait_s)

    async def run(self) -> None:
        backoff = Backoff()
        while True:
            await self._ready.wait()
            await self._gather()
            batch = [(i, f) for i, f in self._queue[: self._max_batch] if not f.done()]
            del self._queue[: self._max_batch]
            self._first_at = 0.0  # the rest (beyond max_batch) goes next, without a wait
            if not self._queue:
                self._ready.clear()
            if not batch:
                continue
            started = time.perf_counter()
            try:
                answers = await self._flush([item for item, _ in batch])
            except Exception as exc:
                if not _transient(exc) and len(batch) > 1 and not self._stopping():
                    # one item PostgreSQL refuses must not fail its neighbours: one by one
                    await self._isolate(batch)
                    continue
                if not _transient(exc) or self._stopping():
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(
                                exc if not _transient(exc) else DatabaseUnavailable(str(exc))
                            )
                    if not _transient(exc):
                        log.error("lease %s failed", self.name, exc_info=exc)
                    continue
                metrics.DB_ERRORS.labels(op=self.name).inc()
                wait_s = backoff.next()
                log_retry(log, "PostgreSQL", f"lease {self.name}", exc, wait_s)
                self._queue[:0] = batch  # retry the same batch first
                self._ready.set()
                await asyncio.sleep(wait_s)
                continue
            backoff.reset()
            metrics.LEASE_BATCH_SECONDS.labels(op=self.name).observe(time.perf_counter() - started)
            metrics.LEASE_BATCH_SIZE.labels(op=self.name).observe(len(batch))
            for (_, future), answer in zip(batch, answers, strict=True):
                if not future.done():
                    future.set_result(answer)

    async def _isolate(self, batch: list[tuple[I, asyncio.Future[O]]]) -> None:
        """Run a refused batch's items alone: each gets its own answer or error. A transient
        error on the way puts the rest back in the queue, to be retried as usual."""
        for index, (item, future) in enumerate(batch):
            try:
                [answer] = await self._flush([item])
            except Exception as exc:
                if _transient(exc):
                    self._queue[:0] = batch[index:]
                    self._ready.set()
                    return
                log.error("lease %s refused one item", self.name, exc_info=exc)
                if not future.done():
                    future.set_exception(exc)
                continue
            if not future.done():
                future.set_result(answer)

    def fail_all(self, exc: BaseException) -> None:
        for _, future in self._queue:
            if not future.done():
                future.set_exception(exc)
        self._queue.clear()


_ClaimItem = tuple[str, int, str | None, str | None]
"""(execution_id, attempt, job_id, dag_run_id)"""
_LimitedItem = tuple[str, int, str | None, str | None, Limits]


@dataclass(frozen=True, slots=True)
class _Completion:
    execution_id: str
    token: int
    outcome: str
    result: bytes


class LeaseStore:
    """The worker's side of ``leases``: batched claim, renew, complete and release."""

    def __init__(
        self,
        database_url: str,
        owner: str,
        ttl_s: float,
        pool_size: int = 4,
        max_batch: int = 500,
        complete_gather_s: float = 0.0,
    ) -> None:
        self.owner = owner
        self.ttl_s = ttl_s
        self._stopping = False
        name = f"duetime-worker {owner}"[:63]
        self._pool = AsyncConnectionPool(
            database_url,
            min_size=1,
            max_size=max(1, pool_size - pool_size // 2),
            open=False,
            # autocommit: every statement is its own short transaction (no idle-in-transaction)
            kwargs={"autocommit": True, "application_name": name},
            # a short wait for a connection: the batcher's backoff handles an outage
            timeout=5.0,
            name="duetime-leases",
        )
        # renewals and releases do not wait for the WAL flush (see the module doc)
        self._fast_pool = AsyncConnectionPool(
            database_url,
            min_size=1,
            max_size=max(1, pool_size // 2),
            open=False,
            kwargs={
                "autocommit": True,
                "application_name": name,
                "options": "-c synchronous_commit=off",
            },
            timeout=5.0,
            name="duetime-leases-fast",
        )
        self._claims: _Batcher[_ClaimItem, Claim] = _Batcher(
            "claim", self._claim_batch, max_batch, self.stopping
        )
        self._limited_claims: _Batcher[_LimitedItem, Claim] = _Batcher(
            "claim_limited", self._claim_limited_batch, max_batch, self.stopping
        )
        # a completion waits up to complete_gather_s for others: results are published after
        # it, and nothing waits on a result's first tens of milliseconds (WorkerSettings)
        self._completions = _Batcher(
            "complete", self._complete_batch, max_batch, self.stopping, complete_gather_s
        )
        self._tasks: list[asyncio.Task[None]] = []

    def stopping(self) -> bool:
        return self._stopping

    async def open(self) -> None:
        # wait=False: a worker may start while PostgreSQL is still coming up; calls retry
        await self._pool.open(wait=False)
        await self._fast_pool.open(wait=False)
        self._tasks = [
            asyncio.create_task(self._claims.run(), name="lease-claims"),
            asyncio.create_task(self._limited_claims.run(), name="lease-limited-claims"),
            asyncio.create_task(self._completions.run(), name="lease-completions"),
        ]

    async def close(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._claims.fail_all(DatabaseUnavailable("worker stopped"))
        self._limited_claims.fail_all(DatabaseUnavailable("worker stopped"))
        self._completions.fail_all(DatabaseUnavailable("worker stopped"))
        await self._pool.close()
        await self._fast_pool.close()

    # --- the public calls -----------------------------------------------------------------

    async def claim(
        self,
        execution_id: str,
        attempt: int,
        job_id: str | None = None,
        dag_run_id: str | None = None,
        limits: Limits | None = None,
    ) -> Claim:
        """Claim the lease; ``job_id`` and ``dag_run_id`` let a cancel find it later.

        With ``limits``, the lease is claimed only with a slot of its concurrency key and a
        token of its rate key, or the answer is a ``limited`` conflict saying which."""
        if limits is None:
            return await self._claims.submit((execution_id, attempt, job_id, dag_run_id))
        return await self._limited_claims.submit(
            (execution_id, attempt, job_id, dag_run_id, limits)
        )

    async def complete(self, execution_id: str, token: int, outcome: str, result: bytes) -> bool:
        """True when the lease was still ours and is now done; False: it was taken over."""
        return await self._completions.submit(_Completion(execution_id, token, outcome, result))

    async def renew(self, held: Sequence[tuple[str, int]]) -> set[str]:
        """Renew these leases; returns the execution_ids whose lease was taken over (lost)."""
        return set((await self.renew_checked(held)).lost)

    async def renew_checked(self, held: Sequence[tuple[str, int]]) -> Renewal:
        """Renew these leases; say which were taken over and which were asked to cancel.

        The cancel flag rides on the renewal (one statement either way), so a cancel reaches
        the holder within one renewal interval (``WorkerSettings.renew_interval_s``)."""
        if not held:
            return Renewal()
        rows = await self._execute(
            _RENEW,
            {
                "ttl_s": self.ttl_s,
                "ids": text_array([e for e, _ in held]),
                "tokens": int_array([t for _, t in held]),
            },
            "renew",
            fast=True,
        )
        renewed = {row[0] for row in rows}
        return Renewal(
            lost=frozenset(e for e, _ in held if e not in renewed),
            cancelled=frozenset(row[0] for row in rows if row[1]),
        )

    async def release(self, held: Sequence[tuple[str, int]]) -> None:
        """Expire these leases now (shutdown hands the work back to the next owner)."""
        if held:
            await self._execute(
                _RELEASE,
                {
                    "ids": text_array([e for e, _ in held]),
                    "tokens": int_array([t for _, t in held]),
                },
                "release",
                fetch=False,
                retries=2,
                fast=True,
            )

    async def purge(self, age_s: float, limit: int = 5000) -> int:
        """Delete up to ``limit`` leases finished more than ``age_s`` ago."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(_PURGE, {"age_s": age_s, "limit": limit})
            unclaimed = await conn.execute(
                _PURGE_UNCLAIMED_CANCELS, {"age_s": age_s, "limit": limit, "owner": CANCEL_OWNER}
            )
            # full buckets: a missing bucket counts as full, so this changes no answer
            await conn.execute(_PURGE_BUCKETS, {"limit": limit})
            return cur.rowcount + max(0, unclaimed.rowcount)

    # --- batches --------------------------------------------------------------------------

    async def _claim_batch(self, items: list[_ClaimItem]) -> list[Claim]:
        # one statement cannot touch a row twice: a duplicate waits for the next batch
        firsts = _firsts(items)
        params = {
            "owner": self.owner,
            "ttl_s": self.ttl_s,
            "ids": text_array(firsts),
            "attempts": int_array([item[1] for item in firsts.values()]),
            "jobs": text_array([item[2] for item in firsts.values()]),
            "runs": text_array([item[3] for item in firsts.values()]),
        }
        claimed, held = await self._claim_rows(_CLAIM, params, list(firsts))
        return self._answers(
            [(i[0], i[1]) for i in items],
            claimed,
            held,
            lambda row: Claim(token=row[1], cancelled=bool(row[2])),
        )

    async def _claim_limited_batch(self, items: list[_LimitedItem]) -> list[Claim]:
        # one execution once per transaction: a duplicate waits for the next batch
        chosen = list(_firsts(items).values())
        params = {
            "owner": self.owner,
            "ttl_s": self.ttl_s,
            "ids": text_array([i[0] for i in chosen]),
            "attempts": int_array([i[1] for i in chosen]),
            "jobs": text_array([i[2] for i in chosen]),
            "runs": text_array([i[3] for i in chosen]),
            "ckeys": text_array([i[4].concurrency_key for i in chosen]),
            "climits": int_array([i[4].concurrency_limit for i in chosen]),
            "rkeys": text_array([i[4].rate_key for i in chosen]),
            "rates": [i[4].per_s for i in chosen],
            "bursts": [i[4].burst for i in chosen],
        }
        answered, held = await self._claim_rows(_CLAIM_LIMITED, params, [i[0] for i in chosen])
        return self._answers([(i[0], i[1]) for i in items], answered, held, _limited_claim)

    async def _claim_rows(
        self, sql: str, params: dict[str, Any], ids: list[str]
    ) -> tuple[dict[str, tuple[Any, ...]], dict[str, tuple[Any, ...]]]:
        """Run a claim statement; (its rows by execution_id, the inspected rows of the ids it
        did not answer for), on one connection."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql, params)
            answered = {row[0]: row for row in await cur.fetchall()}
            missing = [e for e in ids if e not in answered]
            held: dict[str, tuple[Any, ...]] = {}
            if missing:
                cur = await conn.execute(_INSPECT, {"ids": text_array(missing)})
                held = {row[0]: row for row in await cur.fetchall()}
        return answered, held

    def _answers(
        self,
        asked: list[tuple[str, int]],
        answered: dict[str, tuple[Any, ...]],
        held: dict[str, tuple[Any, ...]],
        claim_of: Callable[[tuple[Any, ...]], Claim],
    ) -> list[Claim]:
        """One answer per (execution_id, attempt) asked, in order: the statement's row for
        the first of an execution, the inspected conflict for the rest."""
        answers: list[Claim] = []
        used: set[str] = set()
        for execution_id, attempt in asked:
            row = answered.get(execution_id)
            if row is None or execution_id in used:
                answers.append(_conflict(held.get(execution_id), attempt, self.ttl_s))
                continue
            used.add(execution_id)
            answers.append(claim_of(row))
        return answers

    async def _complete_batch(self, items: list[_Completion]) -> list[bool]:
        answers = [False] * len(items)
        # one statement cannot touch a row twice: duplicates go into the next chunk
        for chunk in _unique_chunks(list(enumerate(items))):
            rows = await self._execute(
                _COMPLETE,
                {
                    "ids": text_array([c.execution_id for _, c in chunk]),
                    "tokens": int_array([c.token for _, c in chunk]),
                    "outcomes": text_array([c.outcome for _, c in chunk]),
                    "results": bytea_array([c.result for _, c in chunk]),
                },
                "complete",
                retries=0,
            )
            completed = {row[0] for row in rows}
            for index, c in chunk:
                answers[index] = c.execution_id in completed
        return answers

    async def _execute(
        self,
        sql: str,
        params: dict[str, Any],
        op: str,
        *,
        fetch: bool = True,
        retries: int | None = None,
        fast: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Run one statement; retry transient errors (``retries=None``: until stopping)."""
        pool = self._fast_pool if fast else self._pool
        failures = itertools.count(1)

        async def once() -> list[tuple[Any, ...]]:
            started = time.perf_counter()
            async with pool.connection() as conn:
                cur = await conn.execute(sql, params)
                rows = await cur.fetchall() if fetch else []
            metrics.LEASE_BATCH_SECONDS.labels(op=op).observe(time.perf_counter() - started)
            return rows

        def worth_retrying(exc: BaseException) -> bool:
            return _transient(exc) and (retries is None or next(failures) <= retries)

        return await retry_transient_async(
            once,
            transient=worth_retrying,
            dependency="PostgreSQL",
            what=f"lease {op}",
            logger=log,
            stopping=self.stopping,
            on_retry=lambda exc: metrics.DB_ERRORS.labels(op=op).inc(),
        )


K = TypeVar("K", bound=tuple[Any, ...])


def _firsts(items: list[K]) -> dict[str, K]:
    """The first item of each execution_id (``item[0]``), in order."""
    firsts: dict[str, K] = {}
    for item in items:
        firsts.setdefault(item[0], item)
    return firsts


def _limited_claim(row: tuple[Any, ...]) -> Claim:
    """A row of ``duetime_claim_limited``: a token, or the limit that refused the claim."""
    _, token, cancelled_flag, waiting, retry_in_s = row
    if token is None:
        return Claim(conflict=LIMITED, waiting=waiting, retry_in_s=float(retry_in_s or 0))
    return Claim(token=token, cancelled=bool(cancelled_flag))


def _conflict(row: tuple[Any, ...] | None, attempt: int, ttl_s: float) -> Claim:
    if row is None:  # the row vanished between the two statements (purged): claim again
        return Claim(conflict="busy", retry_in_s=0.05)
    _, held_attempt, state, owner, remaining_s, result = row
    if held_attempt > attempt:
        return Claim(conflict="stale", owner=owner)
    if state == "done" and held_attempt == attempt:
        return Claim(conflict="done", result=None if result is None else bytes(result), owner=owner)
    # held by another worker and not expired yet: try again just after it expires, or
    # sooner: a holder that hands its work back (shutdown, or the partition moved while the
    # work ran) expires the lease at once, and the next owner should not sit out the TTL
    wait_s = min(ttl_s, float(remaining_s), BUSY_RECHECK_S)
    return Claim(conflict="busy", retry_in_s=wait_s + 0.05, owner=owner)


def _unique_chunks(items: list[tuple[int, _Completion]]) -> list[list[tuple[int, _Completion]]]:
    chunks: list[list[tuple[int, _Completion]]] = []
    seen: list[set[str]] = []
    for item in items:
        execution_id = item[1].execution_id
        for chunk, ids in zip(chunks, seen, strict=True):
            if execution_id not in ids:
                chunk.append(item)
                ids.add(execution_id)
                break
        else:
            chunks.append([item])
            seen.append({execution_id})
    return chunks
