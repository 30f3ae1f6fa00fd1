"""`pip install duetime` is the SDK and the CLI client with light dependencies (issue 16,
packaging): installed from this repository into a clean virtualenv, it publishes a job to the
test broker and drives the REST API, with none of the server roles' packages present; a role
command there says which extra to install. (`duetime[server]` is what every other test runs
on: the test extra includes it.)

It needs PyPI (or the machine's configured index) to install the dependencies; pip's cache
makes a second run quick."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from duetime.core.config import CommonSettings
from duetime.core.records import JobDefinition
from duetime.core.topics import Topics
from duetime.infra.harness import ROOT, TopicReader, wait_for
from tests.integration.test_api_support import RunningApi

SERVER_DISTRIBUTIONS = {
    "faust-streaming", "fastapi", "uvicorn", "aiohttp", "prometheus-client", "psycopg-pool",
    "starlette", "uvloop", "httptools", "croniter",
}  # fmt: skip


def source_copy(dest: Path) -> Path:
    """The repository's tracked files as they are in the working tree (symlinks kept): a
    build from the tree itself could pick up stale files from an earlier in-tree build."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        rel = Path(os.fsdecode(raw))
        src, dst = ROOT / rel, dest / rel
        if not (src.exists() or src.is_symlink()):
            continue  # deleted in the working tree, not yet in git
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, dst)
    return dest


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("packaging")
    source = source_copy(base / "src")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    done = subprocess.run(
        [*pip, "install", str(source)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    yield venv


def installed(venv: Path) -> set[str]:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {d["name"].lower() for d in json.loads(out)}


def test_the_light_install_has_no_server_package(light_venv: Path) -> None:
    names = installed(light_venv)
    assert "duetime" in names and "confluent-kafka" in names
    assert not names & SERVER_DISTRIBUTIONS, names & SERVER_DISTRIBUTIONS


def test_the_light_sdk_publishes_a_job(light_venv: Path, settings: CommonSettings) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from duetime import JobClient
        with JobClient(bootstrap_servers={settings.bootstrap_servers!r},
                       topic_prefix={settings.topic_prefix!r}) as jobs:
            job = jobs.create_job(name="from-a-light-install",
                                  schedule={{"at": "2099-01-01T00:00:00Z"}},
                                  target={{"type": "http", "url": "http://127.0.0.1:9/x"}})
        heavy = sorted(m for m in sys.modules
                       if m.split(".")[0] in ("faust", "fastapi", "uvicorn", "aiohttp"))
        print(job.job_id, heavy)
        """
    )
    done = subprocess.run(
        [str(light_venv / "bin" / "python"), "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=light_venv,  # not the repository: the installed package, not the source tree
    )
    assert done.returncode == 0, done.stderr[-3000:]
    job_id, heavy = done.stdout.split(" ", 1)
    assert heavy.strip() == "[]"
    reader = TopicReader(settings, [Topics(settings.topic_prefix).jobs], "job")
    try:
        found = wait_for(
            lambda: [r for r in reader.snapshot() if r["job_id"] == job_id],
            30,
            "the light SDK's job on the jobs topic",
        )
    finally:
        reader.close()
    assert (
        JobDefinition.from_avro({k: v for k, v in found[0].items() if not k.startswith("_")}).name
        == "from-a-light-install"
    )


def test_the_light_cli_drives_the_api_and_names_the_extra_for_roles(
    light_venv: Path, settings: CommonSettings
) -> None:
    api = RunningApi(settings)
    duetime = str(light_venv / "bin" / "duetime")
    env = {**os.environ, "DUETIME_API_URL": api.url}
    try:
        created = subprocess.run(
            [duetime, "jobs", "create", "--name", "light-cli", "--at", "2099-01-01T00:00:00Z",
             "--url-target", "http://127.0.0.1:9/x", "--json"],
            env=env, capture_output=True, text=True, timeout=60, cwd=light_venv,
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        job_id = json.loads(created.stdout)["job_id"]
        listed = subprocess.run(
            [duetime, "jobs", "list", "--json"],
            env=env, capture_output=True, text=True, timeout=60, cwd=light_venv,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert job_id in {j["job_id"] for j in json.loads(listed.stdout)}
    finally:
        api.stop()
    role = subprocess.run(
        [duetime, "scheduler"], env=env, capture_output=True, text=True, timeout=60
    )
    assert role.returncode == 2
    assert "pip install 'duetime[server]'" in role.stderr and "Traceback" not in role.stderr
