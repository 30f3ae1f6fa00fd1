"""``POST /v1/jobs`` past FastAPI's routing (``producers/api/fastcreate.py``) answers exactly
as the framework's route does: the same request to an API with the fast path and to one
without it gets the same status, headers and body, for every kind of answer a create has."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any, cast

import httpx
import pytest
from fastapi import FastAPI

from duetime.core.config import CommonSettings
from duetime.producers.api import app as app_module
from duetime.producers.api.fastcreate import FastCreate
from tests.integration import test_api_support
from tests.integration.test_api import job_body
from tests.integration.test_api_support import RunningApi

TOKEN = "fastcreate-test-token-0123456789"
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def without_fast_path(settings: Any, **kwargs: Any) -> FastAPI:
    app = app_module.create_app(settings, **kwargs)
    app.user_middleware = [m for m in app.user_middleware if cast(Any, m.cls) is not FastCreate]
    return app


def middleware(api: RunningApi) -> list[Any]:
    app = api.server.config.app
    assert isinstance(app, FastAPI)
    return [m.cls for m in app.user_middleware]


def answers(api: RunningApi) -> list[tuple[int, dict[str, str], str]]:
    """Every kind of answer of POST /v1/jobs, job ids masked (each API makes its own jobs)."""
    with api.client(TOKEN) as c, httpx.Client(base_url=api.url, timeout=30) as anonymous:
        existing = job_body(job_id=str(uuid.uuid4()))
        key = f"k-{uuid.uuid4()}"
        unique = job_body(unique={"key": key, "window_s": 60})
        calls: list[Callable[[], httpx.Response]] = [
            lambda: c.post("/v1/jobs", json=existing),  # 201
            lambda: c.post("/v1/jobs", json=existing),  # 200: the same job
            lambda: c.post("/v1/jobs", json={**existing, "name": "other"}),  # 409
            lambda: c.post("/v1/jobs", json={**existing, "priority": "urgent"}),  # 422
            lambda: c.post("/v1/jobs", content=b"{not json", headers=_json()),  # 400
            lambda: c.post("/v1/jobs", content=b"[1, 2]", headers=_json()),  # 422
            lambda: c.post("/v1/jobs", json=unique),  # 201
            lambda: c.post("/v1/jobs", json=unique),  # 200, Duetime-Deduplicated
            lambda: c.post("/v1/jobs", json={**job_body(), "payload": "x" * 5000}),  # 413
            lambda: anonymous.post("/v1/jobs", json=job_body()),  # 401
            lambda: c.post("/v1/jobs?dry_run=1", json=job_body()),  # 400: the framework's
        ]
        out = []
        for call in calls:
            r = call()
            # ids differ, their length does not: content-length is compared as it is
            headers = {k: v for k, v in r.headers.items() if k not in ("date", "server")}
            out.append((r.status_code, headers, UUID_RE.sub("<id>", r.text)))
        return out


def _json() -> dict[str, str]:
    return {"content-type": "application/json"}


def test_the_fast_path_answers_as_the_framework_does(
    settings: CommonSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = RunningApi(settings, tokens=(TOKEN,), max_payload_bytes=1024)
    try:
        assert FastCreate in middleware(fast)
        with_fast = answers(fast)
        with fast.client() as c:
            metrics = c.get("/metrics").text
    finally:
        fast.stop()
    # the fast path's requests carry the route's label, as the framework's do
    assert 'duetime_api_requests_total{method="POST",route="/v1/jobs",status="201"}' in metrics
    monkeypatch.setattr(test_api_support, "create_app", without_fast_path)
    slow = RunningApi(settings, tokens=(TOKEN,), max_payload_bytes=1024)
    try:
        assert FastCreate not in middleware(slow)
        framework = answers(slow)
    finally:
        slow.stop()
    assert [a[0] for a in with_fast] == [201, 200, 409, 422, 400, 422, 201, 200, 413, 401, 400]
    for fast_answer, framework_answer in zip(with_fast, framework, strict=True):
        assert fast_answer == framework_answer
