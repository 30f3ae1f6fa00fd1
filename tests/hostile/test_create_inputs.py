"""Hostile inputs refused at creation (REST and SDK), against one stack of real role processes.

Each test sends inputs that were once accepted (or crashed something) and asserts the refusal
names the field and leaves nothing behind: no row in PostgreSQL, no record on the jobs or dags
topic. The last test asserts the stack survived all of them (same PIDs, plain jobs still fire).
See README.md in this folder for the findings each test covers.
"""

from __future__ import annotations

import decimal
import functools
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient

from duetime.producers.sdk import dag_member_job_id, dag_trigger_job_id
from tests.helpers import wait_for
from tests.hostile.conftest import (
    FAR,
    HostileStack,
    assert_refused,
    assert_sdk_refused,
    dumps,
    thread_count,
)


def job(stack: HostileStack, **fields: Any) -> dict[str, Any]:
    """A valid job body with a fresh client-chosen id (so a refusal can be traced), then
    ``fields`` over it."""
    body: dict[str, Any] = {
        "job_id": str(uuid.uuid4()),
        "name": "hostile",
        "schedule": FAR,
        "target": {"type": "http", "url": stack.sink.url},
        "payload": {"k": "v"},
        "retry": {"max_retries": 0},
    }
    body.update(fields)
    return body


def refused_everywhere(
    stack: HostileStack,
    body: dict[str, Any],
    field: str,
    statuses: tuple[int, ...] = (422,),
) -> None:
    """REST and SDK both refuse ``body`` naming ``field``; neither wrote anything."""
    rest = dict(body, job_id=str(uuid.uuid4()))
    assert_refused(stack.post_job(rest), field, statuses)
    sdk = dict(body, job_id=str(uuid.uuid4()))
    assert_sdk_refused(lambda: stack.sdk.create_job(sdk), field)
    stack.assert_nothing_written({rest["job_id"], sdk["job_id"]})


# --- finding 1: the reserved label namespace ---------------------------------------------


@pytest.mark.parametrize(
    "labels",
    [
        {"duetime.dag": "DAG"},
        {"duetime.dag": "not-a-uuid"},
        {"duetime.anything": "x"},
        {"team": "a", "duetime.dag": "DAG"},
    ],
    ids=["dag-uuid", "dag-not-uuid", "other-reserved", "mixed"],
)
def test_reserved_label_refused(stack: HostileStack, labels: dict[str, str]) -> None:
    labels = {k: (str(uuid.uuid4()) if v == "DAG" else v) for k, v in labels.items()}
    refused_everywhere(stack, job(stack, labels=labels), "labels")


# --- finding 3: a DAG whose run-start event would not fit in a record ----------------------


def test_oversized_dag_refused(stack: HostileStack) -> None:
    nodes = 3200
    keys = [f"{i:05d}-" + "k" * 194 for i in range(nodes)]
    members = [
        {"key": k, "name": "n", "target": {"type": "http", "url": stack.sink.url}} for k in keys
    ]
    for attempt in ("rest", "sdk"):
        dag_id = str(uuid.uuid4())
        if attempt == "rest":
            resp = stack.api.post(
                "/v1/dags", json={"dag_id": dag_id, "name": "huge", "jobs": members}
            )
            error = assert_refused(resp, "jobs", (413, 422))
            named = error["details"]["field"]
        else:
            exc = assert_sdk_refused(
                functools.partial(stack.sdk.create_dag, "huge", members, dag_id=dag_id), "jobs"
            )
            named = exc.details.get("field")
        # the DAG as a whole is too large: not a complaint about one member's field
        assert named == "jobs", f"refused for {named!r}, not for its size"
        ids = {dag_member_job_id(dag_id, k) for k in keys} | {dag_trigger_job_id(dag_id)}
        stack.assert_nothing_written(ids, {dag_id})
    stack.assert_up()


# --- finding 4: CSRF and DNS rebinding ------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_simple_request_content_types_refused(stack: HostileStack, content_type: str) -> None:
    """What a browser may send cross-site without a preflight must not create a job."""
    body = job(stack)
    resp = stack.api.post("/v1/jobs", content=dumps(body), headers={"Content-Type": content_type})
    assert_refused(resp, None, (415,))
    stack.assert_nothing_written({body["job_id"]})


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1.evil.example"])
def test_foreign_origin_refused(stack: HostileStack, origin: str) -> None:
    body = job(stack)
    resp = stack.post_job(body, headers={"Origin": origin})
    assert_refused(resp, None, (403,))
    stack.assert_nothing_written({body["job_id"]})


