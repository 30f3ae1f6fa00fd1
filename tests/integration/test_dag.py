"""DAGs against the real broker: creation, runs, the resolver's releases and skips.

The scheduler runs in the test process, the resolver as a real ``duetime resolver`` process,
and a simulated worker reports results as a worker would, with outcomes chosen per test.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from bench.dag_harness import ResolverProcess
from duetime.core import kafka
from duetime.core.config import CommonSettings
from duetime.core.errors import DagCycleError, ValidationError
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from duetime.schedulers.settings import SchedulerSettings
from duetime.schemas.codec import Codec
from tests.helpers import RunningScheduler, TopicReader, wait_for
from tests.integration.test_dag_support import (
    DIAMOND,
    delete_internal_topics,
    job,
    run_events,
    sim_worker,
    wait_completed,
    wait_known,
)


@pytest.fixture
def scheduler(settings: CommonSettings) -> Iterator[RunningScheduler]:
    running = RunningScheduler(SchedulerSettings(common=settings, misfire_threshold_s=2.0))
    wait_for(lambda: running.owned() == settings.partitions, 30, "the scheduler to own it all")
    yield running
    running.stop()


@pytest.fixture
def resolver(settings: CommonSettings) -> Iterator[ResolverProcess]:
    process = ResolverProcess(settings).start()
    yield process
    code = process.stop()
    delete_internal_topics(settings)
    if code not in (0, None):
        print(process.log()[-5000:])


B_DEAD = {"a": "success", "b": "dead", "c": "success", "d": "skipped"}


def _success_at(worker: Any, run_id: str, key: str) -> int:
    return int(
        max(
            r.at_ms
            for r in worker.reports_of(run_id)
            if r.request["dag_key"] == key and r.status == "success"
        )
    )


def test_diamond_runs_d_only_after_b_and_c(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    resolver: ResolverProcess,
    client: JobClient,
    dag_runs: TopicReader,
) -> None:
    with sim_worker(settings) as worker:
        dag = client.create_dag("diamond", DIAMOND)
        wait_known(settings, dag)
        run_id = client.trigger_dag(dag.dag_id)
        done = wait_completed(dag_runs, run_id, resolver=resolver)
        assert done["status"] == "success"
        assert done["node_statuses"] == dict.fromkeys("abcd", "success")
        executed = Counter(r["dag_key"] for r in worker.requests_of(run_id))
        assert executed == Counter("abcd")  # each node once
        d_request = worker.requests_of(run_id, "d")[0]
        assert d_request["emitted_at_ms"] >= _success_at(worker, run_id, "b")
        assert d_request["emitted_at_ms"] >= _success_at(worker, run_id, "c")
        assert d_request["dag_id"] == dag.dag_id and d_request["trigger"] == "release"
        started = next(e for e in run_events(dag_runs, run_id) if e["kind"] == "started")
        assert started["node_statuses"] == {
            "a": "queued",
            "b": "blocked",
            "c": "blocked",
            "d": "blocked",
        }
        assert {n["key"]: n["job_id"] for n in started["nodes"]} == dag.job_ids


def test_a_retried_b_delays_d(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    resolver: ResolverProcess,
    client: JobClient,
    dag_runs: TopicReader,
) -> None:
    def outcome(request: dict[str, Any]) -> Any:
        return "failure" if request["dag_key"] == "b" and request["attempt"] == 1 else "success"

    with sim_worker(settings, outcome) as worker:
        dag = client.create_dag("diamond-retry", DIAMOND)
        wait_known(settings, dag)
        run_id = client.trigger_dag(dag.dag_id)
        done = wait_completed(dag_runs, run_id, resolver=resolver)
        assert done["status"] == "success"
        b_attempts = sorted(r["attempt"] for r in worker.requests_of(run_id, "b"))
        assert b_attempts == [1, 2]  # the retry happened inside the run
        [d_request] = worker.requests_of(run_id, "d")
        assert d_request["emitted_at_ms"] >= _success_at(worker, run_id, "b")
        b_failed_ms = next(
            r.at_ms
            for r in worker.reports_of(run_id)
            if r.request["dag_key"] == "b" and r.status == "failure"
        )
        assert d_request["emitted_at_ms"] > b_failed_ms + 150  # waited for B's retry (0.2 s)
        statuses = [
            e["node_status"]
            for e in run_events(dag_runs, run_id)
            if e["kind"] == "node_status" and e["node_key"] == "b"
        ]
        assert "failed" in statuses and statuses[-1] == "success"


def test_a_dead_b_skips_d_and_fails_the_run(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    resolver: ResolverProcess,
    client: JobClient,
    dag_runs: TopicReader,
) -> None:
    def outcome(request: dict[str, Any]) -> Any:
        return "failure" if request["dag_key"] == "b" else "success"

    jobs = [job("a"), job("b", "a", retry={"max_retries": 1, "base_delay_s": 0.1}), *DIAMOND[2:]]
    with sim_worker(settings, outcome) as worker:
        dag = client.create_dag("diamond-dead", jobs)
        wait_known(settings, dag)
        run_id = client.trigger_dag(dag.dag_id)
        done = wait_completed(dag_runs, run_id, resolver=resolver)
        assert done["status"] == "failed"
        assert done["node_statuses"] == B_DEAD
        assert worker.requests_of(run_id, "d") == []  # D never ran
        assert len(worker.requests_of(run_id, "b")) == 2  # one retry, then dead


def test_a_thousand_node_layered_dag_completes_in_dependency_order(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    resolver: ResolverProcess,
    client: JobClient,
    dag_runs: TopicReader,
) -> None:
    layers, width = 10, 100
    jobs = []
    for layer in range(layers):
        for i in range(width):
            deps = (
                []
                if layer == 0
                else sorted({f"n{layer - 1}.{i}", f"n{layer - 1}.{(i * 7 + 3) % width}"})
            )
            jobs.append(job(f"n{layer}.{i}", *deps))
    upstreams = {j["key"]: j["depends_on"] for j in jobs}
    with sim_worker(settings) as worker:
        started = time.monotonic()
        dag = client.create_dag("layered", jobs)
        wait_known(settings, dag)
        run_id = client.trigger_dag(dag.dag_id)
        done = wait_completed(dag_runs, run_id, timeout_s=90, resolver=resolver)
        elapsed_s = time.monotonic() - started
        assert done["status"] == "success"
        assert len(done["node_statuses"]) == layers * width
        requests = worker.requests_of(run_id)
        assert Counter(r["dag_key"] for r in requests) == Counter(list(upstreams))  # each once
        succeeded_ms = {
            r.request["dag_key"]: r.at_ms
            for r in worker.reports_of(run_id)
            if r.status == "success"
        }
        for request in requests:
            for dep in upstreams[request["dag_key"]]:
                assert request["emitted_at_ms"] >= succeeded_ms[dep], (request["dag_key"], dep)
        print(f"1,000-node DAG: {elapsed_s:.1f} s from create to completed")


def test_invalid_dags_are_refused_and_nothing_is_published(
    settings: CommonSettings, client: JobClient
) -> None:
    with pytest.raises(DagCycleError) as cycle:
        client.create_dag("cycle", [job("a", "c"), job("b", "a"), job("c", "b"), job("d", "c")])
    assert cycle.value.details["cycle"] == ["a", "b", "c", "a"]
    assert "a → b → c → a" in cycle.value.message
    with pytest.raises(DagCycleError, match="depends on itself"):
        client.create_dag("self-loop", [job("a", "a")])
    with pytest.raises(ValidationError, match="unknown upstream"):
        client.create_dag("unknown", [job("a"), job("b", "zz")])
    with pytest.raises(ValidationError, match="duplicate"):
        client.create_dag("duplicate", [job("a"), job("a")])
    with pytest.raises(ValidationError, match="schedule of its own"):
        client.create_dag("member schedule", [job("a", schedule={"cron": "* * * * *"})])
    with pytest.raises(ValidationError) as bad_member:
        client.create_dag("bad member", [job("a"), job("b", "a", target={"type": "ftp"})])
    assert bad_member.value.details["field"] == "jobs[1].target.type"
    assert _records(settings) == 0  # nothing reached Kafka

    # an update that would introduce a cycle is refused the same way, and changes nothing
    dag = client.create_dag("fine", [job("a"), job("b", "a")])
    before = _records(settings)
    with pytest.raises(DagCycleError) as update:
        client.create_dag("fine", [job("a", "b"), job("b", "a")], dag_id=dag.dag_id)
    assert update.value.details["cycle"] == ["a", "b", "a"]
    assert _records(settings) == before


def _records(settings: CommonSettings) -> int:
    """Records on the topics a DAG creation or run would write."""
    topics = Topics(settings.topic_prefix)
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": "count"})
    try:
        total = 0
        for topic in (topics.jobs, topics.dags, topics.control, *topics.executions):
            for p in range(settings.partitions):
                # retried while a just-created topic has no leader yet
                low, high = kafka.watermarks(consumer, topic, p)
                total += high - low
        return total
    finally:
        consumer.close()


def test_overlapping_runs_keep_their_statuses_apart(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    resolver: ResolverProcess,
    client: JobClient,
    dag_runs: TopicReader,
) -> None:
    runs: list[str] = []

    def outcome(request: dict[str, Any]) -> Any:
        # B fails for good in the first run only; everything is slow enough to overlap
        if request["dag_key"] == "b" and request["dag_run_id"] == runs[0]:
            return "fatal"
        return "success"

    with sim_worker(settings, outcome, duration_s=0.3) as worker:
        dag = client.create_dag("overlap", DIAMOND)
        wait_known(settings, dag)
        runs.append(client.trigger_dag(dag.dag_id))
        runs.append(client.trigger_dag(dag.dag_id))
        first = wait_completed(dag_runs, runs[0], resolver=resolver)
        second = wait_completed(dag_runs, runs[1], resolver=resolver)
        assert first["status"] == "failed"
        assert first["node_statuses"] == B_DEAD
        assert second["status"] == "success"
        assert second["node_statuses"] == dict.fromkeys("abcd", "success")
        assert worker.requests_of(runs[0], "d") == []
        assert len(worker.requests_of(runs[1], "d")) == 1
        # they really overlapped: the second run's A ran before the first run ended
        a2 = worker.requests_of(runs[1], "a")[0]
        assert a2["emitted_at_ms"] < first["at_ms"]


def test_a_cron_dag_starts_runs_on_time_and_skip_keeps_them_apart(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    resolver: ResolverProcess,
    client: JobClient,
    dag_runs: TopicReader,
) -> None:
    """Every second a run is due; a run takes ~1.5 s; overlap=skip: never two at once."""
    with sim_worker(settings, duration_s=0.5):
        client.create_dag(
            "every-second",
            [job("a"), job("b", "a"), job("c", "b")],
            schedule={"cron": "* * * * * *"},
            overlap="skip",
        )
        wait_for(
            lambda: sum(e["kind"] == "completed" for e in dag_runs.snapshot()) >= 3,
            30,
            "three runs of the cron DAG to end",
        )
    events = dag_runs.snapshot()
    starts = {e["dag_run_id"]: e["at_ms"] for e in events if e["kind"] == "started"}
    ends = {e["dag_run_id"]: e for e in events if e["kind"] == "completed"}
    ordered = sorted(starts, key=starts.__getitem__)
    for earlier, later in itertools.pairwise(ordered):
        assert earlier in ends, "a run started while the one before it was still going"
        assert starts[later] >= ends[earlier]["at_ms"] - 50  # clocks: same host
    for run_id, end in ends.items():
        assert end["status"] == "success", run_id
        assert end["node_statuses"] == dict.fromkeys("abc", "success")


def test_the_resolver_ignores_aborted_dead_letters(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    resolver: ResolverProcess,
    client: JobClient,
    dag_runs: TopicReader,
) -> None:
    """Dead letters come from scheduler transactions: an aborted one must not skip anything."""

    def outcome(request: dict[str, Any]) -> Any:
        return "hold" if request["dag_key"] == "a" else "success"

    with sim_worker(settings, outcome) as worker:
        dag = client.create_dag("aborted", DIAMOND)
        wait_known(settings, dag)
        run_id = client.trigger_dag(dag.dag_id)
        [a_request] = wait_for(lambda: worker.requests_of(run_id, "a"), 30, "A's request")
        producer = Producer(
            {"bootstrap.servers": settings.bootstrap_servers, "transactional.id": "t-abort"}
        )
        producer.init_transactions(10)
        producer.begin_transaction()
        dead = {
            "execution_id": a_request["execution_id"],
            "job_id": a_request["job_id"],
            "name": a_request["name"],
            "dead_at_ms": int(time.time() * 1000),
            "attempts": 1,
            "errors": [],
            "request": a_request,
            "dag_id": dag.dag_id,
            "dag_run_id": run_id,
        }
        topic = Topics(settings.topic_prefix).dlq
        producer.produce(topic, key=a_request["job_id"], value=Codec().encode("dead_letter", dead))
        producer.flush(10)
        producer.abort_transaction(10)
        _resolver_read_past(settings, topic, a_request["job_id"])
        # A's success now reaches the resolver after the aborted dead letter would have: had
        # the resolver taken it in, A would be dead and the run failed
        assert worker.release_held() == 1
        done = wait_completed(dag_runs, run_id, resolver=resolver)
        assert done["status"] == "success", done["node_statuses"]
        assert not any(e.get("node_status") == "dead" for e in run_events(dag_runs, run_id))


def _resolver_read_past(settings: CommonSettings, topic: str, key: str) -> None:
    """Wait until the resolver has read the partition of ``key`` in ``topic`` up to now: a
    record it cannot decode is sent behind everything there, and it parks a copy of it on
    the poison topic when it gets there (it reads a partition in order)."""
    marker = f"not a record: {uuid.uuid4()}".encode()
    poison = TopicReader(settings, [Topics(settings.topic_prefix).poison], None)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    try:
        producer.produce(topic, key=key, value=marker)  # the key's partition, as the original
        producer.flush(10)
        wait_for(
            lambda: any(m.value() == marker for m in list(poison.raw)),
            30,
            "the resolver to park the marker sent behind the aborted dead letter",
        )
    finally:
        poison.close()


def test_finished_runs_are_swept_from_the_resolver_tables(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    client: JobClient,
    dag_runs: TopicReader,
) -> None:
    env = {"DUETIME_RESOLVER_RETENTION_S": "1", "DUETIME_RESOLVER_SWEEP_INTERVAL_S": "0.5"}
    resolver = ResolverProcess(settings, env).start()
    changelog: TopicReader | None = None
    try:
        with sim_worker(settings):
            dag = client.create_dag("swept", DIAMOND)
            wait_known(settings, dag)
            run_id = client.trigger_dag(dag.dag_id)
            wait_completed(dag_runs, run_id, resolver=resolver)
            topic = f"{settings.topic_prefix}resolver-progress-changelog"  # made by the resolver
            changelog = TopicReader(settings, [topic], None)
            reader = changelog

            def tombstoned() -> bool:
                return any(
                    m.value() is None and run_id.encode() in (m.key() or b"")
                    for m in list(reader.raw)
                )

            wait_for(tombstoned, 20, "the run's progress to be swept (a tombstone)")
    finally:
        if changelog is not None:
            changelog.close()
        resolver.stop()
        delete_internal_topics(settings)
