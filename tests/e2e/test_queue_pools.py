"""Two worker pools on two queues, as real processes (issue 14.1's "done when"): 1,000 jobs over
the queues ``alpha`` and ``beta``; pool alpha serves only ``alpha`` and may import only
``tests.e2e.pools.alpha``, pool beta likewise. Every job completes exactly once, on its own
queue's pool (each task returns its pool's name, the result names the worker), and jobs whose
task only the other pool could import dead-letter in their queue's pool instead of running
anywhere. Each pool is a new consumer group started at the production default
(``DUETIME_WORKER_NEW_GROUP_START=end``): requests already in its topics before it started
(history) are never run, and it says so in its log."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from duetime.core.config import CommonSettings
from duetime.core.models import Priority, Trigger
from duetime.core.records import ExecutionRequest, PythonTarget
from duetime.core.topics import Topics
from duetime.infra.queues import create_queue
from duetime.producers.sdk import JobClient
from duetime.schedulers.settings import SchedulerSettings
from duetime.schemas.codec import Codec
from tests.e2e.procs import Role, role_env
from tests.helpers import RunningScheduler, TopicReader, wait_for
from tests.integration import conftest as integration

POOLS = ("alpha", "beta")
PAST = {"at": "2020-01-01T00:00:00Z"}
LEASE_TTL_S = 3.0
HISTORY = 20
"""Requests written to each queue before its pool starts: a new group must not run them."""
CROSS = 10
"""Jobs in queue beta whose task only pool alpha may import: they must dead-letter on beta."""
TOTAL = 1000

# the integration tests' fixtures, re-exported: an SDK client and readers of results and DLQ
client = integration.client
results = integration.results
dlq = integration.dlq


def task_of(pool: str) -> dict[str, str]:
    return {"type": "python", "ref": f"tests.e2e.pools.{pool}:run"}


@pytest.fixture
def scheduler(settings: CommonSettings) -> Iterator[RunningScheduler]:
    # a request a new pool skipped while joining is rescued within seconds, not minutes
    running = RunningScheduler(
        SchedulerSettings(common=settings, lease_ttl_s=LEASE_TTL_S, rescue_grace_s=2.0)
    )
    wait_for(lambda: running.owned() == settings.partitions, 30, "the scheduler to own it all")
    yield running
    running.stop()


@pytest.fixture
def pools(settings: CommonSettings) -> Iterator[dict[str, Role]]:
    for pool in POOLS:
        create_queue(settings, pool)
    _write_history(settings)
    started = {
        pool: Role.start(
            f"pool-{pool}",
            ["worker"],
            role_env(
                settings,
                python_modules=f"tests.e2e.pools.{pool}",
                DUETIME_WORKER_QUEUES=pool,
                DUETIME_WORKER_GROUP=f"{settings.topic_prefix}pool-{pool}",
                DUETIME_WORKER_NEW_GROUP_START="end",  # the production default
                DUETIME_WORKER_CONCURRENCY="100",
                DUETIME_LEASE_TTL_S=str(LEASE_TTL_S),
            ),
        )
        for pool in POOLS
    }
    try:
        yield started
    finally:
        for role in started.values():
            role.kill()


def _write_history(settings: CommonSettings) -> None:
    """Requests already in each queue's topic before its pool exists (as another deployment's
    past would be): valid, runnable by the pool, and never to be run by a new group."""
    topics, codec = Topics(settings.topic_prefix), Codec()
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "acks": "all"})
    now_ms = int(time.time() * 1000)
    for pool in POOLS:
        for i in range(HISTORY):
            request = ExecutionRequest(
                execution_id=f"history-{pool}-{i}",
                job_id=str(uuid.uuid4()),
                name="history",
                attempt=1,
                scheduled_at_ms=now_ms,
                due_at_ms=now_ms,
                emitted_at_ms=now_ms,
                priority=Priority.NORMAL,
                target=PythonTarget(ref=f"tests.e2e.pools.{pool}:run"),
                payload_json="null",
                timeout_s=10.0,
                trigger=Trigger.SCHEDULE,
                queue=pool,
            )
            topic = topics.execution("normal", pool)
            producer.produce(topic, codec.dump(request, topic=topic), request.job_id)
    assert producer.flush(30) == 0


def _pool_of(result: dict[str, Any]) -> str:
    return str(json.loads(result["output_json"])["pool"])


@pytest.mark.slow
def test_two_pools_run_their_own_queues_only_each_job_once(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    pools: dict[str, Role],
    client: JobClient,
    results: TopicReader,
    dlq: TopicReader,
) -> None:
    for pool, role in pools.items():
        wait_for(
            lambda role=role: "start at the end of their topics" in role.log(),  # type: ignore[misc]
            60,
            f"pool {pool} to join and say where its new group starts",
        )
    # a probe per queue: the pipeline flows (a request skipped while the pool joined would be
    # rescued, so this also bounds that case)
    probes = {
        client.create_job(name=f"probe-{p}", schedule=PAST, target=task_of(p), queue=p).job_id: p
        for p in POOLS
    }
    wait_for(
        lambda: (
            {r["job_id"] for r in results.snapshot() if r["status"] == "success"} >= set(probes)
        ),
        60,
        "a probe job to complete on each pool",
    )

    specs: list[dict[str, Any]] = []
    for i in range(TOTAL - CROSS):
        pool = POOLS[i % 2]
        specs.append(
            {"name": f"{pool}-{i}", "schedule": PAST, "target": task_of(pool), "queue": pool}
        )
    for i in range(CROSS):  # beta's queue, alpha's task: beta cannot import it
        specs.append(
            {
                "name": f"cross-{i}",
                "schedule": PAST,
                "target": task_of("alpha"),
                "queue": "beta",
                "retry": {"max_retries": 0},
            }
        )
    started = time.monotonic()
    created: dict[str, dict[str, Any]] = {}
    for at in range(0, len(specs), 100):
        chunk = specs[at : at + 100]
        for spec, job in zip(chunk, client.create_jobs(chunk), strict=True):
            created[job.job_id] = spec
    assert len(created) == TOTAL
    runnable = {j for j, s in created.items() if not s["name"].startswith("cross-")}
    cross = set(created) - runnable

    def finished() -> bool:
        done = {r["job_id"] for r in results.snapshot() if r["status"] == "success"}
        dead = {d["job_id"] for d in dlq.snapshot()}
        return runnable <= done and cross <= dead

    wait_for(finished, 180, f"{len(runnable)} jobs to succeed and {CROSS} to dead-letter")
    elapsed_s = time.monotonic() - started

    successes = [
        r for r in results.snapshot() if r["status"] == "success" and r["job_id"] in created
    ]
    per_execution = Counter(r["execution_id"] for r in successes)
    assert max(per_execution.values()) == 1, "an execution succeeded twice"
    assert Counter(r["job_id"] for r in successes) == Counter(runnable)  # once each
    wrong = [
        (created[r["job_id"]]["queue"], _pool_of(r), r["worker_id"])
        for r in successes
        if not (
            _pool_of(r) == created[r["job_id"]]["queue"]
            and r["worker_id"] == f"pool-{created[r['job_id']]['queue']}"
        )
    ]
    assert wrong == [], f"executions ran on the other pool: {wrong[:5]}"
    # the cross jobs failed on beta only (it cannot import alpha's module), never ran on alpha
    cross_results = [r for r in results.snapshot() if r["job_id"] in cross]
    assert cross_results and {r["worker_id"] for r in cross_results} == {"pool-beta"}
    assert {r["status"] for r in cross_results} <= {"failure", "running"}
    # the history was never run: a new group starts at the end of its topics
    assert not [r for r in results.snapshot() if str(r["execution_id"]).startswith("history-")]
    for pool, role in pools.items():
        assert f"serving queues {pool}" in role.log()
    print(
        f"\nqueue pools: {TOTAL} jobs ({len(runnable)} run, {CROSS} dead-lettered) over "
        f"{len(POOLS)} pools in {elapsed_s:.1f} s from the first create"
    )
