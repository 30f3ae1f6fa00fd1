"""The REST routes the web dashboard reads (issue 9), against the real broker and database:
figures (/v1/stats/...), DAG list, name search, next runs, the dead-letter filters and the
progress of a replay; and the dashboard's own files (served without a token, with a strict
Content-Security-Policy)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from duetime.core.config import CommonSettings
from duetime.core.schedule import next_fire, parse_schedule
from tests.helpers import wait_for
from tests.integration.test_api import assert_error, iso, job_body
from tests.integration.test_api_support import RunningApi, running_stack
from tests.integration.test_worker_support import Sink

TOKEN = "dashboard-test-token-0123456789"


@pytest.fixture
def api(settings: CommonSettings) -> Iterator[RunningApi]:
    running = RunningApi(settings, tokens=(TOKEN,))
    yield running
    running.stop()


def test_the_dashboard_is_served_from_the_package_without_a_token(api: RunningApi) -> None:
    with api.client() as c:
        root = c.get("/")
        assert root.status_code in (302, 307) and root.headers["location"] == "/ui/"
        page = c.get("/ui/")
        assert page.status_code == 200 and 'src="app.js"' in page.text
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
        for asset in ("app.js", "api.js", "dom.js", "charts.js", "graph.js", "style.css"):
            r = c.get(f"/ui/{asset}")
            assert r.status_code == 200, asset
            assert r.headers["x-content-type-options"] == "nosniff"
        js = c.get("/ui/pages/jobs.js")
        assert js.status_code == 200 and "javascript" in js.headers["content-type"]
        assert_error(c.get("/v1/stats/overview"), 401, "unauthorized")
        assert c.get("/ui/../pyproject.toml").status_code == 404


def test_search_by_name_is_literal_and_pages_on_the_server(api: RunningApi) -> None:
    names = ["report_a", "report%b", "Report-C", "other", "<script>alert(1)</script>"]
    with api.client(TOKEN) as c:
        for name in names:
            assert c.post("/v1/jobs", json=job_body(name=name)).status_code == 201

        def found(text: str, **query: Any) -> list[str]:
            page = c.get("/v1/jobs", params={"name_contains": text, **query})
            assert page.status_code == 200, page.text
            return sorted(j["name"] for j in page.json()["items"])

        assert found("report") == ["Report-C", "report%b", "report_a"]  # case-insensitive
        assert found("t_") == ["report_a"]  # "_" and "%" are not wildcards
        assert found("t%") == ["report%b"]
        assert found("<script>") == ["<script>alert(1)</script>"]
        assert found("report", priority="high") == []
        first = c.get("/v1/jobs", params={"name_contains": "report", "limit": 2}).json()
        assert len(first["items"]) == 2 and first["next_cursor"]
        rest = c.get(
            "/v1/jobs", params={"name_contains": "report", "cursor": first["next_cursor"]}
        ).json()
        assert len(rest["items"]) == 1 and rest["next_cursor"] is None
        assert_error(c.get("/v1/jobs", params={"name_contains": ""}), 400)


def test_next_runs_follow_the_schedule_and_stop_with_the_job(api: RunningApi) -> None:
    schedule = {"cron": "30 2 * * *", "timezone": "Europe/Berlin"}
    with api.client(TOKEN) as c:
        job_id = c.post("/v1/jobs", json=job_body(schedule=schedule)).json()["job_id"]
        runs = c.get(f"/v1/jobs/{job_id}/next_runs", params={"count": 4}).json()["next_runs"]
        times = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in runs]
        assert len(times) == 4
        parsed = parse_schedule(schedule)
        for before, after in itertools.pairwise(times):
            assert next_fire(parsed, before) == after
        manual = c.post("/v1/jobs", json=job_body(schedule=None)).json()["job_id"]
        assert c.get(f"/v1/jobs/{manual}/next_runs").json()["next_runs"] == []
        assert_error(c.get(f"/v1/jobs/{uuid.uuid4()}/next_runs"), 404, "not_found")


def test_figures_dag_list_dead_letters_and_replay_progress(
    settings: CommonSettings, api: RunningApi
) -> None:
    with running_stack(settings) as sink, api.client(TOKEN) as c:
        _run_some_work(c, sink)
        # overview: jobs by status and the dead letter not replayed yet
        overview = wait_for(
            lambda: (o := c.get("/v1/stats/overview").json())["dlq_depth"] == 1 and o,
            30,
            "the dead letter in the overview",
        )
        assert overview["jobs_by_status"].get("dead") == 1
        assert overview["jobs_total"] == sum(overview["jobs_by_status"].values()) == 2
        # executions: outcomes per bucket, lateness percentiles of started executions
        stats = c.get("/v1/stats/executions", params={"window_s": 600, "bucket_s": 10}).json()
        assert stats["bucket_s"] == 10 and len(stats["buckets"]) == 60
        starts = [b["start"] for b in stats["buckets"]]
        assert starts == sorted(starts)
        totals = {k: sum(b["outcomes"][k] for b in stats["buckets"]) for k in ("success", "dead")}
        assert totals == {"success": 1, "dead": 1}
        lateness = [b for b in stats["buckets"] if b["started"]]
        assert lateness and all(0 <= b["lateness_p50_ms"] <= b["lateness_p99_ms"] for b in lateness)
        assert_error(c.get("/v1/stats/executions", params={"window_s": 86400, "bucket_s": 5}), 400)
        # consumer lag per priority: all four, the worker has consumed what it ran
        lag = c.get("/v1/stats/lag").json()
        assert [p["priority"] for p in lag["priorities"]] == ["critical", "high", "normal", "low"]
        assert lag["group"] == f"{settings.topic_prefix}workers"
        assert all(
            p["lag"] >= 0 and p["end_offset"] >= p["committed_offset"] for p in lag["priorities"]
        )
        # dead letters: by name, not replayed only
        name = c.get("/v1/dlq", params={"name": "dies", "include_replayed": "false"}).json()
        assert [d["name"] for d in name["items"]] == ["dies"]
        assert c.get("/v1/dlq", params={"name": "nope"}).json()["items"] == []
        dead_id = name["items"][0]["execution_id"]
        # replay: progress says "in progress", then "succeeded" once the new execution ran
        sink.broken = False
        assert c.post(f"/v1/dlq/{dead_id}/replay").status_code == 202
        assert c.get("/v1/dlq", params={"include_replayed": "false"}).json()["items"] == []

        def progress() -> dict[str, Any]:
            r = c.post("/v1/dlq/replay-progress", json={"execution_ids": [dead_id]})
            assert r.status_code == 200, r.text
            return dict(r.json())

        first = progress()
        assert first["requested"] == first["replayed"] == 1
        done = wait_for(lambda: (p := progress())["succeeded"] == 1 and p, 30, "the replay")
        assert done["in_progress"] == 0 and done["dead"] == 0
        assert done["executions"][0]["execution_id"] != dead_id
        unknown = c.post("/v1/dlq/replay-progress", json={"execution_ids": [str(uuid.uuid4())]})
        assert unknown.json()["replayed"] == 0 and unknown.json()["executions"] == []
        assert_error(c.post("/v1/dlq/replay-progress", json={"execution_ids": []}), 422)
        # DAGs: listed newest first with their latest run
        ok = {"type": "http", "url": sink.url}
        dag = c.post(
            "/v1/dags",
            json={
                "name": "nightly-etl",
                "jobs": [
                    {"key": "a", "name": "a", "target": ok},
                    {"key": "b", "name": "b", "target": ok, "depends_on": ["a"]},
                ],
            },
        ).json()
        listed = c.get("/v1/dags").json()["items"]
        assert [(d["dag_id"], d["node_count"], d["last_run"]) for d in listed] == [
            (dag["dag_id"], 2, None)
        ]
        run = c.post(f"/v1/dags/{dag['dag_id']}/trigger").json()["dag_run_id"]
        last = wait_for(
            lambda: c.get("/v1/dags", params={"name_contains": "ETL"}).json()["items"][0][
                "last_run"
            ],
            30,
            "the DAG's run in the list",
        )
        assert last["dag_run_id"] == run
        assert c.get("/v1/dags", params={"name_contains": "zzz"}).json()["items"] == []


def _run_some_work(c: httpx.Client, sink: Sink) -> None:
    """One job that succeeds, one that dies (the sink refuses it), both run by now."""
    now = iso(datetime.now(UTC) - timedelta(seconds=1))
    target = {"type": "http", "url": sink.url}
    ok = c.post("/v1/jobs", json=job_body(name="works", schedule={"at": now}, target=target))
    assert ok.status_code == 201, ok.text
    wait_for(
        lambda: c.get(f"/v1/jobs/{ok.json()['job_id']}").json()["status"] == "success",
        30,
        "the first job to succeed",
    )
    sink.broken = True
    dies = job_body(name="dies", schedule={"at": now}, target=target, retry={"max_retries": 0})
    dead = c.post("/v1/jobs", json=dies)
    assert dead.status_code == 201, dead.text
    wait_for(
        lambda: c.get(f"/v1/jobs/{dead.json()['job_id']}").json()["status"] == "dead",
        30,
        "the second job to die",
    )
