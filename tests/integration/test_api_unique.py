"""Unique jobs and debounce on ``POST /v1/jobs`` (issue 18, item 3) against the real broker and
database: concurrent creates of one key from threads make one job (unique) or leave exactly one
job to run (debounce); the key's window ends; what is invalid is refused and writes nothing."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import psycopg

from duetime.core.config import CommonSettings
from tests.helpers import wait_for
from tests.integration import test_api
from tests.integration.test_api import assert_error
from tests.integration.test_api_support import RunningApi
from tests.integration.test_worker_support import Sink

FAR = {"at": "2099-01-01T00:00:00Z"}
THREADS = 8

api = test_api.api
stack = test_api.stack


def body(name: str, url: str = "http://127.0.0.1:9/hook", **over: Any) -> dict[str, Any]:
    return {"name": name, "target": {"type": "http", "url": url}, **over}


def at_once(count: int, call: Callable[[int], httpx.Response]) -> list[httpx.Response]:
    """``call(i)`` from ``count`` threads released together (creates that really race)."""
    barrier = threading.Barrier(count)
    answers: list[httpx.Response | None] = [None] * count

    def run(i: int) -> None:
        barrier.wait(timeout=30)
        answers[i] = call(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(a is not None for a in answers), "a create did not answer"
    return [a for a in answers if a is not None]


def job_rows(settings: CommonSettings, name: str) -> list[str]:
    with psycopg.connect(settings.database_url) as conn:
        found = conn.execute("SELECT job_id::text FROM jobs WHERE name = %s", (name,)).fetchall()
    return [r[0] for r in found]


def test_concurrent_unique_creates_make_one_job(settings: CommonSettings, api: RunningApi) -> None:
    name = f"unique-{uuid.uuid4().hex[:8]}"
    unique = {"key": "report-{payload.tenant}", "window_s": 600}

    def create(i: int) -> httpx.Response:
        with api.client() as c:
            return c.post(
                "/v1/jobs",
                json=body(name, schedule=FAR, payload={"tenant": "acme", "i": i}, unique=unique),
            )

    answers = at_once(THREADS, create)
    assert sorted(a.status_code for a in answers) == [200] * (THREADS - 1) + [201], [
        a.text for a in answers
    ]
    [first] = [a.json() for a in answers if a.status_code == 201]
    assert "deduplicated" not in first  # said only when it is true
    for a in answers:
        if a.status_code == 200:
            assert a.json()["job_id"] == first["job_id"] and a.json()["deduplicated"] is True
            assert a.headers["Duetime-Deduplicated"] == "true"
    assert job_rows(settings, name) == [first["job_id"]]
    with api.client() as c:  # another key is another job
        other = c.post(
            "/v1/jobs",
            json=body(name, schedule=FAR, payload={"tenant": "other"}, unique=unique),
        )
        assert other.status_code == 201 and other.json()["job_id"] != first["job_id"]


def test_a_unique_key_is_free_again_when_its_window_ends(api: RunningApi) -> None:
    name = f"unique-window-{uuid.uuid4().hex[:8]}"
    job = body(name, schedule=FAR, unique={"key": name, "window_s": 0.5})
    with api.client() as c:
        first = c.post("/v1/jobs", json=job)
        assert first.status_code == 201, first.text
        ids = {first.json()["job_id"]}

        def created_anew() -> bool:
            r = c.post("/v1/jobs", json=job)
            ids.add(r.json()["job_id"])
            return r.status_code == 201

        wait_for(created_anew, 30, "a create after the 0.5 s window to make a new job")
    assert len(ids) == 2


def test_debounce_runs_only_the_last_create(
    settings: CommonSettings, api: RunningApi, stack: Sink
) -> None:
    name = f"debounce-{uuid.uuid4().hex[:8]}"
    debounce = {"key": "sync-{payload.account}", "window_s": 3}

    def create(i: int) -> httpx.Response:
        with api.client() as c:
            return c.post(
                "/v1/jobs",
                json=body(name, stack.url, payload={"account": 7, "i": i}, debounce=debounce),
            )

    answers = at_once(THREADS, create)
    assert all(a.status_code == 201 for a in answers), [a.text for a in answers]
    ids = {a.json()["job_id"] for a in answers}
    replaced = {a.json().get("replaced_job_id") for a in answers} - {None}
    # every create but one replaced the job pending before it: a chain through all of them
    assert len(ids) == THREADS and len(replaced) == THREADS - 1 and replaced < ids
    [last] = ids - replaced

    def delivered(job_id: str) -> int:
        with stack.lock:
            return sum(1 for d in stack.deliveries if d.job_id == job_id)

    wait_for(lambda: delivered(last) == 1, 60, "the last debounced job to run")

    def statuses() -> dict[str, str]:
        with api.client() as c:
            return {j: c.get(f"/v1/jobs/{j}").json().get("status", "") for j in ids}

    wait_for(
        lambda: all(s == "cancelled" for j, s in statuses().items() if j != last),
        30,
        "every replaced job to be cancelled",
    )
    assert [j for j in ids if delivered(j)] == [last]
    assert sorted(job_rows(settings, name)) == sorted(ids)


def test_invalid_unique_and_debounce_are_refused_and_write_nothing(
    settings: CommonSettings, api: RunningApi
) -> None:
    name = f"unique-bad-{uuid.uuid4().hex[:8]}"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"unique": {"key": "k", "window_s": 0}}, "unique.window_s"),
        ({"unique": {"key": "k"}}, "unique.window_s"),
        ({"unique": {"key": "k", "window_s": 1, "x": 1}}, "unique.x"),
        ({"unique": {"key": "{payload.missing}", "window_s": 1}}, "unique.key"),
        ({"unique": "k"}, "unique"),
        ({"debounce": {"key": "k", "window_s": 1e9}}, "debounce.window_s"),
        (
            {
                "debounce": {"key": "k", "window_s": 1},
                "schedule": {"cron": "* * * * *", "timezone": "UTC"},
            },
            "debounce",
        ),
        (
            {"debounce": {"key": "k", "window_s": 1}, "unique": {"key": "k", "window_s": 1}},
            "debounce",
        ),
    ]
    with api.client() as c:
        for extra, field in cases:
            r = c.post("/v1/jobs", json=body(name, payload={"a": 1}, **extra))
            error = assert_error(r, 422)
            assert error["details"].get("field") == field, (extra, r.text)
        batch = c.post(
            "/v1/jobs:batch",
            json={"jobs": [body(name, unique={"key": "k", "window_s": 1})]},
        )
        assert batch.status_code == 422 and "POST /v1/jobs" in batch.text
    assert job_rows(settings, name) == []
