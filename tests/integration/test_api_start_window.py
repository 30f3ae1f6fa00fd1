"""``start_within_s`` through the producers against the real broker and database (issue 14,
item 4): REST create, GET, PATCH and its 422s, the SDK and the CLI. What the window does to
an execution is tested in ``test_worker_gate.py`` and ``tests/hostile/test_start_window.py``."""

from __future__ import annotations

import math
from typing import Any

import pytest

from duetime.core.config import CommonSettings
from duetime.core.errors import ValidationError
from duetime.producers.sdk import JobClient
from tests.helpers import wait_for
from tests.integration import test_api
from tests.integration.test_api import JSON, assert_error, job_body
from tests.integration.test_api_support import RunningApi, table_counts, topic_record_count
from tests.integration.test_cli import Cli

api = test_api.api  # the REST tests' in-process API (its fixture, re-exported)

FAR = {"at": "2099-01-01T00:00:00Z"}


@pytest.mark.parametrize("bad", [0, -1, -0.001, 604_801, 1e308, "60", True, [1], {"s": 1}])
def test_a_bad_window_is_refused_with_422_naming_the_field_and_writes_nothing(
    settings: CommonSettings, api: RunningApi, bad: Any
) -> None:
    before = topic_record_count(settings), table_counts(settings)
    with api.client() as c:
        r = c.post("/v1/jobs", json=job_body(schedule=FAR, start_within_s=bad))
        error = assert_error(r, 422)
    assert "start_within_s" in error["details"]["field"], error
    assert (topic_record_count(settings), table_counts(settings)) == before


def test_nan_is_not_json_over_rest_and_not_a_window_over_the_sdk(
    api: RunningApi, client: JobClient
) -> None:
    body = b'{"name": "n", "target": {"type": "http", "url": "http://127.0.0.1:9/x"}, '
    with api.client() as c:
        r = c.post("/v1/jobs", content=body + b'"start_within_s": NaN}', **JSON)
        assert_error(r, 400, "bad_request")  # JSON has no NaN: malformed, as for any field
    for bad in (math.nan, math.inf, 0.0):
        with pytest.raises(ValidationError) as caught:
            client.create_job(job_body(schedule=FAR), start_within_s=bad)
        assert caught.value.details["field"] == "start_within_s"


def test_rest_create_get_and_patch_keep_the_window(api: RunningApi) -> None:
    with api.client() as c:
        created = c.post("/v1/jobs", json=job_body(schedule=FAR, start_within_s=90))
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        # idempotent: the same body again is no conflict, another window is
        again = c.post("/v1/jobs", json=job_body(schedule=FAR, start_within_s=90, job_id=job_id))
        assert again.status_code in (200, 201), again.text
        other = c.post("/v1/jobs", json=job_body(schedule=FAR, start_within_s=5, job_id=job_id))
        assert_error(other, 409)

        def shown() -> dict[str, Any]:
            r = c.get(f"/v1/jobs/{job_id}")
            return dict(r.json()) if r.status_code == 200 else {}

        job = wait_for(shown, 30, "the job to be projected")
        assert job["start_within_s"] == 90.0
        # a change of another field keeps the window; then the window changes; null removes it
        r = c.patch(f"/v1/jobs/{job_id}", json={"payload": {"v": 2}})
        assert r.status_code == 200 and r.json()["start_within_s"] == 90.0, r.text
        r = c.patch(f"/v1/jobs/{job_id}", json={"start_within_s": 2.5})
        assert r.status_code == 200 and r.json()["start_within_s"] == 2.5, r.text
        bad = c.patch(f"/v1/jobs/{job_id}", json={"start_within_s": -3})
        assert "start_within_s" in assert_error(bad, 422)["details"]["field"]
        r = c.patch(f"/v1/jobs/{job_id}", json={"start_within_s": None})
        assert r.status_code == 200 and r.json()["start_within_s"] is None, r.text
        assert c.get(f"/v1/jobs/{job_id}").json()["start_within_s"] is None


def test_the_sdk_and_the_cli_set_the_window(
    api: RunningApi, client: JobClient, capsys: pytest.CaptureFixture[str]
) -> None:
    created = client.create_job(job_body(schedule=FAR), start_within_s=12.5)
    assert created.definition.start_within_s == 12.5
    cli = Cli(api, capsys)
    out = cli.json(
        "jobs", "create", "--name", "windowed", "--at", FAR["at"],
        "--url-target", "http://127.0.0.1:9/x", "--start-within", "45",
    )  # fmt: skip
    with api.client() as c:

        def projected() -> dict[str, Any]:
            r = c.get(f"/v1/jobs/{out['job_id']}")
            return dict(r.json()) if r.status_code == 200 else {}

        job = wait_for(projected, 30, "the CLI's job to be projected")
    assert job["start_within_s"] == 45.0
    rc, _, err = cli(
        "jobs", "create", "--name", "w", "--at", FAR["at"],
        "--url-target", "http://127.0.0.1:9/x", "--start-within", "0",
    )  # fmt: skip
    assert rc != 0 and "start_within_s" in err
