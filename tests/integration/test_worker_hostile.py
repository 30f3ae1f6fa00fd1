"""A real worker (real broker and database) against hostile jobs: after each, it is still up
and a plain job still succeeds.

Most requests here are written straight to the execution topics, as a producer with broker
access could, past the API's validation: the worker must refuse them on its own.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from duetime.consumers.worker import metrics
from duetime.consumers.worker.policy import EgressPolicy
from duetime.core.config import CommonSettings
from duetime.core.models import ErrorReason
from duetime.core.topics import Topics, TopicSpec
from duetime.infra.topics import create_topics
from duetime.producers.sdk import JobClient
from duetime.schemas.codec import Codec
from tests.e2e.procs import Role, role_env
from tests.helpers import RunningScheduler, TopicReader, wait_for
from tests.integration import test_worker_support as support
from tests.integration.test_worker import committed, consumed_ends, final, worker_settings
from tests.integration.test_worker_support import RunningWorker, Sink

MOD = "tests.integration.test_worker_support"
EGRESS_DENIED = "egress_denied" if "egress_denied" in set(ErrorReason) else "error"


class Requests:
    """Writes execution requests to the execution topic directly (past the API)."""

    def __init__(self, settings: CommonSettings) -> None:
        self.topic = Topics(settings.topic_prefix).execution("normal")
        self.codec = Codec()
        # message.max.bytes: some requests here are as large as the topic takes (~1 MiB)
        self.producer = Producer(
            {"bootstrap.servers": settings.bootstrap_servers, "message.max.bytes": 2_000_000}
        )

    def send(self, target: dict[str, Any], payload: Any = None, **overrides: Any) -> str:
        job_id = str(uuid.uuid4())
        now_ms = int(time.time() * 1000)
        record = {
            "execution_id": str(uuid.uuid4()),
            "job_id": job_id,
            "name": "hostile",
            "attempt": 1,
            "scheduled_at_ms": now_ms,
            "due_at_ms": now_ms,
            "emitted_at_ms": now_ms,
            "priority": "normal",
            "target": target,
            "payload_json": json.dumps(payload),
            "timeout_s": 10.0,
            "trigger": "schedule",
            "dag_id": None,
            "dag_run_id": None,
            "dag_key": None,
        }
        record.update(overrides)
        self.producer.produce(self.topic, self.codec.encode("execution", record), job_id)
        self.producer.flush(10)
        return job_id


def http(url: str, headers: dict[str, str] | None = None, method: str = "POST") -> dict[str, Any]:
    return {"url": url, "method": method, "headers": headers or {}}


def python(ref: str) -> dict[str, Any]:
    return {"ref": ref}


def outcome(results: TopicReader, job_id: str) -> dict[str, Any]:
    [result] = final(results, job_id)
    return dict(result)


def still_serving(running: RunningWorker, requests: Requests, results: TopicReader) -> None:
    """The worker's loop is alive and a plain job still succeeds."""
    assert running.thread.is_alive(), "the worker's loop ended"
    job_id = requests.send(python(f"{MOD}:record"), {"plain": True})
    result = outcome(results, job_id)
    assert result["status"] == "success", result
    assert running.thread.is_alive()


def start(settings: CommonSettings, *, allowances: bool = True, **overrides: Any) -> RunningWorker:
    support.reset()
    running = RunningWorker(
        worker_settings(settings, **overrides),
        registry=support.REGISTRY,
        test_allowances=allowances,
    )
    wait_for(lambda: running.assigned() == 4 * settings.partitions, 30, "the worker's assignment")
    return running


@pytest.fixture
def requests(settings: CommonSettings) -> Requests:
    return Requests(settings)


@pytest.fixture
def worker(settings: CommonSettings) -> Iterator[RunningWorker]:
    running = start(settings, secrets={"SINK_TOKEN": "tok-4f9a1c77e2"})
    yield running
    running.stop()


# --- python -------------------------------------------------------------------------------


def test_refs_the_operator_did_not_allow_fail_permanently_and_import_nothing(
    worker: RunningWorker,
    requests: Requests,
    results: TopicReader,
    capfd: pytest.CaptureFixture[str],
) -> None:
    this_was_loaded = "this" in sys.modules
    refs = [
        "sys:exit",
        "this:s",
        "builtins:print",
        "os:path.__class__",
        "os:path.__class__.__subclasses__",
        f"{MOD}:time.sleep",  # an allowed module's import is not one of its tasks
        f"{MOD}:_LOCK",
    ]
    jobs = {ref: requests.send(python(ref), "marker-7d1e0b") for ref in refs}
    for ref, job_id in jobs.items():
        result = outcome(results, job_id)
        error = result["error"]
        assert result["status"] == "failure", (ref, result)
        assert error["reason"] == "unknown_target" and error["retryable"] is False, (ref, error)
        assert any(
            why in error["message"] for why in ("not allowed", "private", "reaches the module")
        ), error
    assert ("this" in sys.modules) == this_was_loaded, "'this' was imported"
    assert "marker-7d1e0b" not in capfd.readouterr().out, "builtins:print ran"
    still_serving(worker, requests, results)


