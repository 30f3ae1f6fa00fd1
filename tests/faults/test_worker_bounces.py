"""Worker bounces (issue 8): three workers, each SIGKILLed (or SIGTERMed) three times after
progress and restarted, while one-time jobs fall due; every job must have exactly one effect.

Modelled on Kafka's exactly-once system test (copy under hard bounces: input set = output
set, 0 duplicates). CI size: 1,000 executions; full size (``./run faults``): 10,000.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.faults.harness import Scenario, size, utc_ms, wait_for, write_figures

SIZES = {"ci": {"jobs": 1000, "spread_s": 20}, "full": {"jobs": 10_000, "spread_s": 90}}
WORKERS = 3
BOUNCES_EACH = 3
WORKER_ENV = {
    "DUETIME_WORKER_CONCURRENCY": "50",
    "DUETIME_WORKER_BUFFER": "200",
    # a killed worker's leases are taken over after this (the session timeout is 3 s)
    "DUETIME_LEASE_TTL_S": "3",
    "DUETIME_WORKER_SHUTDOWN_S": "3",
}


def create_jobs(scenario: Scenario, n: int, start: datetime, spread_s: float) -> None:
    with scenario.job_client() as client:
        for i in range(n):
            at = start + timedelta(seconds=spread_s * i / n)
            created = client.create_job(
                name=f"bounce-{i}",
                schedule={"at": at.isoformat()},
                target={"type": "http", "url": scenario.sink.url},
                payload={"sleep_s": 0.3, "i": i},
                retry={"max_retries": 5, "base_delay_s": 1, "max_delay_s": 5},
                timeout_s=30,
                wait=False,
            )
            scenario.record_job(created, [utc_ms(at)])
        client.flush()


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_worker_bounces_lose_nothing_and_double_nothing(
    new_scenario: Callable[..., Scenario], how: str
) -> None:
    sized = SIZES[size()]
    n = sized["jobs"]
    scenario = new_scenario(f"worker-bounces-{how}", effects=True, terminal=True)
    scenario.start_role("scheduler")
    scenario.start_role("projector")
    workers = [scenario.start_role("worker", f"worker-{i + 1}", **WORKER_ENV) for i in range(3)]
    scenario.schedulers_own_all(1)
    scenario.workers_assigned()
    start = datetime.now(UTC) + timedelta(seconds=3)
    create_jobs(scenario, n, start, sized["spread_s"])

    bounces = WORKERS * BOUNCES_EACH
    for k in range(bounces):
        # after progress: the k-th bounce waits for its share of the effects
        target = (k + 1) * n // (bounces + 2)
        wait_for(lambda t=target: scenario.sink.effects() >= t, 300, f"{target} effects")  # type: ignore[misc]
        victim = workers[k % WORKERS]
        with scenario.fault(f"{how}-{victim.name}-{k // WORKERS + 1}"):
            if how == "sigkill":
                victim.kill()
            else:
                victim.stop(timeout_s=60)
            victim.spawn()
        # the group has settled before the next victim: the restarted worker has partitions
        victim.wait_log("assigned", 90, since_start=True)
    wait_for(lambda: scenario.sink.effects() >= n, 600, f"{n} effects", interval_s=1)
    report = scenario.finish()
    config: dict[str, Any] = {
        "workers": WORKERS,
        "bounces_each": BOUNCES_EACH,
        "signal": how,
        "spread_s": sized["spread_s"],
        "worker_env": WORKER_ENV,
        "partitions": scenario.settings.partitions,
        "restarts": {w.name: w.starts - 1 for w in workers},
    }
    write_figures(f"worker-bounces-{how}", report, size(), config)
    print("figures:", report.figures())
    assert report.ok, report.summary()
    assert report.figures()["lost"] == 0 and report.effects == n
