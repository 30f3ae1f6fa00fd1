"""Oversized payloads and results: refused at the edge, or failing alone.

- At the edge (SDK, REST API, CLI): a payload over its limit, and a job whose other fields
  (labels, target headers) make it too large for a Kafka record, are refused with a 413 /
  ``PayloadTooLarge`` naming the field and the limit; nothing reaches a topic or a table.
- Past the edge: a definition too large for the scheduler to keep in its changelog, written
  straight to the jobs topic, goes to the poison topic; the jobs around it still run.
- In a worker: Python tasks returning a 2 MiB result or raising with a 2 MiB message run in
  the same batches as ordinary ones; each reports once (the oversized output replaced by a
  marker, the message truncated with a marker) and every other execution completes exactly
  once.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from duetime.cli import main
from duetime.core.config import CommonSettings
from duetime.core.errors import PayloadTooLarge
from duetime.core.jobspec import DEFAULT_MAX_PAYLOAD_BYTES, MAX_DEFINITION_BYTES
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from duetime.schemas.codec import Codec
from tests.e2e.procs import Role, role_env
from tests.faults.support import parked, write_counts
from tests.helpers import TopicReader, wait_for
from tests.integration.test_api_support import RunningApi, table_counts, topic_record_count
from tests.integration.test_worker_support import Sink

ROOT = Path(__file__).resolve().parents[2]
NOW = {"at": "2020-01-01T00:00:00Z"}
TASKS = "tests.faults.oversized_tasks"


@pytest.fixture
def api(settings: CommonSettings) -> Iterator[RunningApi]:
    running = RunningApi(settings)
    yield running
    running.stop()


def body(**over: Any) -> dict[str, Any]:
    return {
        "name": "big",
        "schedule": NOW,
        "target": {"type": "http", "url": "http://127.0.0.1:9/hook"},
        **over,
    }


BIG_PAYLOAD = {"blob": "p" * (DEFAULT_MAX_PAYLOAD_BYTES + 1)}
BIG_LABELS = {f"label-{i}": "v" * 1000 for i in range(1500)}  # ~1.5 MB, each label is valid
BIG_HEADERS = {"X-Big": "h" * (MAX_DEFINITION_BYTES + 1)}


def test_oversized_jobs_are_refused_at_every_edge_and_write_nothing(
    settings: CommonSettings,
    api: RunningApi,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    before = topic_record_count(settings), table_counts(settings)
    # the SDK
    with JobClient(settings=settings) as client:
        for fields, field in (
            ({"payload": BIG_PAYLOAD}, "payload"),
            ({"labels": BIG_LABELS}, "labels"),
            ({"target": {"type": "http", "url": "http://x/", "headers": BIG_HEADERS}}, "target"),
        ):
            with pytest.raises(PayloadTooLarge) as refused:
                client.create_job(body(**fields))
            details = refused.value.details
            assert details["field"] == field, details
            assert details["size_bytes"] > details["limit_bytes"], details
            assert field in refused.value.message and str(details["limit_bytes"]) in (
                refused.value.message
            )
    # the REST API
    with api.client() as c:
        for fields, field in (
            ({"payload": BIG_PAYLOAD}, "payload"),
            ({"labels": BIG_LABELS}, "labels"),
            ({"target": {"type": "http", "url": "http://x/", "headers": BIG_HEADERS}}, "target"),
        ):
            r = c.post("/v1/jobs", json=body(**fields))
            assert r.status_code == 413, r.text
            error = r.json()["error"]
            assert error["code"] == "payload_too_large"
            assert error["details"]["field"] == field, error
            assert error["details"]["limit_bytes"] > 0
        huge = c.post(
            "/v1/jobs",
            content=json.dumps(body(payload={"blob": "z" * (6 * 1024 * 1024)})).encode(),
            headers={"content-type": "application/json"},
        )
        assert huge.status_code == 413, huge.text
    # the CLI (through the API): exit status 1, the error code on stderr
    payload_file = tmp_path / "payload.json"
    payload_file.write_text(json.dumps(BIG_PAYLOAD))
    capsys.readouterr()
    rc = main(
        ["jobs", "create", "--name", "big", "--at", "2020-01-01T00:00:00Z",
         "--url-target", "http://127.0.0.1:9/hook", "--payload", f"@{payload_file}",
         "--url", api.url]
    )  # fmt: skip
    _, err = capsys.readouterr()
    assert rc == 1 and "payload_too_large" in err, err
    assert str(DEFAULT_MAX_PAYLOAD_BYTES) in err, err
    # nothing was written anywhere
    assert (topic_record_count(settings), table_counts(settings)) == before


# --- past the edge -------------------------------------------------------------------------


@pytest.fixture
def roles(settings: CommonSettings, tmp_path: Path) -> Iterator[dict[str, Role]]:
    env = role_env(
        settings,
        PYTHONPATH=str(ROOT),
        DUETIME_SCHEDULER_STATE_DIR=str(tmp_path / "state"),
        DUETIME_WORKER_CONCURRENCY="8",
        DUETIME_LEASE_TTL_S="5",
    )
    started = {
        name: Role.start(f"oversized-{name}", [name], env) for name in ("scheduler", "worker")
    }
    yield started
    for role in started.values():
        role.kill()


def _alive(roles: dict[str, Role]) -> None:
    for name, role in roles.items():
        assert role.process.poll() is None, f"{name} exited:\n{role.log()[-3000:]}"


@pytest.mark.slow
def test_oversized_definitions_and_results_fail_alone(
    settings: CommonSettings, sink: Sink, roles: dict[str, Role]
) -> None:
    topics = Topics(settings.topic_prefix)
    codec = Codec()
    results = TopicReader(settings, [topics.results], "result")
    requests = TopicReader(settings, topics.executions, "execution")
    try:
        with JobClient(settings=settings) as client:
            # a definition the SDK would refuse, written straight to the topic (as a buggy
            # or foreign producer could): just under the broker's record limit
            template = client.build(body(name="too-big-for-the-scheduler"))
            giant = dataclasses.replace(template, labels={"blob": "g" * 1_030_000})
            raw = Producer(
                {"bootstrap.servers": settings.bootstrap_servers, "message.max.bytes": 1_048_000}
            )
            good_before = [
                client.create_job(
                    body(name=f"before-{i}", target={"type": "http", "url": sink.url})
                )
                for i in range(6)
            ]
            for p in range(settings.partitions):
                raw.produce(topics.jobs, key=giant.job_id, value=codec.dump(giant), partition=p)
            assert raw.flush(30) == 0
            python_jobs: dict[str, str] = {}
            for i in range(30):
                kind = ("ok", "big_output", "big_error")[i % 3]
                created = client.create_job(
                    body(
                        name=f"{kind}-{i}",
                        target={"type": "python", "ref": f"{TASKS}:{kind}"},
                        retry={"max_retries": 0, "base_delay_s": 0.1},
                    ),
                    wait=False,
                )
                python_jobs[created.job_id] = kind
            good_after = [
                client.create_job(body(name=f"after-{i}", target={"type": "http", "url": sink.url}))
                for i in range(6)
            ]
        http_jobs = {j.job_id for j in good_before + good_after}

        def final() -> dict[str, list[dict[str, Any]]]:
            _alive(roles)
            out: dict[str, list[dict[str, Any]]] = {}
            for r in results.snapshot():
                if r["status"] != "running":
                    out.setdefault(r["job_id"], []).append(r)
            return out if (set(python_jobs) | http_jobs) <= set(out) else {}

        done = wait_for(final, 120, "a final result for every job (the oversized ones too)")
        giant_parked = [
            p for p in parked(settings) if p.topic == topics.jobs and p.role == "scheduler"
        ]
        assert len(giant_parked) == settings.partitions, giant_parked
        assert all(p.value is not None and len(p.value) > 1_000_000 for p in giant_parked)
    finally:
        results.close()
        requests.close()

    per_job = Counter(r["job_id"] for r in requests.snapshot())
    deliveries = Counter(d.job_id for d in sink.deliveries)
    everyone = http_jobs | set(python_jobs)
    write_counts(
        "oversized",
        {
            "jobs": len(everyone),
            "lost": sum(1 for j in everyone if j not in done),
            "duplicate_effects": sum(1 for j in http_jobs if deliveries[j] > 1)
            + sum(1 for j in python_jobs if len(done.get(j, [])) > 1),
            "duplicate_requests": sum(1 for j in everyone if per_job[j] > 1),
            "oversized_definitions_parked": len(giant_parked),
        },
        {
            "python_results": {"ok": 10, "2 MiB output": 10, "2 MiB error message": 10},
            "http_jobs": len(http_jobs),
            "definition_bytes": len(codec.dump(giant)),
            "edge": "SDK, REST (413), CLI refuse payload/labels/target over their limits",
        },
    )
    assert {j: n for j, n in per_job.items() if n != 1} == {}
    assert giant.job_id not in per_job
    for job_id in http_jobs:
        assert [r["status"] for r in done[job_id]] == ["success"]
    assert Counter(d.job_id for d in sink.deliveries) == Counter(dict.fromkeys(http_jobs, 1))
    for job_id, kind in python_jobs.items():
        (result,) = done[job_id]
        if kind == "ok":
            assert result["status"] == "success" and json.loads(result["output_json"]) == {
                "ok": True
            }
        elif kind == "big_output":
            assert result["status"] == "success"
            marker = json.loads(result["output_json"])
            assert marker["duetime_truncated"] is True and marker["size_bytes"] > 2_000_000
        else:
            assert result["status"] == "failure"
            message = result["error"]["message"]
            assert len(message) < 4000 and "truncated" in message and message.startswith("yyy")
    print(
        f"oversized: {len(http_jobs)} http + {len(python_jobs)} python jobs, one request and "
        f"one final result each; {len(giant_parked)} oversized definitions parked"
    )