@pytest.mark.parametrize(
    "task,raised",
    [
        ("exits", "SystemExit"),
        ("exits_async", "SystemExit"),
        ("interrupts", "KeyboardInterrupt"),
        ("interrupts_async", "KeyboardInterrupt"),
        ("generator_exit", "GeneratorExit"),
        ("cancels_itself", "CancelledError"),
    ],
)
def test_a_task_raising_what_would_end_the_worker_fails_its_attempt_for_good(
    worker: RunningWorker, requests: Requests, results: TopicReader, task: str, raised: str
) -> None:
    result = outcome(results, requests.send(python(f"{MOD}:{task}")))
    assert result["status"] == "failure"
    assert result["error"]["type"] == raised and result["error"]["retryable"] is False
    assert raised in result["error"]["message"]
    still_serving(worker, requests, results)


def test_a_task_ignoring_its_cancellation_times_out_and_frees_its_slot(
    settings: CommonSettings, requests: Requests, results: TopicReader
) -> None:
    running = start(settings, concurrency=1, buffer=10, critical_share=0.0)
    try:
        job_id = requests.send(python(f"{MOD}:ignores_cancellation"), {"for_s": 30}, timeout_s=0.3)
        result = outcome(results, job_id)
        assert result["error"]["reason"] == "timeout"
        # one slot: the plain job runs while the abandoned task is still looping
        still_serving(running, requests, results)
    finally:
        running.stop()


# --- kafka --------------------------------------------------------------------------------


def test_kafka_targets_never_publish_into_duetime_or_kafka_topics(
    settings: CommonSettings, worker: RunningWorker, requests: Requests, results: TopicReader
) -> None:
    topics = Topics(settings.topic_prefix)
    jobs_reader = TopicReader(settings, [topics.jobs], None)
    try:
        forbidden = [
            topics.jobs,
            topics.execution("critical"),
            "duetime.jobs",
            "__consumer_offsets",
        ]
        for topic in forbidden:
            error = outcome(results, requests.send({"topic": topic}, {"evil": 1}))["error"]
            assert error["reason"] == "unknown_target" and not error["retryable"], error
            assert topic in error["message"] and "never a target" in error["message"]
        still_serving(worker, requests, results)
        assert list(jobs_reader.raw) == [], "something was published into duetime's jobs"
    finally:
        jobs_reader.close()


def test_the_kafka_allow_list_admits_only_its_topics(
    settings: CommonSettings, requests: Requests, results: TopicReader
) -> None:
    name = settings.topic_prefix.rstrip(".")
    allowed, other = f"out-{name}", f"elsewhere-{name}"
    create_topics(settings.bootstrap_servers, [TopicSpec(t, 1, {}, None) for t in (allowed, other)])
    running = start(settings, kafka_topics=("out-*",))
    try:
        assert outcome(results, requests.send({"topic": allowed}, 1))["status"] == "success"
        error = outcome(results, requests.send({"topic": other}, 1))["error"]
        assert "DUETIME_WORKER_KAFKA_TOPICS" in error["message"]
    finally:
        running.stop()
        AdminClient({"bootstrap.servers": settings.bootstrap_servers}).delete_topics(
            [allowed, other]
        )


# --- http ---------------------------------------------------------------------------------


def test_metadata_and_link_local_targets_are_denied_whatever_the_headers(
    worker: RunningWorker, requests: Requests, results: TopicReader
) -> None:
    targets = [
        http("http://169.254.169.254/computeMetadata/v1/", {"Metadata-Flavor": "Google"}),
        http("http://[::ffff:169.254.169.254]/latest/meta-data/", method="GET"),
        http("http://0.0.0.0:80/"),
    ]
    for target in targets:
        error = outcome(results, requests.send(target))["error"]
        assert error["reason"] == EGRESS_DENIED and error["type"] == "EgressDenied", error
        assert error["retryable"] is False and "denied" in error["message"]
    still_serving(worker, requests, results)


def test_loopback_is_denied_without_the_allowance_by_address_and_by_name(
    settings: CommonSettings, sink: Sink, requests: Requests, results: TopicReader
) -> None:
    running = start(settings, allowances=False, python_modules=("tests",))
    try:
        port = sink.url.split(":")[2].split("/")[0]
        for url in (sink.url, f"http://localhost:{port}/hook", f"http://[::1]:{port}/hook"):
            error = outcome(results, requests.send(http(url)))["error"]
            assert error["reason"] == EGRESS_DENIED and "loopback" in error["message"], error
        for url in (f"http://127.1:{port}/hook", f"http://0x7f000001:{port}/hook"):
            error = outcome(results, requests.send(http(url)))["error"]
            assert error["retryable"] is False, error  # not canonical: no URL, or denied
        assert sink.deliveries == []
        still_serving(running, requests, results)
    finally:
        running.stop()


