"""End to end, roles as processes (issue 14, item 4): a backlog whose start window elapses
while no worker runs is dropped, not run late.

On the hostile suite's module stack (scheduler, worker, resolver, projector and API as real
processes): the worker is stopped; jobs with ``start_within_s=1`` and jobs without a window
fall due and are queued; once every windowed execution's window has passed by the clock, a
new worker process starts. The windowed jobs end ``expired`` in the API (their executions too)
with zero deliveries at the HTTP sink; the jobs without a window all run, once each.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

from tests.e2e.procs import Role
from tests.helpers import wait_for
from tests.hostile.conftest import PAST, HostileStack

WINDOW_S = 1.0
JOBS_EACH = 3


def test_a_backlog_past_its_window_expires_unrun_while_unlimited_jobs_run(
    stack: HostileStack,
) -> None:
    stack.roles["worker"].stop(30)  # SIGTERM: the pool is gone while the backlog builds
    windowed: list[str] = []
    unlimited: list[str] = []
    for n in range(JOBS_EACH):
        for window, ids in ((WINDOW_S, windowed), (None, unlimited)):
            body = {
                "name": f"backlog-{n}",
                "schedule": PAST,
                "target": {"type": "http", "url": stack.sink.url},
                "payload": {"n": n},
                "retry": {"max_retries": 0},
                "start_within_s": window,
            }
            resp = stack.post_job(body)
            assert resp.status_code == 201, resp.text
            ids.append(resp.json()["job_id"])
    shown = stack.get_json(f"/v1/jobs/{windowed[0]}")
    assert shown["start_within_s"] == WINDOW_S
    assert stack.get_json(f"/v1/jobs/{unlimited[0]}")["start_within_s"] is None

    # every execution emitted (queued) while no worker runs
    due_s: dict[str, float] = {}

    def all_queued() -> bool:
        for job_id in windowed + unlimited:
            resp = stack.api.get(f"/v1/jobs/{job_id}/executions")
            items = resp.json()["items"] if resp.status_code == 200 else []
            if not items:
                return False
            due = items[0]["attempts"][0].get("due_at") or items[0]["scheduled_at"]
            due_s[job_id] = datetime.fromisoformat(due).timestamp()
        return True

    wait_for(all_queued, 60, "every job's execution to be queued", interval_s=0.2)
    last_deadline = max(due_s[j] for j in windowed) + WINDOW_S
    wait_for(lambda: time.time() > last_deadline + 0.2, 10, "every window to pass")

    worker = Role.start(f"gate-worker-{uuid.uuid4().hex[:4]}", ["worker"], stack.env)
    stack.roles["worker"] = worker
    stack.pids["worker"] = worker.process.pid
    for job_id in windowed:
        job = stack.wait_job(job_id, ("expired", "success", "dead"), timeout_s=90)
        assert job["status"] == "expired", job
        [execution] = stack.executions(job_id)
        assert execution["status"] == "expired", execution
        assert execution["error"]["reason"] == "expired", execution
    for job_id in unlimited:
        assert stack.wait_job(job_id, ("expired", "success", "dead"), 90)["status"] == "success"
    # (the stack's own start-up job also reached the sink: only this test's jobs count)
    delivered = [d.job_id for d in stack.sink.deliveries if d.job_id in windowed + unlimited]
    assert not set(delivered) & set(windowed), delivered
    assert sorted(delivered) == sorted(unlimited)  # each ran, once
    assert "not starting the attempt" in worker.log()