def test_own_origin_accepted(stack: HostileStack) -> None:
    """The dashboard's own requests (same origin) still create jobs: the refusals above are
    of the foreign origin, not of every request with an Origin."""
    resp = stack.post_job(job(stack), headers={"Origin": stack.url})
    assert resp.status_code == 201, resp.text


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "127.0.0.1.nip.io"])
def test_foreign_host_refused(stack: HostileStack, host: str) -> None:
    """A DNS-rebound page reaches 127.0.0.1 under its own name: neither writes nor reads."""
    body = job(stack)
    resp = stack.post_job(body, headers={"Host": host})
    assert_refused(resp, None, (400, 421))
    stack.assert_nothing_written({body["job_id"]})
    read = stack.api.get("/v1/jobs", headers={"Host": host})
    assert_refused(read, None, (400, 421))


# --- finding 5 (at creation): headers no target may set --------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"Host": "internal.example"},
        {"host": "169.254.169.254"},
        {"Transfer-Encoding": "chunked"},
        {"Content-Length": "0"},
        {"X-Ok": "a\r\nX-Injected: 1"},
        {"X-Bad\nName": "v"},
    ],
    ids=["Host", "host-lower", "Transfer-Encoding", "Content-Length", "crlf-value", "lf-name"],
)
def test_target_headers_refused(stack: HostileStack, headers: dict[str, str]) -> None:
    target = {"type": "http", "url": stack.sink.url, "headers": headers}
    refused_everywhere(stack, job(stack, target=target), "target.headers")


# --- finding 6: Kafka targets into the deployment's own topics ------------------------------


def internal_topics(stack: HostileStack) -> list[str]:
    prefix = stack.settings.topic_prefix
    made = AdminClient({"bootstrap.servers": stack.settings.bootstrap_servers}).list_topics(
        timeout=10
    )
    changelogs = sorted(t for t in made.topics if t.startswith(prefix) and "changelog" in t)
    return [
        "duetime.jobs",
        "duetime.exec.critical",
        stack.topics.jobs,
        stack.topics.execution("normal"),
        stack.topics.control,
        stack.topics.results,
        *(changelogs[:1] or [f"{prefix}resolver-runs-changelog"]),
        f"{prefix}resolver-anything-changelog",
        "__consumer_offsets",
        "__transaction_state",
    ]


def test_kafka_targets_into_internal_topics_refused(stack: HostileStack) -> None:
    for topic in internal_topics(stack):
        refused_everywhere(
            stack, job(stack, target={"type": "kafka", "topic": topic}), "target.topic"
        )


# --- finding 7: DAGs and existing ids --------------------------------------------------------


def test_dag_member_cannot_take_over_an_existing_job(stack: HostileStack) -> None:
    existing = job(stack, name="owned-by-someone")
    assert stack.post_job(existing).status_code == 201
    before = stack.get_json(f"/v1/jobs/{existing['job_id']}")
    stack.keys.catch_up()
    records_before = stack.keys.count(stack.topics.jobs, existing["job_id"])
    # the reader sees what is written (so its "nothing written" elsewhere means something)
    assert records_before >= 1, "the key reader did not see the existing job's record"
    dag_id = str(uuid.uuid4())
    resp = stack.api.post(
        "/v1/dags",
        json={
            "dag_id": dag_id,
            "name": "takeover",
            "jobs": [
                {
                    "key": "a",
                    "name": "a",
                    "job_id": existing["job_id"],
                    "target": {"type": "http", "url": stack.secret_sink.url},
                }
            ],
        },
    )
    assert_refused(resp, None, (409,))
    after = stack.get_json(f"/v1/jobs/{existing['job_id']}")
    assert after == before, "the existing job changed"
    stack.keys.catch_up()
    assert stack.keys.count(stack.topics.jobs, existing["job_id"]) == records_before
    stack.assert_nothing_written({dag_trigger_job_id(dag_id)}, {dag_id})


def test_dag_repost(stack: HostileStack) -> None:
    dag_id = str(uuid.uuid4())
    body: dict[str, Any] = {
        "dag_id": dag_id,
        "name": "repost",
        "jobs": [
            {"key": "a", "name": "a", "target": {"type": "http", "url": stack.sink.url}},
            {
                "key": "b",
                "name": "b",
                "depends_on": ["a"],
                "target": {"type": "http", "url": stack.sink.url},
            },
        ],
    }
    first = stack.api.post("/v1/dags", json=body)
    assert first.status_code == 201, first.text
    same = stack.api.post("/v1/dags", json=body)
    assert same.status_code in (200, 201), f"an identical re-post: {same.status_code} {same.text}"
    assert same.json()["job_ids"] == first.json()["job_ids"]
    changed = {**body, "jobs": [{**body["jobs"][0], "payload": {"changed": True}}, body["jobs"][1]]}
    assert_refused(stack.api.post("/v1/dags", json=changed), None, (409,))
    stack.assert_up()


