"""End to end, roles as processes (issue 14, item 4): a backlog whose start window elapses
while no worker runs is dropped, not run late.

On the hostile suite's module stack (scheduler, worker, resolver, projector and API as real
processes): the worker is stopped; jobs with ``start_within_s=1`` and jobs without a window
fall due and are queued; once every windowed execution's window has passed by the clock, a
new worker process starts. The windowed jobs end ``expired`` in the API (their executions too)
with zero deliveries at the HTTP sink; the jobs without a window all run, once each.

The same module stack (one stack start for both) also runs the limits per key end to end
(issue 18, items 1 and 2), across two worker processes: jobs whose concurrency key is
``tenant-{payload.tenant}`` with limit 1 (sequential per tenant), and jobs sharing one rate
limit (2 a second, burst 1), all due at once. An HTTP sink records when each call started and
ended: per tenant no two calls overlap, the rate key's starts stay within R + burst in any
second, every job succeeds once. The edge refuses a limit of 0 and a key template naming a
field the payload lacks (422 naming the field), and GET shows the limits as written.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

from tests.e2e.procs import Role
from tests.helpers import wait_for
from tests.hostile.conftest import PAST, HostileStack
from tests.limit_sink import IntervalSink, duplicates, max_in_window, max_overlap

WINDOW_S = 1.0
JOBS_EACH = 3
JOIN_WAIT_S = 180
"""How long a job may wait for a worker that has just joined: its group join can stall for
90-120 s under a heavily loaded box (a KIP-848 heartbeat timing out, bench/README.md "Seen on
the way, not fixed"); CI once timed both tests out at 90 s with no log to tell why."""


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
        job = stack.wait_job(job_id, ("expired", "success", "dead"), timeout_s=JOIN_WAIT_S)
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


TENANTS = ("a", "b")
PER_TENANT = 4
RATE_JOBS = 5
PER_S, BURST = 2.0, 1


def test_limits_hold_across_two_workers(stack: HostileStack) -> None:
    sink = IntervalSink().start()
    second = Role.start(f"limits-worker-{uuid.uuid4().hex[:4]}", ["worker"], stack.env)
    try:
        tag = uuid.uuid4().hex[:6]
        base = {"schedule": PAST, "target": {"type": "http", "url": sink.url}}
        for field, bad in (
            ("concurrency.limit", {"concurrency": {"key": "k", "limit": 0}}),
            ("concurrency.key", {"concurrency": {"key": "{payload.nope}", "limit": 1}}),
            ("rate_limit.per_s", {"rate_limit": {"key": "k", "per_s": 0, "burst": 1}}),
        ):
            resp = stack.post_job({"name": "bad-limit", **base, "payload": {}, **bad})
            assert resp.status_code == 422, resp.text
            assert field in resp.text, resp.text
        ids: list[str] = []
        for tenant in TENANTS:
            for n in range(PER_TENANT):
                resp = stack.post_job(
                    {
                        "name": f"tenant-{tenant}-{n}",
                        **base,
                        "payload": {"tenant": f"{tag}{tenant}", "key": tenant, "sleep_s": 0.3},
                        "concurrency": {"key": "tenant-{payload.tenant}", "limit": 1},
                    }
                )
                assert resp.status_code == 201, resp.text
                ids.append(resp.json()["job_id"])
        for n in range(RATE_JOBS):
            resp = stack.post_job(
                {
                    "name": f"rated-{n}",
                    **base,
                    "payload": {"key": "rated"},
                    "rate_limit": {"key": f"api-{tag}", "per_s": PER_S, "burst": BURST},
                }
            )
            assert resp.status_code == 201, resp.text
            ids.append(resp.json()["job_id"])
        shown = stack.get_json(f"/v1/jobs/{ids[0]}")
        assert shown["concurrency"] == {"key": "tenant-{payload.tenant}", "limit": 1}
        assert stack.get_json(f"/v1/jobs/{ids[-1]}")["rate_limit"] == {
            "key": f"api-{tag}",
            "per_s": PER_S,
            "burst": BURST,
        }
        for job_id in ids:
            job = stack.wait_job(job_id, timeout_s=JOIN_WAIT_S, others={"limits-worker": second})
            assert job["status"] == "success", job
        calls = sink.snapshot()
        assert sorted(c.job_id for c in calls) == sorted(ids)  # each ran, once
        assert duplicates(calls) == 0
        overlap = max_overlap(c for c in calls if c.key in TENANTS)
        assert overlap == dict.fromkeys(TENANTS, 1), overlap
        rated = [c for c in calls if c.key == "rated"]
        assert max_in_window(rated, 1.0)["rated"] <= PER_S * 1.0 + BURST
        starts = sorted(c.start_s for c in rated)
        # 5 starts at 2 a second from a bucket of 1 take at least 2 s (less the start-up
        # jitter between a claim and its call reaching the sink)
        assert starts[-1] - starts[0] >= (RATE_JOBS - BURST) / PER_S - 0.5
        assert second.process.poll() is None, second.log()[-3000:]
    finally:
        second.stop(10)
        sink.stop()
