"""A new owner reads the inputs that waited for it before it fires (found by the fault
campaign's schedulers-down scenario: with overlap=skip, every misfire catch-up was dropped
because the run that had ended during the outage still looked live)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from confluent_kafka import Producer

from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from duetime.schedulers.settings import SchedulerSettings
from duetime.schemas.codec import Codec
from tests.helpers import RunningScheduler, TopicReader, execution_reader, wait_for

HTTP_TARGET = {"type": "http", "url": "http://127.0.0.1:9/none"}


@pytest.fixture
def executions(settings: CommonSettings) -> Iterator[TopicReader]:
    reader = execution_reader(settings)
    yield reader
    reader.close()


def success_of(request: dict[str, object]) -> dict[str, object]:
    """What a worker reports when the run of ``request`` succeeded."""
    now_ms = int(time.time() * 1000)
    return {
        "execution_id": request["execution_id"],
        "job_id": request["job_id"],
        "attempt": request["attempt"],
        "status": "success",
        "worker_id": "a-worker",
        "lease_token": 1,
        "scheduled_at_ms": request["scheduled_at_ms"],
        "started_at_ms": now_ms,
        "finished_at_ms": now_ms,
        "error": None,
        "retry_after_s": None,
        "output_json": None,
        "priority": request["priority"],
        "dag_id": None,
        "dag_run_id": None,
        "dag_key": None,
    }


@pytest.mark.parametrize("overlap", ["skip", "queue_one"])
def test_a_run_that_ended_while_no_scheduler_ran_does_not_block_the_catch_up(
    settings: CommonSettings, executions: TopicReader, overlap: str
) -> None:
    # the scenario needs exactly one run before the gap: a first scheduler still up when the
    # next occurrence falls due emits it (with a fire lead, up to the lead before) or, under
    # queue_one, queues it behind the live run, and the second scheduler then releases that
    # 'schedule' run instead of the 'misfire' catch-up (seen with a cron of every second and
    # a busy box: 1 ./run test in 4 with the 1 s lead, once more without it). So no lead, a
    # cron of every 5 s, and the gap runs until an occurrence is well past its misfire
    # threshold.
    unled = SchedulerSettings(
        common=settings, misfire_threshold_s=1.0, fire_lead_ms=0, crowd_lead_max_ms=0
    )
    first = RunningScheduler(unled)
    wait_for(lambda: first.owned() == settings.partitions, 30, "the first scheduler to own all")
    with JobClient(settings=settings) as client:
        job = client.create_job(
            name="catch-up",
            schedule={"cron": "*/5 * * * * *"},
            target=HTTP_TARGET,
            misfire="run_once",
            overlap=overlap,
        )
    [request] = wait_for(
        lambda: [r for r in executions.snapshot() if r["job_id"] == job.job_id], 30, "a run"
    )
    first.stop()
    # the run ends while no scheduler is up: its result waits in the results topic
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    producer.produce(
        Topics(settings.topic_prefix).results,
        key=job.job_id,
        value=Codec().encode("result", success_of(request)),
    )
    assert producer.flush(10) == 0
    # the subject: an occurrence falls due with nobody to fire it (a misfire)
    next_due_s = int(request["scheduled_at_ms"]) / 1000 + 5
    time.sleep(max(0.0, next_due_s + 2.5 - time.time()))
    second = RunningScheduler(replace(unled, common=replace(settings, instance_id="second")))
    try:
        # run_once: one catch-up run, although overlap is not allow: nothing runs any more
        catch_up = wait_for(
            lambda: [
                r
                for r in executions.snapshot()
                if r["job_id"] == job.job_id and r["scheduled_at_ms"] > request["scheduled_at_ms"]
            ],
            30,
            "the misfire catch-up run",
        )
        assert [r["trigger"] for r in catch_up] == ["misfire"]
    finally:
        second.stop()
