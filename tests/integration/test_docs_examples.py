"""The runnable examples in docs/ run as written: each is read from its Markdown file (the
block after a ``<!-- tested: … -->`` marker naming this file), run as its own process against
the test broker, and its effect checked end to end (a scheduler and a worker run the job)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from duetime.core.config import CommonSettings
from duetime.infra.harness import wait_for
from tests.integration.test_api_support import running_stack
from tests.integration.test_worker_support import Sink

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- tested: tests/integration/test_docs_examples.py -->"


def examples_in(doc: Path) -> list[str]:
    """The code of each fenced block right after a marker line."""
    pattern = re.escape(MARKER) + r"\n```python\n(.*?)\n```"
    return re.findall(pattern, doc.read_text(encoding="utf-8"), flags=re.DOTALL)


def latest_schema(name: str) -> Path:
    versions = sorted(
        (ROOT / "schemas" / "history").glob(f"{name}.v*.avsc"),
        key=lambda p: int(p.name.rsplit(".v", 1)[1].split(".")[0]),
    )
    return versions[-1]


@pytest.fixture
def stack(settings: CommonSettings) -> Iterator[Sink]:
    with running_stack(settings) as sink:
        yield sink


def test_the_doc_marks_exactly_one_example() -> None:
    # a renamed marker or a changed fence would silently leave the example untested
    assert len(examples_in(ROOT / "docs" / "from-another-service.md")) == 1


def test_plain_avro_example_creates_a_job_that_runs(settings: CommonSettings, stack: Sink) -> None:
    (code,) = examples_in(ROOT / "docs" / "from-another-service.md")
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": settings.bootstrap_servers,
        "DUETIME_TOPIC_PREFIX": settings.topic_prefix,
        "JOB_SCHEMA": str(latest_schema("JobDefinition").relative_to(ROOT)),
        "TARGET_URL": stack.url,
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    delivery = wait_for(
        lambda: next((d for d in stack.deliveries if d.job_id == job_id), None),
        60,
        "the example's job to call its HTTP target",
    )
    assert delivery is not None  # wait_for returns only a truthy value
    assert delivery.body["payload"] == {"invoice": 42}, json.dumps(delivery.body)
