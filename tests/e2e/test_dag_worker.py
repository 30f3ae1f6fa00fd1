"""DAGs with real workers: scheduler, worker and resolver roles, python tasks, real results."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.dag_harness import RoleProcess
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from duetime.schedulers.settings import SchedulerSettings
from tests.helpers import RunningScheduler, TopicReader, execution_reader, wait_for
from tests.integration.test_dag_support import delete_internal_topics, wait_completed, wait_known

ROOT = Path(__file__).resolve().parents[2]
TASKS = "tests.e2e.test_dag_tasks"
RETRY = {"max_retries": 2, "base_delay_s": 0.2, "max_delay_s": 1.0, "jitter": False}


def member(key: str, task: str, *depends_on: str) -> dict[str, object]:
    return {
        "key": key,
        "name": f"e2e-{key}",
        "target": {"type": "python", "ref": f"{TASKS}:{task}"},
        "retry": RETRY,
        "depends_on": list(depends_on),
    }


@pytest.fixture
def roles(settings: CommonSettings) -> Iterator[list[RoleProcess]]:
    scheduler = RunningScheduler(SchedulerSettings(common=settings))
    env = {"PYTHONPATH": str(ROOT), "DUETIME_SESSION_TIMEOUT_MS": "3000"}
    worker = RoleProcess(settings, env, role="worker").start()
    resolver = RoleProcess(settings, env).start()
    wait_for(lambda: scheduler.owned() == settings.partitions, 30, "the scheduler to own all")
    yield [worker, resolver]
    for role in (worker, resolver):
        role.stop()
    scheduler.stop()
    delete_internal_topics(settings)


def test_a_diamond_with_real_workers_retries_inside_the_run_and_skips_after_a_dead_node(
    settings: CommonSettings, roles: list[RoleProcess]
) -> None:
    dag_runs = TopicReader(settings, [Topics(settings.topic_prefix).dag_runs], "dag_run")
    requests = execution_reader(settings)
    try:
        with JobClient(settings=settings) as client:
            retried = client.create_dag(
                "e2e-retry",
                [
                    member("a", "ok"),
                    member("b", "fail_once", "a"),
                    member("c", "ok", "a"),
                    member("d", "ok", "b", "c"),
                ],
            )
            dead = client.create_dag(
                "e2e-dead",
                [
                    member("a", "ok"),
                    member("b", "fail", "a"),
                    member("c", "ok", "a"),
                    member("d", "ok", "b", "c"),
                ],
            )
            wait_known(settings, retried)
            wait_known(settings, dead)
            ok_run = client.trigger_dag(retried.dag_id)
            dead_run = client.trigger_dag(dead.dag_id)
        done = wait_completed(dag_runs, ok_run, timeout_s=60, resolver=roles[1])
        assert done["status"] == "success"
        assert done["node_statuses"] == dict.fromkeys("abcd", "success")
        failed = wait_completed(dag_runs, dead_run, timeout_s=60, resolver=roles[1])
        assert failed["status"] == "failed"
        assert failed["node_statuses"] == {
            "a": "success",
            "b": "dead",
            "c": "success",
            "d": "skipped",
        }
        seen = requests.snapshot()
        b_attempts = sorted(
            r["attempt"] for r in seen if r["dag_run_id"] == ok_run and r["dag_key"] == "b"
        )
        assert b_attempts == [1, 2]
        assert [r for r in seen if r["dag_run_id"] == dead_run and r["dag_key"] == "d"] == []
        # the request reader may trail the run's completion event by a moment
        wait_for(
            lambda: any(
                r["dag_run_id"] == ok_run and r["dag_key"] == "d" for r in requests.snapshot()
            ),
            15,
            "d's execution request in the successful run",
        )
        seen = requests.snapshot()
        assert sum(r["dag_run_id"] == ok_run and r["dag_key"] == "d" for r in seen) == 1
    finally:
        dag_runs.close()
        requests.close()
