"""Competing schedulers under churn (issue 8): one scheduler added or removed every 5 s (a
removal is a SIGKILL or a SIGTERM, in turn) while one-time jobs fall due within 30 s. Every job
must be requested exactly once: 0 duplicates, 0 misses (read_committed recorder).

CI size: 2,000 jobs; full size (``./run faults``): 10,000 jobs, both within 30 s.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.faults.harness import RoleProc, Scenario, size, utc_ms, wait_for, write_figures

SIZES = {"ci": {"jobs": 2000}, "full": {"jobs": 10_000}}
DUE_S = 30
CHURN_EVERY_S = 5
PARTITIONS = 6


def test_competing_schedulers_under_churn_fire_each_job_once(
    new_scenario: Callable[..., Scenario],
) -> None:
    n = SIZES[size()]["jobs"]
    scenario = new_scenario("scheduler-churn", PARTITIONS, effects=False, terminal=False)
    for _ in range(2):
        scenario.start_role("scheduler")
    scenario.schedulers_own_all(2)
    start = datetime.now(UTC) + timedelta(seconds=5)
    with scenario.job_client() as client:
        for i in range(n):
            at = start + timedelta(seconds=DUE_S * i / n)
            created = client.create_job(
                name=f"churn-{i}",
                schedule={"at": at.isoformat()},
                target={"type": "http", "url": "http://127.0.0.1:9/unused"},
                wait=False,
            )
            scenario.record_job(created, [utc_ms(at)])
        client.flush()

    rng = random.Random(8)
    live: list[RoleProc] = list(scenario.of_kind("scheduler"))
    steps: list[str] = []
    removals = 0
    # the churn's own clock (the test's subject, not a settling): it starts when the jobs
    # start to fall due and changes the membership every CHURN_EVERY_S
    time.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds()))
    end = start + timedelta(seconds=DUE_S + CHURN_EVERY_S)
    while datetime.now(UTC) < end:
        time.sleep(CHURN_EVERY_S)
        add = len(live) <= 1 or (len(live) < 3 and rng.random() < 0.5)
        if add:
            with scenario.fault(f"add-{len(steps) + 1}"):
                live.append(scenario.start_role("scheduler"))
            steps.append("add")
        else:
            victim = live.pop(rng.randrange(len(live)))
            how = "sigkill" if removals % 2 == 0 else "sigterm"
            removals += 1
            with scenario.fault(f"{how}-{victim.name}-{len(steps) + 1}"):
                victim.kill() if how == "sigkill" else victim.stop(timeout_s=30)
            steps.append(how)

    wait_for(
        lambda: len(scenario.recorder.executions) >= n,
        180,
        f"{n} execution requests after the churn",
        interval_s=1,
    )
    # "no duplicate arrives late": a window in which nothing may happen, so a sleep on purpose
    time.sleep(3)
    report = scenario.finish(statuses=False)
    config: dict[str, Any] = {
        "due_within_s": DUE_S,
        "churn_every_s": CHURN_EVERY_S,
        "steps": steps,
        "schedulers_started": len(scenario.of_kind("scheduler")),
        "partitions": PARTITIONS,
    }
    write_figures("scheduler-churn", report, size(), config)
    print("figures:", report.figures(), "steps:", steps)
    assert report.ok, report.summary()
    assert report.figures()["lost"] == 0 and report.figures()["duplicate_requests"] == 0
