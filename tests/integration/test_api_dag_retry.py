"""POST /v1/dags/{dag_id}/runs/{run_id}/retry and ``duetime dags retry`` against the real
broker and database: which runs may be repaired (404, 409 and 202, by the run's projected
status), and that an accepted retry is one ``retry`` event on the dag_runs topic for the
resolver. The runs are made by publishing their DagRunEvents, projected by a real projector:
the resolver's and the scheduler's part are tested in test_dag_repair.py and end to end in
tests/hostile/test_runtime_inputs.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from duetime.cli import main
from duetime.core.config import CommonSettings
from duetime.core.models import (
    DagRunEventKind,
    DagRunStatus,
    ErrorReason,
    Priority,
    Status,
    Trigger,
)
from duetime.core.records import (
    AttemptError,
    DagRunEvent,
    DeadLetter,
    ErrorInfo,
    ExecutionRequest,
    HttpTarget,
)
from duetime.core.topics import Topics
from duetime.schemas.codec import Codec
from tests.helpers import TopicReader, wait_for
from tests.integration.test_api_support import RunningApi
from tests.integration.test_projector_support import RunningProjector

TOKEN = "dag-retry-token-0123456789abcdef"
CHAIN = {"a": [], "b": ["a"], "c": ["b"]}


@pytest.fixture
def api(settings: CommonSettings) -> Iterator[RunningApi]:
    running = RunningApi(settings, tokens=(TOKEN,))
    projector = RunningProjector(settings)
    yield running
    projector.stop()
    running.stop()


def publish_dead_letter(settings: CommonSettings, dag_id: str, run_id: str, job_id: str) -> str:
    """The dead letter of ``job_id``'s execution in the run, as its scheduler writes it."""
    execution_id = str(uuid.uuid4())
    request = ExecutionRequest(
        execution_id=execution_id,
        job_id=job_id,
        name="member",
        attempt=1,
        scheduled_at_ms=1,
        due_at_ms=1,
        emitted_at_ms=1,
        priority=Priority.NORMAL,
        target=HttpTarget(url="http://127.0.0.1:9/hook"),
        payload_json="null",
        timeout_s=1.0,
        trigger=Trigger.RELEASE,
        dag_id=dag_id,
        dag_run_id=run_id,
    )
    error = ErrorInfo(type="E", message="down", retryable=False, reason=ErrorReason.ERROR)
    letter = DeadLetter(
        execution_id=execution_id,
        job_id=job_id,
        name="member",
        dead_at_ms=2,
        attempts=1,
        errors=[AttemptError(attempt=1, at_ms=2, error=error)],
        request=request,
        dag_id=dag_id,
        dag_run_id=run_id,
    )
    topic = Topics(settings.topic_prefix).dlq
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "acks": "all"})
    producer.produce(topic, key=job_id, value=Codec().dump(letter, topic=topic))
    assert producer.flush(10) == 0
    return execution_id


def publish_run(settings: CommonSettings, dag_id: str, status: str, nodes: dict[str, str]) -> str:
    """A run of the DAG as its started and (unless running) completed events say."""
    run_id = str(uuid.uuid4())
    codec, topic = Codec(), Topics(settings.topic_prefix).dag_runs
    events = [DagRunEvent(dag_id=dag_id, dag_run_id=run_id, kind=DagRunEventKind.STARTED,
                          at_ms=1, status=DagRunStatus.RUNNING)]  # fmt: skip
    if status != "running":
        events.append(
            DagRunEvent(
                dag_id=dag_id,
                dag_run_id=run_id,
                kind=DagRunEventKind.COMPLETED,
                at_ms=2,
                status=DagRunStatus(status),
                node_statuses={k: Status(s) for k, s in nodes.items()},
            )
        )
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "acks": "all"})
    for event in events:
        producer.produce(topic, key=dag_id, value=codec.dump(event, topic=topic))
    assert producer.flush(10) == 0
    return run_id


