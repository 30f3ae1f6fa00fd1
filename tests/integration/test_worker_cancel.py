"""Cancelling a running execution (issue 14, item 3), against the real broker and database.

The cancel reaches the worker through the lease row (``duetime.core.cancel``), read on
every renewal; the worker runs with the default lease TTL (10 s, so a renewal every 2 s) and
must stop the work within 5 s of the cancel: an HTTP call is aborted (the sink sees the
connection close), a coroutine task is cancelled, a sync task sees ``ctx.cancelled``. The
attempt ends ``failure`` with reason ``cancelled``, not retryable, and is not run again.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

from bench.dag_harness import ResolverProcess
from duetime.consumers.worker.leases import LeaseStore
from duetime.core.cancel import (
    CANCEL_OWNER,
    flag_cancelled_jobs,
    request_cancel,
    request_cancel_dag_run,
)
from duetime.core.config import CommonSettings
from duetime.producers.sdk import JobClient
from tests.helpers import RunningScheduler, TopicReader, wait_for
from tests.integration import test_worker_support as support
from tests.integration.test_dag import resolver as resolver  # the fixture, re-exported
from tests.integration.test_dag_support import job, wait_completed, wait_known
from tests.integration.test_worker import NOW, final, start_worker
from tests.integration.test_worker_support import HoldingSink, RunningWorker

MOD = "tests.integration.test_worker_support"
STOP_WITHIN_S = 5.0
"""The issue's bound: from the cancel to the work stopped."""
RETRY = {"max_retries": 3, "base_delay_s": 0.2, "jitter": False}
"""Retries the policy would allow at once: a cancel must not use them."""


@pytest.fixture
def worker(settings: CommonSettings) -> Iterator[RunningWorker]:
    support.reset()
    running = start_worker(settings, lease_ttl_s=10.0)  # the default TTL: renewals every 2 s
    assert running.worker.settings.renew_interval_s == 2.0
    yield running
    running.stop()


@pytest.fixture
def holding_sink() -> Iterator[HoldingSink]:
    sink = HoldingSink().start()
    yield sink
    sink.stop()


def flag(settings: CommonSettings, job_id: str) -> tuple[float, int]:
    """What the API does after publishing the cancel: flag the job's live leases.
    Returns (when, how many leases were flagged)."""

    async def run() -> int:
        async with await psycopg.AsyncConnection.connect(
            settings.database_url, autocommit=True
        ) as conn:
            return await request_cancel(conn, job_id)

    at = time.time()
    return at, asyncio.run(run())


def cancelled_total(stage: str) -> float:
    return REGISTRY.get_sample_value("duetime_worker_cancelled_total", {"stage": stage}) or 0.0


def assert_cancelled(result: dict[str, Any], cancelled_at: float) -> None:
    assert result["status"] == "failure", result
    assert result["error"]["reason"] == "cancelled" and result["error"]["retryable"] is False
    assert result["finished_at_ms"] / 1000 - cancelled_at < STOP_WITHIN_S, result


def test_a_running_http_call_is_aborted_within_5_s_of_the_cancel(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    holding_sink: HoldingSink,
    results: TopicReader,
) -> None:
    before = cancelled_total("running")
    job = client.create_job(
        name="slow-http",
        schedule=NOW,
        target={"type": "http", "url": holding_sink.url},
        timeout_s=120,
        retry=RETRY,
    )
    wait_for(lambda: holding_sink.arrived, 30, "the HTTP call to reach the sink")
    [key] = holding_sink.arrived
    client.cancel(job.job_id)  # the API's order: the control command first, then the flag
    cancelled_at, flagged = flag(settings, job.job_id)
    assert flagged == 1

    aborted_at = wait_for(lambda: holding_sink.aborted.get(key, 0.0), 15, "the call to abort")
    assert aborted_at - cancelled_at < STOP_WITHIN_S
    [result] = final(results, job.job_id)
    assert result["execution_id"] == key
    assert_cancelled(result, cancelled_at)
    assert cancelled_total("running") == before + 1
    # the subject: no retry follows (the policy's 0.2 s delay has passed 5 times over)
    time.sleep(1.0)
    assert len(final(results, job.job_id)) == 1 and len(holding_sink.arrived) == 1


