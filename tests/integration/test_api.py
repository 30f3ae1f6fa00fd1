"""The REST API against the real broker and database: every documented error (and that it
writes nothing), auth, idempotent creates, pagination, end to end through scheduler, worker
and projector, the DLQ and DAG routes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from duetime.core.config import CommonSettings
from duetime.producers.sdk import JobClient
from tests.helpers import wait_for
from tests.integration.test_api_support import (
    RunningApi,
    running_stack,
    settle,
    table_counts,
    topic_record_count,
)
from tests.integration.test_worker_support import Sink

TOKEN = "s3cret-token-for-tests-0123456789"
JSON: dict[str, Any] = {"headers": {"Content-Type": "application/json"}}


def job_body(**over: Any) -> dict[str, Any]:
    return {
        "name": "nightly-report",
        "schedule": {"cron": "0 2 * * *", "timezone": "Europe/Berlin"},
        "target": {"type": "http", "url": "http://127.0.0.1:9/hook"},
        **over,
    }


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["details"], dict)
    if code is not None:
        assert body["error"]["code"] == code, body
    return dict(body["error"])


@pytest.fixture
def api(settings: CommonSettings) -> Iterator[RunningApi]:
    running = RunningApi(settings, max_payload_bytes=1024, max_body_bytes=64 * 1024)
    yield running
    running.stop()


@pytest.fixture
def stack(settings: CommonSettings) -> Iterator[Sink]:
    with running_stack(settings) as sink:
        yield sink


def test_every_documented_error_has_its_status_and_body_and_writes_nothing(
    settings: CommonSettings, api: RunningApi
) -> None:
    with api.client() as c:
        existing = c.post("/v1/jobs", json=job_body()).json()["job_id"]
        before_records, before_rows = topic_record_count(settings), table_counts(settings)
        unknown = str(uuid.uuid4())
        cases: list[tuple[str, str, dict[str, Any], int, str]] = [
            ("POST", "/v1/jobs", {"content": b'{"name": "x",', **JSON}, 400, "bad_request"),
            ("POST", "/v1/jobs", {"content": b"", **JSON}, 400, "bad_request"),
            ("POST", "/v1/jobs", {"content": b'{"a": NaN}', **JSON}, 400, "bad_request"),
            ("POST", "/v1/jobs", {"content": b"{}"}, 415, "unsupported_media_type"),
            ("POST", "/v1/jobs", {"json": []}, 422, "invalid"),
            (
                "POST",
                "/v1/jobs",
                {"json": job_body(schedule={"cron": "61 * * * *"})},
                422,
                "invalid_schedule",
            ),
            (
                "POST",
                "/v1/jobs",
                {"json": job_body(schedule={"cron": "0 2 * * *", "timezone": "Mars/Olympus"})},
                422,
                "unknown_timezone",
            ),
            ("POST", "/v1/jobs", {"json": job_body(target={"type": "ftp"})}, 422, "invalid"),
            ("POST", "/v1/jobs", {"json": job_body(priority="urgent")}, 422, "invalid"),
            ("POST", "/v1/jobs", {"json": job_body(surprise=1)}, 422, "invalid"),
            ("POST", "/v1/jobs", {"json": job_body(payload="x" * 2000)}, 413, "payload_too_large"),
            (
                "POST",
                "/v1/jobs",
                {"json": job_body(payload="x" * 100_000)},
                413,
                "payload_too_large",
            ),
            ("POST", "/v1/jobs", {"json": job_body(name="a\u0000b")}, 422, "invalid"),
            (
                "POST",
                "/v1/jobs",
                {"json": job_body(job_id=existing, name="another")},
                409,
                "conflict",
            ),
            ("GET", f"/v1/jobs/{unknown}", {}, 404, "not_found"),
            ("GET", "/v1/jobs/not-a-uuid", {}, 404, "not_found"),
            ("GET", f"/v1/jobs/{unknown}/executions", {}, 404, "not_found"),
            ("POST", f"/v1/jobs/{unknown}/pause", {}, 404, "not_found"),
            # resume a job that is not paused: a conflicting state change
            ("POST", f"/v1/jobs/{existing}/resume", {}, 409, "illegal_transition"),
            ("GET", f"/v1/executions/{unknown}", {}, 404, "not_found"),
            ("GET", "/v1/jobs?limit=0", {}, 400, "bad_request"),
            ("GET", "/v1/jobs?status=sleeping", {}, 400, "bad_request"),
            ("GET", "/v1/jobs?cursor=garbage", {}, 400, "bad_request"),
            ("GET", "/v1/nowhere", {}, 404, "not_found"),
            ("DELETE", "/v1/jobs", {}, 405, "method_not_allowed"),
            ("POST", f"/v1/dlq/{unknown}/replay", {}, 404, "not_found"),
            ("POST", "/v1/dlq/replay", {"json": {"colour": "red"}}, 422, "invalid"),
            ("GET", f"/v1/dags/{unknown}", {}, 404, "not_found"),
            ("GET", f"/v1/dags/{unknown}/runs", {}, 404, "not_found"),
            ("POST", f"/v1/dags/{unknown}/trigger", {}, 404, "not_found"),
        ]
        for method, path, kwargs, status, code in cases:
            assert_error(c.request(method, path, **kwargs), status, code)
        target = {"type": "http", "url": "http://127.0.0.1:9/h"}
        cycle = assert_error(
            c.post(
                "/v1/dags",
                json={
                    "name": "loop",
                    "jobs": [
                        {"key": "a", "name": "a", "target": target, "depends_on": ["b"]},
                        {"key": "b", "name": "b", "target": target, "depends_on": ["a"]},
                    ],
                },
            ),
            422,
            "dag_cycle",
        )
        assert cycle["details"]["cycle"] == ["a", "b", "a"]
        assert "a → b → a" in cycle["message"]
    settle()
    assert topic_record_count(settings) == before_records, "an error wrote to Kafka"
    assert table_counts(settings) == before_rows, "an error wrote to PostgreSQL"


def test_tokens_guard_every_v1_route_and_a_refused_request_writes_nothing(
    settings: CommonSettings,
) -> None:
    api = RunningApi(settings, tokens=(TOKEN,))
    try:
        before_records, before_rows = topic_record_count(settings), table_counts(settings)
        for token in (None, "wrong-token-of-some-length", TOKEN + "x"):
            with api.client(token) as c:
                assert_error(c.post("/v1/jobs", json=job_body()), 401, "unauthorized")
                assert_error(c.get("/v1/jobs"), 401, "unauthorized")
                assert_error(c.post(f"/v1/jobs/{uuid.uuid4()}/cancel"), 401, "unauthorized")
                r = c.post("/v1/dlq/replay", json={})
                assert_error(r, 401, "unauthorized")
                assert r.headers["WWW-Authenticate"] == "Bearer"
                assert c.get("/healthz").status_code == 200  # operations stay open
        settle()
        assert topic_record_count(settings) == before_records
        assert table_counts(settings) == before_rows
        with api.client(TOKEN) as c:
            assert c.post("/v1/jobs", json=job_body()).status_code == 201
            assert c.get("/v1/jobs").status_code == 200
    finally:
        api.stop()


def test_create_is_idempotent_readable_at_once_and_pages_newest_first(
    settings: CommonSettings, api: RunningApi
) -> None:
    with api.client() as c:
        job_id = str(uuid.uuid4())
        first = c.post("/v1/jobs", json=job_body(job_id=job_id, payload={"n": 1}))
        assert first.status_code == 201
        assert first.json() == {
            "job_id": job_id,
            "status": "pending",
            "next_run_at": first.json()["next_run_at"],
        }
        # readable at once, before any projector ran
        got = c.get(f"/v1/jobs/{job_id}")
        assert got.status_code == 200 and got.json()["payload"] == {"n": 1}
        assert got.json()["last_execution"] is None
        again = c.post("/v1/jobs", json=job_body(job_id=job_id, payload={"n": 1}))
        assert again.status_code == 200 and again.json()["job_id"] == job_id
        ids = [job_id]
        for i in range(4):
            ids.append(c.post("/v1/jobs", json=job_body(name=f"page-{i}")).json()["job_id"])
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 2}
            if cursor:
                params["cursor"] = cursor
            page = c.get("/v1/jobs", params=params).json()
            seen += [j["job_id"] for j in page["items"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == 3 and seen == list(reversed(ids))
        only = c.get("/v1/jobs", params={"name": "page-2"}).json()["items"]
        assert [j["job_id"] for j in only] == [ids[3]]
        assert c.get("/v1/jobs", params={"status": "paused"}).json()["items"] == []
    # the job event went out once: the idempotent re-create published nothing
    assert topic_record_count(settings) == 5


def iso(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def _wait_status(
    c: httpx.Client, job_id: str, status: str, timeout_s: float = 30, *, ran: bool = False
) -> dict[str, Any]:
    def check() -> dict[str, Any]:
        r = c.get(f"/v1/jobs/{job_id}")  # an SDK-created job: 404 until projected
        ok = r.status_code == 200 and r.json()["status"] == status
        # ran: its last execution too; the job's status (from the state topic) and the
        # execution (from the execution and result topics) come from different partitions
        ok = ok and (not ran or r.json()["last_execution"] is not None)
        return dict(r.json()) if ok else {}

    return wait_for(check, timeout_s, f"job {job_id} to be {status}", interval_s=0.1)


def test_end_to_end_over_rest_and_through_the_sdk(
    settings: CommonSettings, api: RunningApi, stack: Sink
) -> None:
    soon = iso(datetime.now(UTC) + timedelta(seconds=1))
    target = {"type": "http", "url": stack.url}
    with api.client() as c:
        created = c.post(
            "/v1/jobs", json=job_body(name="rest-e2e", schedule={"at": soon}, target=target)
        )
        assert created.status_code == 201
        job_id = created.json()["job_id"]
        job = _wait_status(c, job_id, "success", ran=True)
        last = job["last_execution"]
        assert last["status"] == "success" and last["attempt"] == 1
        execs = c.get(f"/v1/jobs/{job_id}/executions").json()
        assert [e["execution_id"] for e in execs["items"]] == [last["execution_id"]]
        one = c.get(f"/v1/executions/{last['execution_id']}").json()
        assert one["worker_id"] and one["started_at"] and one["finished_at"]
        assert one["attempts"][0]["status"] == "success" and one["lateness_ms"] >= 0
        assert stack.of_key(last["execution_id"]), "the sink saw the call"

        with JobClient(settings=settings) as client:
            sdk_job = client.create_job(name="sdk-e2e", schedule={"at": soon}, target=target)
        sdk_view = _wait_status(c, sdk_job.job_id, "success", ran=True)
        assert sdk_view["last_execution"]["status"] == "success"

        # a recurring job, paused then cancelled over REST
        cron = c.post("/v1/jobs", json=job_body(name="cron", target=target)).json()["job_id"]
        # accepted at once: the scheduler holds a command that overtakes its job
        assert c.post(f"/v1/jobs/{cron}/pause").status_code == 202
        _wait_status(c, cron, "paused")
        assert c.post(f"/v1/jobs/{cron}/resume").status_code == 202
        _wait_status(c, cron, "pending")
        assert c.post(f"/v1/jobs/{cron}/trigger").status_code == 202
        wait_for(
            lambda: c.get(f"/v1/jobs/{cron}/executions").json()["items"],
            30,
            "the triggered run",
        )
        assert c.post(f"/v1/jobs/{cron}/cancel").status_code == 202
        _wait_status(c, cron, "cancelled")
        assert_error(c.post(f"/v1/jobs/{cron}/resume"), 409, "illegal_transition")


def test_dead_executions_are_listed_and_replayed_one_and_by_filter(
    settings: CommonSettings, api: RunningApi, stack: Sink
) -> None:
    now = iso(datetime.now(UTC))
    body = job_body(
        name="always-fails",
        schedule={"at": now},
        target={"type": "http", "url": stack.url},
        payload={"fail_times": 1000},
        retry={"max_retries": 0},
    )
    with api.client() as c:
        job_id = c.post("/v1/jobs", json=body).json()["job_id"]
        _wait_status(c, job_id, "dead")
        dead = wait_for(lambda: c.get("/v1/dlq").json()["items"], 30, "the dead letter")
        assert dead[0]["job_id"] == job_id and dead[0]["replayed_at"] is None
        first = dead[0]["execution_id"]
        out = c.post(f"/v1/dlq/{first}/replay")
        assert out.status_code == 202 and out.json()["execution_ids"] == [first]
        assert c.get("/v1/dlq").json()["items"][0]["replayed_at"] is not None
        # the replayed run fails again: a second dead letter, not yet replayed
        wait_for(lambda: len(c.get("/v1/dlq").json()["items"]) == 2, 30, "a second dead letter")
        bulk = c.post("/v1/dlq/replay", json={"job_id": job_id}).json()
        assert bulk["replayed"] == 1 and first not in bulk["execution_ids"]
        again = c.post("/v1/dlq/replay", json={"job_id": job_id, "include_replayed": True})
        assert again.json()["replayed"] == 2


def test_dags_are_created_read_and_triggered(
    settings: CommonSettings, api: RunningApi, stack: Sink
) -> None:
    target = {"type": "http", "url": stack.url}
    with api.client() as c:
        created = c.post(
            "/v1/dags",
            json={
                "name": "etl",
                "jobs": [
                    {"key": "extract", "name": "extract", "target": target},
                    {
                        "key": "load",
                        "name": "load",
                        "target": target,
                        "depends_on": ["extract"],
                    },
                ],
            },
        )
        assert created.status_code == 201, created.text
        dag_id = created.json()["dag_id"]
        dag = c.get(f"/v1/dags/{dag_id}").json()
        assert [n["key"] for n in dag["nodes"]] == ["extract", "load"]
        assert dag["nodes"][1]["depends_on"] == ["extract"]
        run_id = c.post(f"/v1/dags/{dag_id}/trigger").json()["dag_run_id"]
        runs = wait_for(lambda: c.get(f"/v1/dags/{dag_id}/runs").json()["items"], 30, "the DAG run")
        assert runs[0]["dag_run_id"] == run_id
        wait_for(
            lambda: (
                c.get(f"/v1/dags/{dag_id}/runs").json()["items"][0]["node_statuses"].get("extract")
                == "success"
            ),
            30,
            "the root node to succeed",
        )


def test_unreachable_postgresql_is_503_not_ready_and_nothing_is_published(
    settings: CommonSettings,
) -> None:
    down = replace(settings, database_url="postgresql://duetime:duetime@127.0.0.1:9/none")
    api = RunningApi(down, db_timeout_s=1.0)
    try:
        with api.client() as c:
            assert c.get("/healthz").status_code == 200
            ready = assert_error(c.get("/readyz"), 503, "unavailable")
            assert ready["details"]["checks"]["kafka"] == "ok"
            assert ready["details"]["checks"]["postgresql"].startswith("unreachable")
            assert_error(c.post("/v1/jobs", json=job_body()), 503, "unavailable")
            assert_error(c.get(f"/v1/jobs/{uuid.uuid4()}"), 503, "unavailable")
        settle()
        assert topic_record_count(settings) == 0
    finally:
        api.stop()
