"""Changing and deleting jobs (issue 14 item 7) against the real broker and database, with the
scheduler, a worker and the projector running: PATCH /v1/jobs/{id}, DELETE /v1/jobs/{id}, the
SDK's update_job / delete_job and the CLI's ``jobs update`` / ``jobs delete``."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from duetime.core.config import CommonSettings
from duetime.core.errors import Conflict, NotFound, RetryableError, ValidationError
from duetime.producers.sdk import JobClient, dag_trigger_job_id
from tests.helpers import wait_for
from tests.integration import test_api
from tests.integration.test_api import assert_error, iso, job_body
from tests.integration.test_api_support import (
    RunningApi,
    settle,
    table_counts,
    topic_record_count,
)
from tests.integration.test_cli import Cli
from tests.integration.test_worker_support import Sink

FAR = {"at": "2099-01-01T00:00:00Z"}

# the same API (small payload limit) and running roles as the REST tests
api = test_api.api
stack = test_api.stack


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def calls_of(sink: Sink, job_id: str) -> int:
    with sink.lock:
        return sum(1 for d in sink.deliveries if d.job_id == job_id)


def wait_job(c: httpx.Client, job_id: str, check: Any, what: str) -> dict[str, Any]:
    def done() -> dict[str, Any]:
        r = c.get(f"/v1/jobs/{job_id}")
        return dict(r.json()) if r.status_code == 200 and check(r.json()) else {}

    return wait_for(done, 30, what, interval_s=0.1)


def listed(c: httpx.Client) -> set[str]:
    return {j["job_id"] for j in c.get("/v1/jobs", params={"limit": 500}).json()["items"]}


def test_patch_changes_the_schedule_and_the_scheduler_fires_on_the_new_one(
    api: RunningApi, stack: Sink
) -> None:
    target = {"type": "http", "url": stack.url}
    with api.client() as c:
        created = c.post("/v1/jobs", json=job_body(name="later", schedule=FAR, target=target))
        job_id = created.json()["job_id"]
        # the scheduler holds the far revision before it is changed
        wait_job(c, job_id, lambda j: j["next_run_at"] is not None, "the job to be scheduled")
        before = c.get(f"/v1/jobs/{job_id}").json()
        soon = iso(datetime.now(UTC) + timedelta(seconds=1))
        r = c.patch(
            f"/v1/jobs/{job_id}",
            json={"schedule": {"at": soon}, "payload": {"v": 2}, "labels": {"team": "a"}},
            headers={"If-Match": f'"{before["revision"]}"'},
        )
        assert r.status_code == 200, r.text
        shown = r.json()
        # kept to the millisecond, as a create keeps it
        assert abs((_at(shown["schedule"]["at"]) - _at(soon)).total_seconds()) < 0.001
        assert shown["payload"] == {"v": 2}
        assert shown["labels"] == {"team": "a"} and shown["name"] == "later"
        assert shown["revision"] > before["revision"]
        assert shown["created_at"] == before["created_at"]
        assert shown["deleted"] is False
        job = wait_job(c, job_id, lambda j: j["status"] == "success", "the new schedule to fire")
        assert job["last_execution"]["status"] == "success"
        assert calls_of(stack, job_id) == 1
        # a finished one-time job given another time runs again
        again = iso(datetime.now(UTC) + timedelta(seconds=1))
        assert c.patch(f"/v1/jobs/{job_id}", json={"schedule": {"at": again}}).status_code == 200
        wait_for(lambda: calls_of(stack, job_id) == 2, 30, "the second run")
        # the same If-Match again names a revision the job has moved past
        stale = c.patch(
            f"/v1/jobs/{job_id}",
            json={"priority": "high"},
            headers={"If-Match": str(before["revision"])},
        )
        assert_error(stale, 412, "precondition_failed")


def test_patch_is_refused_naming_the_field_and_writes_nothing(
    settings: CommonSettings, api: RunningApi
) -> None:
    with api.client() as c:
        job_id = c.post("/v1/jobs", json=job_body(schedule=FAR)).json()["job_id"]
        revision = c.get(f"/v1/jobs/{job_id}").json()["revision"]
        before = topic_record_count(settings), table_counts(settings)
        cases: list[tuple[Any, str]] = [
            ({"schedule": {"cron": "61 * * * *"}}, "schedule"),
            ({"timeout_s": -1}, "timeout_s"),
            ({"priority": "urgent"}, "priority"),
            ({"labels": {"duetime.deleted": "true"}}, "labels"),
            ({"job_id": str(uuid.uuid4())}, "job_id"),
            ({"dag_id": str(uuid.uuid4())}, "dag_id"),
            ({"colour": "red"}, "colour"),
            ({"target": {"type": "http"}}, "target"),
            ({}, ""),
            ([], ""),
        ]
        for body, field in cases:
            error = assert_error(c.patch(f"/v1/jobs/{job_id}", json=body), 422)
            assert str(error["details"].get("field", "")).startswith(field), (body, error)
        assert_error(c.patch(f"/v1/jobs/{uuid.uuid4()}", json={"priority": "high"}), 404)
        assert_error(c.patch(f"/v1/jobs/{job_id}", content=b"{", **_json()), 400)
        assert_error(c.patch(f"/v1/jobs/{job_id}", content=b"{}"), 415)
        bad_match = c.patch(
            f"/v1/jobs/{job_id}", json={"priority": "high"}, headers={"If-Match": "abc"}
        )
        assert_error(bad_match, 422, "invalid")
        settle()
        assert (topic_record_count(settings), table_counts(settings)) == before
        assert c.get(f"/v1/jobs/{job_id}").json()["revision"] == revision


def _json() -> dict[str, Any]:
    return {"headers": {"Content-Type": "application/json"}}


def test_dag_members_and_trigger_jobs_change_only_through_their_dag(api: RunningApi) -> None:
    with api.client() as c:
        dag = c.post(
            "/v1/dags",
            json={
                "name": "d",
                "jobs": [{"key": "a", "name": "a", "target": {"type": "python", "ref": "x.y"}}],
            },
        )
        assert dag.status_code in (200, 201), dag.text
        out = dag.json()
        trigger = dag_trigger_job_id(out["dag_id"])
        for job_id in [*out["job_ids"].values(), trigger]:
            assert_error(c.patch(f"/v1/jobs/{job_id}", json={"priority": "high"}), 409)
            assert_error(c.delete(f"/v1/jobs/{job_id}"), 409)


def test_delete_hides_the_job_from_lists_and_stops_its_runs(
    settings: CommonSettings, api: RunningApi, stack: Sink
) -> None:
    target = {"type": "http", "url": stack.url}
    due = iso(datetime.now(UTC) + timedelta(seconds=4))
    with api.client() as c:
        doomed = c.post("/v1/jobs", json=job_body(schedule={"at": due}, target=target)).json()
        witness = c.post("/v1/jobs", json=job_body(schedule={"at": due}, target=target)).json()
        doomed_id, witness_id = doomed["job_id"], witness["job_id"]
        assert {doomed_id, witness_id} <= listed(c)
        r = c.delete(f"/v1/jobs/{doomed_id}")
        assert r.status_code == 200, r.text
        assert r.json()["deleted"] is True
        assert doomed_id not in listed(c) and witness_id in listed(c)
        # answered by id, cancelled by its scheduler; the witness, due at the same time, runs
        job = wait_job(c, doomed_id, lambda j: j["status"] == "cancelled", "the cancel")
        assert job["deleted"] is True and job["next_run_at"] is None
        wait_job(c, witness_id, lambda j: j["status"] == "success", "the witness to run")
        assert calls_of(stack, doomed_id) == 0
        assert c.get(f"/v1/jobs/{doomed_id}/executions").json()["items"] == []
        # the projector's rows keep it deleted (the label travels in the definition)
        wait_for(lambda: _projected_deleted(settings, doomed_id), 30, "the projected delete")
        overview = c.get("/v1/stats/overview").json()
        assert overview["jobs_total"] == 1
        # idempotent; a deleted job cannot be changed nor re-created with its id
        before = topic_record_count(settings)
        assert c.delete(f"/v1/jobs/{doomed_id}").status_code == 200
        assert topic_record_count(settings) == before
        assert_error(c.patch(f"/v1/jobs/{doomed_id}", json={"priority": "high"}), 409)
        again = c.post("/v1/jobs", json=job_body(schedule={"at": due}, job_id=doomed_id))
        assert_error(again, 409)
        assert_error(c.delete(f"/v1/jobs/{uuid.uuid4()}"), 404)


def _projected_deleted(settings: CommonSettings, job_id: str) -> bool:
    """The projector has written the deleted revision and the scheduler's cancelled state."""
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute(
            "SELECT deleted, status, state_offset FROM jobs WHERE job_id = %s", (job_id,)
        ).fetchone()
    return row is not None and row[0] is True and row[1] == "cancelled" and row[2] >= 0