def test_loopback_by_name_is_reached_with_the_allowance(
    sink: Sink, worker: RunningWorker, requests: Requests, results: TopicReader
) -> None:
    assert worker.worker.settings.egress == EgressPolicy(loopback=True)
    port = sink.url.split(":")[2].split("/")[0]
    result = outcome(results, requests.send(http(f"http://localhost:{port}/hook")))
    assert result["status"] == "success", result


def test_framing_headers_and_redirects_are_refused_at_run_time(
    sink: Sink, worker: RunningWorker, requests: Requests, results: TopicReader
) -> None:
    for headers in (
        {"Host": "internal.example"},
        {"Transfer-Encoding": "chunked"},
        {"content-length": "0"},
        {"Proxy-Authorization": "x"},
        {"X-Split": "a\r\nHost: evil"},
    ):
        error = outcome(results, requests.send(http(sink.url, headers)))["error"]
        assert error["type"] == "InvalidTarget" and error["retryable"] is False, error
    # credentials both in the URL and in a header: aiohttp refuses to build the request
    both = http(sink.url.replace("http://", "http://u:pw-3b1f@"), {"Authorization": "Basic x"})
    error = outcome(results, requests.send(both))["error"]
    assert error["type"] == "InvalidTarget" and error["retryable"] is False, error
    assert "pw-3b1f" not in error["message"]
    assert sink.deliveries == []
    redirected = requests.send(http(sink.url), {"answer_status": 302, "answer_body": ""})
    error = outcome(results, redirected)["error"]
    assert error["reason"] == "http_status" and error["http_status"] == 302
    assert len(sink.deliveries) == 1, "the redirect was not followed"
    still_serving(worker, requests, results)


def test_a_failing_answer_is_summarised_never_stored_and_urls_are_redacted(
    sink: Sink,
    worker: RunningWorker,
    requests: Requests,
    results: TopicReader,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="duetime")
    body = "internal error; db password=hunter2-5e1d"
    url = sink.url.replace("http://", "http://alice:pw-8c2b77@") + "?api_key=key-19fd33&x=1"
    job_id = requests.send(http(url), {"answer_status": 500, "answer_body": body})
    error = outcome(results, job_id)["error"]
    assert error["reason"] == "http_status" and error["http_status"] == 500
    assert "answered 500" in error["message"] and f"{len(body)} bytes" in error["message"]
    assert "text/plain" in error["message"] and "api_key=***" in error["message"]
    [delivery] = sink.deliveries
    assert delivery.headers["Authorization"].startswith("Basic ")  # the userinfo still works
    everything = json.dumps(error) + caplog.text
    for secret in ("hunter2-5e1d", "pw-8c2b77", "key-19fd33"):
        assert secret not in everything, secret
    still_serving(worker, requests, results)


def test_dead_letters_and_logs_hold_no_response_body_nor_url_secret(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    sink: Sink,
    results: TopicReader,
    dlq: TopicReader,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="duetime")
    url = sink.url + "?api_key=key-77ab01"
    job = client.create_job(
        name="leaky",
        schedule={"at": "2020-01-01T00:00:00Z"},
        target={"type": "http", "url": url},
        payload={"answer_status": 503, "answer_body": "token=body-secret-0c3e"},
        retry={"max_retries": 0},
    )
    [dead] = wait_for(
        lambda: [d for d in dlq.snapshot() if d["job_id"] == job.job_id], 30, "the dead letter"
    )
    stored = json.dumps(dead["errors"]) + json.dumps(final(results, job.job_id))
    for secret in ("key-77ab01", "body-secret-0c3e"):
        assert secret not in stored and secret not in caplog.text, secret
    assert "answered 503" in stored


def test_a_secret_reference_reaches_the_sink_and_nothing_else(
    sink: Sink,
    worker: RunningWorker,
    requests: Requests,
    results: TopicReader,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="duetime")
    headers = {"Authorization": "Bearer ${secret:SINK_TOKEN}", "X-Team": "${secret:SINK_TOKEN}"}
    result = outcome(results, requests.send(http(sink.url, headers)))
    assert result["status"] == "success", result
    [delivery] = sink.deliveries
    assert delivery.headers["Authorization"] == "Bearer tok-4f9a1c77e2"
    assert delivery.headers["X-Team"] == "tok-4f9a1c77e2"
    missing = requests.send(http(sink.url, {"Authorization": "Bearer ${secret:NOT_HERE}"}))
    error = outcome(results, missing)["error"]
    assert error["type"] == "MissingSecret" and "NOT_HERE" in error["message"]
    assert error["retryable"] is False and len(sink.deliveries) == 1
    assert "tok-4f9a1c77e2" not in caplog.text + json.dumps(result) + json.dumps(error)
    still_serving(worker, requests, results)


