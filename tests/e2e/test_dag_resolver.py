"""The resolver as a real process, SIGKILLed mid-run: after a restart D is released once."""

from __future__ import annotations

import time
from typing import Any

from bench.dag_harness import ResolverProcess
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from tests.helpers import RunningScheduler, TopicReader, wait_for
from tests.integration.test_dag_support import (
    DIAMOND,
    delete_internal_topics,
    run_events,
    scheduler_read_past,
    sim_worker,
    wait_completed,
    wait_known,
    wait_logged,
)


def _node_seen(reader: TopicReader, run_id: str, key: str, status: str) -> bool:
    return any(
        e["kind"] == "node_status" and e["node_key"] == key and e["node_status"] == status
        for e in run_events(reader, run_id)
    )


def test_sigkill_between_b_and_c_releases_d_exactly_once(
    settings: CommonSettings, scheduler: RunningScheduler
) -> None:
    topics = Topics(settings.topic_prefix)
    dag_runs = TopicReader(settings, [topics.dag_runs], "dag_run")
    control = TopicReader(settings, [topics.control], "control")
    # commits far apart: whatever the killed resolver did is redelivered to its successor
    env = {"DUETIME_RESOLVER_COMMIT_INTERVAL_S": "60"}
    first = ResolverProcess(settings, env).start()
    second: ResolverProcess | None = None

    def outcome(request: dict[str, Any]) -> Any:
        return "hold" if request["dag_key"] == "c" else "success"

    try:
        with sim_worker(settings, outcome) as worker, JobClient(settings=settings) as client:
            dag = client.create_dag("diamond-kill", DIAMOND)
            wait_known(settings, dag)
            run_id = client.trigger_dag(dag.dag_id)
            wait_for(lambda: worker.held, 30, "C's execution to be held by the worker")
            wait_for(
                lambda: _node_seen(dag_runs, run_id, "b", "success"),
                30,
                "the resolver to take in B's success",
            )
            first.kill()  # SIGKILL: nothing committed, nothing flushed on the way out
            assert worker.release_held() == 1  # C succeeds while no resolver runs
            # the subject, not a settling wait: with no resolver running nothing releases D
            time.sleep(0.5)
            assert worker.requests_of(run_id, "d") == []  # nobody released D yet
            second = ResolverProcess(settings, env).start()
            # a deadline, not a figure: the take-over takes seconds. The successor that sat
            # silent here until the deadline (1 run in ~8 beside two busy cores) had started
            # past the run's events: faust left its uncommitted partitions where a fetch during
            # the recovery had moved them (seek_to_committed_or_start, test_resolver_seek.py)
            done = wait_completed(dag_runs, run_id, timeout_s=60, resolver=second)
            assert done["status"] == "success"
            wait_for(lambda: worker.requests_of(run_id, "d"), 10, "D's execution request")
            wait_for(
                lambda: scheduler_read_past(settings, list(control.raw)),
                30,
                "the scheduler to handle every control command seen (a resent release too)",
            )
            # what a duplicate release made the scheduler emit is written by now; the subject:
            # no second request of D reaches the worker within this window
            time.sleep(0.5)
            assert len(worker.requests_of(run_id, "d")) == 1
            releases = [
                c
                for c in control.snapshot()
                if c["kind"] == "release"
                and c["dag_run_id"] == run_id
                and c["job_id"] == dag.job_ids["d"]
            ]
            # the successor re-derived everything from the redelivered events; it may say
            # "release D" more than once, the scheduler emits it once
            assert len(releases) >= 1
            print(f"release commands for D: {len(releases)}")
    finally:
        first.kill()
        if second is not None:
            second.stop()
        dag_runs.close()
        control.close()
        delete_internal_topics(settings)


def test_sigkill_after_d_was_released_resends_the_release_and_d_still_runs_once(
    settings: CommonSettings, scheduler: RunningScheduler
) -> None:
    """The successor re-processes C's success and says "release D" again: dropped."""
    topics = Topics(settings.topic_prefix)
    dag_runs = TopicReader(settings, [topics.dag_runs], "dag_run")
    control = TopicReader(settings, [topics.control], "control")
    env = {"DUETIME_RESOLVER_COMMIT_INTERVAL_S": "60"}
    first = ResolverProcess(settings, env).start()
    second: ResolverProcess | None = None

    def outcome(request: dict[str, Any]) -> Any:
        return "hold" if request["dag_key"] == "d" else "success"

    def releases_of_d(run_id: str, job_id: str) -> int:
        return sum(
            c["kind"] == "release" and c["dag_run_id"] == run_id and c["job_id"] == job_id
            for c in control.snapshot()
        )

    try:
        with sim_worker(settings, outcome) as worker, JobClient(settings=settings) as client:
            dag = client.create_dag("diamond-kill-late", DIAMOND)
            wait_known(settings, dag)
            run_id = client.trigger_dag(dag.dag_id)
            wait_for(lambda: worker.held, 30, "D's execution to reach the worker")
            first.kill()
            wait_for(
                lambda: releases_of_d(run_id, dag.job_ids["d"]) == 1,
                10,
                "the control reader to see D's one release",
            )
            second = ResolverProcess(settings, env).start()
            # a deadline, not a figure (see the test above); the logs say where it stood
            wait_logged(
                lambda: releases_of_d(run_id, dag.job_ids["d"]) >= 2,
                60,
                "the successor to send D's release again",
                second,
                first,
            )
            wait_for(
                lambda: scheduler_read_past(settings, list(control.raw)),
                30,
                "the scheduler to handle the resent release of D",
            )
            # the subject: the resent release made no second request of D (window for one
            # already written to reach the worker)
            time.sleep(0.5)
            assert len(worker.requests_of(run_id, "d")) == 1
            assert worker.release_held() == 1
            done = wait_completed(dag_runs, run_id, timeout_s=30, resolver=second)
            assert done["status"] == "success"
            assert len(worker.requests_of(run_id, "d")) == 1
    finally:
        first.kill()
        if second is not None:
            second.stop()
        dag_runs.close()
        control.close()
        delete_internal_topics(settings)