def test_sdk_update_job_and_delete_job(
    settings: CommonSettings, api: RunningApi, stack: Sink
) -> None:
    target = {"type": "http", "url": stack.url}
    with JobClient(settings=settings) as client, api.client() as c:
        created = client.create_job(name="sdk", schedule=FAR, target=target)
        job_id = created.job_id
        wait_job(c, job_id, lambda j: j["next_run_at"] is not None, "the projected job")
        with pytest.raises(ValidationError) as bad:
            client.update_job(job_id, timeout_s=0)
        assert bad.value.field == "timeout_s"
        with pytest.raises(ValidationError) as fixed:
            client.update_job(job_id, dag_id=str(uuid.uuid4()))
        assert fixed.value.field == "dag_id"
        with pytest.raises(NotFound):
            client.update_job(str(uuid.uuid4()), priority="high")
        with pytest.raises(Conflict):
            client.update_job(job_id, expected_revision=1, priority="high")
        soon = iso(datetime.now(UTC) + timedelta(seconds=1))
        updated = client.update_job(job_id, schedule={"at": soon}, priority="high")
        assert updated.revision > created.definition.revision
        assert updated.created_at_ms == created.definition.created_at_ms
        job = wait_job(c, job_id, lambda j: j["status"] == "success", "the SDK's new schedule")
        assert job["priority"] == "high" and calls_of(stack, job_id) == 1

        other = client.create_job(name="sdk-doomed", schedule=FAR, target=target).job_id
        wait_job(c, other, lambda j: j["next_run_at"] is not None, "the projected job")
        assert client.delete_job(other) is True
        assert client.delete_job(other) is False
        wait_job(c, other, lambda j: j["status"] == "cancelled", "the SDK's cancel")
        assert other not in listed(c) and c.get(f"/v1/jobs/{other}").json()["deleted"] is True
        with pytest.raises(Conflict):
            client.update_job(other, priority="low")