def test_a_sync_task_sees_ctx_cancelled_and_the_attempt_is_not_retried(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    results: TopicReader,
    dlq: TopicReader,
) -> None:
    # only the lease flag, no control command: the result's 'not retryable' alone must stop
    # the retries (the scheduler dead-letters the attempt instead of running it again)
    job = client.create_job(
        name="sync-cancel",
        schedule=NOW,
        target={"type": "python", "ref": f"{MOD}:waits_for_cancel"},
        payload={"for_s": 60},
        timeout_s=120,
        retry=RETRY,
    )
    wait_for(lambda: job.job_id in support.CANCEL_STARTED, 30, "the sync task to start")
    cancelled_at, flagged = flag(settings, job.job_id)
    assert flagged == 1
    seen_at = wait_for(lambda: support.CANCEL_SEEN.get(job.job_id, 0.0), 15, "ctx.cancelled")
    assert seen_at - cancelled_at < STOP_WITHIN_S
    [result] = final(results, job.job_id)
    assert_cancelled(result, cancelled_at)
    assert result["attempt"] == 1
    wait_for(lambda: [d for d in dlq.snapshot() if d["job_id"] == job.job_id], 15, "dead letter")
    time.sleep(1.0)  # the subject: no retry follows within 1 s (5 retry delays)
    assert len(final(results, job.job_id)) == 1


def test_an_async_task_is_cancelled_within_5_s(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    results: TopicReader,
) -> None:
    job = client.create_job(
        name="async-cancel",
        schedule=NOW,
        target={"type": "python", "ref": f"{MOD}:awaits_cancel"},
        payload={"for_s": 60},
        timeout_s=120,
        retry=RETRY,
    )
    wait_for(lambda: job.job_id in support.CANCEL_STARTED, 30, "the async task to start")
    client.cancel(job.job_id)
    cancelled_at, flagged = flag(settings, job.job_id)
    assert flagged == 1
    seen_at = wait_for(lambda: support.CANCEL_SEEN.get(job.job_id, 0.0), 15, "the task's cancel")
    assert seen_at - cancelled_at < STOP_WITHIN_S
    [result] = final(results, job.job_id)
    assert_cancelled(result, cancelled_at)
    time.sleep(1.0)  # the subject: no retry follows within 1 s
    assert len(final(results, job.job_id)) == 1


def test_cancelling_a_dag_run_stops_its_running_node_and_skips_the_rest(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    resolver: ResolverProcess,
    worker: RunningWorker,
    client: JobClient,
    results: TopicReader,
    dag_runs: TopicReader,
) -> None:
    target = {"type": "python", "ref": f"{MOD}:awaits_cancel"}
    dag = client.create_dag(
        "cancel-run",
        [job("a", target=target, payload={"for_s": 60}, timeout_s=120), job("b", "a")],
    )
    wait_known(settings, dag)
    run_id = client.trigger_dag(dag.dag_id)
    a_job = wait_for(lambda: next(iter(support.CANCEL_STARTED), ""), 30, "node a to start")

    async def cancel_run() -> int:
        async with await psycopg.AsyncConnection.connect(
            settings.database_url, autocommit=True
        ) as conn:
            return await request_cancel_dag_run(conn, run_id)

    cancelled_at = time.time()
    assert asyncio.run(cancel_run()) == 1
    seen_at = wait_for(lambda: support.CANCEL_SEEN.get(a_job, 0.0), 15, "node a's cancel")
    assert seen_at - cancelled_at < STOP_WITHIN_S
    [result] = final(results, a_job)
    assert result["dag_run_id"] == run_id
    assert_cancelled(result, cancelled_at)
    done = wait_completed(dag_runs, run_id, resolver=resolver)
    assert done["status"] == "failed" and done["node_statuses"] == {"a": "dead", "b": "skipped"}