# --- records that decode but no scheduler can have written --------------------------------


def test_requests_our_checks_refuse_are_parked_and_the_worker_goes_on(
    settings: CommonSettings, worker: RunningWorker, requests: Requests, results: TopicReader
) -> None:
    poison = TopicReader(settings, [Topics(settings.topic_prefix).poison], None)
    try:
        bad: list[dict[str, Any]] = [
            {"timeout_s": float("inf")},
            {"execution_id": f"urn:uuid:{uuid.uuid4()}"},  # uuid.UUID takes it, PostgreSQL not
            {"scheduled_at_ms": 2**62},
        ]
        for overrides in bad:
            requests.send(python(f"{MOD}:record"), **overrides)
        wait_for(lambda: len(poison.raw) == len(bad), 20, "the parked requests")
        still_serving(worker, requests, results)
    finally:
        poison.close()


def test_a_request_postgresql_refuses_is_parked_alone_and_its_batch_neighbours_run(
    settings: CommonSettings, worker: RunningWorker, requests: Requests, results: TopicReader
) -> None:
    """Stands in for any record our code or the database cannot take: a CHECK constraint
    makes PostgreSQL refuse one execution's lease. Before, the whole claim batch failed and
    the offsets of every request in it stayed uncommitted until the next rebalance."""
    cursed = str(uuid.uuid4())
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE leases ADD CONSTRAINT cursed CHECK (execution_id <> '{cursed}')")
    parked_before = metrics.HANDLING_ERRORS.labels(stage="execute")._value.get()
    poison = TopicReader(settings, [Topics(settings.topic_prefix).poison], None)
    try:
        plain = [requests.send(python(f"{MOD}:record"), i) for i in range(5)]
        requests.send(python(f"{MOD}:record"), "cursed", execution_id=cursed)
        plain += [requests.send(python(f"{MOD}:record"), i) for i in range(5, 10)]
        for job_id in plain:
            assert outcome(results, job_id)["status"] == "success"
        [parked] = wait_for(lambda: list(poison.raw), 20, "the refused request, parked")
        assert b"CheckViolation" in dict(parked.headers())["duetime-error"]
        assert metrics.HANDLING_ERRORS.labels(stage="execute")._value.get() == parked_before + 1
        topic = Topics(settings.topic_prefix).execution("normal")
        wait_for(
            lambda: committed(settings, topic) == consumed_ends(settings, topic),
            15,
            "every offset committed, the parked one included",
        )
        still_serving(worker, requests, results)
    finally:
        poison.close()


def test_a_result_the_broker_refuses_parks_its_request_instead_of_retrying_forever(
    settings: CommonSettings, worker: RunningWorker, requests: Requests, results: TopicReader
) -> None:
    """A request near the topic's size limit, mostly DAG fields (copied into its result),
    whose task returns 60 KB: the result exceeds the results topic's limit. Before, the worker
    retried publishing it every second, forever, and the partition's offsets never moved."""
    poison = TopicReader(settings, [Topics(settings.topic_prefix).poison], None)
    try:
        requests.send(python(f"{MOD}:big_output"), None, dag_key="k" * 1_000_000)
        [parked] = wait_for(lambda: list(poison.raw), 30, "the request, parked")
        assert b"refused the result" in dict(parked.headers())["duetime-error"]
        topic = Topics(settings.topic_prefix).execution("normal")
        wait_for(
            lambda: committed(settings, topic) == consumed_ends(settings, topic),
            15,
            "the parked request's offset committed",
        )
        still_serving(worker, requests, results)
    finally:
        poison.close()


def test_the_worker_process_outlives_tasks_that_exit(
    settings: CommonSettings, requests: Requests, results: TopicReader
) -> None:
    """As a real process (``duetime worker``): sys:exit and SystemExit/KeyboardInterrupt
    raised by tasks do not end it."""
    role = Role.start("hostile-worker", ["worker"], role_env(settings))
    try:
        wait_for(lambda: "assigned" in role.log(), 60, "the worker's assignment")
        for target in (
            python("sys:exit"),
            python(f"{MOD}:exits"),
            python(f"{MOD}:exits_async"),
            python(f"{MOD}:interrupts"),
        ):
            result = outcome(results, requests.send(target))
            assert result["status"] == "failure" and result["error"]["retryable"] is False
            assert role.process.poll() is None, role.log()[-3000:]
        result = outcome(results, requests.send(python(f"{MOD}:record"), "plain"))
        assert result["status"] == "success" and role.process.poll() is None
    finally:
        role.stop()
