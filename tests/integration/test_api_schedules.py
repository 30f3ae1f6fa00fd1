"""The schedule toolkit over REST, the SDK and the CLI, against the real broker and database:
named calendars (/v1/calendars), a job's calendar and jitter in next_runs, and a backfill run
by the scheduler, a worker and the projector (in this process) with its progress."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from duetime.core.config import CommonSettings
from duetime.core.errors import ValidationError
from duetime.core.schedule import jitter_ms
from duetime.producers.sdk import JobClient
from tests.helpers import wait_for
from tests.integration.test_api import assert_error, job_body
from tests.integration.test_api_support import (
    RunningApi,
    running_stack,
    settle,
    table_counts,
    topic_record_count,
)
from tests.integration.test_cli import Cli
from tests.integration.test_worker_support import Sink

HOLIDAYS = {
    "name": "holidays",
    "timezone": "Europe/Berlin",
    "exclude": ["2026-12-25", "2026-12-24..2026-12-31"],
    "exclude_weekdays": ["sat", "sun"],
}


@pytest.fixture
def api(settings: CommonSettings) -> Iterator[RunningApi]:
    running = RunningApi(settings)
    yield running
    running.stop()


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_calendars_are_created_read_listed_replaced_and_deleted(api: RunningApi) -> None:
    with api.client() as c:
        r = c.post("/v1/calendars", json=HOLIDAYS)
        assert r.status_code == 201, r.text
        shown = r.json()
        # normalised: the range swallows the single day; weekdays in their short names
        assert shown["exclude"] == ["2026-12-24..2026-12-31"]
        assert shown["exclude_weekdays"] == ["sat", "sun"]
        assert c.post("/v1/calendars", json=HOLIDAYS).status_code == 200  # the same: idempotent
        other = {**HOLIDAYS, "exclude_weekdays": ["sun"]}
        assert_error(c.post("/v1/calendars", json=other), 409, "conflict")
        assert c.put("/v1/calendars/holidays", json=other).json()["exclude_weekdays"] == ["sun"]
        assert c.get("/v1/calendars/holidays").json()["exclude_weekdays"] == ["sun"]
        for name in ("b-cal", "a-cal"):
            assert c.post("/v1/calendars", json={"name": name}).status_code == 201
        page = c.get("/v1/calendars", params={"limit": 2}).json()
        assert [i["name"] for i in page["items"]] == ["a-cal", "b-cal"]
        rest = c.get("/v1/calendars", params={"cursor": page["next_cursor"]}).json()
        assert [i["name"] for i in rest["items"]] == ["holidays"] and rest["next_cursor"] is None
        assert c.delete("/v1/calendars/a-cal").json()["name"] == "a-cal"
        assert_error(c.get("/v1/calendars/a-cal"), 404, "not_found")
        assert_error(c.delete("/v1/calendars/a-cal"), 404, "not_found")
        assert_error(c.get("/v1/calendars/no%20such"), 404, "not_found")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**HOLIDAYS, "timezone": "Mars/Olympus"}, "calendar.timezone"),
        ({**HOLIDAYS, "exclude": ["2026-13-01"]}, "calendar.exclude[0]"),
        ({**HOLIDAYS, "exclude": ["2026-12-31..2026-12-01"]}, "calendar.exclude[0]"),
        ({**HOLIDAYS, "exclude_weekdays": ["caturday"]}, "calendar.exclude_weekdays[0]"),
        ({**HOLIDAYS, "name": "has space"}, "calendar.name"),
        ({**HOLIDAYS, "colour": "red"}, "calendar.colour"),
    ],
)
def test_a_bad_calendar_is_a_422_naming_the_field_and_writes_nothing(
    settings: CommonSettings, api: RunningApi, body: dict[str, Any], field: str
) -> None:
    with api.client() as c:
        before = table_counts(settings)
        error = assert_error(c.post("/v1/calendars", json=body), 422)
        assert error["details"]["field"] == field
        assert c.get("/v1/calendars").json()["items"] == []
        assert table_counts(settings) == before


def test_a_job_copies_its_calendar_and_next_runs_skip_and_jitter(
    settings: CommonSettings, api: RunningApi
) -> None:
    with api.client() as c:
        # an unknown calendar: 422, nothing written
        before = topic_record_count(settings), table_counts(settings)
        unknown = job_body(schedule={"cron": "0 9 * * *", "calendar": "holidays"})
        error = assert_error(c.post("/v1/jobs", json=unknown), 422, "unknown_calendar")
        assert error["details"] == {"field": "schedule.calendar", "calendar": "holidays"}
        batch = c.post("/v1/jobs:batch", json={"jobs": [job_body(), unknown]})
        assert assert_error(batch, 422)["details"]["field"] == "jobs[1].schedule.calendar"
        assert (topic_record_count(settings), table_counts(settings)) == before

        c.post("/v1/calendars", json=HOLIDAYS)
        schedule = {
            "cron": "0 9 * * *",
            "timezone": "Europe/Berlin",
            "jitter_s": 600,
            "calendar": "holidays",
            "start_at": "2026-12-21T00:00:00Z",
        }
        created = c.post("/v1/jobs", json=job_body(schedule=schedule))
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        job = c.get(f"/v1/jobs/{job_id}").json()
        assert job["schedule"]["calendar"] == {**HOLIDAYS, "exclude": ["2026-12-24..2026-12-31"]}
        assert job["schedule"]["jitter_s"] == 600
        runs = [_at(t) for t in c.get(f"/v1/jobs/{job_id}/next_runs?count=5").json()["next_runs"]]
        nominal = [datetime(2026, 12, d, 8, tzinfo=UTC) for d in (21, 22, 23)] + [
            datetime(2027, 1, 1, 8, tzinfo=UTC),
            datetime(2027, 1, 4, 8, tzinfo=UTC),
        ]
        # the job starts on 21 December: weekends and 24 to 31 December are left out, and
        # each run is its 09:00 plus the job's own jitter
        assert runs == [
            n + timedelta(milliseconds=jitter_ms(job_id, int(n.timestamp() * 1000), 600))
            for n in nominal
        ]

        # a calendar change reaches a job when the job is updated (it carries a copy)
        c.put("/v1/calendars/holidays", json={**HOLIDAYS, "exclude_weekdays": ["mon"]})
        assert c.get(f"/v1/jobs/{job_id}").json()["schedule"]["calendar"]["exclude_weekdays"] == [
            "sat",
            "sun",
        ]
        patched = c.patch(f"/v1/jobs/{job_id}", json={"schedule": schedule})
        assert patched.status_code == 200, patched.text
        assert patched.json()["schedule"]["calendar"]["exclude_weekdays"] == ["mon"]


def test_the_sdk_resolves_a_calendar_name_from_the_database(
    settings: CommonSettings, api: RunningApi
) -> None:
    with api.client() as c:
        c.post("/v1/calendars", json=HOLIDAYS)
    with JobClient(settings=settings) as client:
        spec = job_body(schedule={"cron": "0 9 * * *", "calendar": "holidays"})
        definition = client.build(spec)
        assert definition.schedule is not None
        calendar = getattr(definition.schedule, "calendar", None)
        assert calendar is not None and calendar.exclude_weekdays == ["sat", "sun"]
        with pytest.raises(ValidationError) as err:
            client.build(job_body(schedule={"cron": "0 9 * * *", "calendar": "nope"}))
        assert err.value.code == "unknown_calendar"


# --------------------------------------------------------------------------------- backfill


@pytest.fixture
def stack(settings: CommonSettings) -> Iterator[Sink]:
    with running_stack(settings) as sink:
        yield sink


def deliveries(sink: Sink, job_id: str) -> list[dict[str, Any]]:
    with sink.lock:
        return [d.body for d in sink.deliveries if d.job_id == job_id]


def test_a_backfill_runs_each_occurrence_once_and_shows_its_progress(
    settings: CommonSettings,
    api: RunningApi,
    stack: Sink,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = {"type": "http", "url": stack.url}
    with api.client() as c:
        # yearly: nothing of its own schedule fires during the test; overlap=skip: one at a time
        body = job_body(schedule={"cron": "0 0 1 1 *"}, target=target, overlap="skip")
        job_id = c.post("/v1/jobs", json=body).json()["job_id"]
        wait_for(
            lambda: c.get(f"/v1/jobs/{job_id}").json()["next_run_at"] is not None,
            30,
            "the scheduler to hold the job",
        )
        rng = {"from": "2020-01-01T00:00:00Z", "to": "2024-12-31T23:59:59Z"}
        r = c.post(f"/v1/jobs/{job_id}/backfill", json=rng)
        assert r.status_code == 202, r.text
        first = r.json()
        assert (first["occurrences"], first["excluded"], first["from"]) == (
            5,
            0,
            "2020-01-01T00:00:00Z",
        )
        path = f"/v1/jobs/{job_id}/backfills/{first['backfill_id']}"

        def done() -> dict[str, Any]:
            shown = c.get(path).json()
            return dict(shown) if shown["state"] == "done" else {}

        final = wait_for(done, 60, "the backfill's 5 occurrences to run")
        assert (final["succeeded"], final["failed"], final["pending"]) == (5, 0, 0)
        assert final["progress"].startswith("backfill 2020-01-01 00:00 → 2024-12-31 23:59: 5/5")
        ran = sorted(d["scheduled_at"] for d in deliveries(stack, job_id))
        assert ran == [f"{y}-01-01T00:00:00.000Z" for y in range(2020, 2025)]
        # the same range again: the same backfill, nothing runs twice
        again = c.post(f"/v1/jobs/{job_id}/backfill", json=rng)
        assert again.status_code == 200 and again.json()["backfill_id"] == first["backfill_id"]
        listed = c.get(f"/v1/jobs/{job_id}/backfills").json()["items"]
        assert [b["backfill_id"] for b in listed] == [first["backfill_id"]]

        # the CLI: a second range, followed to its end with the progress bar
        cli = Cli(api, capsys)
        rc, _, err = cli(
            "jobs", "backfill", job_id, "--from", "2018-01-01T00:00:00Z",
            "--to", "2019-06-01T00:00:00Z",
        )  # fmt: skip
        assert rc == 0, err
        assert "[##############################] backfill 2018-01-01 00:00" in err
        assert "2/2 done" in err
        settle()
        assert len(deliveries(stack, job_id)) == 7  # 5 + 2, each once

        # a cancelled job is not backfilled
        c.post(f"/v1/jobs/{job_id}/cancel")
        wait_for(
            lambda: c.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled",
            30,
            "the cancel to be projected",
        )
        assert_error(c.post(f"/v1/jobs/{job_id}/backfill", json=rng), 409, "conflict")


def test_a_bad_backfill_is_refused_and_writes_nothing(
    settings: CommonSettings, api: RunningApi
) -> None:
    with api.client() as c:
        cron_id = c.post("/v1/jobs", json=job_body(schedule={"cron": "* * * * * *"})).json()[
            "job_id"
        ]
        once = job_body(schedule={"at": "2099-01-01T00:00:00Z"})
        once_id = c.post("/v1/jobs", json=once).json()["job_id"]
        before = topic_record_count(settings), table_counts(settings)
        day = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"}
        cases: list[tuple[str, Any, int, str | None]] = [
            (cron_id, day, 422, "to"),  # 86,401 occurrences: over 10,000
            (cron_id, {"from": day["to"], "to": day["from"]}, 422, "to"),
            (cron_id, {"from": "yesterday", "to": day["to"]}, 422, "from"),
            (cron_id, {"from": day["from"]}, 422, "to"),
            (cron_id, {**day, "step": 1}, 422, "step"),
            (cron_id, [], 422, ""),
            (once_id, day, 422, "schedule"),
            (str(uuid.uuid4()), day, 404, None),
        ]
        for job_id, body, status, field in cases:
            error = assert_error(c.post(f"/v1/jobs/{job_id}/backfill", json=body), status)
            if field is not None:
                assert error["details"]["field"] == field, (body, error)
        assert_error(c.get(f"/v1/jobs/{cron_id}/backfills/{uuid.uuid4()}"), 404, "not_found")
        assert c.get(f"/v1/jobs/{cron_id}/backfills").json() == {"items": []}
        assert (topic_record_count(settings), table_counts(settings)) == before


def test_a_dag_schedule_names_a_calendar_too(api: RunningApi) -> None:
    target = {"type": "http", "url": "http://127.0.0.1:9/hook"}
    dag: dict[str, Any] = {
        "name": "etl",
        "jobs": [{"key": "extract", "name": "extract", "target": target}],
        "schedule": {"cron": "0 2 * * *", "calendar": "holidays"},
    }
    with api.client() as c:
        error = assert_error(c.post("/v1/dags", json=dag), 422, "unknown_calendar")
        assert error["details"]["field"] == "schedule.calendar"
        c.post("/v1/calendars", json=HOLIDAYS)
        created = c.post("/v1/dags", json=dag)
        assert created.status_code == 201, created.text
        shown = c.get(f"/v1/dags/{created.json()['dag_id']}").json()
        assert shown["schedule"]["calendar"]["exclude_weekdays"] == ["sat", "sun"]