def test_which_runs_may_be_retried_and_what_is_published(
    settings: CommonSettings, api: RunningApi, capsys: pytest.CaptureFixture[str]
) -> None:
    retries = TopicReader(settings, [Topics(settings.topic_prefix).dag_runs], "dag_run")
    target = {"type": "http", "url": "http://127.0.0.1:9/hook"}
    jobs = [{"key": k, "name": k, "target": target, "depends_on": d} for k, d in CHAIN.items()]
    try:
        with api.client(TOKEN) as c:
            created = c.post("/v1/dags", json={"name": "retry-api", "jobs": jobs})
            assert created.status_code == 201, created.text
            dag_id = created.json()["dag_id"]
            dead = {"a": "dead", "b": "skipped", "c": "skipped"}
            cancelled = {"a": "success", "b": "cancelled", "c": "skipped"}
            succeeded = dict.fromkeys(CHAIN, "success")
            runs = {
                "failed": publish_run(settings, dag_id, "failed", dead),
                "success": publish_run(settings, dag_id, "success", succeeded),
                "cancelled": publish_run(settings, dag_id, "cancelled", cancelled),
                "running": publish_run(settings, dag_id, "running", {}),
            }

            def projected() -> bool:
                items = c.get(f"/v1/dags/{dag_id}/runs").json()["items"]
                return {i["dag_run_id"] for i in items if i["status"] != "running" or
                        i["dag_run_id"] == runs["running"]} == set(runs.values())  # fmt: skip

            wait_for(projected, 30, "the four runs to be projected")

            def retry(run_id: str, dag: str = dag_id) -> Any:
                return c.post(f"/v1/dags/{dag}/runs/{run_id}/retry")

            for what in ("success", "cancelled", "running"):
                answer = retry(runs[what])
                assert answer.status_code == 409, (what, answer.text)
                error = answer.json()["error"]
                assert error["code"] == "illegal_transition"
                assert error["details"]["status"] == what
            assert retry(str(uuid.uuid4())).status_code == 404  # an unknown run
            assert retry(runs["failed"], str(uuid.uuid4())).status_code == 404  # another DAG
            assert retry("not-a-uuid").status_code == 404
            accepted = retry(runs["failed"])
            assert accepted.status_code == 202, accepted.text
            assert accepted.json() == {
                "dag_id": dag_id,
                "dag_run_id": runs["failed"],
                "rerun": ["a"],
                "reblock": ["b", "c"],
                "already_requested": False,  # no dead letter to claim: the resolver dedups
            }

            # the CLI says the same (one more request: the resolver applies a repair once)
            rc = main(["dags", "retry", dag_id, runs["failed"], "--url", api.url,
                       "--token", TOKEN, "--json"])  # fmt: skip
            out = capsys.readouterr().out
            assert rc == 0, out
            assert json.loads(out)["rerun"] == ["a"]
            assert json.loads(out)["reblock"] == ["b", "c"]
            rc = main(["dags", "retry", dag_id, runs["success"], "--url", api.url,
                       "--token", TOKEN])  # fmt: skip
            assert rc != 0
            assert "succeeded" in capsys.readouterr().err

        def requests() -> list[dict[str, Any]]:
            return [e for e in retries.snapshot() if e["kind"] == "retry"]

        wait_for(lambda: len(requests()) == 2, 30, "the two retry events")
        for event in requests():
            assert (event["dag_id"], event["dag_run_id"]) == (dag_id, runs["failed"])
            assert event["node_key"] is None and event["request_id"]
    finally:
        retries.close()


def test_dead_letters_make_a_retry_idempotent_and_a_replay_repairs_its_run(
    settings: CommonSettings, api: RunningApi
) -> None:
    """A retry claims the run's dead letters: a second retry asks nothing new. A replay of a
    member's dead letter (POST /v1/dlq/{id}/replay) carries its run, so that the member's
    scheduler repairs the run instead of running the job alone."""
    topics = Topics(settings.topic_prefix)
    control = TopicReader(settings, [topics.control], "control")
    target = {"type": "http", "url": "http://127.0.0.1:9/hook"}
    jobs = [{"key": k, "name": k, "target": target, "depends_on": d} for k, d in CHAIN.items()]
    dead = {"a": "dead", "b": "skipped", "c": "skipped"}
    try:
        with api.client(TOKEN) as c:
            created = c.post("/v1/dags", json={"name": "retry-letters", "jobs": jobs})
            assert created.status_code == 201, created.text
            dag_id, job_ids = created.json()["dag_id"], created.json()["job_ids"]
            retried = publish_run(settings, dag_id, "failed", dead)
            replayed = publish_run(settings, dag_id, "failed", dead)
            publish_dead_letter(settings, dag_id, retried, job_ids["a"])
            letter = publish_dead_letter(settings, dag_id, replayed, job_ids["a"])
            wait_for(
                lambda: len(c.get("/v1/dlq", params={"job_id": job_ids["a"]}).json()["items"]) == 2,
                30,
                "both dead letters projected",
            )

            # the runs are in another topic: projected in no particular order with the letters
            def failed_runs() -> set[str]:
                items = c.get(f"/v1/dags/{dag_id}/runs").json()["items"]
                return {i["dag_run_id"] for i in items if i["status"] == "failed"}

            wait_for(lambda: {retried, replayed} <= failed_runs(), 30, "both runs projected")
            first = c.post(f"/v1/dags/{dag_id}/runs/{retried}/retry")
            assert first.status_code == 202 and not first.json()["already_requested"], first.text
            second = c.post(f"/v1/dags/{dag_id}/runs/{retried}/retry")
            assert second.status_code == 202 and second.json()["already_requested"], second.text
            assert second.json()["rerun"] == ["a"]
            replay = c.post(f"/v1/dlq/{letter}/replay")
            assert replay.status_code == 202, replay.text

        def replays() -> list[dict[str, Any]]:
            return [m for m in control.snapshot() if m["kind"] == "replay"]

        [command] = wait_for(replays, 30, "the replay command")
        assert (command["job_id"], command["execution_id"]) == (job_ids["a"], letter)
        assert command["dag_run_id"] == replayed
    finally:
        control.close()