async def _leases(settings: CommonSettings, owner: str) -> LeaseStore:
    store = LeaseStore(settings.database_url, owner, ttl_s=10.0)
    await store.open()
    return store


def test_the_flag_reaches_renewals_and_later_claims_of_the_job_or_dag_run_only(
    settings: CommonSettings,
) -> None:
    """The lease side alone: who is flagged, idempotence, hostile ids, and a redelivery that
    takes over a cancelled execution's lease is told so at its claim."""

    async def scenario() -> None:
        a, b = await _leases(settings, "worker-a"), await _leases(settings, "worker-b")
        conn = await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True)
        try:
            ids = [str(uuid.uuid4()) for _ in range(4)]
            mine = await a.claim(ids[0], 1, "job-1")
            other = await a.claim(ids[1], 1, "job-2")
            in_run = await a.claim(ids[2], 1, "job-3", "run-1")
            assert mine.token and other.token and in_run.token and not mine.cancelled
            held = [(ids[0], mine.token), (ids[1], other.token), (ids[2], in_run.token)]
            assert (await a.renew_checked(held)).cancelled == frozenset()

            assert await request_cancel(conn, "job-1") == 1
            assert await request_cancel(conn, "job-1") == 0  # already flagged: idempotent
            assert await request_cancel(conn, "no-such-job") == 0
            assert await request_cancel_dag_run(conn, "run-1") == 1
            renewal = await a.renew_checked(held)
            assert renewal.cancelled == {ids[0], ids[2]} and renewal.lost == frozenset()

            for bad in ("", "x" * 201, "a\x00b"):
                with pytest.raises(ValueError, match="job_id"):
                    await request_cancel(conn, bad)
            with pytest.raises(ValueError, match="dag_run_id"):
                await request_cancel_dag_run(conn, 42)  # type: ignore[arg-type]

            # the holder dies (its lease handed back); the redelivery's claim sees the cancel
            await a.release([(ids[0], mine.token)])
            again = await b.claim(ids[0], 1, "job-1")
            assert again.token is not None and again.token != mine.token and again.cancelled
            fresh = await b.claim(ids[3], 1, "job-1")  # claimed after the cancel: not flagged
            assert fresh.token is not None and not fresh.cancelled
            # the projector's batched, blocking variant, in its own transaction
            with psycopg.connect(settings.database_url) as blocking:
                assert flag_cancelled_jobs(blocking, []) == 0
                assert flag_cancelled_jobs(blocking, ["job-1", "job-2", "nothing"]) == 2
                with pytest.raises(ValueError, match="job_id"):
                    flag_cancelled_jobs(blocking, ["ok", ""])
            renewal = await b.renew_checked([(ids[0], again.token), (ids[3], fresh.token)])
            assert renewal.cancelled == {ids[0], ids[3]}
            assert (await a.renew_checked([(ids[1], other.token)])).cancelled == {ids[1]}
        finally:
            await conn.close()
            await a.close()
            await b.close()

    asyncio.run(scenario())


