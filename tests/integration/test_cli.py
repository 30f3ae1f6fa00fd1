"""The job/execution/DAG/DLQ commands against a live API: end to end, tables, --json, errors,
bulk DLQ replay with progress and confirmation, dags list, a closed pipe."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from duetime.cli import main
from duetime.core.config import CommonSettings
from tests.helpers import wait_for
from tests.integration.test_api_support import RunningApi, running_stack
from tests.integration.test_worker_support import Sink

TOKEN = "cli-test-token-0123456789abcdef"


@pytest.fixture
def api(settings: CommonSettings) -> Iterator[RunningApi]:
    running = RunningApi(settings, tokens=(TOKEN,))
    yield running
    running.stop()


@pytest.fixture
def stack(settings: CommonSettings) -> Iterator[Sink]:
    with running_stack(settings) as sink:
        yield sink


class Cli:
    def __init__(self, api: RunningApi, capsys: pytest.CaptureFixture[str]) -> None:
        self.api, self.capsys = api, capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        rc = main([*argv, "--url", self.api.url, "--token", TOKEN])
        out, err = self.capsys.readouterr()
        return rc, out, err

    def json(self, *argv: str) -> Any:
        rc, out, err = self(*argv, "--json")
        assert rc == 0, err
        return json.loads(out)


def test_jobs_end_to_end_tables_json_and_errors(
    settings: CommonSettings, api: RunningApi, stack: Sink, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capsys)
    now = datetime.now(UTC).isoformat()
    created = cli.json(
        "jobs", "create", "--name", "cli-e2e", "--at", now, "--url-target", stack.url,
        "--payload", '{"from": "cli"}', "--label", "team=ops",
    )  # fmt: skip
    job_id = created["job_id"]
    wait_for(
        lambda: cli.json("jobs", "get", job_id)["status"] == "success", 30, "the CLI's job to run"
    )
    rc, out, _ = cli("executions", job_id)
    assert rc == 0 and "EXECUTION_ID" in out.splitlines()[0] and " success " in out
    execution_id = cli.json("executions", job_id)[0]["execution_id"]
    one = cli.json("executions", "get", execution_id)
    assert one["attempts"][0]["status"] == "success"
    rc, out, _ = cli("jobs", "list")
    assert rc == 0 and job_id in out
    assert out.splitlines()[0].split()[:3] == ["JOB_ID", "NAME", "STATUS"]
    rc, out, _ = cli("jobs", "get", job_id)
    assert rc == 0 and "team" in out and "last execution:" in out
    # errors: the API's code and message, exit status 1
    rc, _, err = cli("jobs", "get", str(uuid.uuid4()))
    assert rc == 1 and "not_found" in err
    rc, _, err = cli("jobs", "create", "--name", "x", "--cron", "0 0 31 2 *", "--url-target", "x")
    assert rc == 1 and "invalid" in err
    rc, _, err = cli("jobs", "resume", job_id)
    assert rc == 1 and "illegal_transition" in err
    # a recurring job through its lifecycle
    cron = cli.json(
        "jobs", "create", "--name", "c", "--cron", "0 3 * * *", "--url-target", stack.url
    )
    rc, out, err = cli("jobs", "pause", cron["job_id"])
    if rc != 0:  # created a moment ago: the scheduler has not taken it yet
        assert "retry in a moment" in err
        wait_for(lambda: cli("jobs", "pause", cron["job_id"])[0] == 0, 15, "pause accepted")
    else:
        assert "pause sent" in out
    wait_for(lambda: cli.json("jobs", "get", cron["job_id"])["status"] == "paused", 10, "paused")
    assert cli("jobs", "cancel", cron["job_id"])[0] == 0


def test_bulk_dlq_replay_shows_progress(
    settings: CommonSettings,
    api: RunningApi,
    stack: Sink,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cli = Cli(api, capsys)
    now = datetime.now(UTC).isoformat()
    ids = [
        cli.json(
            "jobs", "create", "--name", f"doomed-{i}", "--at", now, "--url-target", stack.url,
            "--payload", '{"fail_times": 1000}', "--max-retries", "0",
        )["job_id"]
        for i in range(3)
    ]  # fmt: skip
    wait_for(lambda: len(cli.json("dlq", "list")) == 3, 30, "three dead letters")
    rc, out, _ = cli("dlq", "list")
    assert rc == 0 and "SimulatedError" not in out and "doomed-" in out
    rc, out, _ = cli("dlq", "list", "--name", "doomed-2")
    assert rc == 0 and "doomed-2" in out and "doomed-0" not in out and len(out.splitlines()) == 2
    rc, out, err = cli("dlq", "replay", "--name", "doomed-1", "--chunk", "1", "--yes")
    assert rc == 0 and "replayed 1 dead execution(s)" in out and "1/1 replayed" in err
    # without --yes it asks; anything but yes replays nothing
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    with pytest.raises(SystemExit, match="not confirmed"):
        cli("dlq", "replay", "--since", "2020-01-01T00:00:00Z")
    # the two others, and doomed-1's replay if it has already died again (as below)
    asked = capsys.readouterr().err
    assert re.search(r"replay [23] dead execution\(s\)\? \[y/N\]", asked), asked
    assert sum(1 for d in cli.json("dlq", "list") if d["replayed_at"] is None) >= 2
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    rc, out, err = cli("dlq", "replay", "--since", "2020-01-01T00:00:00Z", "--chunk", "1")
    # the two others, and doomed-1's replay if it has already died again
    replayed = int(out.split()[1])
    assert rc == 0 and replayed in (2, 3)
    # a bar per chunk, against the total counted before the first replay
    bars = [line for line in err.splitlines() if line.startswith("[")]
    assert bars[-1].endswith(f"{replayed}/{replayed} replayed"), err
    listed = {d["job_id"]: d["replayed_at"] for d in cli.json("dlq", "list")}
    assert all(listed[j] for j in ids)


def test_the_cli_runs_as_a_process_with_the_environment(api: RunningApi) -> None:
    env = {**os.environ, "DUETIME_API_URL": api.url, "DUETIME_API_TOKEN": TOKEN}
    done = subprocess.run(
        [sys.executable, "-m", "duetime.cli", "jobs", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    env["DUETIME_API_TOKEN"] = "wrong"
    done = subprocess.run(
        [sys.executable, "-m", "duetime.cli", "jobs", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "unauthorized" in done.stderr


def test_dags_list_shows_each_dag_with_its_latest_run(
    api: RunningApi, stack: Sink, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(api, capsys)
    target = {"type": "http", "url": stack.url}
    body = {
        "name": "cli-nightly-etl",
        "jobs": [
            {"key": "a", "name": "a", "target": target},
            {"key": "b", "name": "b", "target": target, "depends_on": ["a"]},
        ],
    }
    dag = cli.json("dags", "create", json.dumps(body))
    rc, out, _ = cli("dags", "list", "--name", "NIGHTLY")
    lines = out.splitlines()
    assert rc == 0 and lines[0].split()[:4] == ["DAG_ID", "NAME", "SCHEDULE", "NODE_COUNT"]
    assert len(lines) == 2 and dag["dag_id"] in lines[1] and "cli-nightly-etl" in lines[1]
    assert cli.json("dags", "list", "--name", "no-such-dag") == []
    cli.json("dags", "trigger", dag["dag_id"])
    # the run's status, whatever it has reached (this stack has no resolver to finish it)
    last = wait_for(
        lambda: cli.json("dags", "list", "--name", "nightly")[0]["last_run"], 30, "the run"
    )
    rc, out, _ = cli("dags", "list", "--name", "nightly")
    assert rc == 0 and f" {last['status']} " in out.splitlines()[1] + " "


def test_a_closed_pipe_ends_quietly(api: RunningApi) -> None:
    """`duetime jobs list | head` where head has gone: no traceback, SIGPIPE's exit status.
    The read end is closed before the CLI starts, so its first write surely fails."""
    env = {**os.environ, "DUETIME_API_URL": api.url, "DUETIME_API_TOKEN": TOKEN}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "duetime.cli", "jobs", "list"],
            env=env,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
