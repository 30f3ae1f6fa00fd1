"""End to end, roles as processes (issue 18, items 1 and 2): concurrency and rate limits per
key, across two worker processes.

On the hostile suite's module stack plus a second worker: jobs whose concurrency key is
``tenant-{payload.tenant}`` with limit 1 (sequential per tenant), and jobs sharing one rate
limit (2 a second, burst 1), all due at once. An HTTP sink records when each call started and
ended: per tenant no two calls overlap, the rate key's starts stay within R + burst in any
second, every job succeeds once. The edge refuses a limit of 0 and a key template naming a
field the payload lacks (422 naming the field), and GET shows the limits as written.
"""

from __future__ import annotations

import uuid

from tests.e2e.procs import Role
from tests.hostile.conftest import PAST, HostileStack
from tests.limit_sink import IntervalSink, duplicates, max_in_window, max_overlap

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
            assert stack.wait_job(job_id, timeout_s=90)["status"] == "success"
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
