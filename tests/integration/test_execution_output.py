"""Errors and outputs, visible (issue 14.5), against the real broker and database.

An in-process scheduler and worker run Python tasks that raise (through nested calls, with a
credential in the message) and that return values (small, large, not strict JSON); then:

- the worker's result carries the traceback: the raising frames, redacted, bounded;
- the projector stores each execution's output and its latest attempt's traceback, and a
  rebuild from the topics writes the same;
- ``GET /v1/executions/{id}`` shows output and traceback; a list shows the output when it is
  small and never a traceback; 404 for an unknown id, 422 for a malformed one;
- ``duetime executions get`` prints them, inert; ``JobClient.get_execution`` returns them.
"""

from __future__ import annotations

import json
import math
from typing import Any

import psycopg
import pytest

from duetime.cli import main
from duetime.consumers.worker.results import MAX_TRACEBACK_BYTES
from duetime.core.config import CommonSettings
from duetime.core.errors import NotFound, ValidationError
from duetime.producers.sdk import JobClient
from tests.helpers import RunningScheduler, TopicReader, wait_for
from tests.integration.test_api import api as api  # the fixture, re-exported
from tests.integration.test_api import assert_error
from tests.integration.test_api_support import RunningApi
from tests.integration.test_projector_support import project_all
from tests.integration.test_worker import worker as worker  # the fixture, re-exported
from tests.integration.test_worker_support import RunningWorker

NOW = {"at": "2020-01-01T00:00:00Z"}  # a past one-time schedule: runs at once
MOD = "tests.integration.test_execution_output"
SECRET = "pw-0f3c9e7d1a"
ONCE = {"max_retries": 0}


# --- the tasks (refs under ``tests``: the worker's test allowance) ------------------------


def _connect(dsn: str) -> None:
    raise ConnectionError(f"cannot reach {dsn}\x1b[2J <img src=x onerror=alert(1)>")


def fails(ctx: Any) -> None:
    try:
        _connect(f"postgresql://app:{SECRET}@db.internal/prod?sslpassword={SECRET}")
    except ConnectionError as exc:
        raise RuntimeError("the report could not be built") from exc


def returns(ctx: Any) -> dict[str, Any]:
    return {"rows": 3, "note": "<b>bold</b>"}


def returns_big(ctx: Any) -> str:
    return "x" * 5000


def returns_nan(ctx: Any) -> dict[str, float]:
    return {"ratio": math.nan}


def final_result(results: TopicReader, job_id: str) -> dict[str, Any]:
    def found() -> dict[str, Any]:
        for r in results.snapshot():
            if r["job_id"] == job_id and r["status"] != "running":
                return dict(r)
        return {}

    return wait_for(found, 60, f"the final result of job {job_id}")


def stored(settings: CommonSettings, execution_id: str) -> tuple[str | None, str | None, Any]:
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute(
            "SELECT output_json, traceback, error FROM executions WHERE execution_id = %s",
            (execution_id,),
        ).fetchone()
    assert row is not None, f"execution {execution_id} not projected"
    return row[0], row[1], row[2]


