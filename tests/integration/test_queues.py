"""Queues against the real broker and database (issue 14.1): ``duetime queues create|list``,
the 422 for a queue that does not exist (REST single, batch and PATCH; the SDK), a raw
definition naming a missing queue (the scheduler dead-letters its execution and the partition
goes on), lag in records per queue (transaction markers not counted), and the figures and
rows per queue. The two worker pools are the end-to-end test's (tests/e2e/test_queue_pools.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from duetime.cli import main as duetime_main
from duetime.consumers.worker.service import Worker
from duetime.consumers.worker.settings import WorkerSettings
from duetime.core.config import CommonSettings
from duetime.core.errors import ConfigError, ValidationError
from duetime.core.jobspec import build_job
from duetime.core.topics import Topics
from duetime.infra.queues import create_queue, list_queues
from duetime.producers.sdk import JobClient
from tests.helpers import TopicReader, wait_for
from tests.integration import test_api
from tests.integration.test_api import assert_error, job_body
from tests.integration.test_api_support import RunningApi, running_stack, table_counts
from tests.integration.test_cli import Cli

api = test_api.api  # the REST tests' in-process API (its fixture, re-exported)

PAST = {"at": "2020-01-01T00:00:00Z"}
FAR = {"at": "2099-01-01T00:00:00Z"}


@pytest.fixture
def queue(settings: CommonSettings) -> Iterator[str]:
    """A queue created for the test (its topics deleted after it)."""
    name = f"q{uuid.uuid4().hex[:6]}"
    done = create_queue(settings, name)
    assert sorted(done.created) == sorted(Topics(settings.topic_prefix).executions_of(name))
    yield name
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    for future in admin.delete_topics(Topics(settings.topic_prefix).executions_of(name)).values():
        with contextlib.suppress(Exception):
            future.result()


def test_queues_create_is_idempotent_and_list_shows_partitions_and_lag(
    settings: CommonSettings,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    again = create_queue(settings, queue)
    assert again.created == [] and len(again.existing) == 4
    rows = {r.queue: r for r in list_queues(settings, f"{settings.topic_prefix}workers")}
    assert set(rows) == {"default", queue} and rows[queue].complete
    lag = rows[queue].lag
    assert lag is not None and lag.partitions == settings.partitions and lag.lag == 0
    # the command itself, as an operator runs it
    for name, value in {
        "DUETIME_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
        "DUETIME_TOPIC_PREFIX": settings.topic_prefix,
        "DUETIME_PARTITIONS": str(settings.partitions),
        "DUETIME_DATABASE_URL": settings.database_url,
    }.items():
        monkeypatch.setenv(name, value)
    assert duetime_main(["queues", "create", queue]) == 0
    assert f"queue {queue}: 0 topics created, 4 already there" in capsys.readouterr().out
    assert duetime_main(["queues", "list"]) == 0
    out = capsys.readouterr().out
    assert queue in out and "default" in out
    assert duetime_main(["queues", "create", "Bad.Name"]) == 2
    assert "queue name" in capsys.readouterr().err
    assert duetime_main(["queues", "create", "other", "--partitions", "7"]) == 2
    assert "DUETIME_PARTITIONS" in capsys.readouterr().err


def test_a_job_naming_a_missing_queue_is_refused_with_422_and_nothing_is_written(
    settings: CommonSettings, api: RunningApi, client: JobClient, queue: str
) -> None:
    before = table_counts(settings)
    with api.client() as c:
        error = assert_error(c.post("/v1/jobs", json=job_body(schedule=FAR, queue="ghost")), 422)
        assert error["details"]["field"] == "queue" and "ghost" in error["message"]
        batch = c.post(
            "/v1/jobs:batch",
            json={"jobs": [job_body(schedule=FAR), job_body(schedule=FAR, queue="ghost")]},
        )
        assert "jobs[1]" in assert_error(batch, 422)["details"]["field"]
        assert table_counts(settings) == before
        # an existing queue is accepted, shown and filtered on
        created = c.post("/v1/jobs", json=job_body(schedule=FAR, queue=queue))
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        assert c.get(f"/v1/jobs/{job_id}").json()["queue"] == queue
        listed = c.get("/v1/jobs", params={"queue": queue}).json()["items"]
        assert [j["job_id"] for j in listed] == [job_id]
        assert c.get("/v1/jobs", params={"queue": "Bad.Name"}).status_code == 400
        # PATCH: to a missing queue 422, back to the default queue fine; other fields keep it
        bad = c.patch(f"/v1/jobs/{job_id}", json={"queue": "ghost"})
        assert assert_error(bad, 422)["details"]["field"] == "queue"
        r = c.patch(f"/v1/jobs/{job_id}", json={"payload": {"v": 2}})
        assert r.status_code == 200 and r.json()["queue"] == queue, r.text
        r = c.patch(f"/v1/jobs/{job_id}", json={"queue": "default"})
        assert r.status_code == 200 and r.json()["queue"] == "default", r.text
    with pytest.raises(ValidationError) as caught:
        client.create_job(job_body(schedule=FAR), queue="ghost")
    assert caught.value.details["field"] == "queue"
    assert client.create_job(job_body(schedule=FAR), queue=queue).definition.queue == queue


def test_a_raw_definition_naming_a_missing_queue_is_dead_lettered_and_the_partition_goes_on(
    settings: CommonSettings, scheduler: Any, client: JobClient, dlq: TopicReader, queue: str
) -> None:
    topics = Topics(settings.topic_prefix)
    requests = TopicReader(
        settings, [*topics.executions, *topics.executions_of(queue)], "execution"
    )
    try:
        # written past the SDK's check, as another service or an old client could: the same
        # job id's partition then gets a job in a queue that exists, which must still fire
        job_id = str(uuid.uuid4())
        ghost = build_job(
            {**job_body(schedule=PAST, job_id=job_id), "queue": "ghost"},
            now_ms=int(time.time() * 1000),
        )
        client.publish_definition(ghost)
        dead = wait_for(
            lambda: [d for d in dlq.snapshot() if d["job_id"] == job_id],
            60,
            "the dead letter of the execution whose queue is missing",
        )
        error = dead[0]["errors"][-1]["error"]
        assert error["type"] == "UnknownQueue" and "ghost" in error["message"]
        assert not error["retryable"]
        later = [
            client.create_job(job_body(schedule=PAST), queue=q).job_id for q in ("default", queue)
        ]

        def topics_of_later() -> dict[str, str]:
            got = {r["job_id"]: r["_topic"] for r in requests.snapshot() if r["job_id"] in later}
            return got if len(got) == 2 else {}

        got = wait_for(topics_of_later, 60, "the requests of the jobs after it")
        assert got == {
            later[0]: topics.execution("normal"),
            later[1]: topics.execution("normal", queue),
        }
        assert all(r["job_id"] != job_id for r in requests.snapshot())
    finally:
        requests.close()


def test_lag_per_queue_counts_requests_not_transaction_markers(
    settings: CommonSettings, api: RunningApi, scheduler: Any, client: JobClient, queue: str
) -> None:
    n = 7
    for i in range(n):
        client.create_job(job_body(schedule=PAST, name=f"lag-{i}"), queue=queue)

    def lag_of_queue() -> dict[str, Any]:
        with api.client() as c:
            body = c.get("/v1/stats/lag").json()
        found: dict[str, Any] = next((q for q in body["queues"] if q["queue"] == queue), {})
        return found if found.get("lag") == n else {}

    row: dict[str, Any] = wait_for(lag_of_queue, 60, f"the queue's lag to reach {n}")
    by_priority = {p["priority"]: p for p in row["priorities"]}
    normal = by_priority["normal"]
    assert normal["lag"] == n and normal["exact"] and not normal["committed"]
    # every request was written in a scheduler transaction: each one left a marker
    assert normal["end_offset"] > n
    with api.client() as c:
        body = c.get("/v1/stats/lag", params={"queue": queue}).json()
        assert [q["queue"] for q in body["queues"]] == [queue]
        assert all(p["lag"] == 0 for p in body["priorities"]) or body["priorities"] == []
        assert c.get("/v1/stats/lag", params={"queue": "nope"}).status_code == 404


def test_executions_are_projected_with_their_queue_and_counted_per_queue(
    settings: CommonSettings, api: RunningApi, client: JobClient, queue: str
) -> None:
    soon = {"at": (datetime.now(UTC) + timedelta(seconds=1)).isoformat()}
    with running_stack(settings) as sink:  # its worker serves the default queue only
        ran = client.create_job(job_body(schedule=soon, target={"type": "http", "url": sink.url}))
        waits = client.create_job(job_body(schedule=soon), queue=queue)

        def rows() -> dict[str, tuple[str, str]]:
            with psycopg.connect(settings.database_url) as conn:
                found = conn.execute(
                    "SELECT job_id::text, queue, status FROM executions WHERE job_id = ANY(%s)",
                    ([ran.job_id, waits.job_id],),
                ).fetchall()
            return {str(j): (str(q), str(s)) for j, q, s in found}

        def both() -> dict[str, tuple[str, str]]:
            found = rows()
            done = found.get(ran.job_id, ("", ""))[1] == "success" and waits.job_id in found
            return found if done else {}

        got = wait_for(both, 60, "both executions projected (one run, one waiting in its queue)")
        assert got == {ran.job_id: ("default", "success"), waits.job_id: (queue, "queued")}
        with api.client() as c:
            per_queue = {
                q: c.get("/v1/stats/executions", params={"queue": q}).json()
                for q in ("default", queue)
            }
            assert c.get("/v1/stats/executions", params={"queue": "A"}).status_code == 400
    assert per_queue[queue]["queue"] == queue
    done = {q: sum(b["outcomes"]["success"] for b in s["buckets"]) for q, s in per_queue.items()}
    assert done == {"default": 1, queue: 0}
    # each queue's one execution has a lateness (the waiting one's: until it was queued)
    assert {q: sum(b["started"] for b in s["buckets"]) for q, s in per_queue.items()} == {
        "default": 1,
        queue: 1,
    }


def test_the_cli_creates_lists_and_moves_jobs_by_queue(
    api: RunningApi, queue: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capsys)
    target = ("--url-target", "http://127.0.0.1:9/x", "--at", FAR["at"])
    made = cli.json("jobs", "create", "--name", "queued", *target, "--queue", queue)
    assert made["job_id"]
    listed = cli.json("jobs", "list", "--queue", queue)
    assert [j["job_id"] for j in listed] == [made["job_id"]]
    rc, _, err = cli("jobs", "create", "--name", "lost", *target, "--queue", "ghost")
    assert rc != 0 and "queue" in err and "ghost" in err
    moved = cli.json("jobs", "update", made["job_id"], "--queue", "default")
    assert moved["queue"] == "default"


def test_a_worker_serving_a_queue_without_topics_stops_at_start_naming_it(
    settings: CommonSettings, queue: str
) -> None:
    async def start(queues: tuple[str, ...]) -> None:
        worker = Worker(replace(WorkerSettings(common=settings), queues=queues))
        await worker.run()

    with pytest.raises(ConfigError) as caught:
        asyncio.run(start((queue, "ghost")))
    assert "ghost" in caught.value.message and queue not in caught.value.message
    assert caught.value.details["variable"] == "DUETIME_WORKER_QUEUES"
