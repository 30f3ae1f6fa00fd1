"""``POST /v1/jobs:batch`` (issue 15: the API's create path) against the real broker and
database: all or none, each job validated as a single create validates it, idempotent per
job id, and the jobs run (scheduler, worker and projector running)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import psycopg
import pytest

from duetime.core.config import CommonSettings
from duetime.core.errors import NotFound, ValidationError
from duetime.core.topics import Topics
from duetime.producers.api.batch import MAX_BATCH
from duetime.producers.sdk import JobClient
from tests.helpers import wait_for
from tests.integration import test_api
from tests.integration.test_api import assert_error, job_body
from tests.integration.test_api_support import RunningApi, settle, topic_record_count
from tests.integration.test_worker_support import Sink

PAST = {"at": "2020-01-01T00:00:00Z"}
FAR = {"at": "2099-01-01T00:00:00Z"}
URL = "http://127.0.0.1:9/hook"

api = test_api.api
stack = test_api.stack


def rows(settings: CommonSettings, job_ids: list[str]) -> set[str]:
    with psycopg.connect(settings.database_url) as conn:
        found = conn.execute(
            "SELECT job_id::text FROM jobs WHERE job_id = ANY(%s::uuid[])", (job_ids,)
        ).fetchall()
    return {r[0] for r in found}


def batch(c: httpx.Client, jobs: list[Any]) -> httpx.Response:
    return c.post("/v1/jobs:batch", json={"jobs": jobs})


def test_a_batch_creates_every_job_once_and_they_run(
    settings: CommonSettings, api: RunningApi, stack: Sink
) -> None:
    jobs = [
        job_body(
            job_id=str(uuid.uuid4()),
            name=f"batch-{i}",
            schedule=PAST,
            target={"type": "http", "url": stack.url},
        )
        for i in range(40)
    ]
    ids = [j["job_id"] for j in jobs]
    with api.client() as c:
        r = batch(c, jobs)
        assert r.status_code == 201, r.text
        items = r.json()["items"]
        assert [i["job_id"] for i in items] == ids  # in the request's order
        assert all(i["created"] and i["status"] == "pending" for i in items)
        # every job reaches the sink once
        wait_for(
            lambda: ids_delivered(stack) >= set(ids), 60, "every job of the batch to be delivered"
        )
        # the jobs ran: their results still change states; the jobs topic is what a create
        # writes
        jobs_topic = [Topics(settings.topic_prefix).jobs]
        records = topic_record_count(settings, jobs_topic)
        again = batch(c, jobs)  # the same batch again: answered as it is, nothing published
        assert again.status_code == 200, again.text
        assert [i["created"] for i in again.json()["items"]] == [False] * len(jobs)
        settle()
        assert topic_record_count(settings, jobs_topic) == records
    with stack.lock:
        counts = [sum(1 for d in stack.deliveries if d.job_id == j) for j in ids]
    assert counts == [1] * len(ids)


def ids_delivered(sink: Sink) -> set[str]:
    with sink.lock:
        return {d.job_id for d in sink.deliveries}


def test_an_invalid_job_or_a_repeated_id_refuses_the_whole_batch(
    settings: CommonSettings, api: RunningApi
) -> None:
    good = [job_body(job_id=str(uuid.uuid4()), schedule=FAR) for _ in range(5)]
    bad_target = job_body(job_id=str(uuid.uuid4()), target={"type": "http", "url": "ftp://x"})
    repeated = dict(good[0], name="same id, other name")
    records = topic_record_count(settings)
    with api.client() as c:
        err = assert_error(batch(c, [*good, bad_target, "not an object", repeated]), 422)
    problems = err["details"]["errors"]
    assert [p["index"] for p in problems] == [5, 6, 7], problems
    assert "target" in problems[0].get("field", "") + problems[0]["message"]
    assert "jobs[0]" in problems[2]["message"]
    assert err["details"]["invalid"] == 3
    settle()
    assert rows(settings, [j["job_id"] for j in good]) == set()
    assert topic_record_count(settings) == records


def test_an_existing_job_with_another_body_refuses_the_whole_batch(
    settings: CommonSettings, api: RunningApi
) -> None:
    existing = job_body(job_id=str(uuid.uuid4()), schedule=FAR)
    with api.client() as c:
        assert c.post("/v1/jobs", json=existing).status_code == 201
        records = topic_record_count(settings)
        fresh = [job_body(job_id=str(uuid.uuid4()), schedule=FAR) for _ in range(3)]
        err = assert_error(batch(c, [*fresh, dict(existing, name="changed")]), 409)
    assert err["details"] == {"index": 3, "job_id": existing["job_id"]}
    settle()
    assert rows(settings, [j["job_id"] for j in fresh]) == set()  # rolled back
    assert topic_record_count(settings) == records


def test_the_batch_shape_is_checked(api: RunningApi) -> None:
    one = job_body(schedule=FAR)
    with api.client() as c:
        shapes: list[Any] = [[one], {"jobs": []}, {"jobs": one}, {"jobs": [one], "more": 1}]
        for body in shapes:
            assert_error(c.post("/v1/jobs:batch", json=body), 422)
        too_many = {"jobs": [{"name": "x"}] * (MAX_BATCH + 1)}
        err = assert_error(c.post("/v1/jobs:batch", json=too_many), 422)
        assert str(MAX_BATCH) in err["message"]
        doc = c.get("/openapi.json").json()
        assert "/v1/jobs:batch" in doc["paths"]


def test_the_sdk_creates_many_with_one_wait_or_none(settings: CommonSettings) -> None:
    specs = [
        {"name": f"sdk-batch-{i}", "schedule": FAR, "target": {"type": "http", "url": URL}}
        for i in range(3)
    ]
    with JobClient(settings=settings) as client:
        records = topic_record_count(settings)
        with pytest.raises(ValidationError) as refused:
            client.create_jobs([specs[0], {**specs[1], "timeout_s": -1}, specs[2]])
        assert "jobs[1]" in refused.value.message and "timeout_s" in refused.value.message
        assert topic_record_count(settings) == records  # nothing published
        created = client.create_jobs(specs)
    assert len({c.job_id for c in created}) == 3
    assert topic_record_count(settings) == records + 3


def test_sdk_commands_for_an_unknown_job_raise_when_the_client_checks(
    settings: CommonSettings, api: RunningApi
) -> None:
    """Issue 16: ``pause()`` of an unknown job id raised nothing and was held forever."""
    known = job_body(job_id=str(uuid.uuid4()), schedule=FAR)
    with api.client() as c:
        assert c.post("/v1/jobs", json=known).status_code == 201
    records = topic_record_count(settings)
    with JobClient(settings=settings, check_existing=True) as client:
        for command in (client.pause, client.resume, client.cancel, client.trigger):
            with pytest.raises(NotFound) as raised:
                command(str(uuid.uuid4()))
            assert "nothing was sent" in raised.value.message
        assert topic_record_count(settings) == records
        client.pause(known["job_id"])
    assert topic_record_count(settings) == records + 1