def test_a_cancel_over_kafka_alone_stops_the_running_call_through_the_projector(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    holding_sink: HoldingSink,
    results: TopicReader,
) -> None:
    """The SDK publishes the cancel to Kafka only (no API, nobody writes the flag by hand):
    the projector sees the job turn cancelled in the scheduler's state and flags its lease."""
    from tests.integration.test_projector_support import RunningProjector

    projector = RunningProjector(settings)
    try:
        job = client.create_job(
            name="slow-http-sdk-cancel",
            schedule=NOW,
            target={"type": "http", "url": holding_sink.url},
            timeout_s=120,
            retry=RETRY,
        )
        wait_for(lambda: holding_sink.arrived, 30, "the HTTP call to reach the sink")
        [key] = holding_sink.arrived
        cancelled_at = time.time()
        client.cancel(job.job_id)
        aborted_at = wait_for(lambda: holding_sink.aborted.get(key, 0.0), 15, "the abort")
        # the scheduler's cycle, the projector's batch and one renewal (every 2 s)
        assert aborted_at - cancelled_at < STOP_WITHIN_S
        [result] = final(results, job.job_id)
        assert_cancelled(result, cancelled_at)
    finally:
        projector.stop()


def test_a_run_emitted_before_the_cancel_and_not_started_is_reported_cancelled_unrun(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    client: JobClient,
    holding_sink: HoldingSink,
    results: TopicReader,
) -> None:
    """A run the scheduler emitted before the cancel that no worker has claimed yet (here a
    backlog: no worker runs; a run emitted ahead of its time by the fire or crowd lead is the
    same case) must not start after the cancel: the projector writes a flagged lease row for
    it, and the worker that claims it later reports it cancelled without calling the target."""
    from tests.integration.test_projector_support import RunningProjector

    projector = RunningProjector(settings)
    try:
        job = client.create_job(
            name="queued-then-cancelled",
            schedule=NOW,
            target={"type": "http", "url": holding_sink.url},
            retry=RETRY,
        )
        with psycopg.connect(settings.database_url, autocommit=True) as conn:

            def status(sql: str) -> Any:
                return conn.execute(sql, (job.job_id,)).fetchone()

            wait_for(
                lambda: status("SELECT 1 FROM executions WHERE job_id = %s AND status = 'queued'"),
                30,
                "the run to be recorded queued",
            )
            client.cancel(job.job_id)
            flagged = wait_for(
                lambda: status(
                    "SELECT owner, attempt, state FROM leases "
                    "WHERE job_id = %s AND cancel_requested_at IS NOT NULL"
                ),
                30,
                "the projector to flag the queued run",
            )
            assert flagged == (CANCEL_OWNER, 0, "held")
        support.reset()
        before = cancelled_total("claimed")
        running = start_worker(settings)
        try:
            [result] = final(results, job.job_id)
            assert result["status"] == "failure", result
            assert result["error"]["reason"] == "cancelled", result
            assert result["error"]["retryable"] is False, result
            assert cancelled_total("claimed") == before + 1
            assert not holding_sink.arrived  # the target was never called
        finally:
            running.stop()
    finally:
        projector.stop()


def test_the_purge_drops_old_unclaimed_cancel_rows_and_keeps_workers_leases(
    settings: CommonSettings,
) -> None:
    """A flagged row for a run nobody claimed goes with the finished leases; a worker's
    expired lease (its run may still be redelivered) and a recent cancel row stay."""
    old, recent, workers = (str(uuid.uuid4()) for _ in range(3))
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        for execution_id, owner, age in (
            (old, CANCEL_OWNER, "2 days"),
            (recent, CANCEL_OWNER, "1 minute"),
            (workers, "worker-a", "2 days"),
        ):
            conn.execute(
                "INSERT INTO leases (execution_id, attempt, owner, fencing_token, expires_at, "
                "state, job_id, cancel_requested_at) VALUES (%s, 0, %s, "
                "nextval('lease_fencing_tokens'), now() - %s::interval, 'held', 'job-p', now())",
                (execution_id, owner, age),
            )

        async def purge() -> int:
            store = await _leases(settings, "worker-b")
            try:
                return await store.purge(age_s=3600.0)
            finally:
                await store.close()

        assert asyncio.run(purge()) == 1
        left = conn.execute(
            "SELECT execution_id::text FROM leases WHERE job_id = 'job-p' ORDER BY owner"
        ).fetchall()
        assert sorted(row[0] for row in left) == sorted([recent, workers])