def test_tracebacks_and_outputs_reach_the_projection_the_api_the_cli_and_the_sdk(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    worker: RunningWorker,
    client: JobClient,
    results: TopicReader,
    api: RunningApi,
    capsys: pytest.CaptureFixture[str],
) -> None:
    jobs = {
        name: client.create_job(
            name=name, schedule=NOW, target={"type": "python", "ref": f"{MOD}:{name}"}, retry=ONCE
        ).job_id
        for name in ("fails", "returns", "returns_big", "returns_nan")
    }
    got = {name: final_result(results, job_id) for name, job_id in jobs.items()}
    ids = {name: r["execution_id"] for name, r in got.items()}

    # -- the worker's result ----------------------------------------------------------------
    error = got["fails"]["error"]
    trace = error["traceback"]
    assert error["type"] == "RuntimeError" and trace is not None
    assert SECRET not in json.dumps(got["fails"])
    assert len(trace.encode()) <= MAX_TRACEBACK_BYTES
    assert "in fails" in trace and "in _connect" in trace  # the frames, innermost included
    assert "The above exception was the direct cause" in trace  # the whole chain
    assert "\x1b" not in trace and "\\x1b[2J" in trace  # control characters escaped
    assert trace.rstrip().endswith("RuntimeError: the report could not be built")
    assert got["returns"]["error"] is None and got["returns"]["status"] == "success"

    # -- the projection, live and rebuilt ---------------------------------------------------
    project_all(settings)
    live = {name: stored(settings, execution_id) for name, execution_id in ids.items()}
    output, projected_trace, projected_error = live["fails"]
    assert output is None and projected_trace == trace
    assert "traceback" not in projected_error  # the error column stays small
    assert json.loads(live["returns"][0] or "null") == {"rows": 3, "note": "<b>bold</b>"}
    assert live["returns"][1] is None
    project_all(settings, rebuild=True)
    assert {name: stored(settings, execution_id) for name, execution_id in ids.items()} == live

    # -- REST -----------------------------------------------------------------------------
    with api.client() as c:
        failed = c.get(f"/v1/executions/{ids['fails']}").json()
        assert failed["status"] == "dead" and failed["traceback"] == trace
        assert failed["output"] is None and failed["error"]["type"] == "RuntimeError"
        assert failed["attempts"][0]["error"]["message"].startswith("the report could not")
        ok = c.get(f"/v1/executions/{ids['returns']}").json()
        assert ok["output"] == {"rows": 3, "note": "<b>bold</b>"} and ok["traceback"] is None
        big = c.get(f"/v1/executions/{ids['returns_big']}").json()
        assert big["output"] == "x" * 5000 and big["output_omitted"] is None
        nan = c.get(f"/v1/executions/{ids['returns_nan']}").json()
        assert nan["output"] is None and "not strict JSON" in nan["output_omitted"]
        listed = c.get(f"/v1/jobs/{jobs['returns_big']}/executions").json()["items"]
        assert listed[0]["output"] is None and "5002 bytes" in listed[0]["output_omitted"]
        listed = c.get(f"/v1/jobs/{jobs['fails']}/executions").json()["items"]
        assert "traceback" not in listed[0] and listed[0]["error"]["type"] == "RuntimeError"
        small = c.get(f"/v1/jobs/{jobs['returns']}/executions").json()["items"]
        assert small[0]["output"] == {"rows": 3, "note": "<b>bold</b>"}
        job = c.get(f"/v1/jobs/{jobs['fails']}").json()
        assert "traceback" not in job["last_execution"]
        assert_error(c.get(f"/v1/executions/{'0' * 8}-0000-4000-8000-{'0' * 12}"), 404, "not_found")
        assert_error(c.get("/v1/executions/not-a-uuid"), 422, "invalid")

    # -- the CLI: every line of the traceback, escaped ---------------------------------------
    capsys.readouterr()
    assert main(["executions", "get", ids["fails"], "--url", api.url]) == 0
    out = capsys.readouterr().out
    assert "traceback (latest attempt):" in out and "\x1b" not in out
    assert "  RuntimeError: the report could not be built" in out.split("\n")
    assert SECRET not in out
    assert main(["executions", "get", ids["returns"], "--url", api.url]) == 0
    out = capsys.readouterr().out
    assert '{"rows":3,"note":"<b>bold</b>"}' in out and "traceback (latest" not in out

    # -- the SDK ---------------------------------------------------------------------------
    view = client.get_execution(ids["fails"])
    assert view.traceback == trace and view.status == "dead" and view.output is None
    assert client.get_execution(ids["returns"]).output == {"rows": 3, "note": "<b>bold</b>"}
    not_json = client.get_execution(ids["returns_nan"])  # as REST shows it
    assert not_json.output is None and "not strict JSON" in (not_json.output_omitted or "")
    assert view.model_dump(mode="json") == failed  # the same answer as REST's
    with pytest.raises(NotFound):
        client.get_execution("00000000-0000-4000-8000-000000000000")
    with pytest.raises(ValidationError):
        client.get_execution("not-a-uuid")