# --- finding 8: deep nesting -----------------------------------------------------------------


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = {"a": value} if i % 2 else [value]
    return value


def nested_text(depth: int) -> bytes:
    """``nested(depth)`` as JSON, written without recursion (the test's own json.dumps must
    not be what hits the recursion limit)."""
    opens = "".join('{"a":' if i % 2 else "[" for i in reversed(range(depth)))
    closes = "".join("}" if i % 2 else "]" for i in range(depth))
    return f'{opens}"leaf"{closes}'.encode()


@pytest.mark.parametrize("depth", [100, 500, 950])
def test_deep_payload_refused(stack: HostileStack, depth: int) -> None:
    body = job(stack, payload="PAYLOAD")
    raw = dumps(body).replace(b'"PAYLOAD"', nested_text(depth))
    resp = stack.api.post("/v1/jobs", content=raw, headers={"Content-Type": "application/json"})
    assert_refused(resp, "payload", (400, 413, 422))
    sdk_body = dict(body, job_id=str(uuid.uuid4()), payload=nested(depth))
    assert_sdk_refused(lambda: stack.sdk.create_job(sdk_body), "payload")
    stack.assert_nothing_written({body["job_id"], sdk_body["job_id"]})


def test_every_job_still_reads_after_deep_payloads(stack: HostileStack) -> None:
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(1000):
        params: dict[str, Any] = {"limit": 7}
        if cursor:
            params["cursor"] = cursor
        page = stack.get_json("/v1/jobs", **params)
        seen += [item["job_id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert cursor is None, "paging never reached the end"
    assert len(seen) == len(set(seen)), "paging returned a job twice"
    assert seen, "no job at all listed"
    for job_id in seen:
        stack.get_json(f"/v1/jobs/{job_id}")


@pytest.mark.parametrize(
    "payload",
    [{1, 2}, b"bytes", decimal.Decimal("1.5"), datetime(2026, 1, 1, tzinfo=UTC), object()],
    ids=["set", "bytes", "decimal", "datetime", "object"],
)
def test_sdk_non_json_payload_refused(stack: HostileStack, payload: Any) -> None:
    """A Python caller can hand the SDK what JSON cannot hold: a ValidationError naming the
    payload, not json's TypeError (found by the corpus)."""
    body = job(stack, payload=payload)
    assert_sdk_refused(lambda: stack.sdk.create_job(body), "payload")
    stack.assert_nothing_written({body["job_id"]})


# --- finding 10: next_runs of a per-second cron ----------------------------------------------


def test_next_runs_per_second_cron(stack: HostileStack) -> None:
    body = job(
        stack,
        name="every-second-later",
        schedule={"cron": "* * * * * *", "timezone": "UTC", "start_at": "2099-01-01T00:00:00Z"},
    )
    assert stack.post_job(body).status_code == 201
    path = f"/v1/jobs/{body['job_id']}/next_runs"
    wait_for(
        lambda: stack.get_json(f"/v1/jobs/{body['job_id']}")["next_run_at"],
        30,
        "the job's next_run_at",
    )
    answers: list[httpx.Response | BaseException] = []

    def ask() -> None:
        try:
            with httpx.Client(base_url=stack.url, timeout=30) as c:
                answers.append(c.get(path, params={"count": 100}))
        except BaseException as exc:  # reported below, with the status
            answers.append(exc)

    asker = threading.Thread(target=ask)
    asker.start()
    with httpx.Client(base_url=stack.url, timeout=5) as quick:
        while asker.is_alive():
            assert quick.get("/healthz").status_code == 200  # within 5 s, or httpx raises
        assert quick.get("/healthz").status_code == 200
    asker.join()
    resp = answers[0]
    assert isinstance(resp, httpx.Response), f"next_runs failed: {resp!r}"
    assert resp.status_code == 200, resp.text[:500]
    assert len(resp.json()["next_runs"]) == 100
    for count in (101, 10**6, 0, -1, "1e9", "x"):
        assert_refused(stack.api.get(path, params={"count": count}), "count", (400, 422))


# --- finding 11: huge numbers, dates out of range, NUL ---------------------------------------

HUGE = 10**400


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"timeout_s": HUGE}, "timeout_s"),
        ({"timeout_s": -HUGE}, "timeout_s"),
        ({"retry": {"max_retries": 0, "base_delay_s": HUGE}}, "base_delay_s"),
        ({"retry": {"max_retries": HUGE}}, "max_retries"),
        ({"retry": {"max_delay_s": HUGE}}, "max_delay_s"),
        ({"schedule": {"at": "0001-01-01T00:00:00+14:00"}}, "schedule"),
        ({"schedule": {"at": "9999-12-31T23:59:59-14:00"}}, "schedule"),
        ({"schedule": {"at": HUGE}}, "schedule"),
        ({"name": "nul\x00name"}, "name"),
        ({"name": "\x00"}, "name"),
        ({"labels": {"k": "v\x00"}}, "labels"),
    ],
    ids=[
        "timeout-huge", "timeout-neg-huge", "base-delay-huge", "max-retries-huge",
        "max-delay-huge", "at-year-0", "at-year-10000", "at-number", "nul-name", "only-nul",
        "nul-label",
    ],
)  # fmt: skip
def test_out_of_range_values_refused(
    stack: HostileStack, fields: dict[str, Any], field: str
) -> None:
    body = job(stack, **fields)
    resp = stack.api.post(
        "/v1/jobs", content=dumps(body), headers={"Content-Type": "application/json"}
    )
    assert_refused(resp, field, (400, 422))
    sdk_body = dict(body, job_id=str(uuid.uuid4()))
    assert_sdk_refused(lambda: stack.sdk.create_job(sdk_body), field)
    stack.assert_nothing_written({body["job_id"], sdk_body["job_id"]})


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/v1/jobs", "name_contains"),
        ("/v1/jobs", "name"),
        ("/v1/dlq", "name"),
        ("/v1/dags", "name_contains"),
    ],
)
def test_nul_in_filters_refused(stack: HostileStack, path: str, param: str) -> None:
    assert_refused(stack.api.get(path, params={param: "a\x00b"}), param, (400, 422))


