"""The broker SIGKILLed mid-transaction and restarted after 10 s (issue 8).

One scheduler, two workers and a projector run against the harness's own broker while one-time
jobs and two-second crons fall due. When an execution partition has an open transaction the
scheduler is frozen for a moment (SIGSTOP, so that the transaction stays open), the broker is
SIGKILLed and the scheduler thawed; 10 s later the broker starts again on the same storage.
Nothing else touches the roles.
Then: every job ran once (effects at the sink), no read_committed reader saw an aborted record,
no transaction hangs (the last stable offset catches up), every role is still running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.faults.harness import FaultStack, Scenario, size, utc_ms, wait_for, write_figures

SIZES = {
    "ci": {"jobs": 600, "crons": 10, "load_s": 40},
    "full": {"jobs": 3000, "crons": 50, "load_s": 90},
}
DOWN_S = 10
CRON_PERIOD_S = 2
WORKER_ENV = {"DUETIME_WORKER_CONCURRENCY": "50", "DUETIME_LEASE_TTL_S": "5"}


def create_load(scenario: Scenario, start: datetime, jobs: int, crons: int, load_s: float) -> int:
    """One-time jobs spread over the load, crons every 2 s across it; returns the occurrences."""
    target = {"type": "http", "url": scenario.sink.url}
    retry = {"max_retries": 10, "base_delay_s": 1, "max_delay_s": 5}
    end = start + timedelta(seconds=load_s)
    total = 0
    with scenario.job_client() as client:
        for i in range(jobs):
            at = start + timedelta(seconds=load_s * i / jobs)
            created = client.create_job(
                name=f"once-{i}",
                schedule={"at": at.isoformat()},
                target=target,
                payload={"sleep_s": 0.1},
                retry=retry,
                wait=False,
            )
            scenario.record_job(created, [utc_ms(at)])
            total += 1
        first = utc_ms(start) + (-utc_ms(start)) % (CRON_PERIOD_S * 1000)
        grid = list(range(first, utc_ms(end) + 1, CRON_PERIOD_S * 1000))
        for i in range(crons):
            created = client.create_job(
                name=f"cron-{i}",
                schedule={
                    "cron": f"*/{CRON_PERIOD_S} * * * * *",
                    "start_at": start.isoformat(),
                    "end_at": end.isoformat(),
                },
                target=target,
                payload={"sleep_s": 0.1},
                retry=retry,
                misfire="run_all",
                overlap="allow",
                wait=False,
            )
            scenario.record_job(created, grid)
            total += len(grid)
        client.flush()
    return total


def test_broker_sigkill_mid_transaction_and_restart(
    new_scenario: Callable[..., Scenario], fault_stack: FaultStack
) -> None:
    sized = SIZES[size()]
    scenario = new_scenario("broker-sigkill", effects=True, terminal=True)
    scenario.start_role("scheduler")
    scenario.start_role("projector")
    for i in range(2):
        scenario.start_role("worker", f"worker-{i + 1}", **WORKER_ENV)
    scenario.schedulers_own_all(1)
    scenario.workers_assigned()
    start = datetime.now(UTC) + timedelta(seconds=3)
    expected = create_load(scenario, start, sized["jobs"], sized["crons"], sized["load_s"])

    # a third into the load, catch the scheduler with a transaction open on an execution
    # topic: freeze it (SIGSTOP) so the transaction stays open, check, kill the broker, thaw.
    # (A sleep on purpose: when the fault strikes is part of the scenario, not a settling.)
    time.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds()) + sized["load_s"] / 3)
    scheduler = scenario.of_kind("scheduler")[0]
    open_txn: list[tuple[str, int]] = []
    deadline = time.monotonic() + 30
    while not open_txn and time.monotonic() < deadline:
        if scenario.open_transactions():
            scheduler.pause()
            open_txn = scenario.open_transactions()
            if not open_txn:
                scheduler.resume()  # it had committed meanwhile: try again
    with scenario.fault("broker-sigkill") as fault:
        fault_stack.kill_broker()
        scheduler.resume()
        killed_at = time.monotonic()
        # the broker stays down DOWN_S: the fault's duration, the subject of this test
        time.sleep(max(0.0, DOWN_S - (time.monotonic() - killed_at)))
        restart_s = fault_stack.start_broker()
        fault.update(open_transactions=len(open_txn), broker_restart_s=round(restart_s, 1))

    wait_for(
        lambda: scenario.sink.effects() >= expected,
        sized["load_s"] + 180,
        f"{expected} effects after the broker's restart",
        interval_s=1,
    )
    exited = {r.name: r.returncode() for r in scenario.roles.values() if not r.running}
    report = scenario.finish()
    config: dict[str, Any] = {
        "one_time_jobs": sized["jobs"],
        "crons": sized["crons"],
        "cron_period_s": CRON_PERIOD_S,
        "load_s": sized["load_s"],
        "broker_down_s": DOWN_S,
        "open_transactions_at_kill": len(open_txn),
        "broker_restart_s": round(restart_s, 1),
        "workers": 2,
        "schedulers": 1,
    }
    write_figures("broker-sigkill", report, size(), config)
    print("figures:", report.figures(), "config:", config)
    assert not exited, f"roles exited during the broker's outage: {exited}"
    assert open_txn, "no open transaction was seen to kill the broker in the middle of"
    assert report.ok, report.summary()
