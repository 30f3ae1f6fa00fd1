"""The REST API against hostile callers, each finding of the security review reproduced
against the real API process, broker and database: the status, the error body naming the
field or header, and that nothing was written (no row in PostgreSQL, no record on any job
topic)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest

from duetime.core import kafka
from duetime.core.config import CommonSettings
from duetime.core.jobspec import build_job
from duetime.core.projection import JOB_COLUMNS, job_row
from tests.integration.test_api import assert_error, job_body
from tests.integration.test_api_support import (
    RunningApi,
    settle,
    table_counts,
    topic_record_count,
)

JSON = {"Content-Type": "application/json"}
TARGET = {"type": "http", "url": "http://127.0.0.1:9/hook"}


@pytest.fixture
def api(settings: CommonSettings) -> Iterator[RunningApi]:
    running = RunningApi(settings)
    yield running
    running.stop()


class Unchanged:
    """Counts of every table and job topic now; ``check()`` says they did not move."""

    def __init__(self, settings: CommonSettings) -> None:
        self.settings = settings
        self.records, self.rows = topic_record_count(settings), table_counts(settings)

    def check(self) -> None:
        settle()
        assert topic_record_count(self.settings) == self.records, "a refusal wrote to Kafka"
        assert table_counts(self.settings) == self.rows, "a refusal wrote to PostgreSQL"


def port_of(api: RunningApi) -> int:
    return int(api.url.rsplit(":", 1)[1])


# --- CSRF and DNS rebinding --------------------------------------------------------------------


def test_cross_site_writes_and_foreign_hosts_are_refused_and_write_nothing(
    settings: CommonSettings, api: RunningApi
) -> None:
    port = port_of(api)
    with api.client() as c:
        existing = c.post("/v1/jobs", json=job_body()).json()["job_id"]
        unchanged = Unchanged(settings)
        raw = json.dumps(job_body()).encode()
        # the reported attack: a text/plain "simple request" from another site's page
        refused = assert_error(
            c.post(
                "/v1/jobs",
                content=raw,
                headers={"Content-Type": "text/plain", "Origin": "http://evil.example"},
            ),
            403,
            "forbidden_origin",
        )
        assert refused["details"]["header"] == "Origin"
        for origin in ("http://evil.example", "null", f"http://127.0.0.1:{port + 1}"):
            for path, kwargs in (
                ("/v1/jobs", {"json": job_body()}),
                (f"/v1/jobs/{existing}/cancel", {}),
                (f"/v1/jobs/{existing}/trigger", {}),
                ("/v1/dags", {"json": {"name": "d", "jobs": [{"key": "a", **job_body()}]}}),
                ("/v1/dlq/replay", {"json": {}}),
            ):
                r = c.post(path, headers={"Origin": origin}, **kwargs)
                assert assert_error(r, 403, "forbidden_origin")["details"]["header"] == "Origin"
        # without an Origin (curl, scripts): a body that is not declared JSON is never read
        for content_type in (
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/json; charset=latin-1",
        ):
            for path in ("/v1/jobs", "/v1/dags", "/v1/dlq/replay", "/v1/dlq/replay-progress"):
                r = c.post(path, content=raw, headers={"Content-Type": content_type})
                error = assert_error(r, 415, "unsupported_media_type")
                assert error["details"]["header"] == "Content-Type", path
        # a body-less command with a body that is not JSON, and a body with no type at all
        r = c.post(
            f"/v1/jobs/{existing}/pause", content=b"x=1", headers={"Content-Type": "text/plain"}
        )
        assert_error(r, 415, "unsupported_media_type")
        assert_error(c.post("/v1/jobs", content=raw), 415, "unsupported_media_type")
        # DNS rebinding: a foreign name pointed at 127.0.0.1 sends its own Host
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}", "[::2]"):
            for method, path in (
                ("GET", "/v1/jobs"),
                ("GET", f"/v1/jobs/{existing}"),
                ("POST", "/v1/jobs"),
                ("GET", "/openapi.json"),
                ("GET", "/ui/"),
                ("GET", "/metrics"),
            ):
                extra: dict[str, Any] = {"json": job_body()} if method == "POST" else {}
                r = c.request(method, path, headers={"Host": host}, **extra)
                error = assert_error(r, 421, "misdirected_request")
                assert error["details"]["header"] == "Host"
                assert "DUETIME_API_ALLOWED_HOSTS" in error["message"]
            # orchestrators probe by address: liveness and readiness stay open
            assert c.get("/healthz", headers={"Host": host}).status_code == 200
        unchanged.check()
        # the API's own pages (same origin), by any loopback name, may write
        for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
            host = origin.split("//")[1]
            r = c.post("/v1/jobs", json=job_body(), headers={"Origin": origin, "Host": host})
            assert r.status_code == 201, r.text
        r = c.post(
            "/v1/jobs",
            content=raw,
            headers={"Content-Type": "application/json; charset=UTF-8"},
        )
        assert r.status_code == 201, r.text


def test_configured_hosts_and_origins_are_answered_with_cors_for_the_listed_origins(
    settings: CommonSettings,
) -> None:
    api = RunningApi(
        settings,
        allowed_hosts=("api.example.com", "127.0.0.1"),
        allowed_origins=("https://ops.example.com",),
    )
    try:
        with api.client() as c:
            ops = {"Origin": "https://ops.example.com", "Host": "api.example.com"}
            preflight = c.options(
                "/v1/jobs",
                headers={
                    **ops,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type, authorization",
                },
            )
            assert preflight.status_code == 200, preflight.text
            assert preflight.headers["access-control-allow-origin"] == "https://ops.example.com"
            assert c.post("/v1/jobs", json=job_body(), headers=ops).status_code == 201
            assert c.get("/v1/jobs", headers={"Host": "api.example.com:8443"}).status_code == 200
            unchanged = Unchanged(settings)
            r = c.post("/v1/jobs", json=job_body(), headers={**ops, "Origin": "https://x.example"})
            assert_error(r, 403, "forbidden_origin")
            foreign = {
                **ops,
                "Origin": "https://x.example",
                "Access-Control-Request-Method": "POST",
            }
            r = c.options("/v1/jobs", headers=foreign)
            assert_error(r, 403, "forbidden_origin")
            assert "access-control-allow-origin" not in r.headers
            # localhost is no longer listed: only the configured names are answered
            assert_error(c.get("/v1/jobs", headers={"Host": "localhost"}), 421)
            unchanged.check()
    finally:
        api.stop()


# --- DAG members and ids obey the 409 rule ---------------------------------------------------


def test_a_dag_can_neither_take_over_a_job_nor_silently_replace_a_dag(
    settings: CommonSettings, api: RunningApi
) -> None:
    with api.client() as c:
        victim = c.post("/v1/jobs", json=job_body(name="victim")).json()["job_id"]
        dag_id = str(uuid.uuid4())
        dag: dict[str, Any] = {
            "dag_id": dag_id,
            "name": "etl",
            "jobs": [
                {"key": "extract", "name": "extract", "target": TARGET},
                {"key": "load", "name": "load", "target": TARGET, "depends_on": ["extract"]},
            ],
        }
        created = c.post("/v1/dags", json=dag)
        assert created.status_code == 201, created.text
        unchanged = Unchanged(settings)
        hijack: dict[str, Any] = {
            "name": "hijack",
            "jobs": [{"key": "a", "name": "a", "target": TARGET, "job_id": victim}],
        }
        error = assert_error(c.post("/v1/dags", json=hijack), 409, "conflict")
        assert error["details"]["field"] == "jobs[0].job_id"
        assert error["details"]["job_id"] == victim
        # a member of another DAG is no easier to take
        member = created.json()["job_ids"]["load"]
        hijack["jobs"][0]["job_id"] = member
        assert_error(c.post("/v1/dags", json=hijack), 409, "conflict")
        # two members of one post claiming one id
        twice: dict[str, Any] = {
            "name": "twice",
            "jobs": [
                {"key": "a", "name": "a", "target": TARGET, "job_id": str(uuid.uuid4())},
                {"key": "b", "name": "b", "target": TARGET},
            ],
        }
        twice["jobs"][1]["job_id"] = twice["jobs"][0]["job_id"]
        error = assert_error(c.post("/v1/dags", json=twice), 409, "conflict")
        assert error["details"]["field"] == "jobs[1].job_id"
        # the same dag_id with another body: renamed, a job more, a new schedule
        for changed in (
            {**dag, "name": "etl-2"},
            {**dag, "jobs": [*dag["jobs"], {"key": "x", "name": "x", "target": TARGET}]},
            {**dag, "schedule": {"cron": "0 3 * * *"}},
            {**dag, "jobs": [dag["jobs"][0], {**dag["jobs"][1], "payload": {"n": 1}}]},
        ):
            error = assert_error(c.post("/v1/dags", json=changed), 409, "conflict")
            assert error["details"]["field"] in ("dag_id", "jobs[1].job_id"), error
        # an identical re-post is idempotent: the first answer, nothing published
        again = c.post("/v1/dags", json=dag)
        assert again.status_code == 200, again.text
        assert again.json() == created.json()
        unchanged.check()
        assert c.get(f"/v1/jobs/{victim}").json()["name"] == "victim"
        assert [n["key"] for n in c.get(f"/v1/dags/{dag_id}").json()["nodes"]] == [
            "extract",
            "load",
        ]


# --- nesting depth ------------------------------------------------------------------------------


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def body_with_payload(payload: bytes, **over: Any) -> bytes:
    head = json.dumps(job_body(**over))[:-1].encode()
    return head + b', "payload": ' + payload + b"}"


def test_deep_bodies_are_refused_before_parsing_and_deep_stored_payloads_still_read(
    settings: CommonSettings, api: RunningApi
) -> None:
    with api.client() as c:
        unchanged = Unchanged(settings)
        for depth in (64, 500, 950, 5000, 1_000_000):
            r = c.post("/v1/jobs", content=body_with_payload(nested(depth)), headers=JSON)
            error = assert_error(r, 400, "bad_request")
            assert error["details"] == {"field": "payload", "max_depth": 64}, error
            assert "DUETIME_API_MAX_JSON_DEPTH" in error["message"]
        deep_object = b'{"a":' * 100 + b"1" + b"}" * 100
        deep_dag = (
            b'{"name": "d", "jobs": [{"key": "a", "name": "a", "target": {"type": "http", '
            b'"url": "http://127.0.0.1:9/h"}, "payload": ' + deep_object + b"}]}"
        )
        for path, content, field in (
            ("/v1/jobs", body_with_payload(deep_object), "payload"),
            ("/v1/dags", deep_dag, "jobs[0].payload"),
            ("/v1/dlq/replay", b'{"name": ' + nested(100) + b"}", "name"),
            (
                "/v1/dlq/replay-progress",
                b'{"execution_ids": ' + nested(100) + b"}",
                "execution_ids",
            ),
        ):
            error = assert_error(c.post(path, content=content, headers=JSON), 400, "bad_request")
            assert error["details"] == {"field": field, "max_depth": 64}, path
        unchanged.check()
        # 62 levels of payload inside the body's object: 63 in all, under the limit
        ok = c.post("/v1/jobs", content=body_with_payload(nested(62)), headers=JSON)
        assert ok.status_code == 201, ok.text

        # a payload stored before the limit (or by an older SDK): readable, and paging goes on
        older = c.post("/v1/jobs", json=job_body(name="older")).json()["job_id"]
        deep_id = _store_job_with_payload(settings, "[" * 950 + "]" * 950)
        newer = c.post("/v1/jobs", json=job_body(name="newer")).json()["job_id"]
        got = c.get(f"/v1/jobs/{deep_id}")
        assert got.status_code == 200, got.text
        assert got.json()["payload"] is None and "64" in got.json()["payload_omitted"]
        seen: list[str] = []
        cursor = None
        while True:
            page = c.get("/v1/jobs", params={"limit": 1, **({"cursor": cursor} if cursor else {})})
            assert page.status_code == 200, page.text
            seen += [j["job_id"] for j in page.json()["items"]]
            cursor = page.json()["next_cursor"]
            if cursor is None:
                break
        assert seen.index(newer) < seen.index(deep_id) < seen.index(older)


def _store_job_with_payload(settings: CommonSettings, payload_json: str) -> str:
    """A job row as the projector would write it for a definition holding this payload."""
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    definition = build_job({"name": "deep", "target": TARGET}, now_ms=now_ms)
    row = job_row(replace(definition, payload_json=payload_json))
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) "
            f"VALUES ({', '.join(['%s'] * len(JOB_COLUMNS))})",
            [row[col] for col in JOB_COLUMNS],
        )
    return definition.job_id


def test_a_lower_configured_depth_is_the_limit(settings: CommonSettings) -> None:
    api = RunningApi(settings, max_json_depth=8)
    try:
        with api.client() as c:
            unchanged = Unchanged(settings)
            r = c.post("/v1/jobs", content=body_with_payload(nested(8)), headers=JSON)
            assert assert_error(r, 400, "bad_request")["details"]["max_depth"] == 8
            unchanged.check()
            r = c.post("/v1/jobs", content=body_with_payload(nested(7)), headers=JSON)
            assert r.status_code == 201, r.text
    finally:
        api.stop()


# --- input that used to be a 500 ----------------------------------------------------------------


def test_out_of_range_numbers_times_and_nul_are_4xx_naming_the_parameter(
    settings: CommonSettings, api: RunningApi
) -> None:
    huge = "1" + "0" * 400
    with api.client() as c:
        unchanged = Unchanged(settings)
        for field, raw in (
            (
                "timeout_s",
                body_with_payload(b"null").replace(
                    b'"payload"', b'"timeout_s": ' + huge.encode() + b', "payload"'
                ),
            ),
            (
                "retry",
                json.dumps(job_body(retry={"base_delay_s": 1}))
                .replace(": 1}", f": {huge}}}")
                .encode(),
            ),
            (
                "retry",
                json.dumps(job_body(retry={"max_retries": 1}))
                .replace(": 1}", f": {huge}}}")
                .encode(),
            ),
            (
                "retry",
                json.dumps(job_body(retry={"max_delay_s": 1}))
                .replace(": 1}", f": -{huge}}}")
                .encode(),
            ),
        ):
            r = c.post("/v1/jobs", content=raw, headers=JSON)
            assert r.status_code in (400, 422), (field, r.text)
            assert_error(r, r.status_code)
        for at in (
            "9999-12-31T23:30:00-01:00",  # UTC: year 10000
            "0001-01-01T00:30:00+01:00",  # UTC: year 0
            "9999-12-31T23:59:59.999999-14:00",
        ):
            for schedule in (
                {"at": at},
                {"cron": "0 2 * * *", "start_at": at},
                {"cron": "0 2 * * *", "end_at": at},
            ):
                r = c.post("/v1/jobs", json=job_body(schedule=schedule))
                assert r.status_code in (400, 422), (schedule, r.text)
                assert_error(r, r.status_code)
            # a filter bound far out is a filter that matches nothing, not an error
            r = c.post("/v1/dlq/replay", json={"since": at, "until": at})
            assert r.status_code == 202 and r.json()["replayed"] == 0, r.text
        for body, field in (
            (job_body(name="a\u0000b"), "name"),
            (job_body(labels={"k": "v\u0000"}), "labels.k"),
            (job_body(target={**TARGET, "headers": {"X-\u0000": "v"}}), "target.headers.X-\u0000"),
        ):
            assert assert_error(c.post("/v1/jobs", json=body), 422)["details"]["field"] == field
        dag = {"name": "d", "jobs": [{"key": "a", "name": "a\u0000", "target": TARGET}]}
        assert assert_error(c.post("/v1/dags", json=dag), 422)["details"]["field"] == "jobs[0].name"
        replay = c.post("/v1/dlq/replay", json={"name": "a\u0000b"})
        assert assert_error(replay, 422)["details"]["field"] == "name"
        surrogate = c.post("/v1/jobs", content=b'{"name": "\\ud800x"}', headers=JSON)
        assert assert_error(surrogate, 400)["details"]["field"] == "name"
        # query parameters: NUL and other control characters, named
        for path, param in (
            ("/v1/jobs", "name_contains"),
            ("/v1/jobs", "name"),
            ("/v1/jobs", "cursor"),
            ("/v1/jobs", "status"),
            ("/v1/dlq", "name"),
            ("/v1/dlq", "job_id"),
            ("/v1/dags", "name_contains"),
        ):
            for value in ("a\x00b", "\x00", "line\nbreak", "\x1b[31m"):
                r = c.get(path, params={param: value})
                error = assert_error(r, 400, "bad_request")
                assert error["details"]["field"] == param, (path, param, error)
        assert_error(c.get("/v1/jobs", params={"x\x00": "1"}), 400, "bad_request")
        unchanged.check()


# --- replay once per dead execution ------------------------------------------------------------


def _dead_letter(settings: CommonSettings, job_id: str) -> str:
    execution_id = str(uuid.uuid4())
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO dead_letters (execution_id, job_id, name, dead_at, attempts, errors, "
            "request) VALUES (%s, %s, 'n', now(), 1, %s, '{}')",
            (
                execution_id,
                job_id,
                json.dumps(
                    [
                        {
                            "attempt": 1,
                            "error": {
                                "type": "HTTPStatusError",
                                "message": "POST http://u:pw-secret@127.0.0.1:9/h?token=tk-secret "
                                "answered 500",
                            },
                        }
                    ]
                ),
            ),
        )
    return execution_id


def test_replaying_a_dead_execution_twice_publishes_once_across_api_processes(
    settings: CommonSettings, api: RunningApi
) -> None:
    other = RunningApi(settings)  # a second API process on the same database
    try:
        with api.client() as c, other.client() as d:
            job_id = c.post("/v1/jobs", json=job_body()).json()["job_id"]
            first_dead = _dead_letter(settings, job_id)
            records = topic_record_count(settings)
            first = c.post(f"/v1/dlq/{first_dead}/replay")
            assert first.status_code == 202, first.text
            assert topic_record_count(settings) == records + 1
            for client in (c, d):
                again = client.post(f"/v1/dlq/{first_dead}/replay")
                assert (again.status_code, again.json()) == (202, first.json())
            bulk = d.post("/v1/dlq/replay", json={"job_id": job_id, "include_replayed": True})
            assert bulk.json()["execution_ids"] == [first_dead]
            settle()
            assert topic_record_count(settings) == records + 1, "a repeated replay published"

            # many replays of one dead letter at once, from both processes: one command
            dead = _dead_letter(settings, job_id)
            records = topic_record_count(settings)
            answers: list[tuple[int, Any]] = []
            lock = threading.Lock()

            def replay(client: httpx.Client, bulk: bool) -> None:
                if bulk:
                    r = client.post("/v1/dlq/replay", json={"job_id": job_id})
                else:
                    r = client.post(f"/v1/dlq/{dead}/replay")
                with lock:
                    answers.append((r.status_code, r.json()))

            threads = [
                threading.Thread(target=replay, args=(client, i % 3 == 2))
                for i, client in enumerate([c, d] * 4)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert all(status == 202 for status, _ in answers), answers
            singles = [a for _, a in answers if a["execution_ids"] == [dead] and a["replayed"] == 1]
            assert len(singles) >= 5, answers  # every single replay answered the same
            settle()
            assert topic_record_count(settings) == records + 1, "one dead letter, two replays"
            rows = table_counts(settings)
            assert rows["dlq_replays"] == 2
    finally:
        other.stop()


# --- readiness, docs, next runs, secrets, exposure ----------------------------------------------


def test_readiness_reuses_one_kafka_admin_client(
    api: RunningApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every admin client made from now on is counted (and still made: nothing is faked)
    made: list[object] = []
    real = kafka.admin

    def counting(settings: CommonSettings) -> Any:
        made.append(settings)
        return real(settings)

    monkeypatch.setattr(kafka, "admin", counting)
    with api.client() as c:
        assert c.get("/readyz").status_code == 200

        def ready(_: int) -> str:
            r = c.get("/readyz")
            assert r.status_code == 200, r.text
            return str(r.json()["checks"]["kafka"])

        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(ready, range(80))) == {"ok"}
        # before: a new admin client (its broker connections and threads) per call
        assert made == [], f"{len(made)} admin clients made by 80 readiness checks"


def test_docs_are_served_from_the_package_under_a_content_security_policy(
    api: RunningApi,
) -> None:
    with api.client() as c:
        page = c.get("/docs")
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'self'" in csp
        assert "cdn" not in page.text and "https://" not in page.text
        assert "<script>" not in page.text  # no inline script: script-src 'self' holds
        for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "init.js"):
            r = c.get(f"/docs/assets/{asset}")
            assert r.status_code == 200 and len(r.content) > 100, asset
            assert "content-security-policy" in r.headers
        assert "SwaggerUIBundle" in c.get("/docs/assets/swagger-ui-bundle.js").text
        assert c.get("/redoc").headers["location"] == "/docs"
        assert "script-src 'self'" in c.get("/ui/").headers["content-security-policy"]
        spec = c.get("/openapi.json").json()
        create = spec["paths"]["/v1/jobs"]["post"]["responses"]
        assert {"400", "403", "409", "413", "415", "421", "422"} <= set(create)
        assert "421" in spec["paths"]["/v1/jobs"]["get"]["responses"]
        assert "GetJob" in create["201"]["links"]


def test_next_runs_are_capped_and_computed(api: RunningApi) -> None:
    with api.client() as c:
        job_id = c.post(
            "/v1/jobs", json=job_body(schedule={"cron": "0 0 29 2 *", "timezone": "UTC"})
        ).json()["job_id"]
        error = assert_error(c.get(f"/v1/jobs/{job_id}/next_runs", params={"count": 101}), 400)
        assert error["details"]["field"].endswith("count")
        runs = c.get(f"/v1/jobs/{job_id}/next_runs", params={"count": 100})
        assert runs.status_code == 200, runs.text
        times = runs.json()["next_runs"]
        assert len(times) == 100 and all("-02-29T" in t for t in times)
        assert times == sorted(times)


def test_secrets_in_targets_and_errors_are_redacted_on_every_read(
    settings: CommonSettings, api: RunningApi
) -> None:
    secrets = ("pw-secret", "tk-secret", "hdr-secret", "key-secret")
    target = {
        "type": "http",
        "url": "http://user:pw-secret@127.0.0.1:9/hook?token=tk-secret",
        "headers": {"Authorization": "Bearer hdr-secret", "X-Api-Key": "key-secret", "X-Team": "a"},
    }
    with api.client() as c:
        job_id = c.post("/v1/jobs", json=job_body(target=target)).json()["job_id"]
        dead = _dead_letter(settings, job_id)
        execution_id = str(uuid.uuid4())
        error = {"type": "ConnectError", "message": f"POST {target['url']} refused"}
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO executions (execution_id, scheduled_at, job_id, name, priority, "
                "status, attempt, error, attempts) VALUES (%s, now(), %s, 'n', 'normal', 'dead', "
                "1, %s, %s)",
                (
                    execution_id,
                    job_id,
                    json.dumps(error),
                    json.dumps([{"attempt": 1, "status": "dead", "error": error}]),
                ),
            )
        reads = [
            c.get(f"/v1/jobs/{job_id}"),
            c.get("/v1/jobs"),
            c.get(f"/v1/jobs/{job_id}/executions"),
            c.get(f"/v1/executions/{execution_id}"),
            c.get("/v1/dlq"),
        ]
        for r in reads:
            assert r.status_code == 200, r.text
            for secret in secrets:
                assert secret not in r.text, (r.url, secret)
        job = reads[0].json()
        assert job["target"]["url"] == "http://***@127.0.0.1:9/hook?token=***"
        assert job["target"]["headers"] == {
            "Authorization": "***",
            "X-Api-Key": "***",
            "X-Team": "a",
        }
        assert job["last_execution"]["execution_id"] == execution_id
        assert "127.0.0.1:9/hook" in reads[3].json()["error"]["message"]
        assert [d["execution_id"] for d in reads[4].json()["items"]] == [dead]
    # the stored job keeps what the worker needs
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute("SELECT target FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
    assert row is not None and row[0]["headers"]["Authorization"] == "Bearer hdr-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_without_tokens_the_api_refuses_to_listen_beyond_loopback() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_API_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "duetime.cli",
            "api",
            "--host",
            "0.0.0.0",
            "--port",
            str(_free_port()),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    for variable in ("DUETIME_API_TOKENS", "DUETIME_API_HOST", "DUETIME_API_ALLOW_NO_AUTH"):
        assert variable in done.stderr, done.stderr
