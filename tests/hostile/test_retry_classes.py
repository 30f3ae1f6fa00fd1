"""End to end, roles as processes (issue 18, item 6): per-error-class retry.

On the hostile suite's module stack (scheduler, worker, resolver, projector and API as real
processes), against one HTTP target that answers by path:

- ``/gone``: 404 every time. The job's retry policy lists 404 as non-retryable (and would
  otherwise retry 3 times): it is dead after one attempt, reason ``non_retryable``, and the
  target saw one request.
- ``/busy``: 503 with ``Retry-After: 1`` the first time, then 200. The job's backoff is 60 s,
  so finishing within the test's 30 s deadline means the Retry-After set the delay; and the
  second request came no earlier than 1 s after the first.

And Python tasks (``tests/hostile/retry_tasks.py``): a task that snoozes twice succeeds with
``max_retries: 0``; one raising a subclass of ``ValueError`` under ``non_retryable_errors:
["ValueError"]`` is dead after one attempt.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.helpers import serve_loopback, stop_server
from tests.hostile.conftest import PAST, HostileStack


class StatusSink:
    """Answers ``/gone`` with 404, ``/busy`` with 503 + Retry-After: 1 once and then 200;
    records when each job's requests arrived (monotonic seconds)."""

    def __init__(self) -> None:
        self.arrivals: dict[str, list[float]] = defaultdict(list)
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                job_id = self.headers.get("X-Duetime-Job-Id", "")
                with sink.lock:
                    sink.arrivals[job_id].append(time.monotonic())
                    seen = len(sink.arrivals[job_id])
                if self.path == "/gone":
                    self.send_response(404)
                elif self.path == "/busy" and seen == 1:
                    self.send_response(503)
                    self.send_header("Retry-After", "1")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = serve_loopback(Handler)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def times(self, job_id: str) -> list[float]:
        with self.lock:
            return list(self.arrivals[job_id])

    def stop(self) -> None:
        stop_server(self.server)


def test_404_is_dead_at_once_and_503_waits_for_its_retry_after(stack: HostileStack) -> None:
    sink = StatusSink()
    try:
        retry = {
            "max_retries": 3,
            "base_delay_s": 60,
            "jitter": False,
            "non_retryable_http_statuses": [404, 410],
        }
        ids = {}
        for path in ("/gone", "/busy"):
            resp = stack.post_job(
                {
                    "name": f"retry-class{path.replace('/', '-')}",
                    "schedule": PAST,
                    "target": {"type": "http", "url": sink.url(path)},
                    "retry": retry,
                }
            )
            assert resp.status_code == 201, resp.text
            ids[path] = resp.json()["job_id"]
        shown = stack.get_json(f"/v1/jobs/{ids['/gone']}")["retry"]
        assert shown["non_retryable_http_statuses"] == [404, 410]
        assert shown["respect_retry_after"] is True

        gone = stack.wait_job(ids["/gone"], timeout_s=30)
        assert gone["status"] == "dead", gone
        [execution] = stack.executions(ids["/gone"])
        assert execution["status"] == "dead" and len(execution["attempts"]) == 1, execution
        error = execution["error"]
        assert error["reason"] == "non_retryable" and error["http_status"] == 404, error
        assert "non_retryable_http_statuses" in error["message"], error
        assert len(sink.times(ids["/gone"])) == 1
        dead = stack.get_json("/v1/dlq")["items"]
        assert any(d["job_id"] == ids["/gone"] for d in dead), dead

        busy = stack.wait_job(ids["/busy"], timeout_s=30)  # the backoff alone would be 60 s
        assert busy["status"] == "success", busy
        first, second = sink.times(ids["/busy"])
        assert second - first >= 1.0, second - first  # not before the Retry-After
        [execution] = stack.executions(ids["/busy"])
        assert [a["attempt"] for a in execution["attempts"]] == [1, 2], execution
    finally:
        sink.stop()


def test_a_task_snoozes_without_attempts_and_a_listed_exception_is_not_retried(
    stack: HostileStack,
) -> None:
    """Python tasks: two snoozes with max_retries 0 still succeed (a snooze uses no attempt);
    an exception whose base is listed in non_retryable_errors is dead after one attempt."""
    ids = {}
    for name, ref, retry in (
        ("snooze", "snooze_then_succeed", {"max_retries": 0}),
        ("listed", "fail_with_a_value_error", {"max_retries": 3, "base_delay_s": 60,
                                                "non_retryable_errors": ["ValueError"]}),
    ):  # fmt: skip
        resp = stack.post_job(
            {
                "name": f"retry-class-{name}",
                "schedule": PAST,
                "target": {"type": "python", "ref": f"tests.hostile.retry_tasks:{ref}"},
                "payload": {"snoozes": 2},
                "retry": retry,
            }
        )
        assert resp.status_code == 201, resp.text
        ids[name] = resp.json()["job_id"]

    snoozed = stack.wait_job(ids["snooze"], timeout_s=30)
    assert snoozed["status"] == "success", snoozed
    [execution] = stack.executions(ids["snooze"])
    reasons = [(a["attempt"], (a.get("error") or {}).get("reason")) for a in execution["attempts"]]
    assert reasons == [(1, "snoozed"), (2, "snoozed"), (3, None)], execution

    listed = stack.wait_job(ids["listed"], timeout_s=30)
    assert listed["status"] == "dead", listed
    [execution] = stack.executions(ids["listed"])
    assert len(execution["attempts"]) == 1, execution
    error = execution["error"]
    assert error["reason"] == "non_retryable" and error["type"] == "LedgerClosed", error
    assert "builtins:ValueError" in error["exception_types"], error
    stack.assert_survived()
