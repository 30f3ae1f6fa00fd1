"""End to end, roles as processes (issue 18, item 5): a named calendar and a backfill through
the API, the scheduler, a worker and the projector as real processes, with the scheduler
SIGKILLed in the middle of the backfill and a new one started.

The backfill covers seven yearly occurrences, one of them excluded by the job's calendar, of
an overlap=skip job: they run one at a time. While the first one's HTTP call is held at the
sink, the scheduler is killed; its successor restores the job's state (the backfill's cursor
and the running execution) from the changelog and carries on. Every occurrence the calendar
lets through runs exactly once (one delivery per occurrence, one effect per execution id),
the excluded one never, and GET shows the backfill done.
"""

from __future__ import annotations

import uuid
from collections import Counter

from tests.e2e.procs import Role
from tests.helpers import wait_for
from tests.hostile.conftest import HostileStack

YEARS = range(2018, 2025)
EXCLUDED = 2021


def test_a_backfill_survives_a_scheduler_kill_and_runs_each_occurrence_once(
    stack: HostileStack,
) -> None:
    calendar = {"name": "no-new-year-2021", "exclude": [f"{EXCLUDED}-01-01"]}
    assert stack.api.post("/v1/calendars", json=calendar).status_code == 201
    body = {
        "name": "yearly-backfill",
        "schedule": {"cron": "0 0 1 1 *", "calendar": calendar["name"]},
        "target": {"type": "http", "url": stack.sink.url},
        "payload": {"gated": True},
        "overlap": "skip",
    }
    created = stack.post_job(body)
    assert created.status_code == 201, created.text
    job_id = created.json()["job_id"]
    stack.wait_job(job_id, ("pending",))
    stack.sink.gate.clear()  # the first occurrence's call waits at the sink
    try:
        rng = {"from": f"{YEARS[0]}-01-01T00:00:00Z", "to": f"{YEARS[-1]}-12-31T00:00:00Z"}
        asked = stack.api.post(f"/v1/jobs/{job_id}/backfill", json=rng)
        assert asked.status_code == 202, asked.text
        assert (asked.json()["occurrences"], asked.json()["excluded"]) == (len(YEARS) - 1, 1)
        wait_for(
            lambda: any(d.job_id == job_id for d in stack.sink.deliveries),
            60,
            "the backfill's first occurrence to reach the sink",
        )
        stack.roles["scheduler"].kill()  # SIGKILL: no goodbye, no commit
        scheduler = Role.start(
            f"toolkit-scheduler-{uuid.uuid4().hex[:4]}", ["scheduler"], stack.env
        )
        stack.roles["scheduler"] = scheduler
        stack.pids["scheduler"] = scheduler.process.pid
    finally:
        stack.sink.gate.set()
    path = f"/v1/jobs/{job_id}/backfills/{asked.json()['backfill_id']}"
    wait_for(
        lambda: stack.get_json(path)["state"] == "done",
        120,
        "the backfill to finish under the new scheduler",
        interval_s=0.5,
    )
    shown = stack.get_json(path)
    assert (shown["succeeded"], shown["failed"], shown["excluded"]) == (len(YEARS) - 1, 0, 1)
    with stack.sink.lock:
        mine = [d for d in stack.sink.deliveries if d.job_id == job_id]
    years = Counter(int(d.body["scheduled_at"][:4]) for d in mine)
    assert years == Counter(y for y in YEARS if y != EXCLUDED), years  # each once, in order
    assert all(stack.sink.effects[d.key] == 1 for d in mine)
    assert [int(d.body["scheduled_at"][:4]) for d in mine] == sorted(years)  # one at a time
    stack.assert_survived()
