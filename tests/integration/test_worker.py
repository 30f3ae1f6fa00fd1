"""The worker against the real broker and database, with an in-process scheduler.

Targets (HTTP request shape, Python contexts and typed exceptions, Kafka), retries with the
job's policy, the dead-letter topic and replay, timeouts, unknown targets, poison records, a
redelivered finished execution, graceful hand-back, and offsets committed only after results.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from duetime.consumers.worker.settings import WorkerSettings
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics, TopicSpec
from duetime.infra import harness
from duetime.infra.topics import create_topics
from duetime.producers.sdk import JobClient
from tests.helpers import RunningScheduler, TopicReader, committed_offsets, wait_for
from tests.integration import test_worker_support as support
from tests.integration.test_projector_support import project_all
from tests.integration.test_worker_support import RunningWorker, Sink

NOW = {"at": "2020-01-01T00:00:00Z"}  # a past one-time schedule: runs at once
MOD = "tests.integration.test_worker_support"


def worker_settings(settings: CommonSettings, **overrides: Any) -> WorkerSettings:
    base: dict[str, Any] = {
        "concurrency": 20,
        "buffer": 200,
        "lease_ttl_s": 3.0,
        "shutdown_s": 2.0,
        "commit_interval_s": 0.1,
        "running_event_after_s": 0.0,  # the tests look at every running event
        # requests are often written right after the worker's assignment, before its first
        # fetch resolves a new group's start offset: "end" would skip them (a race)
        "new_group_start": "beginning",
    }
    base.update(overrides)
    return WorkerSettings(common=settings, **base)


def start_worker(
    settings: CommonSettings, name: str | None = None, **overrides: Any
) -> RunningWorker:
    common = settings if name is None else replace(settings, instance_id=name)
    running = RunningWorker(worker_settings(common, **overrides), registry=support.REGISTRY)
    wait_for(lambda: running.assigned() == 4 * settings.partitions, 30, "the worker's assignment")
    return running


@pytest.fixture
def worker(settings: CommonSettings) -> Iterator[RunningWorker]:
    support.reset()
    running = start_worker(settings)
    yield running
    running.stop()


def of_job(reader: TopicReader, job_id: str, status: str | None = None) -> list[dict[str, Any]]:
    return [
        r
        for r in reader.snapshot()
        if r["job_id"] == job_id and (status is None or r["status"] == status)
    ]


def final(reader: TopicReader, job_id: str, n: int = 1, timeout_s: float = 30) -> list[Any]:
    """Wait for ``n`` non-running results of ``job_id``."""

    def finals() -> list[dict[str, Any]]:
        got = [r for r in of_job(reader, job_id) if r["status"] != "running"]
        return got if len(got) >= n else []

    return wait_for(finals, timeout_s, f"{n} final results of job {job_id}")


def committed(settings: CommonSettings, topic: str) -> int:
    """Sum of the worker group's committed offsets over ``topic``'s partitions."""
    group = f"{settings.topic_prefix}workers"
    parts = [(topic, p) for p in range(settings.partitions)]
    offsets = committed_offsets(settings.bootstrap_servers, group, parts)
    return sum(max(0, offset) for offset in offsets.values())


def consumed_ends(settings: CommonSettings, topic: str) -> int:
    """Sum over ``topic``'s partitions of (offset of its last record + 1): what a consumer
    that finished everything commits (transaction markers after it do not count)."""
    consumer = harness.reader(settings.bootstrap_servers, "test-ends")
    try:
        harness.assign_all(consumer, [topic], 10)
        parts = consumer.assignment()
        # read up to the end each partition had when we asked (markers included)
        ends = {
            tp.partition: consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            for tp in parts
        }
        last: dict[int, int] = {}

        def caught_up() -> bool:
            for msg in consumer.consume(500, 0.1):
                partition, offset = msg.partition(), msg.offset()
                if msg.error() is None and partition is not None and offset is not None:
                    last[partition] = max(last.get(partition, 0), offset + 1)
            return all(
                ends[tp.partition] == 0 or tp.offset >= ends[tp.partition]
                for tp in consumer.position(parts)
            )

        wait_for(caught_up, 10, f"reading {topic} to its end")
        return sum(last.values())
    finally:
        consumer.close()


def lease_row(settings: CommonSettings, execution_id: str) -> tuple[Any, ...] | None:
    with psycopg.connect(settings.database_url) as conn:
        return conn.execute(
            "SELECT attempt, owner, fencing_token, state, outcome, expires_at <= now() "
            "FROM leases WHERE execution_id = %s",
            (execution_id,),
        ).fetchone()


# --- HTTP ---------------------------------------------------------------------------------


def test_http_target_gets_the_documented_request_and_offsets_follow_results(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    sink: Sink,
    results: TopicReader,
) -> None:
    job = client.create_job(
        name="hook",
        schedule=NOW,
        target={"type": "http", "url": sink.url, "headers": {"X-Team": "billing"}},
        payload={"invoice": 42},
    )
    [result] = final(results, job.job_id)
    assert result["status"] == "success", result
    [running] = of_job(results, job.job_id, "running")
    execution_id = result["execution_id"]
    assert running["lease_token"] == result["lease_token"] > 0
    assert result["worker_id"] == worker.worker.worker_id
    assert result["started_at_ms"] <= result["finished_at_ms"]
    assert json.loads(result["output_json"]) == {"http_status": 200}

    [delivery] = sink.of_key(execution_id)
    assert delivery.headers["Idempotency-Key"] == execution_id
    assert delivery.headers["X-Duetime-Job-Id"] == job.job_id
    assert delivery.headers["X-Duetime-Attempt"] == "1"
    assert delivery.headers["X-Team"] == "billing"
    assert delivery.headers["Content-Type"] == "application/json"
    body = delivery.body
    assert set(body) == {"job_id", "execution_id", "attempt", "scheduled_at", "payload"}
    assert body["payload"] == {"invoice": 42} and body["attempt"] == 1
    scheduled = datetime.fromisoformat(body["scheduled_at"].replace("Z", "+00:00"))
    assert int(scheduled.timestamp() * 1000) == result["scheduled_at_ms"]

    row = lease_row(settings, execution_id)
    assert row is not None and row[3:5] == ("done", "success")
    assert row[2] == result["lease_token"]
    topic = Topics(settings.topic_prefix).execution("normal")
    wait_for(
        lambda: committed(settings, topic) == consumed_ends(settings, topic) == 1,
        10,
        "the request's offset to be committed after its result",
    )


def test_fail_twice_then_succeed_takes_three_attempts_with_policy_delays(
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    sink: Sink,
    results: TopicReader,
) -> None:
    job = client.create_job(
        name="flaky",
        schedule=NOW,
        target={"type": "http", "url": sink.url},
        payload={"fail_times": 2},
        retry={"max_retries": 3, "base_delay_s": 0.2, "jitter": False},
    )
    outcomes = final(results, job.job_id, n=3)
    assert [(r["attempt"], r["status"]) for r in outcomes] == [
        (1, "failure"),
        (2, "failure"),
        (3, "success"),
    ]
    assert outcomes[0]["error"]["reason"] == "http_status"
    assert outcomes[0]["error"]["http_status"] == 500 and outcomes[0]["error"]["retryable"]
    assert len({r["execution_id"] for r in outcomes}) == 1  # one execution, three attempts
    deliveries = sink.of_key(outcomes[0]["execution_id"])
    assert [d.attempt for d in deliveries] == [1, 2, 3]
    # the next attempt starts no earlier than the policy's delay after the failure
    for failed, nxt, delay_s in ((outcomes[0], outcomes[1], 0.2), (outcomes[1], outcomes[2], 0.4)):
        waited_s = (nxt["started_at_ms"] - failed["finished_at_ms"]) / 1000
        assert delay_s - 0.02 <= waited_s < delay_s + 5, (delay_s, waited_s)
    assert sink.effects[outcomes[0]["execution_id"]] == 1


def test_always_failing_target_goes_dead_then_replay_after_the_fix_succeeds(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    sink: Sink,
    results: TopicReader,
    dlq: TopicReader,
) -> None:
    sink.broken = True
    job = client.create_job(
        name="broken",
        schedule=NOW,
        target={"type": "http", "url": sink.url},
        payload={"status": 502},
        retry={"max_retries": 2, "base_delay_s": 0.1, "jitter": False},
    )
    outcomes = final(results, job.job_id, n=3)
    assert [r["status"] for r in outcomes] == ["failure"] * 3
    [dead] = wait_for(
        lambda: [d for d in dlq.snapshot() if d["job_id"] == job.job_id], 15, "the dead letter"
    )
    assert dead["attempts"] == 3
    assert [e["attempt"] for e in dead["errors"]] == [1, 2, 3]
    assert all(e["error"]["http_status"] == 502 for e in dead["errors"])
    assert {e["worker_id"] for e in dead["errors"]} == {worker.worker.worker_id}
    project_all(settings)  # the projector's dead-letter table, for `duetime dlq list`
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute(
            "SELECT attempts, jsonb_array_length(errors) FROM dead_letters WHERE execution_id = %s",
            (dead["execution_id"],),
        ).fetchone()
    assert row == (3, 3)

    sink.broken = False
    client.replay(job.job_id, dead["execution_id"])
    [replayed] = wait_for(
        lambda: of_job(results, job.job_id, "success"), 20, "the replayed execution's success"
    )
    assert replayed["execution_id"] != dead["execution_id"]  # a new series of attempts
    assert sink.effects[replayed["execution_id"]] == 1


# --- Python and Kafka targets -------------------------------------------------------------


def test_python_targets_get_their_context_and_steer_their_outcome(
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    results: TopicReader,
    dlq: TopicReader,
) -> None:
    retry = {"max_retries": 3, "base_delay_s": 5.0, "jitter": False}
    by_ref = client.create_job(
        name="by-ref",
        schedule=NOW,
        target={"type": "python", "ref": f"{MOD}:record"},
        payload={"n": 1},
        priority="high",
    )
    by_name = client.create_job(
        name="by-name",
        schedule=NOW,
        target={"type": "python", "ref": "test.echo"},
        payload={"n": 2},
    )
    later = client.create_job(
        name="later",
        schedule=NOW,
        target={"type": "python", "ref": f"{MOD}:retry_later"},
        retry=retry,
    )
    void = client.create_job(
        name="void",
        schedule=NOW,
        target={"type": "python", "ref": f"{MOD}:give_up"},
        retry=retry,
    )
    [r1] = final(results, by_ref.job_id)
    assert r1["status"] == "success" and json.loads(r1["output_json"]) == {"echo": {"n": 1}}
    [ctx] = support.CALLS[by_ref.job_id]
    assert (ctx.execution_id, ctx.attempt, ctx.payload) == (r1["execution_id"], 1, {"n": 1})
    assert (
        ctx.priority == "high"
        and ctx.scheduled_at.timestamp() * 1000 == r1["scheduled_at_ms"]
        and ctx.name == "by-ref"
    )

    [r2] = final(results, by_name.job_id)
    assert json.loads(r2["output_json"])["payload"] == {"n": 2}

    # RetryLater(delay_s=0.3) overrides the policy's 5 s base delay
    first, second = final(results, later.job_id, n=2)
    assert first["status"] == "failure" and first["retry_after_s"] == pytest.approx(0.3)
    assert first["error"]["retryable"] and second["status"] == "success"
    assert (second["started_at_ms"] - first["finished_at_ms"]) / 1000 < 4.0

    # FailPermanently: dead after one attempt, no retry loop
    [gone] = final(results, void.job_id)
    assert gone["error"]["retryable"] is False and gone["error"]["type"] == "FailPermanently"
    wait_for(lambda: [d for d in dlq.snapshot() if d["job_id"] == void.job_id], 15, "dead letter")
    time.sleep(0.5)  # the subject: no retry follows within 0.5 s
    assert len(final(results, void.job_id)) == 1


def test_kafka_target_publishes_the_payload_keyed_by_job_with_the_execution_id(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    results: TopicReader,
) -> None:
    # a user's topic: not under duetime's prefix, where targets may not publish
    topic = f"user-sink-{settings.topic_prefix.rstrip('.')}"
    create_topics(settings.bootstrap_servers, [TopicSpec(topic, 1, {}, None)])
    reader = TopicReader(settings, [topic], None)
    try:
        job = client.create_job(
            name="to-kafka",
            schedule=NOW,
            target={"type": "kafka", "topic": topic},
            payload={"hello": "kafka"},
        )
        [result] = final(results, job.job_id)
        assert result["status"] == "success"
        [msg] = wait_for(lambda: list(reader.raw), 10, "the published payload")
        assert json.loads(msg.value()) == {"hello": "kafka"}
        assert msg.key().decode() == job.job_id
        assert dict(msg.headers())["execution_id"].decode() == result["execution_id"]
    finally:
        reader.close()


# --- failures the worker decides ----------------------------------------------------------


def test_timeouts_fail_the_attempt_with_reason_timeout(
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    sink: Sink,
    results: TopicReader,
) -> None:
    jobs = [
        client.create_job(
            name=f"slow-{kind}",
            schedule=NOW,
            target={"type": "python", "ref": f"{MOD}:slow_{kind}"},
            payload={"sleep_s": 30},
            timeout_s=0.5,
            retry={"max_retries": 0},
        )
        for kind in ("async", "sync")
    ] + [
        client.create_job(
            name="slow-http",
            schedule=NOW,
            target={"type": "http", "url": sink.url},
            payload={"sleep_s": 5},
            timeout_s=0.5,
            retry={"max_retries": 0},
        )
    ]
    for job in jobs:
        [r] = final(results, job.job_id)
        assert r["status"] == "failure", r
        assert r["error"]["reason"] == "timeout" and r["error"]["retryable"], r
        assert 0.4 <= (r["finished_at_ms"] - r["started_at_ms"]) / 1000 < 3.0


def test_unknown_targets_fail_permanently_without_a_retry_loop(
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    results: TopicReader,
    dlq: TopicReader,
) -> None:
    retry = {"max_retries": 5, "base_delay_s": 0.1}
    targets = [
        {"type": "python", "ref": "no_such_module.anywhere:run"},
        {"type": "python", "ref": f"{MOD}:no_such_function"},
        {"type": "python", "ref": "not.registered"},
        {"type": "kafka", "topic": "no-such-topic-anywhere"},
    ]
    jobs = [
        client.create_job(name=f"unknown-{i}", schedule=NOW, target=t, retry=retry)
        for i, t in enumerate(targets)
    ]
    for job in jobs:
        [r] = final(results, job.job_id)
        assert r["error"]["reason"] == "unknown_target", r
        assert r["error"]["retryable"] is False
    wait_for(
        lambda: {d["job_id"] for d in dlq.snapshot()} >= {j.job_id for j in jobs}, 15, "4 deads"
    )
    time.sleep(0.5)  # the subject: no retry follows within 0.5 s
    assert all(len(final(results, j.job_id)) == 1 for j in jobs)


def test_poison_records_are_parked_with_their_context_and_the_partition_moves_on(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    results: TopicReader,
) -> None:
    topics = Topics(settings.topic_prefix)
    poison = TopicReader(settings, [topics.poison], None)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    try:
        for p in range(settings.partitions):
            producer.produce(
                topics.execution("normal"),
                b"\xd7garbage",
                key=b"k",
                partition=p,
                headers=[("origin", b"test")],
            )
        producer.flush(10)
        job = client.create_job(
            name="after-poison", schedule=NOW, target={"type": "python", "ref": f"{MOD}:record"}
        )
        final(results, job.job_id)
        parked = wait_for(
            lambda: list(poison.raw) if len(poison.raw) == settings.partitions else [],
            15,
            "a parked copy of each poison record",
        )
        for msg in parked:
            headers = dict(msg.headers())
            assert msg.value() == b"\xd7garbage" and msg.key() == b"k"
            assert headers["origin"] == b"test"
            assert headers["duetime-source-topic"].decode() == topics.execution("normal")
            assert int(headers["duetime-source-partition"]) == msg.partition()
            assert headers["duetime-source-offset"] == b"0"
            assert b"undecodable" in headers["duetime-error"]
        expected = consumed_ends(settings, topics.execution("normal"))
        assert expected == settings.partitions + 1
        wait_for(
            lambda: committed(settings, topics.execution("normal")) == expected,
            10,
            "offsets past the poison records",
        )
    finally:
        poison.close()


def test_a_redelivered_finished_execution_is_not_run_again(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    sink: Sink,
    results: TopicReader,
) -> None:
    topics = Topics(settings.topic_prefix)
    requests = TopicReader(settings, topics.executions, "execution")
    try:
        job = client.create_job(name="once", schedule=NOW, target={"type": "http", "url": sink.url})
        [first] = final(results, job.job_id)
        [raw] = wait_for(
            lambda: [m for m in list(requests.raw) if (m.key() or b"").decode() == job.job_id],
            10,
            "the execution request on its topic",
        )
        producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
        producer.produce(raw.topic(), raw.value(), raw.key(), partition=raw.partition())
        producer.flush(10)
        first, again = final(results, job.job_id, n=2)  # the recorded result, published again
        assert again["execution_id"] == first["execution_id"]
        assert again["lease_token"] == first["lease_token"]
        time.sleep(0.3)  # the subject: no second run within 0.3 s
        assert len(sink.of_key(first["execution_id"])) == 1  # ran once
    finally:
        requests.close()


def test_shutdown_hands_running_work_back_with_its_lease_released(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    client: JobClient,
    results: TopicReader,
) -> None:
    support.reset()
    first = start_worker(settings, "worker-a", lease_ttl_s=20.0, shutdown_s=0.3)
    job = client.create_job(
        name="long",
        schedule=NOW,
        target={"type": "python", "ref": f"{MOD}:slow_async"},
        payload={"sleep_s": 3},
        timeout_s=30,
    )
    [running] = wait_for(lambda: of_job(results, job.job_id, "running"), 20, "the first start")
    stopped_at = time.monotonic()
    first.stop()
    row = lease_row(settings, running["execution_id"])
    assert row is not None and row[3] == "held" and row[5], "released: expired at once"
    second = start_worker(settings, "worker-b", lease_ttl_s=20.0)
    try:
        [done] = final(results, job.job_id, timeout_s=30)
        assert done["status"] == "success" and done["worker_id"] == second.worker.worker_id
        assert done["lease_token"] > running["lease_token"]
        # the second worker did not wait for the 20 s TTL of the handed-back lease
        assert time.monotonic() - stopped_at < 15
    finally:
        second.stop()
