"""Repair of a DAG run and a cancelled member, against the real broker: the scheduler in the
test process, the resolver as a real ``duetime resolver`` process (killed and restarted in one
test), a simulated worker whose outcomes each test chooses."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from bench.dag_harness import ResolverProcess
from duetime.core.config import CommonSettings
from duetime.producers.sdk import JobClient
from tests.helpers import RunningScheduler, TopicReader, wait_for
from tests.integration.test_dag_support import (
    delete_internal_topics,
    job,
    run_events,
    sim_worker,
    wait_known,
)

CHAIN = [job("a"), job("b", "a"), job("c", "b")]


def ended(reader: TopicReader, run_id: str, status: str, resolver: ResolverProcess) -> Any:
    """The run's completed event with this outcome (a repaired run has two)."""

    def found() -> dict[str, Any] | None:
        if not resolver.alive():
            raise AssertionError(f"the resolver died:\n{resolver.log()[-4000:]}")
        return next(
            (
                e
                for e in run_events(reader, run_id)
                if e["kind"] == "completed" and e["status"] == status
            ),
            None,
        )

    # 120 s: under ./run test's parallel load a new resolver once logged nothing past its
    # start-up for 60 s (faust's start and the group's join), twice timing this wait out
    try:
        return wait_for(found, 120, f"run {run_id} to end {status}")
    except AssertionError as exc:  # say what the resolver did, and what the run saw
        seen = [
            (e["kind"], e.get("node_key"), e.get("node_status"), e.get("status"))
            for e in run_events(reader, run_id)
        ]
        raise AssertionError(
            f"{exc}\nthe run's events: {seen}\nthe resolver's log:\n{resolver.log()[-4000:]}"
        ) from None


def fatal_until(fixed: threading.Event, key: str) -> Any:
    """``key`` fails for good (not retryable) until ``fixed`` is set."""
    return lambda r: "fatal" if r["dag_key"] == key and not fixed.is_set() else "success"


def test_a_repair_survives_a_resolver_killed_mid_repair(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    client: JobClient,
    dag_runs: TopicReader,
) -> None:
    """a dies, b and c are skipped; retry_dag_run (the SDK, over Kafka alone); the resolver is
    SIGKILLed while the repaired b runs, with nothing committed for a minute (so its successor
    gets every event of the run again, the repair request included): the run still ends
    success, and a, b, c each ran exactly once more."""
    fixed = threading.Event()
    a_dead = fatal_until(fixed, "a")

    def outcome(request: dict[str, Any]) -> Any:
        return "hold" if fixed.is_set() and request["dag_key"] == "b" else a_dead(request)

    env = {"DUETIME_RESOLVER_COMMIT_INTERVAL_S": "60"}
    first = ResolverProcess(settings, env).start()
    second: ResolverProcess | None = None
    try:
        with sim_worker(settings, outcome) as worker:
            dag = client.create_dag("repair-kill", CHAIN)
            wait_known(settings, dag)
            run_id = client.trigger_dag(dag.dag_id)
            failed = ended(dag_runs, run_id, "failed", first)
            assert failed["node_statuses"] == {"a": "dead", "b": "skipped", "c": "skipped"}
            fixed.set()
            client.retry_dag_run(dag.dag_id, run_id)
            wait_for(lambda: worker.held, 30, "the repaired b to be held by the worker")
            first.kill()  # SIGKILL mid-repair: nothing committed since before the run
            assert worker.release_held() == 1
            second = ResolverProcess(settings, env).start()
            done = ended(dag_runs, run_id, "success", second)
            assert done["node_statuses"] == dict.fromkeys("abc", "success")
            kinds = [e["kind"] for e in run_events(dag_runs, run_id)]
            assert "reopened" in kinds
            wait_for(lambda: worker.requests_of(run_id, "c"), 10, "c's execution request")
            runs = Counter(r["dag_key"] for r in worker.requests_of(run_id))
            assert runs == {"a": 2, "b": 1, "c": 1}
    finally:
        first.stop()
        if second is not None:
            second.stop()
        delete_internal_topics(settings)


def test_a_replay_of_a_members_dead_letter_repairs_its_run(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    client: JobClient,
    dag_runs: TopicReader,
) -> None:
    """``duetime dlq replay`` (the SDK's replay with the dead letter's run) of the dead b:
    b runs again in its run, c after it, and the run ends success; a second replay of the
    same dead letter asks nothing more."""
    fixed = threading.Event()
    resolver = ResolverProcess(settings).start()
    try:
        with sim_worker(settings, fatal_until(fixed, "b")) as worker:
            dag = client.create_dag("repair-replay", CHAIN)
            wait_known(settings, dag)
            run_id = client.trigger_dag(dag.dag_id)
            ended(dag_runs, run_id, "failed", resolver)
            [dead] = worker.requests_of(run_id, "b")
            fixed.set()
            client.replay(dead["job_id"], dead["execution_id"], dag_run_id=run_id)
            client.replay(dead["job_id"], dead["execution_id"], dag_run_id=run_id)
            done = ended(dag_runs, run_id, "success", resolver)
            assert done["node_statuses"] == dict.fromkeys("abc", "success")
            wait_for(lambda: worker.requests_of(run_id, "c"), 10, "c's execution request")
            runs = Counter(r["dag_key"] for r in worker.requests_of(run_id))
            assert runs == {"a": 1, "b": 2, "c": 1}
            again = worker.requests_of(run_id, "b")
            replayed = [r for r in again if r["execution_id"] != dead["execution_id"]]
            assert replayed and all(r["dag_run_id"] == run_id for r in replayed)  # in the run
    finally:
        resolver.stop()
        delete_internal_topics(settings)


def test_a_cancelled_member_ends_its_run_cancelled(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    client: JobClient,
    dag_runs: TopicReader,
) -> None:
    """b is cancelled while a runs: when a succeeds, b is not released, c is skipped and the
    run ends ``cancelled`` instead of looking alive forever."""

    def outcome(request: dict[str, Any]) -> Any:
        return "hold" if request["dag_key"] == "a" else "success"

    resolver = ResolverProcess(settings).start()
    try:
        with sim_worker(settings, outcome) as worker:
            dag = client.create_dag("cancel-member", CHAIN)
            wait_known(settings, dag)
            run_id = client.trigger_dag(dag.dag_id)
            wait_for(lambda: worker.held, 30, "a to be held by the worker")
            client.cancel(dag.job_ids["b"])
            wait_for(
                lambda: any(
                    e["kind"] == "node_status" and e["node_key"] == "b"
                    for e in run_events(dag_runs, run_id)
                ),
                30,
                "the resolver to hear of b's cancel",
            )
            assert worker.release_held() == 1
            done = ended(dag_runs, run_id, "cancelled", resolver)
            assert done["node_statuses"] == {"a": "success", "b": "cancelled", "c": "skipped"}
            assert worker.requests_of(run_id, "b") == []
    finally:
        resolver.stop()
        delete_internal_topics(settings)
