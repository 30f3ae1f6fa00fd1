"""Fairness keys end to end in one process (issue 18, item 4): a real scheduler and a real
worker on the test broker. Tenant A's backlog of 2,000 jobs falls due at once; tenant B's jobs
come a bit later and each starts after a few of A's executions, not after A's backlog. What is
counted is executions started (the start order the task records), never times."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from duetime.consumers.tasks import ExecutionContext
from duetime.consumers.worker.settings import WorkerSettings
from duetime.core.config import CommonSettings
from duetime.producers.sdk import JobClient
from duetime.schedulers.settings import SchedulerSettings
from tests.helpers import RunningScheduler, wait_for
from tests.integration.test_worker_support import RunningWorker

CAP = 4
"""The per-key in-flight cap per partition in these tests (DUETIME_SCHEDULER_FAIRNESS_INFLIGHT)."""
SLOTS = 4

_LOCK = threading.Lock()
STARTS: list[str] = []
"""The tenant of each started execution, in start order."""


async def fair_task(ctx: ExecutionContext) -> None:
    """Record the tenant's start, then run ``payload.sleep_s``."""
    with _LOCK:
        STARTS.append(str(ctx.payload["tenant"]))
    await asyncio.sleep(float(ctx.payload["sleep_s"]))


def spec(tenant: str, at: datetime, sleep_s: float, weight: int = 1) -> dict[str, Any]:
    return {
        "name": f"fair-{tenant}",
        "schedule": {"at": at.isoformat()},
        "target": {"type": "python", "ref": "tests.integration.test_fairness:fair_task"},
        "payload": {"tenant": tenant, "sleep_s": sleep_s},
        "fairness": {"key": "tenant-{payload.tenant}", "weight": weight},
        "retry": {"max_retries": 0},
    }


@dataclass
class Stack:
    client: JobClient
    scheduler: RunningScheduler

    def in_flight(self, key: str) -> int:
        """Executions of ``key`` the scheduler counts in flight, over its partitions."""
        owners = list(self.scheduler.scheduler.owners.values())
        return sum(owner.fairness.inflight(key) for owner in owners)


def start_scheduler(settings: CommonSettings, cap: int = CAP) -> RunningScheduler:
    scheduler = RunningScheduler(SchedulerSettings(common=settings, fairness_inflight=cap))
    wait_for(lambda: scheduler.owned() == settings.partitions, 30, "the scheduler's partitions")
    return scheduler


def start_worker(settings: CommonSettings) -> RunningWorker:
    worker = RunningWorker(
        WorkerSettings(
            common=replace(settings, instance_id=f"fair-{uuid.uuid4().hex[:4]}"),
            concurrency=SLOTS,
            critical_share=0.0,
            shutdown_s=1.0,
        )
    )
    wait_for(lambda: worker.assigned() == 4 * settings.partitions, 30, "the worker's partitions")
    return worker


@pytest.fixture
def stack(settings: CommonSettings) -> Iterator[Stack]:
    """A scheduler and one worker of SLOTS slots, both in this process."""
    with _LOCK:
        STARTS.clear()
    scheduler = start_scheduler(settings)
    worker = start_worker(settings)
    try:
        with JobClient(settings=settings) as client:
            yield Stack(client, scheduler)
    finally:
        worker.stop()
        scheduler.stop()


def started(tenant: str) -> int:
    with _LOCK:
        return STARTS.count(tenant)


def started_once(tenant: str) -> bool:
    return started(tenant) == 1


def test_a_tenants_backlog_delays_another_tenants_jobs_by_a_few_executions(
    settings: CommonSettings, stack: Stack
) -> None:
    backlog = 2000
    due = datetime.now(UTC) + timedelta(seconds=2)
    stack.client.create_jobs([spec("a", due, sleep_s=0.5) for _ in range(backlog)])
    wait_for(lambda: started("a") >= 3 * SLOTS, 60, "tenant A's backlog to be running")
    # the cap holds: never more than CAP x partitions of A's requests are out of the scheduler
    assert 0 < stack.in_flight("tenant-a") <= CAP * settings.partitions
    waits = []
    for tenant in ("b0", "b1", "b2"):
        with _LOCK:
            before = len(STARTS)
        stack.client.create_job(spec(tenant, datetime.now(UTC), sleep_s=0))
        wait_for(partial(started_once, tenant), 30, f"tenant {tenant}'s job to start")
        with _LOCK:
            waits.append(STARTS[before:].index(tenant))
    left = backlog - started("a")
    print(f"A executions started before each B job (after it was created): {waits}; A left {left}")
    # without fairness each B job would start after the A requests ahead of it in its
    # partition: about backlog / partitions of them
    assert left > backlog // 2, "A's backlog must still be there for the test to mean something"
    # what bounds a B job's wait: the A requests in flight when it was emitted (at most CAP per
    # partition, SLOTS of them running) and the time the scheduler and the worker take to pass
    # it on (an A execution lasts 0.5 s: a loaded machine's second adds SLOTS x 2 starts)
    assert max(waits) <= CAP * settings.partitions + 2 * SLOTS, waits


def test_a_heavier_tenant_gets_its_weight_of_the_starts(stack: Stack) -> None:
    due = datetime.now(UTC) + timedelta(seconds=2)
    specs = [spec("heavy", due, sleep_s=0.05, weight=3) for _ in range(300)]
    specs += [spec("light", due, sleep_s=0.05) for _ in range(300)]
    stack.client.create_jobs(specs)
    wait_for(lambda: len(STARTS) >= 200, 90, "200 starts")
    with _LOCK:
        first = STARTS[:200]
    heavy = first.count("heavy") / len(first)
    print(f"heavy share of the first 200 starts: {heavy:.2f} (weights 3:1 -> 0.75)")
    assert 0.6 <= heavy <= 0.9, first


def held_and_in_flight(scheduler: RunningScheduler, key: str) -> tuple[int, int]:
    owners = list(scheduler.scheduler.owners.values())
    return sum(o.fairness.held for o in owners), sum(o.fairness.inflight(key) for o in owners)


def test_held_executions_survive_a_failover_and_run_once(settings: CommonSettings) -> None:
    """No worker at first: with a cap of 1 all but one execution per partition are held. A new
    scheduler restores them from the changelog (their shares in its headers), and once a
    worker comes every one runs exactly once."""
    with _LOCK:
        STARTS.clear()
    jobs = 30
    first = start_scheduler(settings, cap=1)
    try:
        with JobClient(settings=settings) as client:
            client.create_jobs([spec("a", datetime.now(UTC), sleep_s=0) for _ in range(jobs)])

        def all_fired() -> tuple[int, int] | None:
            held, in_flight = held_and_in_flight(first, "tenant-a")
            return (held, in_flight) if held + in_flight == jobs else None

        fired = wait_for(all_fired, 30, "every job to be held or in flight")
        assert fired is not None
        held, in_flight = fired
        assert 1 <= in_flight <= settings.partitions and held == jobs - in_flight
    finally:
        first.stop()
    second = start_scheduler(settings, cap=1)
    try:
        # the gate is rebuilt from the changelog as the partitions are restored
        assert held_and_in_flight(second, "tenant-a") == (held, in_flight)
        worker = start_worker(settings)
        try:
            wait_for(lambda: started("a") >= jobs, 60, "every held execution to run")
            wait_for(
                lambda: held_and_in_flight(second, "tenant-a") == (0, 0),
                30,
                "every result to reach the scheduler",
            )
            assert started("a") == jobs  # none twice (both owners' requests would show)
        finally:
            worker.stop()
    finally:
        second.stop()
