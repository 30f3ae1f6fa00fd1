"""A scheduler's wall clock set 30 s ahead under load (issue 14 item 8).

Two schedulers share the partitions while one-time jobs fall due (HTTP sink, two workers).
Part way through, scheduler-2's wall clock is stepped 30 s ahead (its monotonic clock and the
broker are untouched, as an operator's bad ``date -s`` would leave them): without the clock
check it fires every job of its partitions due within the next 30 s at once. It must stop
firing in the cycle that sees the step, give its partitions up after
``DUETIME_SCHEDULER_CLOCK_GIVE_UP_S`` so scheduler-1 takes them, and come back once its clock
is set right. Judged: 0 early requests (seen by the recorder before their due time less the
schedulers' fire lead, which the workers hold them for), 0 early starts (at the sink before
the scheduled time), 0 lost, 0 duplicates.

The skewed scheduler runs under ``tests/offset_clock.py`` (a launcher that gives it an offset
Clock; SIGUSR1 steps it, SIGUSR2 sets it right): no test switch in the production code.

CI size: 120 jobs over 30 s, give-up after 5 s; full size (``./run faults``): 1,000 jobs over
60 s with the default give-up (30 s).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from duetime.schedulers.settings import SchedulerSettings
from tests.faults.harness import RoleProc, Scenario, size, utc_ms, wait_for, write_figures
from tests.faults.support import lateness_vs_schedule_ms

SIZES: dict[str, dict[str, Any]] = {
    "ci": {"jobs": 120, "spread_s": 30, "give_up_s": "5"},
    "full": {"jobs": 1000, "spread_s": 60, "give_up_s": "30"},
}
STEP_MS = 30_000
EARLY_TOLERANCE_MS = 50
"""The harness, the broker and the roles share this machine's clock: early is early."""
REQUEST_LEAD_MS = SchedulerSettings.fire_lead_ms
"""A request may be written this long before its due time (the schedulers' fire lead: the
worker holds it until then); a start never may."""
PARTITIONS = 6


def start_skewed_scheduler(scenario: Scenario, name: str, **env: str) -> RoleProc:
    """``duetime scheduler`` under the offset-clock launcher, one of the scenario's roles."""
    role = RoleProc(
        name,
        ["scheduler"],
        scenario.role_env(name, DUETIME_TEST_CLOCK_STEP_MS=str(STEP_MS), **env),
        log_path=scenario.dir / "logs" / f"{name}.log",
        python_args=["-m", "tests.offset_clock"],
    )
    scenario.roles[name] = role
    return role.spawn()


def early(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Requests the recorder saw, and calls the sink got, before their time."""
    requests = [
        e
        for e in events
        if e["kind"] == "request"
        and e["t_ms"] < e["due_at_ms"] - REQUEST_LEAD_MS - EARLY_TOLERANCE_MS
    ]
    starts = [
        e
        for e in events
        if e["kind"] == "delivery"
        and e.get("scheduled_at_ms") is not None
        and e["at_ms"] < e["scheduled_at_ms"] - EARLY_TOLERANCE_MS
    ]
    return requests, starts


def test_a_scheduler_with_its_clock_30_s_ahead_fires_nothing_early(
    new_scenario: Callable[..., Scenario],
) -> None:
    sized = SIZES[size()]
    n, spread_s = int(sized["jobs"]), float(sized["spread_s"])
    clock_env = {
        "DUETIME_SCHEDULER_CLOCK_GIVE_UP_S": sized["give_up_s"],
        "DUETIME_SCHEDULER_CLOCK_PROBE_S": "1",
    }
    scenario = new_scenario("clock-skew", PARTITIONS, effects=True, terminal=False)
    scenario.start_role("scheduler", "scheduler-1", **clock_env)
    skewed = start_skewed_scheduler(scenario, "scheduler-2", **clock_env)
    for i in range(2):
        scenario.start_role("worker", f"worker-{i + 1}", DUETIME_WORKER_CONCURRENCY="50")
    scenario.schedulers_own_all(2)
    scenario.workers_assigned()

    start = datetime.now(UTC) + timedelta(seconds=8)
    with scenario.job_client() as client:
        for i in range(n):
            at = start + timedelta(seconds=spread_s * i / n)
            created = client.create_job(
                name=f"skew-{i}",
                schedule={"at": at.isoformat()},
                target={"type": "http", "url": scenario.sink.url},
                payload={"i": i},
                wait=False,
            )
            scenario.record_job(created, [utc_ms(at)])
        client.flush()

    # the fault's own timeline (the test's subject, not a settling): the step a sixth of the
    # way into the due times, set right at two thirds
    pid = skewed.pid
    assert pid is not None
    time.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds() + spread_s / 6))
    with scenario.fault("clock-30s-ahead") as info:
        os.kill(pid, signal.SIGUSR1)
        skewed.wait_log("not firing", 30, since_start=True)
        skewed.wait_log("giving up my partitions", 120, since_start=True)
        scenario.schedulers_own_all(1)  # scheduler-1 took them all
        info["given_up_after_ms"] = int(time.time() * 1000) - info["start_ms"]
        time.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds() + spread_s * 2 / 3))
        os.kill(pid, signal.SIGUSR2)
        scenario.schedulers_own_all(2)  # back, with its share
    assert skewed.log_count("joining the schedulers' group") == 2

    wait_for(lambda: scenario.sink.effects() >= n, 300, f"{n} effects", interval_s=1)
    report = scenario.finish(statuses=False)
    early_requests, early_starts = early(scenario.history.events())
    figures = report.figures()
    config: dict[str, Any] = {
        "jobs": n,
        "spread_s": spread_s,
        "step_ms": STEP_MS,
        "schedulers": 2,
        "partitions": PARTITIONS,
        "clock_env": clock_env,
        "early_requests": len(early_requests),
        "early_starts": len(early_starts),
        "early_tolerance_ms": EARLY_TOLERANCE_MS,
        "given_up_after_ms": info["given_up_after_ms"],
        # what a user waiting for a job of the skewed scheduler's partitions saw: up to the
        # give-up plus the rebalance (the checker's lateness restarts at a misfire's emission)
        "late_vs_schedule_max_ms": lateness_vs_schedule_ms(scenario),
    }
    write_figures("clock-skew", {**figures, **config}, size(), config)
    print("figures:", figures, "early:", len(early_requests), len(early_starts))
    assert early_requests == [] and early_starts == [], (early_requests[:3], early_starts[:3])
    assert report.ok, report.summary()
    assert figures["lost"] == 0 and report.effects == n
    assert figures["duplicate_requests"] == 0 and figures["duplicate_effects"] == 0