@pytest.mark.parametrize(
    "body",
    [
        {"name": "a\x00b"},
        {"limit": HUGE},
        {"limit": -1},
        {"since": HUGE},
        {"until": "9999-12-31T23:59:59\x00"},
        {"job_id": "not-a-uuid"},
        {"include_replayed": "yes"},
        {"unknown": 1},
    ],
    ids=lambda b: next(iter(b)) + "-" + str(next(iter(b.values())))[:12],
)
def test_bulk_replay_filter_refused(stack: HostileStack, body: dict[str, Any]) -> None:
    resp = stack.api.post(
        "/v1/dlq/replay", content=dumps(body), headers={"Content-Type": "application/json"}
    )
    assert_refused(resp, next(iter(body)), (400, 422))


@pytest.mark.parametrize(
    "body",
    [{"since": "0001-01-01T00:00:00+14:00"}, {"until": "9999-12-31T23:59:59-14:00"}],
    ids=["since-year-0", "until-year-10000"],
)
def test_bulk_replay_filter_at_the_edges_of_time(stack: HostileStack, body: dict[str, Any]) -> None:
    """A filter at the edge of representable time is a valid (if empty) filter: answered, or
    refused naming it, never a 5xx."""
    resp = stack.api.post(
        "/v1/dlq/replay", content=dumps(body), headers={"Content-Type": "application/json"}
    )
    if resp.status_code >= 400:
        assert_refused(resp, next(iter(body)), (400, 422))
    else:
        assert resp.status_code == 202, resp.text


@pytest.mark.parametrize("ident", ["not-a-uuid", "%00", "1" * 400, "..%2F..%2Fhealthz"])
@pytest.mark.parametrize("command", ["cancel", "pause", "resume", "trigger"])
def test_commands_on_hostile_ids_refused(stack: HostileStack, ident: str, command: str) -> None:
    resp = stack.api.post(f"/v1/jobs/{ident}/{command}")
    assert_refused(resp, None, (400, 404, 422))


# --- finding 12 (the API part): readiness probes do not leak threads -------------------------


def test_readyz_does_not_grow_threads(stack: HostileStack) -> None:
    pid = stack.pids["api"]
    assert stack.api.get("/readyz").status_code == 200
    before = thread_count(pid)
    for _ in range(80):
        assert stack.api.get("/readyz").status_code == 200
    after = thread_count(pid)
    assert after - before <= 4, f"the API grew from {before} to {after} threads in 80 /readyz"


# --- the end: the stack survived everything above --------------------------------------------


def test_stack_survived(stack: HostileStack) -> None:
    stack.assert_survived()