def test_concurrent_patches_each_build_on_the_other(api: RunningApi) -> None:
    """Two changes of different fields at once: the row lock serialises them, neither is lost."""
    with api.client() as c:
        job_id = c.post("/v1/jobs", json=job_body(schedule=FAR)).json()["job_id"]
        with api.client() as c2:
            import concurrent.futures

            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                a = pool.submit(c.patch, f"/v1/jobs/{job_id}", json={"priority": "high"})
                b = pool.submit(c2.patch, f"/v1/jobs/{job_id}", json={"labels": {"k": "v"}})
                assert a.result().status_code == 200 and b.result().status_code == 200
        job = c.get(f"/v1/jobs/{job_id}").json()
        assert job["priority"] == "high" and job["labels"] == {"k": "v"}


def test_cli_jobs_update_and_delete(api: RunningApi, capsys: pytest.CaptureFixture[str]) -> None:
    cli = Cli(api, capsys)
    created = cli.json("jobs", "create", "--name", "cli", "--at", FAR["at"], "--python", "m:f")
    job_id = created["job_id"]
    revision = cli.json("jobs", "get", job_id)["revision"]
    updated = cli.json(
        "jobs", "update", job_id, "--cron", "*/5 * * * *", "--priority", "high",
        "--label", "team=a", "--if-revision", str(revision),
    )  # fmt: skip
    assert updated["schedule"] == {"cron": "*/5 * * * *", "timezone": "UTC"}
    assert updated["priority"] == "high" and updated["labels"] == {"team": "a"}
    assert updated["target"] == {"type": "python", "ref": "m:f"} and updated["name"] == "cli"
    # refused: a stale revision (412), a bad field (named), nothing to change
    rc, _, err = cli("jobs", "update", job_id, "--priority", "low", "--if-revision", "1")
    assert rc == 1 and "precondition_failed" in err
    rc, _, err = cli("jobs", "update", job_id, "--timeout-s", "-1")
    assert rc == 1 and "field timeout_s" in err
    with pytest.raises(SystemExit, match="at least one field"):
        cli("jobs", "update", job_id)
    rc, out, _ = cli("jobs", "delete", job_id)
    assert rc == 0 and f"job {job_id} deleted" in out
    assert job_id not in {j["job_id"] for j in cli.json("jobs", "list", "--all")}
    assert cli.json("jobs", "get", job_id)["deleted"] is True
    rc, _, err = cli("jobs", "update", job_id, "--priority", "low")
    assert rc == 1 and "deleted" in err


def test_sdk_create_job_over_an_existing_id_checks_the_projection(
    settings: CommonSettings, api: RunningApi
) -> None:
    job_id = str(uuid.uuid4())
    body = job_body(schedule=FAR, job_id=job_id)
    with api.client() as c:
        assert c.post("/v1/jobs", json=body).status_code == 201
    before = topic_record_count(settings)
    with JobClient(settings=settings, check_existing=True) as client:
        same = client.create_job(body)  # the same body: nothing published
        assert same.job_id == job_id
        assert topic_record_count(settings) == before
        with pytest.raises(Conflict):
            client.create_job({**body, "priority": "high"})
        assert topic_record_count(settings) == before
        fresh = client.create_job(job_body(schedule=FAR, job_id=str(uuid.uuid4())))
    assert topic_record_count(settings) == before + 1 and fresh.definition.name
    broken = replace(settings, database_url="postgresql://u:hunter2@127.0.0.1:1/x")
    with JobClient(settings=broken, check_existing=True) as client:
        with pytest.raises(RetryableError) as err:
            client.create_job(body)
        assert "hunter2" not in str(err.value)
